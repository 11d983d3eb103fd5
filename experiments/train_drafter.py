"""Hydra entry point: train a drafter against its target. Configs live in ../configs/train (the pairs are the run
app's, ../configs/pair). Run it as a module from the repository root:

    python -m experiments.train_drafter                                   # an EAGLE head for the embedded target
    python -m experiments.train_drafter drafter=medusa                    # Medusa heads
    python -m experiments.train_drafter drafter=model loss=tv data=on_policy   # distil the pair's draft
    python -m experiments.train_drafter -m loss=kl,rkl,jsd,tv,ce drafter=model  # one run per divergence
    python -m experiments.train_drafter resume=outputs/train/<run>        # continue after a kill (its settings)
    torchrun --nproc-per-node 2 -m experiments.train_drafter ...          # data-parallel (gloo on CPU, nccl on CUDA)

A run directory (outputs/train/<time>/) holds train_config.yaml, log.jsonl (loss per step, tau per evaluation),
tau.png, checkpoint/ (what resume needs), summary.json, and drafter/: the best drafter by simulated tau, which
``drafter=eagle drafter.checkpoint=DIR`` (medusa, model alike) and ``EagleDrafter.from_pretrained(DIR, target)`` load.
Bad settings are refused in one line (exit 2) before any model or data loads.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import hydra
import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments.common.config_checks import ConfigError, one_line
from experiments.common.refusal import refuse as refuse_line
from experiments.common.refusal import refuse_unknown_group_options
from experiments.common.rundir import RunLock
from specdec.checkpoints import target_identity
from specdec.heads import EagleHead, MedusaHeads
from specdec.models import (DTYPES, SHAPED_PRESETS, ModelUnavailableError, load_config, load_pair, plan_pair,
                            resolve_pair_ids)
from specdec.results import config_difference
from specdec.train import corpus as corpus_lib
from specdec.train import data as data_lib
from specdec.train.files import DamagedFile
from specdec.train.loop import (KINDS, Best, Checkpoints, Ranks, SequenceBatches, Settings, TrainingData,
                                TrainingStopped, barrier, build_family, frequent_tokens, heldout_batches,
                                hidden_layers, print_line, start_ranks, train, vocabulary_coverage)
from specdec.train.losses import DIVERGENCES

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRAIN_CONFIGS = CONFIGS / "train"
CONFIG_FILE = "train_config.yaml"
GROUPS = ("pair", "drafter", "loss", "data", "logger")
STARTED = time.time()  # the command's start: max_wall_minutes counts from here
OmegaConf.register_new_resolver("specdec_configs", lambda: str(CONFIGS), replace=True)


@dataclass
class Plan:
    """What the config asks for, checked, as plain objects: nothing here is a DictConfig."""

    settings: Settings
    kind: str
    make_head: object  # a partial of the head's constructor (None for kind "model")
    objective: object  # a partial of the family's loss
    draft_vocab: int | None
    data: data_lib.TargetContinuations | data_lib.FixedText
    pair: dict  # load_pair's arguments
    heldout: dict  # first, count, new_tokens
    hidden: str
    cache_limit_gb: float
    cache_dtype: torch.dtype
    data_dir: Path
    out: Path
    threads: int | None
    logger: object
    config: dict  # the resolved config, as recorded in train_config.yaml
    note: str | None = None  # said once at the start (a resumed run)


@dataclass
class Texts:
    """What the corpus gives, read before any model loads: the training openings and the held-out prompts."""

    openings: list[list[int]]
    heldout_prompts: list[str]
    corpus: corpus_lib.Corpus


def main() -> None:
    """The command line checked before Hydra composes it (Hydra refuses an unknown group option or key in many
    lines), then the run."""
    arguments = with_saved_overrides(sys.argv[1:])
    sys.argv[1:] = arguments
    refuse_unknown_group_options(arguments, TRAIN_CONFIGS)
    try:
        check_override_keys(arguments)
    except ConfigError as err:
        refuse(err)
    train_from_config()


def with_saved_overrides(arguments: list[str]) -> list[str]:
    """``resume=DIR``: DIR's run's own overrides (``.hydra/overrides.yaml``) first, then those typed now, which
    replace a saved one of the same key (a changed setting is then refused, named). Otherwise as typed."""
    resumes = [argument.split("=", 1)[1] for argument in arguments if argument.startswith("resume=")]
    if not resumes or "-m" in arguments or "--multirun" in arguments:
        return arguments
    try:
        previous = yaml.safe_load((Path(resumes[-1]).expanduser() / ".hydra" / "overrides.yaml").read_text("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return arguments
    if not isinstance(previous, list) or not all(isinstance(item, str) for item in previous):
        return arguments
    typed = {override_key(argument) for argument in arguments}
    return [*(item for item in previous if override_key(item) not in typed), *arguments]


def override_key(argument: str) -> str:
    """The key an override sets: ``+data.x=1`` and ``data.x=2`` both set ``data.x``."""
    return argument.split("=", 1)[0].lstrip("+~")


@hydra.main(version_base="1.3", config_path=str(TRAIN_CONFIGS), config_name="train")
def train_from_config(cfg: DictConfig) -> None:
    try:
        plan = check(cfg, Path(HydraConfig.get().runtime.output_dir))
        texts = read_texts(plan)
        with RunLock(plan.out) if int(os.environ.get("RANK", "0")) == 0 else nullcontext():  # rank 0 writes it
            run(plan, texts)
    except ConfigError as err:
        refuse(err)
    except (TrainingStopped, DamagedFile) as err:
        print(f"training stopped: {err}", file=sys.stderr)
        sys.exit(1)


def refuse(err: ConfigError) -> None:
    """The one refusal: one line, exit 2, before any model or data loads."""
    refuse_line(f"config error: {err}")


def top_level_keys() -> list[str]:
    """The keys a composed training config may hold: train.yaml's, its config groups, hydra."""
    primary = OmegaConf.load(TRAIN_CONFIGS / "train.yaml")
    groups = [group for entry in primary.defaults if OmegaConf.is_dict(entry) for group in entry]
    return sorted({*(key for key in primary if key != "defaults"), *groups, "hydra"})


