"""Config validation, done before any model is loaded, and the building of what the config describes.

Every problem is one ``ConfigError`` whose message is one line: the key, the value, and what is allowed.
- ``check_known_keys``: a key nothing reads (``+max_new_token=8``) is refused, naming the nearest known key. The
  run keys are those configs/run.yaml declares; a group's keys are its constructor's parameters.
- ``RULES``: the run keys and the keys no constructor checks.
- The library constructors are the schema of the config groups: ``validate`` builds each model-free group once,
  and a constructor's error becomes the ConfigError. A drafter is built by its factory
  (``_target_: specdec.ModelDrafter.from_pair``), whose ``check_options`` runs here and whose ``from_pair`` runs
  once the pair is loaded.
- The pair's arguments are checked, and its tokenizers and context read, without its weights
  (``specdec.models.plan_pair``): a ``max_new_tokens`` or a prompt beyond the context fails here too, and so does
  a pair with two tokenizers (``pair.cross_tokenizer=true``) for a drafter other than ``cross_tokenizer``.
- ``CheckLaunch``, a Hydra callback, checks the Hydra keys (run and sweep directories, the launcher's limits)
  before any job starts.
A setting that is valid but meaningless in a sweep (greedy verification while sampling) is not an error:
``validate`` returns the reason to skip the job.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import socket
import sys
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from hydra.errors import InstantiationException
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

import specdec
from specdec.checks import SEED_RANGE
from specdec.models import (SHAPED_PRESETS, ModelUnavailableError, PairPlan, plan_pair, resolve_device, resolve_dtype,
                            resolve_pair_ids)
from specdec.prompts import Prompt, resolve_source

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
WANDB_MODES = ("offline", "online", "disabled")
# The most new tokens a run may ask for before its pair's context is known (read from the pair's config files
# before loading, which then bounds it): a larger value is a typo, and would size buffers that cannot fit.
MAX_NEW_TOKENS = 2**20
HUB_PROBE_SECONDS = 3.0  # how long one connection to the Hugging Face hub may take before it counts as unreachable
OFFLINE_PAIRS = ("embedded", *SHAPED_PRESETS)  # the pairs that load without the hub


class ConfigError(ValueError):
    """A config value that cannot run. The message is one line naming the key, the value and what is allowed."""


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_at_least(low: int) -> Callable[[object], bool]:
    return lambda v: is_int(v) and v >= low


def optional(rule: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or rule(v)


def is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def is_list_of_text(value: object) -> bool:
    return OmegaConf.is_list(value) and all(is_text(item) for item in value)


# (key, rule, what is allowed) for the keys no constructor checks before the models load. A key absent from the
# config (e.g. an option without that parameter) is skipped.
RULES: list[tuple[str, Callable[[object], bool], str]] = [
    ("max_new_tokens", lambda v: is_int(v) and 1 <= v <= MAX_NEW_TOKENS,
     f"an integer in [1, {MAX_NEW_TOKENS}] (and below the pair's context)"),
    ("seed", lambda v: is_int(v) and 0 <= v <= SEED_RANGE[1], "an integer in [0, 2**64 - 1] (torch's seeds)"),
    ("batch_size", int_at_least(1), "an integer >= 1"),
    ("warmup", int_at_least(0), "an integer >= 0 (0 disables warm-up)"),
    ("num_prompts", optional(int_at_least(1)), "an integer >= 1, or null for all prompts"),
    ("threads", optional(int_at_least(1)), "an integer >= 1, or null for torch's default"),
    ("stop_at_eos", lambda v: isinstance(v, bool), "true or false"),
    ("compile", lambda v: isinstance(v, bool), "true or false"),
    ("forward", lambda v: v in specdec.FORWARDS, f"one of {', '.join(specdec.FORWARDS)}"),
    ("group", optional(is_text), "a non-empty string, or null for the sweep/run directory name"),
    ("resume", lambda v: isinstance(v, bool) or (is_text(v) and Path(v).expanduser().is_dir()),
     "true, false, or the path of an existing run directory"),
    ("data.limit", optional(int_at_least(1)), "an integer >= 1, or null for all prompts"),
    ("logger.mode", lambda v: v in WANDB_MODES, f"one of {', '.join(WANDB_MODES)}"),
    ("logger.tags", is_list_of_text, "a list of strings, e.g. [baseline,k4]"),
    ("logger.project", is_text, "a W&B project name"),
    ("logger.entity", optional(is_text), "a W&B user or team name, or null for your default entity"),
    ("logger.group", optional(is_text), "a W&B group name, or null for the sweep or run directory name"),
    ("logger.dir", optional(is_text), "a directory path, or null"),
]

# The launcher's keys (Hydra's submitit launcher; the basic launcher has none), checked before any job starts.
LAUNCHER_RULES: list[tuple[str, Callable[[object], bool], str]] = [
    ("hydra.launcher.timeout_min", int_at_least(1), "an integer number of minutes >= 1"),
    ("hydra.launcher.nodes", int_at_least(1), "an integer >= 1"),
    ("hydra.launcher.tasks_per_node", int_at_least(1), "an integer >= 1"),
    ("hydra.launcher.cpus_per_task", optional(int_at_least(1)), "an integer >= 1, or null"),
    ("hydra.launcher.gpus_per_node", optional(int_at_least(0)), "an integer >= 0, or null"),
    ("hydra.launcher.mem_gb", optional(int_at_least(1)), "an integer number of GB >= 1, or null"),
    ("hydra.launcher.signal_delay_s", int_at_least(0), "an integer number of seconds >= 0"),
    ("hydra.launcher.max_num_timeout", int_at_least(0), "an integer >= 0"),
    ("hydra.launcher.array_parallelism", int_at_least(1), "an integer >= 1"),
]

# Groups whose objects are built without models (the drafter's factory too, see ``build_groups``).
MODEL_FREE_GROUPS = ("strategy", "draft_length", "sampling", "system", "logger")
# Groups whose node holds a constructor's arguments (``_target_``), checked by ``check_known_keys``.
CONSTRUCTED_GROUPS = ("pair", "drafter", "strategy", "draft_length", "sampling", "system", "data", "logger")
_ABSENT = object()


def select(cfg: DictConfig, key: str) -> object:
    """The resolved value at a dotted key; a missing mandatory value (???) is a ConfigError."""
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(f"{key} is required and has no value; set it on the command line, e.g. {key}=...") from None


def validate(cfg: DictConfig) -> tuple[dict[str, object], str | None]:
    """Check the config and build its model-free groups (``build_groups``), once; then, unless the job is to be
    skipped, check the pair and the lengths against its context (``check_pair``, ``check_lengths``).

    Returns the built objects and, if the job should be skipped, a one-line reason; raises ``ConfigError`` for an
    invalid config. Loads no model: at most config files, the tokenizer and the prompts.
    """
    check_interpolations(cfg)
    check_known_keys(cfg)
    check_rules(cfg, RULES)
    check_device_and_dtype(select(cfg, "device"), select(cfg, "dtype"))
    check_prompt_sources(cfg)
    objects = build_groups(cfg)
    check_system(cfg, objects)
    reason = skip_reason(objects["strategy"], objects["sampling"])
    if reason is None:
        check_lengths(cfg, objects["draft_length"].max_k, check_pair(cfg))
    return objects, reason


def check_interpolations(cfg: DictConfig) -> None:
    """Every ``${...}`` resolves (a key or an environment variable that does not exist is OmegaConf's traceback
    otherwise, wherever the value is first read), naming the key that holds it."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as err:
        reason = str(err).splitlines()[0].removeprefix("KeyError raised while resolving interpolation: ")
        raise ConfigError(f"{err.full_key}: cannot resolve its value: {reason}") from None


