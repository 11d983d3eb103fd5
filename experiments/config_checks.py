"""Config validation, done before any model is loaded, and the building of what the config describes.

Every problem is one ``ConfigError`` whose message is one line: the key, the value, and what is allowed. The
library constructors are the schema of the config groups: ``validate`` builds each group once, and a constructor's
error becomes the ConfigError. ``RULES`` checks only the run keys, which no constructor sees (and the early-exit
drafter's layer count, which its constructor can check only once the target is loaded).
A setting that is valid but meaningless in a sweep (greedy verification while sampling) is not an error:
``validate`` returns the reason to skip the job.
"""

from __future__ import annotations

import inspect
import re
from typing import Callable

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

import specdec
from specdec.models import resolve_device, resolve_dtype
from specdec.prompts import resolve_source

WANDB_MODES = ("offline", "online", "disabled")


class ConfigError(ValueError):
    """A config value that cannot run. The message is one line naming the key, the value and what is allowed."""


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_at_least(low: int) -> Callable[[object], bool]:
    return lambda v: is_int(v) and v >= low


def optional(rule: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or rule(v)


# (key, rule, what is allowed) for the keys no constructor checks before the models load. A key absent from the
# config (e.g. an option without that parameter) is skipped.
RULES: list[tuple[str, Callable[[object], bool], str]] = [
    ("max_new_tokens", int_at_least(1), "an integer >= 1"),
    ("seed", int_at_least(0), "an integer >= 0"),
    ("batch_size", int_at_least(1), "an integer >= 1"),
    ("warmup", int_at_least(0), "an integer >= 0 (0 disables warm-up)"),
    ("num_prompts", optional(int_at_least(1)), "an integer >= 1, or null for all prompts"),
    ("threads", optional(int_at_least(1)), "an integer >= 1, or null for torch's default"),
    ("stop_at_eos", lambda v: isinstance(v, bool), "true or false"),
    ("compile", lambda v: isinstance(v, bool), "true or false"),
    ("group", lambda v: v is None or isinstance(v, str), "a string, or null for the sweep/run directory name"),
    ("resume", lambda v: isinstance(v, (bool, str)), "true, false, or a run directory path"),
    ("drafter.num_layers", int_at_least(1), "an integer >= 1 (and at most the target's layers)"),
    ("logger.mode", lambda v: v in WANDB_MODES, f"one of {', '.join(WANDB_MODES)}"),
]

# Groups whose objects are built without models (the drafter group's constructor too, see ``build_groups``).
MODEL_FREE_GROUPS = ("strategy", "draft_length", "sampling")
# What a drafter constructor may ask for by name that only exists once the pair is loaded.
PAIR_ARGUMENTS = ("model", "target", "tokenizer")
_ABSENT = object()


def select(cfg: DictConfig, key: str) -> object:
    """The resolved value at a dotted key; a missing mandatory value (???) is a ConfigError."""
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(f"{key} is required and has no value; set it on the command line, e.g. {key}=...") from None


def validate(cfg: DictConfig) -> tuple[dict[str, object], str | None]:
    """Check the config and build its model-free groups (``build_groups``), once.

    Returns the built objects and, if the job should be skipped, a one-line reason; raises ``ConfigError`` for an
    invalid config.
    """
    check_rules(cfg)
    check_device_and_dtype(select(cfg, "device"), select(cfg, "dtype"))
    check_prompt_source(select(cfg, "data.source"))
    objects = build_groups(cfg)
    return objects, skip_reason(objects["strategy"], objects["sampling"])


def check_rules(cfg: DictConfig) -> None:
    for key, rule, allowed in RULES:
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            continue
        value = select(cfg, key)
        if not rule(value):
            raise ConfigError(f"{key}={value!r} is not allowed: must be {allowed}")


def skip_reason(strategy: object, sampling: specdec.SamplingConfig) -> str | None:
    """Why a sweep skips this pairing of strategy and sampling, or None."""
    if isinstance(strategy, specdec.Greedy) and not sampling.is_greedy:
        return (
            f"strategy=greedy needs sampling.temperature=0, got sampling.temperature={sampling.temperature}; "
            f"greedy verification cannot sample (use strategy=speculative, typical or topk)"
        )
    return None


def build_groups(cfg: DictConfig) -> dict[str, object]:
    """Instantiate the groups that need no model; their constructors' errors become one-line ConfigErrors.

    "drafter_factory" is the drafter group's constructor; "drafter" the drafter built from it when it asks for
    none of the loaded models (n-gram), else None: ``complete_drafter`` builds it once the pair is loaded.
    """
    objects = {group: build(cfg, group, lambda group=group: instantiate(cfg[group])) for group in MODEL_FREE_GROUPS}
    factory = build(cfg, "drafter", lambda: instantiate(cfg.drafter))
    objects["drafter_factory"] = factory
    objects["drafter"] = None if needs_pair(factory) else build(
        cfg, "drafter", lambda: complete_drafter(factory, {"compile": cfg.compile}))
    return objects


def build(cfg: DictConfig, group: str, constructor: Callable[[], object]) -> object:
    """``constructor()``, its ValueError or TypeError (also wrapped by Hydra) turned into a ConfigError."""
    try:
        return constructor()
    except InstantiationException as err:
        raise ConfigError(explain(group, cfg[group], err.__cause__ or err)) from None
    except (ValueError, TypeError) as err:
        raise ConfigError(explain(group, cfg[group], err)) from None


def explain(group: str, node: DictConfig, err: BaseException) -> str:
    """The constructor's message on one line, after the key and value it names: 'draft_length.k=0: k must be an
    integer >= 1, got 0'. A message that names several keys (it then shows their values) or none comes after
    the group: 'drafter: need min_ngram <= max_ngram, ...'."""
    message = one_line(err)
    settings = OmegaConf.to_container(node, resolve=True)
    named = [key for key in settings if not key.startswith("_") and re.search(rf"\b{re.escape(key)}\b", message)]
    if len(named) == 1:
        return f"{group}.{named[0]}={settings[named[0]]!r}: {message}"
    return f"{group}: {message}"


def needs_pair(factory) -> bool:
    """Whether a drafter constructor asks for a model, the target or the tokenizer, which exist only once loaded."""
    parameters = inspect.signature(factory.func).parameters
    return any(name in parameters and name not in factory.keywords for name in PAIR_ARGUMENTS)


def complete_drafter(factory, available: dict[str, object]) -> object:
    """Call the drafter constructor with what it asks for by name from ``available`` (the loaded models, the
    run's ``compile`` switch) and has not been given by the config."""
    parameters = inspect.signature(factory).parameters
    bound = getattr(factory, "keywords", {}) or {}
    return factory(**{name: value for name, value in available.items() if name in parameters and name not in bound})


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def check_device_and_dtype(device: object, dtype: object) -> None:
    """The device must be one the pair loader knows and present on this machine; the dtype one it knows."""
    try:
        resolved = resolve_device(device)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"device={device!r}: {one_line(err)}") from None
    try:
        resolve_dtype(dtype, resolved)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"dtype={dtype!r}: {one_line(err)}") from None


def check_prompt_source(source: object) -> None:
    """A shipped prompt set name, or an existing .jsonl / .txt file (checked without reading it)."""
    if not isinstance(source, str) or not source:
        raise ConfigError(f"data.source={source!r} is not allowed: must be a shipped prompt set name or a file path")
    try:
        resolve_source(source)
    except (ValueError, OSError) as err:
        raise ConfigError(f"data.source={source!r}: {one_line(err)}") from None