def check_override_keys(arguments: list[str]) -> None:
    """Each ``key=value`` override (not ``+key``, which adds) must name a key of the config its group overrides
    compose: the nearest known key is named (Hydra would say 'not in struct' in many lines)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "-m" in arguments or "--multirun" in arguments:
        return
    try:
        overrides = OverridesParser.create().parse_overrides([a for a in arguments if not a.startswith("-")])
    except Exception:  # noqa: BLE001 - refuse_unknown_group_options names an override Hydra cannot parse
        return
    groups = [o.input_line for o in overrides if o.key_or_group in GROUPS and not o.is_add() and not o.is_delete()]
    with initialize_config_dir(config_dir=str(TRAIN_CONFIGS), version_base="1.3"):
        composed = compose("train", overrides=groups)
    for override in overrides:
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or override.is_delete() or key in GROUPS \
                or key.split(".")[0] == "hydra" or override.package is not None:
            continue
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(composed, parent) if parent else composed
        if not OmegaConf.is_dict(node) or name not in node:
            known = [f"{parent}.{k}" if parent else k for k in (node if OmegaConf.is_dict(node) else [])]
            nearest = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {nearest[0]}?" if nearest else f"known: {', '.join(known) or 'none'}"
            raise ConfigError(f"{key} is not a key of the training config (configs/train/); {hint}")


def check_known_keys(cfg: DictConfig) -> None:
    """A top-level key nothing reads (``+unknown_key=1``, which Hydra adds silently) is refused."""
    known = top_level_keys()
    for key in cfg:
        if key not in known:
            nearest = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {nearest[0]}?" if nearest else f"known: {', '.join(known)}"
            raise ConfigError(f"{key}={cfg[key]!r} is not a key the training app reads (configs/train/train.yaml); "
                              f"{hint}")


# Checks ------------------------------------------------------------------------------------------------------------

def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


RULES = [  # (key, rule, what is allowed)
    ("steps", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("batch_size", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("lr", lambda v: is_number(v) and v > 0, "a number > 0"),
    ("warmup", lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    ("min_lr", lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    ("weight_decay", lambda v: is_number(v) and v >= 0, "a number >= 0"),
    ("grad_clip", lambda v: is_number(v) and v >= 0, "a number >= 0 (0: no clipping)"),
    ("eval_every", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("checkpoint_every", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("max_minutes", lambda v: v is None or (is_number(v) and v > 0), "null or a number of minutes > 0"),
    ("max_wall_minutes", lambda v: v is None or (is_number(v) and v > 0), "null or a number of minutes > 0"),
    ("heldout.first", lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    ("heldout.count", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("heldout.new_tokens", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("heldout.k", lambda v: is_int(v) and 1 <= v <= 16, "an integer in [1, 16]"),
    ("heldout.batch_size", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    ("hidden", lambda v: v in data_lib.HIDDEN_MODES, f"one of {', '.join(data_lib.HIDDEN_MODES)}"),
    ("cache_limit_gb", lambda v: is_number(v) and v > 0, "a number of GB > 0"),
    ("cache_dtype", lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}"),
    ("save_dtype", lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}"),
    ("data_dir", lambda v: isinstance(v, str) and v.strip() != "", "a directory path"),
    ("seed", lambda v: is_int(v) and 0 <= v < 2**63, "an integer in [0, 2**63 - 1]"),
    ("threads", lambda v: v is None or (is_int(v) and v >= 1), "null or an integer >= 1"),
    ("loss.divergence", lambda v: v in DIVERGENCES, f"one of {', '.join(DIVERGENCES)}"),
    ("drafter.kind", lambda v: v in KINDS, f"one of {', '.join(KINDS)}"),
    ("drafter.draft_vocab", lambda v: v is None or (is_int(v) and v >= 1), "null or an integer >= 1"),
]


def check(cfg: DictConfig, run_dir: Path) -> Plan:
    """Every key checked, the groups built (their constructors check their own arguments) and the pair planned
    without its weights; any problem is one ConfigError line naming the key."""
    check_known_keys(cfg)
    for key, rule, allowed in RULES:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        if not rule(value):
            raise ConfigError(f"{key}={value!r} is not allowed: must be {allowed}")
    if cfg.heldout.k >= cfg.heldout.new_tokens:
        raise ConfigError(f"heldout.k={cfg.heldout.k} is not allowed with heldout.new_tokens="
                          f"{cfg.heldout.new_tokens}: a draft of k tokens is measured within the continuation, so "
                          f"k < new_tokens")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size={cfg.batch_size} is not allowed: must be a multiple of the {world} ranks")
    kind = cfg.drafter.kind
    make_head = build_group(cfg, "drafter.head") if kind != "model" else None
    check_head(cfg, kind)
    objective = build_group(cfg, "drafter.objective")
    data = build_group(cfg, "data")
    if isinstance(data, data_lib.DraftSamples) and kind != "model":
        raise ConfigError(f"data=on_policy is the draft's own samples, for drafter=model; drafter={kind} learns "
                          f"from the target's data (data=greedy, sampled or text)")
    pair = OmegaConf.to_container(cfg.pair, resolve=True)
    pair.pop("_target_", None)
    try:
        pair_plan = plan_pair(**pair)
    except (ValueError, TypeError, OSError, ModelUnavailableError) as err:
        raise ConfigError(f"pair: {one_line(err)}") from None
    check_against_target(cfg, kind, make_head, data, pair, pair_plan.context_limit)
    check_objective(objective)
    logger = build_group(cfg, "logger")
    config = OmegaConf.to_container(cfg, resolve=True)
    out, note = output_directory(cfg.resume, run_dir, config)
    settings = Settings(steps=cfg.steps, batch_size=cfg.batch_size, lr=float(cfg.lr), divergence=cfg.loss.divergence,
                        warmup=float(cfg.warmup), min_lr=float(cfg.min_lr), weight_decay=float(cfg.weight_decay),
                        grad_clip=float(cfg.grad_clip), eval_every=cfg.eval_every,
                        checkpoint_every=cfg.checkpoint_every, k=cfg.heldout.k,
                        eval_batch_size=cfg.heldout.batch_size, max_minutes=cfg.max_minutes, seed=cfg.seed,
                        wall_deadline=None if cfg.max_wall_minutes is None else STARTED + 60 * cfg.max_wall_minutes,
                        save_dtype=DTYPES[cfg.save_dtype])
    return Plan(settings, kind, make_head, objective, cfg.drafter.draft_vocab, data, pair,
                dict(first=cfg.heldout.first, count=cfg.heldout.count, new_tokens=cfg.heldout.new_tokens),
                cfg.hidden, float(cfg.cache_limit_gb), DTYPES[cfg.cache_dtype], Path(cfg.data_dir), out, cfg.threads,
                logger, config, note)


def build_group(cfg: DictConfig, key: str):
    """Instantiate the node at ``key`` (a partial stays a partial); its constructor's error as one line."""
    node = OmegaConf.select(cfg, key)
    try:
        built = instantiate(node)
    except Exception as err:  # noqa: BLE001 - hydra wraps the constructor's error
        cause = err.__cause__ or err
        raise ConfigError(f"{key}: {one_line(cause)}") from None
    if isinstance(built, partial):
        check_partial(key, built)
    return built