def check_rules(cfg: DictConfig, rules: list[tuple[str, Callable[[object], bool], str]]) -> None:
    for key, rule, allowed in rules:
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            continue
        value = select(cfg, key)
        if not rule(value):
            raise ConfigError(f"{key}={value!r} is not allowed: must be {allowed}")


@functools.cache
def run_keys() -> frozenset[str]:
    """The top-level keys a composed run may hold: those configs/run.yaml declares, its config groups, hydra."""
    primary = OmegaConf.load(CONFIGS / "run.yaml")
    groups = [group for entry in primary.defaults if OmegaConf.is_dict(entry) for group in entry]
    return frozenset([*(key for key in primary if key != "defaults"), *groups])


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse a key nothing in the run reads, e.g. ``+max_new_token=8`` (a typo, which Hydra adds silently),
    naming the nearest known key."""
    for key in cfg:
        if key not in run_keys():
            raise ConfigError(unknown_key(key, cfg, sorted(run_keys()), "a key the run reads (configs/run.yaml)"))
    for group in CONSTRUCTED_GROUPS:
        parameters = constructor_parameters(cfg, group)
        if parameters is None:
            continue
        unknown = [key for key in cfg[group] if not key.startswith("_") and key not in parameters]
        if unknown:
            reader = f"a parameter of {cfg[group]._target_}"
            raise ConfigError(unknown_key(unknown[0], cfg, parameters, reader, group))


def unknown_key(key: str, cfg: DictConfig, known: list[str], reader: str, group: str | None = None) -> str:
    """'max_new_token=8 is not a key the run reads (configs/run.yaml); did you mean max_new_tokens?'"""
    prefix = f"{group}." if group else ""
    nearest = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {prefix}{nearest[0]}?" if nearest else f"known: {', '.join(known) or 'none'}"
    return f"{prefix}{key}={OmegaConf.select(cfg, prefix + key, default=None)!r} is not {reader}; {hint}"


def constructor_parameters(cfg: DictConfig, group: str) -> list[str] | None:
    """The parameter names the group's ``_target_`` takes, or None where it takes any (``**options``: its own
    check, e.g. a drafter's ``check_options``, names what it takes)."""
    constructor = build(cfg, group, lambda: instantiate(cfg[group], _partial_=True)).func  # looked up, not called
    parameters = inspect.signature(constructor).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters]


