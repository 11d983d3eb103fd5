"""The one refusal path of every command-line entry point (``experiments.run``, the benches, ``tree_search``,
``train_pair``, ``analysis.report``): a bad argument ends the command before any work, with exit status 2 and one
line on stderr naming the value and what is allowed.

- ``refuse(line)``: print the line, exit 2. Everything below ends there.
- ``ArgumentParser``: argparse's parser whose errors are that one line (argparse prints its usage block first), and
  whose ``check`` turns a command's own checks of its arguments (a ValueError or TypeError naming the value) into
  the same line.
- The checks the commands share, each raising a one-line ``ValueError``: ``check_device``, ``check_dtype``,
  ``check_pair`` (a ``load_pair`` preset, read without its weights) and ``check_writable`` (a directory the command
  writes at the end, written to now, so a command never measures for minutes and then fails to save).
- ``check_group_options``: ``experiments.run``'s overrides of a config group (``sampling=t2``), each value one of
  the group's options, before Hydra composes the config (Hydra's own error is 11 lines and exit 1).
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path
from typing import Callable, NoReturn, TypeVar

from specdec.models import ModelUnavailableError, plan_pair, resolve_device, resolve_dtype

T = TypeVar("T")


def refuse(line: str) -> NoReturn:
    """End the command: ``line`` on stderr, exit status 2."""
    print(" ".join(line.split()), file=sys.stderr)
    sys.exit(2)


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose refusals are one line, 'python -m X: error: ...', exit 2 (``--help`` is
    argparse's)."""

    def error(self, message: str) -> NoReturn:
        refuse(f"{self.prog}: error: {message}")

    def check(self, *checks: Callable[[], object]) -> None:
        """Run a command's own checks of its parsed arguments, in order; the first ValueError or TypeError (or a
        model that cannot be found) is refused."""
        for check in checks:
            try:
                check()
            except (ValueError, TypeError, ModelUnavailableError) as err:
                self.error(one_line(err))


def built_before_measuring(command: str, build: Callable[[], T]) -> T:
    """``build()``: the parts ``command`` measures, built from what it loaded (a tree the pair's vocabulary cannot
    hold is known only then); a part's constructor refusing is refused in one line, before any measuring."""
    try:
        return build()
    except (ValueError, TypeError) as err:
        refuse(f"{command}: error: {one_line(err)}")


def check_device(option: str, device: object) -> None:
    """A device the pair loader knows and this machine has (``cuda`` without a GPU is refused, as is ``tpu``)."""
    try:
        resolve_device(device)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{option} {device!r}: {one_line(err)}") from None


def check_dtype(option: str, dtype: object, device: object = "cpu") -> None:
    try:
        resolve_dtype(dtype, resolve_device(device))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{option} {dtype!r}: {one_line(err)}") from None


def check_pair(option: str, preset: object, device: object = "cpu", dtype: object = "auto") -> None:
    """A ``load_pair`` preset whose configs and tokenizer can be read (no weights load)."""
    try:
        plan_pair(preset, device=device, dtype=dtype)
    except (ValueError, TypeError, ModelUnavailableError) as err:
        raise ValueError(f"{option} {preset!r}: {one_line(err)}") from None


def check_writable(option: str, directory: Path | str) -> None:
    """``directory``, or where it will be made (its nearest existing parent), takes a new file: one is written there
    and removed, since permissions alone do not tell (root, read-only mounts, a full disk). Nothing is made."""
    path = Path(directory).expanduser().absolute()
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    problem = None
    if not existing.is_dir():
        problem = f"{existing} is a file, not a directory"
    else:
        try:
            with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-check-"):
                pass
        except OSError as err:
            problem = f"{err.strerror or one_line(err)} in {existing}"
    if problem:
        raise ValueError(f"{option} {str(directory)!r} cannot be written: {problem}; choose a directory you can "
                         f"write")


def check_readable_file(option: str, path: Path | str) -> None:
    """An existing file the command reads."""
    file = Path(path).expanduser()
    if not file.is_file():
        what = "a directory" if file.is_dir() else "not found"
        raise ValueError(f"{option} {str(path)!r}: {what}; give an existing file")
    try:
        file.open("rb").close()
    except OSError as err:
        raise ValueError(f"{option} {str(path)!r} cannot be read: {err.strerror or one_line(err)}") from None


def check_group_options(argv: list[str], config_dir: Path) -> str | None:
    """What is wrong with the overrides of config groups in a Hydra command line (``argv`` without the program),
    or None: each value of ``group=option`` (sweeps ``a,b`` and ``choice(a,b)`` included) must be one of the
    group's options. A command line Hydra cannot parse is named too; anything else is left to Hydra."""
    from hydra import initialize_config_dir  # Hydra's parsers, for experiments.run alone: imported here
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import OverrideParseException

    try:
        parsed, rest = get_args_parser().parse_known_args(argv)
    except SystemExit:  # flags Hydra's own parser refuses: Hydra says so
        return None
    if parsed.config_name and not parsed.config_path and not parsed.config_dir and \
            not (config_dir / f"{parsed.config_name}.yaml").is_file():
        known = ", ".join(sorted(path.stem for path in config_dir.glob("*.yaml")))
        return (f"--config-name {parsed.config_name}: no {parsed.config_name}.yaml in {config_dir}; primary "
                f"configs: {known}")
    texts = [*(parsed.overrides or []), *(arg for arg in rest if not arg.startswith("-"))]
    overrides, parser = [], OverridesParser.create()
    for text in texts:
        try:
            overrides += parser.parse_overrides([text])
        except OverrideParseException as err:
            return (f"cannot parse the override {text!r} ({one_line(str(err).splitlines()[0])}): see Hydra's "
                    f"override grammar; quote a value holding spaces, brackets or non-ASCII letters: key='value'")
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for override in overrides:
            options = loader.get_group_options(override.key_or_group)
            if not options or override.is_delete():
                continue
            value = override.value()
            values = value.list if isinstance(value, ChoiceSweep) else [value] if isinstance(value, str) else []
            unknown = [str(item) for item in values if str(item) not in options]
            if unknown:
                return unknown_option(override.key_or_group, unknown[0], options)
    return None


def unknown_option(group: str, value: str, options: list[str]) -> str:
    nearest = difflib.get_close_matches(value, options, n=1)
    hint = f"; did you mean {group}={nearest[0]}?" if nearest else ""
    return f"{group}={value} is not an option of {group}; options: {', '.join(options)}{hint}"


def refuse_unknown_group_options(argv: list[str], config_dir: Path) -> None:
    """``check_group_options``, refused as a config error."""
    problem = check_group_options(argv, config_dir)
    if problem is not None:
        refuse(f"config error: {problem}")