def check_partial(key: str, built: partial) -> None:
    """A partial's keywords must be parameters its function takes (the function checks their values)."""
    import inspect

    parameters = inspect.signature(built.func).parameters
    unknown = sorted(set(built.keywords) - set(parameters))
    if unknown:
        raise ConfigError(f"{key}: {built.func.__qualname__} takes no {', '.join(unknown)}; it takes "
                          f"{', '.join(parameters)}")


def check_head(cfg: DictConfig, kind: str) -> None:
    """What the head's constructor can only check once the target is loaded."""
    head = cfg.drafter.head
    if kind == "model":
        if cfg.drafter.draft_vocab is not None:
            raise ConfigError(f"drafter.draft_vocab={cfg.drafter.draft_vocab} is for EAGLE and Medusa heads; "
                              f"drafter=model drafts from the whole vocabulary")
        return
    family = {"eagle": EagleHead, "medusa": MedusaHeads}[kind]
    built = get_class(str(head._target_)) if "_target_" in head else None
    if not (isinstance(built, type) and issubclass(built, family)):
        raise ConfigError(f"drafter.head._target_={head.get('_target_')!r} is not allowed: drafter.kind={kind} "
                          f"trains a specdec.heads.{family.__name__}")
    if kind == "eagle":
        layers = head.feature_layers
        if not OmegaConf.is_list(layers) or not layers or not all(is_int(v) for v in layers):
            raise ConfigError(f"drafter.head.feature_layers={layers!r} is not allowed: must be a non-empty list of "
                              f"hidden-state indices")
        if head.width is not None and not (is_int(head.width) and head.width >= 1):
            raise ConfigError(f"drafter.head.width={head.width!r} is not allowed: must be null or an integer >= 1")
        if head.init_from_last_layer and head.width is not None:
            raise ConfigError("drafter.head.init_from_last_layer=true needs the head at the target's width "
                              f"(drafter.head.width=null), got width={head.width}")
        passes = cfg.drafter.objective.get("passes", 1)
        if not (is_int(passes) and 1 <= passes <= 16):
            raise ConfigError(f"drafter.objective.passes={passes!r} is not allowed: must be an integer in [1, 16]")
    if kind == "medusa":
        heads = head.num_heads
        if not (is_int(heads) and heads >= 1):
            raise ConfigError(f"drafter.head.num_heads={heads!r} is not allowed: must be an integer >= 1")
        if cfg.heldout.k > heads:
            raise ConfigError(f"heldout.k={cfg.heldout.k} is not allowed with {heads} Medusa heads: head i drafts "
                              f"token i + 1, so k <= drafter.head.num_heads")