def check_system(cfg: DictConfig, objects: dict) -> None:
    """A transformers system (``system=hf_generate|hf_assisted``) decodes one prompt per call, and assisted
    generation drafts with the pair's draft model, k tokens at a time, by its own rule (speculative sampling, greedy
    matching at temperature 0): the settings that would mean something else are refused in one line."""
    system = objects["system"]
    if not system.is_transformers:
        return
    prefix = f"system={system.name}"
    if cfg.batch_size != 1:
        raise ConfigError(f"{prefix} decodes one prompt per call (transformers' assisted generation refuses batches): "
                          f"batch_size must be 1, got {cfg.batch_size}")
    if system.name != "hf_assisted":
        return
    drafter = objects["drafter_factory"].func.__self__
    if drafter is not specdec.ModelDrafter:
        raise ConfigError(f"{prefix} drafts with the pair's draft model: drafter must be model, got "
                          f"drafter._target_={cfg.drafter._target_!r}")
    strategy = objects["strategy"]
    if not (isinstance(strategy, specdec.Greedy) or (isinstance(strategy, specdec.Speculative) and strategy.lossless)):
        raise ConfigError(f"{prefix} judges drafts by transformers' own rule (speculative sampling; greedy matching at "
                          f"temperature 0): strategy must be speculative (lenience 1) or greedy, got "
                          f"strategy={strategy.name}")
    if system.assistant == "same_algorithm" and not isinstance(objects["draft_length"], specdec.FixedLength):
        raise ConfigError(f"{prefix} with system.assistant=same_algorithm drafts a constant k: draft_length must be "
                          f"fixed, got draft_length={objects['draft_length'].name}")


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

    "drafter_factory" is the drafter's factory (``Drafter.from_pair`` with the config's options), its options
    checked now with the run's ``compile`` switch; "drafter" the drafter built from it when it reads nothing of
    the pair (n-gram, or a custom drafter that does not declare ``needs_pair``), else None: the runner calls
    ``drafter_factory(pair, compile=...)`` once the pair is loaded. "drafter_name" is the drafter's ``name``.
    """
    objects = {group: build(cfg, group, lambda group=group: instantiate(cfg[group])) for group in MODEL_FREE_GROUPS}
    factory = drafter_factory(cfg)
    drafter = factory.func.__self__
    build(cfg, "drafter", lambda: drafter.check_options(compile=cfg.compile, forward=cfg.forward, **factory.keywords))
    objects["drafter_factory"] = factory
    objects["drafter"] = None if drafter.needs_pair else build_without_pair(cfg, factory)
    objects["drafter_name"] = str(objects["drafter"].name if objects["drafter"] is not None else drafter.name)
    return objects


def drafter_factory(cfg: DictConfig) -> functools.partial:
    """The drafter's factory, ``from_pair`` with the config's options, whether ``drafter._target_`` names the
    factory (``specdec.ModelDrafter.from_pair``, as the shipped options do) or a drafter class itself (a custom
    ``my_parts.EchoDrafter``)."""
    factory = build(cfg, "drafter", lambda: instantiate(cfg.drafter, _convert_="all"))
    if isinstance(factory, functools.partial) and isinstance(factory.func, type) and issubclass(factory.func,
                                                                                               specdec.Drafter):
        return functools.partial(factory.func.from_pair, *factory.args, **factory.keywords)
    drafter_class(cfg, factory)
    return factory


def drafter_class(cfg: DictConfig, factory: object) -> type:
    """The drafter class whose factory the config names, e.g. ``_target_: specdec.ModelDrafter.from_pair`` with
    ``_partial_: true``."""
    method = factory.func if isinstance(factory, functools.partial) else None
    owner = method.__self__ if inspect.ismethod(method) else None
    if not (isinstance(owner, type) and issubclass(owner, specdec.Drafter)):
        raise ConfigError(f"drafter._target_={cfg.drafter._target_!r} is not allowed: must be a drafter class (a "
                          f"subclass of specdec.Drafter) or its factory, with _partial_: true, e.g. "
                          f"specdec.ModelDrafter.from_pair")
    return owner


def build_without_pair(cfg: DictConfig, factory: functools.partial) -> object:
    """A drafter that declares it reads nothing of the pair (``needs_pair`` False), built before any model loads
    with ``pair=None``. One that reads the pair all the same says so in one line."""
    drafter = factory.func.__self__
    try:
        return build(cfg, "drafter", lambda: factory(None, compile=cfg.compile, forward=cfg.forward))
    except AttributeError as err:
        raise ConfigError(f"drafter._target_={cfg.drafter._target_!r}: {drafter.__name__} was built without a model "
                          f"pair, as it declares needs_pair = False, and read one ({one_line(err)}); a drafter that "
                          f"reads the pair declares needs_pair = True and is built from it once it is loaded") from None


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


def check_pair(cfg: DictConfig) -> PairPlan:
    """The pair's arguments checked, and its tokenizers and context read, without loading its weights; a pair whose
    tokenizers differ (``pair.cross_tokenizer=true``) needs the drafter that drafts across them."""
    options = {key: value for key, value in OmegaConf.to_container(cfg.pair, resolve=True).items()
               if not key.startswith("_")}
    unreachable = hub_unreachable() if hub_sources(options) else None
    try:
        plan = plan_pair(**options)
    except ModelUnavailableError as err:
        if unreachable:
            raise ConfigError(offline_message(options, unreachable)) from None
        raise ConfigError(explain("pair", cfg.pair, err)) from None
    except (ValueError, TypeError) as err:
        raise ConfigError(explain("pair", cfg.pair, err)) from None
    check_draft_model(cfg, plan)
    if not plan.shares_tokenizer:
        drafter = drafter_factory(cfg).func.__self__
        if not issubclass(drafter, specdec.CrossTokenizerDrafter):
            raise ConfigError(f"pair.cross_tokenizer=true: the pair's tokenizers differ ({len(plan.draft_tokenizer)} "
                              f"vs {len(plan.tokenizer)} tokens), and only drafter=cross_tokenizer drafts across "
                              f"them; got drafter._target_={cfg.drafter._target_!r}")
    return plan


def check_draft_model(cfg: DictConfig, plan: PairPlan) -> None:
    """A pair of a target alone (``pair.target=DIR``) has no draft model: a drafter that drafts with one is
    refused, naming the two ways out."""
    if plan.spec is None or plan.spec.draft is not None:
        return
    factory = drafter_factory(cfg)
    if factory.func.__self__.reads_draft_model(**factory.keywords):
        raise ConfigError(f"pair.target={plan.spec.target!r} alone is a target without a draft model, and "
                          f"drafter._target_={cfg.drafter._target_!r} drafts with one: give the draft too "
                          f"(pair.draft=DIR), or choose a drafter that reads the target alone (drafter=eagle, "
                          f"medusa, early_exit or ngram)")


def hub_sources(options: dict) -> list[str]:
    """The pair's models and tokenizers that would come from the Hugging Face hub: every source that is no local
    directory (none for the embedded and the ``*-shaped`` pairs)."""
    try:
        spec = resolve_pair_ids(options.get("preset"), options.get("draft"), options.get("target"))
    except (ValueError, TypeError, ModelUnavailableError):
        return []  # a shaped preset's (it reads no source), or a problem plan_pair names
    sources = [spec.draft, spec.target, options.get("draft_tokenizer") or spec.draft_tokenizer,
               options.get("target_tokenizer") or spec.target_tokenizer]
    return [source for source in sources if isinstance(source, str) and not Path(source).expanduser().is_dir()]


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached, found once per process by one connection of at most
    ``HUB_PROBE_SECONDS``; None where it can be, or where offline mode is on already. Unreachable, the process
    goes offline (``HF_HUB_OFFLINE``): every later load reads the local cache alone, at once, where each file
    would otherwise cost its retries (about 30 s)."""
    import huggingface_hub.constants as hub

    if hub.HF_HUB_OFFLINE:
        return None
    address = urlparse(hub.ENDPOINT)
    port = address.port or (443 if address.scheme == "https" else 80)
    try:
        socket.create_connection((address.hostname, port), timeout=HUB_PROBE_SECONDS).close()
    except OSError as err:
        hub.HF_HUB_OFFLINE = True
        os.environ["HF_HUB_OFFLINE"] = "1"
        why = (f"no answer in {HUB_PROBE_SECONDS:g} s" if isinstance(err, TimeoutError)
               else one_line(err.strerror or err))
        return f"{address.hostname}:{port}: {why}"
    return None


