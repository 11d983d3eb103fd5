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
import functools
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


def check_group_options(argv: list[str], config_dir: Path, config_name: str = "run") -> str | None:
    """What is wrong with the overrides of config groups in a Hydra command line (``argv`` without the program),
    or None: each value of ``group=option`` (sweeps ``a,b`` and ``choice(a,b)`` included) must be one of the
    group's options, found on Hydra's composed search path (``config_dir``, ``--config-dir`` and
    ``hydra.searchpath``, as Hydra will compose it); and a key of a group (``drafter.checkpoint=DIR``) must be one
    the chosen option holds, and cannot be set while the group is swept (``group_key_problem``). A command line
    Hydra cannot parse is named too; anything else is left to Hydra."""
    from hydra._internal.utils import get_args_parser  # Hydra's parsers, for experiments.run alone: imported here
    from hydra.core.override_parser.overrides_parser import OverridesParser
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
    search = [override.input_line for override in overrides if override.get_key_element() == "hydra.searchpath"]
    composed = ComposedSearchPath(config_dir, parsed.config_dir, parsed.config_name or config_name, search)
    choices = {}
    for override in overrides:
        options = composed.options(override.key_or_group)
        if not options or override.is_delete():
            continue
        values = option_values(override)
        unknown = [value for value in values if value not in options]
        if unknown:
            return unknown_option(override.key_or_group, unknown[0], options)
        choices[override.key_or_group] = values
    for override in overrides:
        problem = group_key_problem(override, choices, composed) or top_level_key_problem(override, composed)
        if problem is not None:
            return problem
    return None


def top_level_key_problem(override, composed: ComposedSearchPath) -> str | None:
    """What is wrong with an override of a top-level key the primary config lacks (``unknown_key=1``: Hydra's
    'not in struct' is many lines), or None; a key of one's own is added with ``+``."""
    key = override.key_or_group
    if override.is_add() or override.is_force_add() or override.is_delete() or "." in key or \
            key.startswith("hydra") or composed.options(key):
        return None
    primary = composed.compose(())
    if primary is None or key in primary:
        return None
    known = sorted(str(name) for name in primary if name != "hydra")
    nearest = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {nearest[0]}?" if nearest else f"known: {', '.join(known)}"
    return f"{override.input_line}: {key} is not a key of the config; {hint} (a key of your own: +{key}=...)"


class ComposedSearchPath:
    """The config groups as Hydra will compose them: the app's ``config_dir``, a ``--config-dir``, the
    ``hydra.searchpath`` override (``search``) and Hydra's own configs (``hydra/launcher``)."""

    def __init__(self, config_dir: Path, extra_dir: str | None, config_name: str, search: list[str]):
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra._internal.utils import create_config_search_path

        search_path = create_config_search_path(f"file://{config_dir}")
        if extra_dir:
            search_path.prepend("command-line", f"file://{Path(extra_dir).expanduser().absolute()}")
        self.loader = ConfigLoaderImpl(config_search_path=search_path)
        self.config_name = config_name if (config_dir / f"{config_name}.yaml").is_file() or extra_dir else None
        self.search = search

    def options(self, group: str) -> list[str]:
        import warnings

        with warnings.catch_warnings():  # a search path entry that does not exist: Hydra warns of it itself
            warnings.simplefilter("ignore")
            return self.loader.get_group_options(group, config_name=self.config_name, overrides=self.search)

    @functools.lru_cache(maxsize=None)
    def compose(self, overrides: tuple[str, ...]):
        """The primary config composed with ``overrides`` (None where Hydra cannot: Hydra will name why)."""
        import warnings

        from hydra.types import RunMode

        if self.config_name is None:
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return self.loader.load_configuration(self.config_name, [*self.search, *overrides], RunMode.RUN)
        except Exception:  # noqa: BLE001 - what Hydra cannot compose is Hydra's to name
            return None

    def default(self, group: str) -> str | None:
        """The option the primary config chooses for ``group``."""
        composed = self.compose(())
        return None if composed is None else composed.hydra.runtime.choices.get(group)

    def keys(self, group: str, option: str) -> list[str] | None:
        """The keys of one option of ``group``, its own defaults list merged in."""
        composed = self.compose((f"{group}={option}",))
        node = None if composed is None else composed.get(group)
        return None if node is None else [str(name) for name in node if not str(name).startswith("_")]


def option_values(override) -> list[str]:
    """The options a group override chooses: one, or each of a sweep's."""
    from hydra.core.override_parser.types import ChoiceSweep

    value = override.value()
    return [str(item) for item in value.list] if isinstance(value, ChoiceSweep) else \
        [value] if isinstance(value, str) else []


def group_key_problem(override, choices: dict[str, list[str]], composed: ComposedSearchPath) -> str | None:
    """What is wrong with an override of a key of a config group (``drafter.checkpoint=DIR``), or None. Hydra
    composes a sweep's shared config before it chooses a swept group's option, so such a key cannot be set while
    its group is swept (Hydra's error is many lines); and an option that lacks the key takes it only with ``+``.
    Either way the way out is named: an option of one's own holding the key (docs/experiments.md)."""
    key = override.key_or_group
    if override.is_add() or override.is_force_add() or override.is_delete() or "." not in key or \
            key.startswith("hydra."):
        return None
    group, rest = key.split(".", 1)
    if not composed.options(group):
        return None
    chosen = choices.get(group) or [composed.default(group)]
    if chosen[0] is None:
        return None
    value = override.input_line.split("=", 1)[1]
    holding = [option for option in chosen if rest.split(".")[0] in (composed.keys(group, option) or [])]
    if len(chosen) > 1:
        mine = holding[0] if holding else chosen[0]
        return (f"{key}={value} cannot be set while {group} is swept ({group}={','.join(chosen)}): Hydra composes "
                f"the sweep before it chooses each {group}; write the option with its {rest} as one of your own, "
                f"my_configs/{group}/my_{mine}.yaml holding the two lines 'defaults: [{mine}]' and "
                f"'{rest}: {value}', and sweep it by name beside the others: -m 'hydra.searchpath=[file://my_configs]' "
                f"{group}={','.join(f'my_{option}' if option == mine else option for option in chosen)} "
                f"(docs/experiments.md, \"Your own parts\")")
    keys = composed.keys(group, chosen[0])
    if keys is not None and not holding:
        return (f"{key}={value}: {group}={chosen[0]} has no key {rest} (its keys: {', '.join(keys) or 'none'}); a "
                f"key of your own is added with +{key}=...")
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