def check_against_target(cfg: DictConfig, kind: str, make_head, data, pair: dict, context_limit: int | None) -> None:
    """What needs the target's shape, checked on its config alone (a model on the meta device, no weights): the
    head built as training builds it, the layers it reads, the draft vocabulary and the lengths."""
    config = target_config(pair)
    vocabulary = config.vocab_size
    draft_vocab = cfg.drafter.draft_vocab
    if draft_vocab is not None and draft_vocab > vocabulary:
        raise ConfigError(f"drafter.draft_vocab={draft_vocab} is not allowed: the target's vocabulary holds "
                          f"{vocabulary} tokens")
    longest = {"data": data.width, "heldout": corpus_lib.PROMPT_TOKENS[1] + cfg.heldout.new_tokens}
    for key, length in longest.items():
        if context_limit is not None and length > context_limit:
            raise ConfigError(f"{key}: sequences of up to {length} tokens are not allowed: the pair attends over "
                              f"{context_limit} positions (shorten {key}'s new_tokens or prompt lengths)")
    if kind == "model":
        return
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(config)
    try:
        head = make_head(target, draft_ids=list(range(draft_vocab))) if draft_vocab is not None else make_head(target)
        hidden_layers(target, getattr(head, "feature_layers", ()))
    except (ValueError, TypeError, RuntimeError, AssertionError) as err:
        raise ConfigError(f"drafter.head: {one_line(err)}") from None