def offline_message(options: dict, unreachable: str) -> str:
    """One line for a pair that needs the hub while it cannot be reached."""
    given = [f"pair.{role}={options[role]!r}" for role in ("draft", "target") if options.get(role) is not None]
    named = " ".join(given) or f"pair={options.get('preset')}"
    return (f"{named}: the Hugging Face hub cannot be reached ({unreachable}) and the pair is not in the local "
            f"cache; pairs that load offline: {', '.join(OFFLINE_PAIRS)}")


def check_lengths(cfg: DictConfig, max_k: int, plan: PairPlan) -> None:
    """``max_new_tokens``, the longest draft (``max_k``) and every prompt (tokenized as the runner will) within
    the pair's context: a prompt of n tokens leaves room for context - n new ones, and needs at least one."""
    limit = plan.context_limit
    if limit is None:
        return
    if cfg.max_new_tokens >= limit:
        raise ConfigError(f"max_new_tokens={cfg.max_new_tokens} is not allowed: the pair attends over {limit} "
                          f"positions, so at most {limit - 1} tokens follow a one-token prompt")
    if max_k >= limit:
        raise ConfigError(f"draft_length: drafts of up to {max_k} tokens do not fit the pair's context of {limit} "
                          f"positions; the longest draft must be below {limit}")
    prompts = read_prompts(cfg)
    lengths = [len(plan.tokenizer(prompt.text).input_ids) for prompt in prompts]
    too_long = [(prompt.id, length) for prompt, length in zip(prompts, lengths) if length >= limit]
    if too_long:
        (first, length), others = too_long[0], len(too_long) - 1
        more = f" (and {others} more)" if others else ""
        raise ConfigError(f"{data_label(cfg)}: prompt {first} has {length} tokens{more}, at or beyond "
                          f"the pair's context of {limit} positions; prompts must be shorter than {limit} tokens")


