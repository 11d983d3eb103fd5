"""Config validation, done before any model is loaded.

Every problem is one ``ConfigError`` whose message is one line: the key, the value, and what is allowed.
A setting that is valid but meaningless in a sweep (greedy verification while sampling) is not an error:
``validate`` returns the reason to skip the job.
"""

from __future__ import annotations

import inspect
from numbers import Real
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


def is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def int_at_least(low: int) -> Callable[[object], bool]:
    return lambda v: is_int(v) and v >= low


def optional(rule: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or rule(v)


# (key, rule, what is allowed). A key absent from the config (e.g. an option without that parameter) is skipped.
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
    ("draft_length.k", int_at_least(1), "an integer >= 1"),
    ("sampling.temperature", lambda v: is_number(v) and v >= 0, "a number >= 0 (0 means greedy)"),
    ("sampling.top_k", optional(int_at_least(1)), "an integer >= 1, or null for no top-k filter"),
    ("sampling.top_p", optional(lambda v: is_number(v) and 0 < v <= 1), "a number in (0, 1], or null"),
    ("sampling.min_p", optional(lambda v: is_number(v) and 0 <= v <= 1), "a number in [0, 1], or null"),
    ("strategy.lenience", lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1] (1 is exact)"),
    ("strategy.epsilon", lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    ("strategy.delta", lambda v: is_number(v) and v > 0, "a number > 0"),
    ("strategy.n", int_at_least(1), "an integer >= 1"),
    ("drafter.num_layers", int_at_least(1), "an integer >= 1 (and at most the target's layers)"),
    ("logger.mode", lambda v: v in WANDB_MODES, f"one of {', '.join(WANDB_MODES)}"),
]

# Groups whose objects are cheap to build without models: building them runs the constructors' own checks.
MODEL_FREE_GROUPS = ("strategy", "draft_length", "sampling", "drafter")
_ABSENT = object()


def select(cfg: DictConfig, key: str) -> object:
    """The resolved value at a dotted key; a missing mandatory value (???) is a ConfigError."""
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(f"{key} is required and has no value; set it on the command line, e.g. {key}=...") from None


def validate(cfg: DictConfig) -> str | None:
    """Raise ``ConfigError`` for an invalid config; return a one-line reason if the job should be skipped."""
    for key, rule, allowed in RULES:
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            continue
        value = select(cfg, key)
        if not rule(value):
            raise ConfigError(f"{key}={value!r} is not allowed: must be {allowed}")
    check_device_and_dtype(select(cfg, "device"), select(cfg, "dtype"))
    check_prompt_source(select(cfg, "data.source"))
    objects = build_model_free(cfg)
    strategy, sampling = objects["strategy"], objects["sampling"]
    if isinstance(strategy, specdec.Greedy) and not sampling.is_greedy:
        return (
            f"strategy=greedy needs sampling.temperature=0, got sampling.temperature={sampling.temperature}; "
            f"greedy verification cannot sample (use strategy=speculative, typical or topk)"
        )
    return None


def build_model_free(cfg: DictConfig) -> dict[str, object]:
    """Instantiate the groups that need no model, turning constructor errors into one-line ConfigErrors."""
    objects = {}
    for group in MODEL_FREE_GROUPS:
        try:
            objects[group] = instantiate(cfg[group])
            if group == "drafter":
                complete_if_model_free(objects[group])
        except InstantiationException as err:
            cause = err.__cause__ if err.__cause__ is not None else err
            raise ConfigError(f"{group}: {one_line(cause)}") from None
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{group}: {one_line(err)}") from None
    return objects


def complete_if_model_free(factory) -> None:
    """Build a drafter that needs no loaded model (e.g. n-gram) once, so its constructor checks its settings now."""
    parameters = inspect.signature(factory.func).parameters
    if not any(name in parameters and name not in factory.keywords for name in ("model", "target", "tokenizer")):
        factory()


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