def target_config(pair: dict):
    """The target's transformers config, read without its weights."""
    preset = pair.get("preset")
    if pair.get("target") is None and preset in SHAPED_PRESETS:
        from transformers import GPT2Config

        from specdec.models import GPT2_SHAPES

        return GPT2Config(**GPT2_SHAPES[SHAPED_PRESETS[preset][1]])
    return load_config(resolve_pair_ids(preset, pair.get("draft"), pair.get("target")).target)


def check_objective(objective: partial) -> None:
    """The loss's weights: finite numbers >= 0 (a NaN or negative weight trains toward nothing useful)."""
    for name in ("feature_weight", "token_weight", "pass_decay"):
        if name in objective.keywords:
            value = objective.keywords[name]
            if not (is_number(value) and value >= 0):
                raise ConfigError(f"drafter.objective.{name}={value!r} is not allowed: must be a finite number >= 0")


def read_texts(plan: Plan) -> Texts:
    """The corpus, split, its training openings and held-out prompts, with the pair's tokenizer (no weights): a
    corpus too small for the data asked is refused here."""
    tokenizer = plan_pair(**plan.pair).tokenizer
    try:
        corpus = plan.data.read_corpus()
        openings = plan.data.openings(corpus, tokenizer)
        prompts = plan.data.heldout_texts(corpus, tokenizer, plan.heldout["first"], plan.heldout["count"])
    except (ValueError, OSError) as err:
        raise ConfigError(f"data: {one_line(err)}") from None
    return Texts(openings, prompts, corpus)


def output_directory(resume: object, run_dir: Path, config: dict) -> tuple[Path, str | None]:
    """The run's own directory, or the one ``resume`` names (a directory, or true: the newest unfinished run
    with this config under the run directory's parent), which must hold a run of the same config."""
    if resume is None or resume is False:
        return run_dir, None
    if resume is True:
        found = unfinished_runs(run_dir.parent, config, exclude=run_dir)
        if not found:
            return run_dir, f"resume=true: no unfinished run with this config under {run_dir.parent}; starting anew"
        return found[-1], f"resuming {found[-1]}"
    directory = Path(str(resume)).expanduser()
    if not (directory / CONFIG_FILE).is_file():
        raise ConfigError(f"resume={resume!r} is not allowed: not a training run directory (no {CONFIG_FILE})")
    difference = config_difference(saved_config(directory), config)
    if difference:
        raise ConfigError(f"resume={resume!r}: that run has another config ({difference}); resume with its settings")
    return directory, f"resuming {directory}"


def same_config(directory: Path, config: dict) -> bool:
    try:
        return config_difference(saved_config(directory), config) is None
    except ConfigError:  # a damaged run directory is not one to continue
        return False


def saved_config(directory: Path) -> dict:
    """The config a run directory's train_config.yaml holds; a damaged one is named."""
    path = directory / CONFIG_FILE
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        saved = err
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} is damaged (not a config): resume another run, or delete {directory} to drop "
                          f"this one")
    return saved


def unfinished_runs(root: Path, config: dict, exclude: Path) -> list[Path]:
    """Run directories under ``root`` with this config and no summary.json, oldest change first."""
    found = [path.parent for path in root.glob(f"*/{CONFIG_FILE}")
             if path.parent.resolve() != exclude.resolve() and not (path.parent / "summary.json").exists()
             and same_config(path.parent, config)]
    return sorted(found, key=lambda path: (path / CONFIG_FILE).stat().st_mtime)


# The run -----------------------------------------------------------------------------------------------------------