def read_prompts(cfg: DictConfig) -> list[Prompt]:
    """The run's prompts (``data`` group), a reading error as one line naming the source."""
    try:
        return instantiate(cfg.data)
    except InstantiationException as err:
        raise ConfigError(f"{data_label(cfg)}: {one_line(err.__cause__ or err)}") from None


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


def data_name(cfg: DictConfig) -> str:
    """The run's prompt set as rows name it (the ``data`` column): a set's source, or a suite's name."""
    return cfg.data.source if "source" in cfg.data else cfg.data.name


def data_label(cfg: DictConfig) -> str:
    """The key and value that name the run's prompts, for a one-line error: data.source='...' or data.name='...'."""
    key = "source" if "source" in cfg.data else "name"
    return f"data.{key}={cfg.data[key]!r}"


def check_prompt_sources(cfg: DictConfig) -> None:
    """The prompt set (``data.source``), or each set of a suite (``data.sets``), exists: checked without reading."""
    if "sets" not in cfg.data:
        check_prompt_source(select(cfg, "data.source"))
        return
    sets = select(cfg, "data.sets")
    if not OmegaConf.is_list(sets) or not sets:
        raise ConfigError(f"data.sets={sets!r} is not allowed: must be a non-empty list of prompt sets")
    for source in sets:
        check_prompt_source(source, "data.sets")