def run(plan: Plan, texts: Texts) -> None:
    """Load the pair, write (or reuse) the data, train from the last checkpoint, write the summary."""
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    device_name = plan.pair.get("device", "auto")
    ranks = start_ranks(torch.device("cuda") if device_name in ("auto", "cuda") and torch.cuda.is_available()
                        else torch.device("cpu"))
    if torch.cuda.is_available() and ranks.world > 1:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", ranks.rank)))
    say = print_line if ranks.main else (lambda text: None)
    if plan.note:
        say(plan.note)
    plan.out.mkdir(parents=True, exist_ok=True)
    if ranks.main and not (plan.out / CONFIG_FILE).is_file():
        (plan.out / CONFIG_FILE).write_text(yaml.safe_dump(plan.config, sort_keys=False), encoding="utf-8")
    torch.manual_seed(plan.settings.seed)
    pair = load_pair(**plan.pair)
    target = pair.target
    say(f"target: {target_identity(target).describe()}; training drafter={plan.kind} with "
        f"loss={plan.settings.divergence} into {plan.out}")
    directory, sequences = write_data(plan, pair, texts, ranks, say)
    draft_ids, coverage, heldout_coverage = None, None, None  # the held-out coverage is measured on the main rank
    if plan.draft_vocab is not None:
        draft_ids, coverage = frequent_tokens(sequences, plan.draft_vocab)
        say(f"draft vocabulary: the {len(draft_ids)} most frequent tokens, {coverage:.1%} of the trained-on tokens")
    torch.manual_seed(plan.settings.seed)
    family = build_family(plan.kind, plan.make_head, plan.objective, pair, draft_ids)
    parameters = sum(parameter.numel() for parameter in family.module.parameters())
    say(f"{plan.kind}: {parameters / 1e6:.2f} M trained parameters, {len(sequences)} sequences, "
        f"{int(sequences.counts.sum())} trained-on positions")
    hidden = hidden_states(plan, family, target, directory, sequences, ranks, say)
    heldout = []
    if ranks.main:
        heldout_sequences = data_lib.heldout_set(plan.data_dir / "heldout", texts.heldout_prompts, pair.tokenizer,
                                                 target, plan.heldout["new_tokens"])
        heldout = heldout_batches(heldout_sequences, family, target, next(target.parameters()).device,
                                  plan.settings.eval_batch_size)
        if draft_ids is not None:
            heldout_coverage = vocabulary_coverage(draft_ids, heldout_sequences)
            say(f"draft vocabulary: {heldout_coverage:.1%} of the held-out tokens (the target's greedy ones) are "
                f"inside it, a ceiling on a_1")
    barrier(ranks)
    info = {"data": {"kind": type(plan.data).__name__, **asdict(plan.data)}, "loss": plan.settings.divergence,
            "steps": plan.settings.steps, "batch_size": plan.settings.batch_size, "lr": plan.settings.lr,
            "draft_vocab": plan.draft_vocab, "draft_vocab_coverage": None if draft_ids is None else
            {"trained_on": coverage, "heldout": heldout_coverage}, "hidden_states": hidden.reason,
            "config": {"drafter": plan.config["drafter"]}}
    if ranks.main:
        plan.logger.start(run_id(plan.out), plan.out.name, plan.out.name, plan.config, plan.out)
    start = (Checkpoints(plan.out / "checkpoint").steps() or [0])[-1]
    bar = tqdm(total=plan.settings.steps, initial=start, disable=not ranks.main, dynamic_ncols=True,
               desc=f"train {plan.kind}")

    def progress(step: int, loss: float, best: Best) -> None:
        bar.update(step - bar.n)
        walked = "-" if best.walked_tau is None else f"{best.walked_tau:.3f}"
        bar.set_postfix(loss=f"{loss:.4f}", tau=f"{best.tau:.3f}" if best.tau > 0 else "-", loop_tau=walked,
                        refresh=False)

    try:
        batches = SequenceBatches(TrainingData(sequences, hidden.values), family, target, plan.settings, ranks)
        outcome = train(plan.settings, family, target, batches, plan.out, heldout=heldout, ranks=ranks,
                        logger=plan.logger, training_info=info, progress_of=progress)
    finally:
        bar.close()
    if ranks.main:
        write_summary(plan, outcome, parameters)
    barrier(ranks)


def write_data(plan: Plan, pair, texts: Texts, ranks: Ranks, say) -> tuple[Path, data_lib.Sequences]:
    """The spec's sequences: shards on disk, this rank's missing ones written first."""
    writers = {"target": pair.target, "draft": pair.draft}
    models = {"target": pair.target} if plan.data.writer != "draft" else writers
    directory = data_lib.data_directory(plan.data_dir, plan.data, texts.corpus, models, pair.tokenizer)
    openings = texts.openings
    bar = tqdm(desc="data sequences", unit="seq", disable=not ranks.main, dynamic_ncols=True)
    data_lib.write_sequences(directory, plan.data, openings, pair.tokenizer, writers, ranks.rank, ranks.world,
                             progress_of(bar))
    bar.close()
    barrier(ranks)
    say(f"data: {directory} ({len(openings)} sequences)")
    vocabulary = pair.target.get_input_embeddings().weight.shape[0]
    return directory, data_lib.read_sequences(directory, len(openings), plan.data.shard_size, plan.data.width,
                                              vocabulary)


def progress_of(bar: tqdm):
    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        bar.refresh()
    return progress


@dataclass
class Hidden:
    values: torch.Tensor | None  # [N, W, H, D] cached, or None: computed per batch
    reason: str


def hidden_states(plan: Plan, family, target, directory: Path, sequences: data_lib.Sequences, ranks: Ranks,
                  say) -> Hidden:
    """The target's hidden states at the family's layers: cached on disk (and read into memory) or computed per
    batch, as ``choose_hidden`` decides; the decision and its reason go to the log."""
    reads = plan.settings.steps * plan.settings.batch_size / len(sequences)
    width = sequences.tokens.shape[1]
    hidden_size = target.get_input_embeddings().weight.shape[1]
    choice = data_lib.choose_hidden(plan.hidden, len(sequences), width, len(family.layers), hidden_size, reads,
                                    plan.cache_limit_gb, torch.finfo(plan.cache_dtype).bits // 8)
    say(f"hidden states: {choice.reason}")
    if not choice.cache:
        return Hidden(None, choice.reason)
    cache = data_lib.hidden_directory(directory, family.layers, plan.cache_dtype)
    bar = tqdm(desc="hidden-state shards", disable=not ranks.main, dynamic_ncols=True)
    data_lib.write_hidden(cache, sequences, plan.data.shard_size, target, family.layers, plan.cache_dtype,
                          ranks.rank, ranks.world, progress=progress_of(bar))
    bar.close()
    barrier(ranks)
    return Hidden(data_lib.read_hidden(cache, sequences, plan.data.shard_size, len(family.layers), hidden_size),
                  choice.reason)


def run_id(out: Path) -> str:
    """One W&B id per run directory, so a resumed run continues its W&B run."""
    return hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]


def write_summary(plan: Plan, outcome, parameters: int) -> None:
    """summary.json (a run with one is finished), and the result in two lines."""
    best = outcome.best
    summary = {"drafter": plan.kind, "loss": plan.settings.divergence, "parameters": parameters,
               "steps": outcome.steps, "finished": outcome.finished, "training_seconds": round(outcome.seconds, 1),
               "best_step": best.step, "simulated_tau": best.tau, "per_position": best.per_position,
               "walked_tau": best.walked_tau, "k": plan.settings.k, "drafter_dir": str(plan.out / "drafter")}
    if outcome.finished:
        (plan.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    plan.logger.finish([], summary, failed=False)
    walked = "-" if best.walked_tau is None else f"{best.walked_tau:.3f}"
    state = "done" if outcome.finished else (f"stopped at step {outcome.steps} (max_minutes or max_wall_minutes); "
                                             f"resume={plan.out} continues")
    print_line(f"{state}: best simulated tau {best.tau:.3f} at step {best.step} (k = {plan.settings.k}, a_i "
               f"{', '.join(f'{a:.3f}' for a in best.per_position)}; the loop's tau, walked: {walked}) in "
               f"{outcome.seconds / 60:.1f} min")
    print_line(f"drafter: {plan.out / 'drafter'}")


if __name__ == "__main__":
    main()