def check_prompt_source(source: object, key: str = "data.source") -> None:
    """A shipped prompt set name, or an existing .jsonl / .txt file (checked without reading it)."""
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{key}={source!r} is not allowed: must be a shipped prompt set name or a file path")
    try:
        resolve_source(source)
    except (ValueError, OSError) as err:
        raise ConfigError(f"{key}={source!r}: {one_line(err)}") from None


class CheckLaunch(Callback):
    """The Hydra keys, checked before Hydra makes any directory or starts any job (configs/hydra/default.yaml):
    a run or sweep directory must be a path (an empty one writes into the launch directory), and the launcher's
    sizes and time limits must be usable. A problem is one line and exit 2."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        exit_on_config_error(lambda: check_directory(config, "hydra.run.dir"))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        exit_on_config_error(lambda: check_sweep(config))
        exit_on_config_error(lambda: check_sweep_jobs(config))


def exit_on_config_error(check: Callable[[], None]) -> None:
    try:
        check()
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)


def check_directory(cfg: DictConfig, key: str) -> None:
    value = select(cfg, key)
    if not is_text(value):
        raise ConfigError(f"{key}={value!r} is not allowed: must be a directory path (an empty one would write into "
                          f"the launch directory)")


def check_sweep(cfg: DictConfig) -> None:
    check_directory(cfg, "hydra.sweep.dir")
    check_rules(cfg, LAUNCHER_RULES)
    timeout_min = OmegaConf.select(cfg, "hydra.launcher.timeout_min")
    signal_delay_s = OmegaConf.select(cfg, "hydra.launcher.signal_delay_s")
    if timeout_min is not None and signal_delay_s is not None and signal_delay_s >= 60 * timeout_min:
        raise ConfigError(f"hydra.launcher.signal_delay_s={signal_delay_s} is not allowed: the signal must come "
                          f"before the time limit (hydra.launcher.timeout_min={timeout_min} minutes), or every "
                          f"job is requeued as it starts")


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The overrides of each job the basic sweeper will launch, in its order: its ``hydra.sweeper.params``, then the
    command line's, crossed (``BasicSweeper.split_arguments``). Another sweeper (one that chooses its jobs as it
    goes) gives none."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith("BasicSweeper"):
        return []
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    [jobs] = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return jobs


def runs_elsewhere(config: DictConfig) -> bool:
    """Whether the sweep's jobs run on other machines (SLURM), whose devices this one cannot see."""
    return "slurm" in str(OmegaConf.select(config, "hydra.launcher._target_", default="")).lower()


def check_sweep_jobs(config: DictConfig) -> None:
    """Every job of a sweep composed and checked (``validate``: keys, values, parts, the pair without its weights,
    the prompts) before any job is launched: a setting that fails stops the sweep in one line, which says whether
    every job fails so or names the first job that does; a sweep whose every job would be skipped stops too. Jobs
    sent to other machines (SLURM) are not checked for a device this machine lacks."""
    from hydra.core.global_hydra import GlobalHydra

    jobs = sweep_jobs(config)
    loader = GlobalHydra.instance().config_loader()
    failures, skipped = [], []
    for number, overrides in enumerate(jobs):
        job = loader.load_sweep_config(master_config=config, sweep_overrides=list(overrides))
        with open_dict(job):
            del job["hydra"]
            if runs_elsewhere(config) and job.device in ("cuda", "mps"):
                job.device = "auto"  # present on the machine the job runs on, or refused there in one line
        try:
            skipped.append(validate(job)[1])
        except ConfigError as err:
            failures.append((number, overrides, str(err)))
    if failures:
        messages = {message for _, _, message in failures}
        if len(failures) == len(jobs) and len(messages) == 1:
            raise ConfigError(f"{messages.pop()} (every one of the sweep's {len(jobs)} jobs; none was launched)")
        number, overrides, message = failures[0]
        raise ConfigError(f"job {number} ({' '.join(varying(jobs, overrides))}): {message} ({len(failures)} of the "
                          f"sweep's {len(jobs)} jobs fail; none was launched)")
    if jobs and all(skipped):
        raise ConfigError(f"every one of the sweep's {len(jobs)} jobs would be skipped ({skipped[0]}); none was "
                          "launched")


def varying(jobs: list[list[str]], overrides: list[str]) -> list[str]:
    """The overrides of one job that tell it apart from the sweep's other jobs."""
    return [override for override in overrides if any(override not in other for other in jobs)]
