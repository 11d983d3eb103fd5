"""One run: validate the config, load the pair and prompts, take the run directory (``experiments.common.rundir``: one
writer, resume), then for each prompt decode with the autoregressive baseline and with the run's system (our
speculative decoding, or transformers' generate: ``experiments.common.harness.System``), interleaved with the same seed,
and append one row (``specdec.results.Row``) to rows.jsonl. The run ends with its summary
(``specdec.results.summarize_rows``: pooled figures and per-prompt means) in summary.json and on the console.

The composed ``DictConfig`` stops here: groups become library objects through ``hydra.utils.instantiate`` and
the library (``specdec``) is called with plain arguments.

With ``batch_size > 1`` prompts are decoded in left-padded batches. Counts (emitted, drafted, accepted,
target_calls, per-position acceptance) are per row; timings and everything derived from them (seconds,
tokens/s, speedup, cost ratio, TTFT/ITL, draft_calls, expected acceptance) describe the whole batch and are
repeated on each of its rows, whose ``batch_size`` column says how many rows shared them.
"""

from __future__ import annotations

import copy
import hashlib
import math
import sys
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
import transformers
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import specdec
from experiments.common import rundir
from experiments.common.concurrency import LiveJobs, host_name, live_jobs_dir
from experiments.common.config_checks import ConfigError, data_label, data_name, one_line, validate
from experiments.common.harness import System, compilations, settle
from experiments.common.provenance import (
    code_provenance,
    drafter_weights_hash,
    load_average,
    processor_name,
    weights_hash,
)
from experiments.common.recovery import prompts_left, recover
from experiments.common.summary import format_table, complete_summary, title
from specdec.batching import left_pad
from specdec.profile import time_forwards
from specdec.stats import DecodeStats
from specdec.results import (
    SUMMARY,
    Condition,
    Metrics,
    Outputs,
    PromptColumns,
    Provenance,
    Row,
    RunIdentity,
    read_rows,
)

# Identity columns that the config alone does not fix: named once the run directory is known (run_id, group), by
# the loaded pair (pair, device, dtype, and how transformers is called on it), or per batch (batch_size).
UNSETTLED_COLUMNS = ("run_id", "group", "batch_size", "pair", "device", "dtype", "system_settings")
LOADED_COLUMNS = ("pair", "device", "dtype", "system_settings")
MIN_TIMED_CALLS = 4  # fewer timed generate calls per side than this, and a run says its speedup is noise


@dataclass
class Job:
    """Where a run writes and what Hydra knows about it (see ``job_from_hydra``)."""

    run_dir: Path  # Hydra's output directory of this run (a sweep's job subdirectory under -m)
    default_group: str  # group when the config leaves it null: the sweep directory name, or the run directory name
    choices: dict  # config group -> chosen option name, e.g. {"sampling": "t1"}
    search_root: Path  # where resume=true looks for unfinished runs
    in_sweep: bool = False  # a job of a -m sweep: incompatible settings skip it; a single run fails instead
    live_jobs_dir: Path | None = None  # where the sweep's jobs on this host count each other (None: a single run)


def job_from_hydra() -> Job:
    """The ``Job`` of the Hydra run or sweep job being executed."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hydra_cfg.sweep.dir)
        return Job(run_dir, sweep_dir.name, dict(hydra_cfg.runtime.choices), sweep_dir.parent, in_sweep=True,
                   live_jobs_dir=live_jobs_dir(sweep_dir))
    return Job(run_dir, run_dir.name, dict(hydra_cfg.runtime.choices), run_dir.parent)


@dataclass
class Setting:
    """The library objects and identity columns of one run, built from the config before any model loads."""

    strategy: object
    draft_length: object
    sampling: specdec.SamplingConfig
    system: System
    drafter_factory: Callable
    drafter: object | None  # built already if it needs no loaded model, else None (built from the factory)
    identity: RunIdentity  # run_id and group set once the run directory is known; pair, device, dtype once loaded
    options: dict  # every other parameter of a swept group, as <group>_<key> columns

    def settled_columns(self) -> dict:
        """The setting columns the config fixes before any model loads: what every row of this run will say."""
        columns = {k: v for k, v in asdict(self.identity).items() if k not in UNSETTLED_COLUMNS}
        return columns | self.options


def run(cfg: DictConfig, job: Job, after_row: Callable[[dict], None] | None = None) -> dict | None:
    """Run every prompt of ``cfg`` and return the summary (None for a skipped job).

    ``after_row`` is called with each row once it is on disk (tests use it to simulate a kill).
    """
    objects, skip_reason = validate(cfg)
    check_rounds(cfg.get("rounds", 1))
    if skip_reason and not job.in_sweep:
        raise ConfigError(f"{skip_reason} (a sweep skips such a job; a single run refuses it)")
    config = resolved(cfg)
    setting = build_setting(cfg, job, objects)
    out_dir, note = rundir.results_dir(config["resume"], job.run_dir, job.search_root, config,
                                       setting.settled_columns())
    if out_dir.resolve() != job.run_dir.resolve():
        rundir.remove_if_only_hydra_files(job.run_dir)  # resuming elsewhere: no stray empty run directory
    if skip_reason:
        print(f"skipping job: {skip_reason}", file=sys.stderr)
        with rundir.RunLock(out_dir):
            rundir.write_json(out_dir / SUMMARY, {"status": "skipped", "reason": skip_reason})
        return None
    prompts = load_checked_prompts(cfg)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    with rundir.RunLock(out_dir):
        return run_in(out_dir, note, cfg, job, setting, config, prompts, after_row)


def run_in(out_dir: Path, note: str | None, cfg: DictConfig, job: Job, setting: Setting, config: dict, prompts: list,
           after_row) -> dict:
    """The run, once this process holds ``out_dir``: recover what is there, decode the prompts left, summarise."""
    recovery = recover(out_dir, prompts, setting.settled_columns())
    done_rows = recovery.rows
    run_id = done_rows[0]["run_id"] if done_rows else new_run_id(out_dir)
    group = done_rows[0]["group"] if done_rows else (cfg.group or job.default_group)
    config["group"] = group
    rundir.write_config(out_dir, config)
    todo = [(number, prompt) for number in range(rounds(cfg))
            for prompt in prompts_left(prompts, done_rows, number)]
    if todo:
        rundir.check_appendable(out_dir)  # before the models load, and before saying the run continues
    if note or done_rows or recovery.set_aside or recovery.moved:
        print(recovery.report(note or f"continuing {out_dir}", len(todo)), file=sys.stderr)
    setting.identity = replace(setting.identity, run_id=run_id, group=group)
    logger = instantiate(cfg.logger)
    logger.start(run_id, group, run_name(setting.identity), config, out_dir)
    failed = True
    load_at_start = load_average()
    try:
        if todo:
            # Registered from before the models load: loading competes for the machine too.
            with LiveJobs(job.live_jobs_dir) as live_jobs:
                decode_prompts(cfg, setting, todo, out_dir, done_rows, len(prompts) * rounds(cfg), logger,
                               live_jobs, after_row)
        rows = read_rows(out_dir)
        summary = complete_summary(rows, cfg.batch_size, rounds(cfg), load_at_start, load_average())
        rundir.write_json(out_dir / SUMMARY, summary)
        print(format_table(summary, title(rows[0], len(rows), out_dir)))
        failed = False
    finally:
        logger.finish(read_rows(out_dir), summary if not failed else {"status": "failed"}, failed)
    return summary


def rounds(cfg: DictConfig) -> int:
    """How many times each prompt's interleaved baseline/speculative pair is decoded (the run key ``rounds``)."""
    return cfg.get("rounds", 1)


def check_rounds(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"rounds={value!r}: rounds must be an integer >= 1 (how many times each prompt's "
                          "baseline/speculative pair is decoded)")


def resolved(cfg: DictConfig) -> dict:
    """The resolved config as plain data, without Hydra's own node."""
    config = OmegaConf.to_container(cfg, resolve=True)
    config.pop("hydra", None)
    return config


def new_run_id(out_dir: Path) -> str:
    """Readable and unique: <run dir>-<random>, or <sweep dir>-<job>-<random> for a sweep job."""
    name = f"{out_dir.parent.name}-{out_dir.name}" if out_dir.name.isdigit() else out_dir.name
    return f"{name}-{uuid.uuid4().hex[:8]}"


def load_checked_prompts(cfg: DictConfig) -> list:
    """The run's prompts, read and checked before any model loads: every problem is a one-line ConfigError."""
    source = data_label(cfg)
    try:
        prompts = instantiate(cfg.data)
    except InstantiationException as err:
        raise ConfigError(f"{source}: {one_line(err.__cause__ or err)}") from None
    ids = [str(p.id) for p in prompts]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigError(f"{source}: prompt ids must be unique (rows and reports name prompts by "
                          f"them); repeated: {', '.join(duplicates[:5])}")
    if not prompts:
        raise ConfigError(f"{source}: the prompt set is empty (no prompts, or num_prompts=0)")
    return prompts


def build_setting(cfg: DictConfig, job: Job, objects: dict) -> Setting:
    """The run's setting from the objects ``validate`` built, and the identity columns of its rows (run_id and
    group empty until the run directory is known). Parts are named by their own ``name`` (a custom part's too), the
    sampling settings by their values (``sampling_label``)."""
    sampling, system = objects["sampling"], objects["system"]
    strategy, policy = objects["strategy"], objects["draft_length"]
    names = dict(drafter=objects["drafter_name"], strategy=strategy.name, lossless=strategy.lossless)
    if system.name == "hf_generate":  # transformers decodes the target alone: nothing drafts, nothing is judged
        names = dict(drafter="none", strategy="none", lossless=True)
    elif system.name == "hf_assisted":  # speculative sampling, greedy matching at temperature 0: lossless
        names = dict(drafter=objects["drafter_name"], strategy="speculative", lossless=True)
    identity = RunIdentity(
        run_id="",
        group="",
        pair=job.choices.get("pair"),
        system=system.name,
        system_settings=None,
        **names,
        draft_length=policy.name,
        k=policy.max_k,
        sampling=sampling_label(sampling),
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        batch_size=cfg.batch_size,
        data=data_name(cfg),
        device=cfg.device,
        dtype=cfg.dtype,
        compile=cfg.compile,
        forward=cfg.forward,
        stop_at_eos=cfg.stop_at_eos,
        threads=cfg.threads,
        warmup=cfg.warmup,
    )
    return Setting(strategy, policy, sampling, system, objects["drafter_factory"], objects["drafter"], identity,
                   option_columns(cfg))


def sampling_label(sampling: specdec.SamplingConfig) -> str:
    """The sampling settings in short, from their values (never a preset's name, which an override would belie):
    'greedy' at temperature 0, else 'T=0.7' and each filter set, e.g. 'T=0.7, top_p=0.9'."""
    if sampling.is_greedy:
        return "greedy"
    filters = [f"{name}={value:g}" for name in ("top_k", "top_p", "min_p")
               if (value := getattr(sampling, name)) is not None]
    return ", ".join([f"T={sampling.temperature:g}", *filters])


def option_columns(cfg: DictConfig) -> dict:
    """Every other parameter of a swept group as its own column, e.g. strategy_lenience, strategy_n. A list of
    numbers (a tree's branching) is one column, e.g. drafter_branching = "2-2-1-1"."""
    columns = {}
    for group_name in ("strategy", "draft_length", "drafter"):
        for key, value in cfg[group_name].items():
            if OmegaConf.is_list(value):
                value = "-".join(map(str, value))
            if not key.startswith("_") and key != "k" and isinstance(value, (int, float, str, bool, type(None))):
                columns[f"{group_name}_{key}"] = value
    return columns


def run_name(identity: RunIdentity) -> str:
    system = "" if identity.system == "specdec" else f"{identity.system}/"
    return f"{identity.pair}/{system}{identity.drafter}/{identity.strategy}/k{identity.k}/{identity.sampling}"


def pair_drafter(setting: Setting, pair, compile: bool, forward: str) -> object:
    """The run's drafter: built before loading, or now by its factory from the loaded pair and the run's
    ``compile`` and ``forward`` switches, where what needs the pair (e.g. layers the target has) fails in one line."""
    if setting.drafter is not None:
        return setting.drafter
    try:
        return setting.drafter_factory(pair, compile=compile, forward=forward)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"drafter: {one_line(err)}") from None


@dataclass(frozen=True)
class Measured:
    """What the measured side decoded in one batch: each row's tokens, and each row's metrics from the baseline's
    stats of the same batch (``metrics(base_stats, row)``)."""

    tokens: list[list[int]]
    metrics: Callable[[DecodeStats, int], Metrics]


def decode_prompts(cfg, setting: Setting, todo: list[tuple[int, object]], out_dir: Path, done_rows, total: int, logger,
                   live_jobs: LiveJobs, after_row) -> None:
    """Load the pair, warm up, then decode every (round, prompt) batch of ``todo`` with the baseline and the run's
    system and write its rows, each saying how many jobs of the sweep ran on this machine meanwhile (counted before
    and after the batch), the machine's load average before and after it, and the run's provenance."""
    transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bars say nothing a run needs
    pair = instantiate(cfg.pair)
    tokenizer = pair.tokenizer
    device = pair.target.device
    setting.identity = replace(
        setting.identity,
        pair=getattr(pair, "name", None) or setting.identity.pair,
        device=str(device),
        dtype=str(next(pair.target.parameters()).dtype).removeprefix("torch."),
        system_settings=setting.system.settings(pair.target, setting.identity.k),
    )
    check_loaded_setting(out_dir, done_rows, setting.identity)
    logger.update_config(resolved_settings(cfg, setting.identity))
    # The baseline gets its own policy object, so an adaptive policy never learns from k = 0 steps.
    baseline = specdec.Decoder(pair.target, None, setting.strategy, copy.deepcopy(setting.draft_length),
                               setting.sampling, compile=cfg.compile, forward=cfg.forward)
    eos = tokenizer.eos_token_id if cfg.stop_at_eos else None
    batches = [(number, batch) for number in dict.fromkeys(number for number, _ in todo)
               for batch in batched([prompt for n, prompt in todo if n == number], cfg.batch_size)]
    if len(batches) < MIN_TIMED_CALLS:
        print(f"warning: {len(batches)} timed call(s) per side (prompts={len(todo)}, batch_size="
              f"{cfg.batch_size}): a speedup from fewer than {MIN_TIMED_CALLS} calls is noise; use num_prompts >= "
              f"{MIN_TIMED_CALLS * cfg.batch_size}", file=sys.stderr)
    encoded = [encode(tokenizer, [p.text for p in batch], device) for _, batch in batches]
    side = TransformersSide(setting, pair) if setting.system.is_transformers else SpecdecSide(cfg, setting, pair)
    provenance = Provenance(**code_provenance(), target_weights=weights_hash(pair.target),
                            drafter_weights=side.drafter_weights(), processor=processor_name(device),
                            torch_threads=torch.get_num_threads())
    logger.update_config({"provenance": asdict(provenance)})
    side.compile_seconds = warm_up(cfg, ((baseline.generate, lambda: baseline.measuring), (side.warm, side.measuring)),
                                   encoded, device)
    side.profile(cfg, encoded[0])
    compiled_before = compilations()

    writer = rundir.RowWriter(out_dir)
    all_rows = list(done_rows)
    progress = tqdm(total=total, initial=len(done_rows), unit="prompt", desc=run_name(setting.identity),
                    file=sys.stderr, dynamic_ncols=True)
    try:
        for index, (number, batch) in enumerate(batches):
            input_ids, mask = encode(tokenizer, [p.text for p in batch], device)
            jobs_before, load_before = live_jobs.count(), load_average()
            # Alternate which side goes first, so drift (thermal, caches, other load) hits both alike; a prompt's
            # next round swaps its order.
            if (index + number) % 2 == 0:
                base_out = generate_or_explain(baseline.generate, input_ids, mask, batch, cfg, eos)
                measured = generate_or_explain(side.measure, input_ids, mask, batch, cfg, eos)
            else:
                measured = generate_or_explain(side.measure, input_ids, mask, batch, cfg, eos)
                base_out = generate_or_explain(baseline.generate, input_ids, mask, batch, cfg, eos)
            condition = Condition(host_name(), most_jobs(jobs_before, live_jobs.count()), load_before, load_average())
            for row_index, prompt in enumerate(batch):
                prompt_ids = input_ids[row_index, mask[row_index].bool()].tolist()
                likelihoods = None if setting.identity.lossless else (
                    mean_log_likelihood(pair.target, prompt_ids, measured.tokens[row_index]),
                    mean_log_likelihood(pair.target, prompt_ids, base_out.tokens[row_index]))
                row = make_row(setting, condition, provenance, prompt, number, len(prompt_ids), row_index, batch,
                               measured, base_out, likelihoods).to_json()
                writer.write(row)
                all_rows.append(row)
                logger.log_row(row, len(all_rows) - 1)
                progress.set_postfix(running_means(all_rows), refresh=False)
                progress.update(1)
                if after_row is not None:
                    after_row(row)
    finally:
        progress.close()
        writer.close()
    if cfg.compile and compilations() > compiled_before:
        print(f"warning: {compilations() - compiled_before} compilation(s) happened while prompts were timed (a shape "
              f"the warm-up did not meet): those prompts' timings include them", file=sys.stderr)


class SpecdecSide:
    """Our speculative decoder over the loaded pair, as the measured side of each row. ``compile_seconds`` (the
    run's warm-up, where it compiled) and ``cost_ratio`` (profiled where steps run on the device) are the run's,
    set once it has warmed up."""

    def __init__(self, cfg, setting: Setting, pair):
        drafter = pair_drafter(setting, pair, cfg.compile, cfg.forward)  # before any decoding
        self.decoder = specdec.Decoder(pair.target, drafter, setting.strategy, setting.draft_length,
                                       setting.sampling, compile=cfg.compile, forward=cfg.forward)
        self.k, self.tree = setting.identity.k, drafter.drafts_trees
        self.compile_seconds: float | None = None
        self.cost_ratio: float | None = None
        self.drafter, self.target = drafter, pair.target

    def drafter_weights(self) -> str | None:
        return drafter_weights_hash(self.drafter, self.target)

    def warm(self, input_ids, mask, max_new_tokens, eos_token_id, seed) -> None:
        self.decoder.generate(input_ids, mask, max_new_tokens, eos_token_id, seed)

    def measuring(self) -> bool:
        return self.decoder.measuring

    def profile(self, cfg, encoded: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.cost_ratio = profiled_cost_ratio(cfg, self.decoder, encoded, self.k)

    def measure(self, input_ids, mask, max_new_tokens, eos_token_id, seed) -> Measured:
        out = self.decoder.generate(input_ids, mask, max_new_tokens, eos_token_id, seed)
        step_costs = self.decoder.draft_length.step_costs()
        return Measured(out.tokens, lambda base, i: Metrics.measure(out.stats, base, i, self.tree,
                                                                    self.compile_seconds, self.cost_ratio,
                                                                    step_costs))


class TransformersSide:
    """transformers' generate (``setting.system``) over the loaded pair as the measured side, one prompt per call
    (assisted generation refuses batches; the config check keeps batch_size = 1), timed here as our decoder times
    itself (``specdec.Clock``: synchronised on GPU)."""

    def __init__(self, setting: Setting, pair):
        self.system, self.pair, self.k, self.sampling = setting.system, pair, setting.identity.k, setting.sampling
        self.clock = specdec.Clock(pair.target.device)
        self.compile_seconds: float | None = None

    def warm(self, input_ids, mask, max_new_tokens, eos_token_id, seed) -> None:
        self.measure(input_ids, mask, max_new_tokens, eos_token_id, seed)

    def measuring(self) -> bool:
        """transformers' candidate generators measure nothing before they choose."""
        return False

    def drafter_weights(self) -> str | None:
        """Assisted generation drafts with the pair's draft model; transformers' generate drafts nothing."""
        return weights_hash(self.pair.draft) if self.system.name == "hf_assisted" else None

    def profile(self, cfg, encoded) -> None:
        """transformers' phases are not timed apart: no cost ratio."""

    def measure(self, input_ids, mask, max_new_tokens, eos_token_id, seed) -> Measured:
        prompt = input_ids[0, mask[0].bool()].tolist()
        start = self.clock.now()
        tokens, calls = self.system.decode(self.pair, prompt, max_new_tokens, self.k, self.sampling, seed,
                                           eos_token_id)
        seconds = self.clock.now() - start
        return Measured([tokens], lambda base, i: Metrics.measure_system(seconds, len(tokens), calls, base, i,
                                                                         self.compile_seconds))


def mean_log_likelihood(target: torch.nn.Module, prompt: list[int], tokens: list[int]) -> float | None:
    """The target's mean log-probability per token of ``tokens`` after ``prompt`` (raw logits: temperature 1),
    from one untimed forward; None for no tokens."""
    if not tokens:
        return None
    ids = torch.tensor([prompt + tokens], device=target.device)  # [1, T + n]
    with torch.inference_mode():
        logits = target(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [n, V]
    chosen = torch.tensor(tokens, device=target.device)  # [n]
    return float(torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).mean())


def resolved_settings(cfg: DictConfig, identity: RunIdentity) -> dict:
    """What the config leaves open, as the run resolved it, for W&B's config: the device and dtype as loaded (the
    requested values kept under ``requested``) and the run's k."""
    return {"device": identity.device, "dtype": identity.dtype, "k": identity.k,
            "requested": {"device": cfg.device, "dtype": cfg.dtype}}


def warm_up(cfg, calls: tuple, encoded: list[tuple[torch.Tensor, torch.Tensor]], device) -> float | None:
    """``cfg.warmup`` untimed rounds, each decoding with every side's call the widest batch of each batch size in
    the run, EOS ignored, so a compiled decoder compiles before timing every shape it will meet: each batch size,
    caches sized for the longest prompt (later calls reuse them), and every draft length the loop takes near the end
    of ``max_new_tokens``. ``calls`` holds (call, measuring) per side: a call is repeated while its side is still
    measuring the machine (``settle``). Returns the warm-up's seconds for a compiled run (where its compilations
    happen: reported apart from decode time as ``compile_seconds``), None for an eager one."""
    widest = {}
    for input_ids, mask in encoded:  # [B, T] each
        batch_size = input_ids.shape[0]
        if batch_size not in widest or input_ids.shape[1] > widest[batch_size][0].shape[1]:
            widest[batch_size] = (input_ids, mask)
    clock = specdec.Clock(device)
    start = clock.now()
    for _ in range(cfg.warmup):
        for input_ids, mask in widest.values():
            for call, measuring in calls:
                call(input_ids, mask, cfg.max_new_tokens, None, cfg.seed)
                settle(lambda: call(input_ids, mask, cfg.max_new_tokens, None, cfg.seed), measuring)
    if not cfg.compile:
        return None
    if not cfg.warmup:
        print("warning: compile=true with warmup=0: the first prompts' timings include compilation",
              file=sys.stderr)
    return clock.now() - start


def profiled_cost_ratio(cfg, decoder: specdec.Decoder, encoded: tuple[torch.Tensor, torch.Tensor],
                        k: int) -> float | None:
    """The cost ratio of a decoder whose steps run on the device, where its phases are not timed apart: its
    drafter's model's forward of one token over the target's verify forward of k + 1, each timed alone as the device
    step runs it (a CUDA graph replay on CUDA), over the first prompt. None for a decoder timed by phase, or a
    drafter that runs no single model."""
    models = decoder.drafter.models()
    if not decoder.steps_on_device or len(models) != 1 or k < 1:
        return None
    input_ids, mask = encoded
    prompt = input_ids[:1, mask[0].bool()]  # [1, T] the first prompt, unpadded
    prompt = prompt.repeat(1, -(-(k + 1) // prompt.shape[1]))  # at least the k + 1 tokens a verify forward feeds

    def seconds(model: torch.nn.Module, width: int, label: str) -> float:
        return time_forwards(model, prompt, [width], compile=cfg.compile, label=label, forward=cfg.forward,
                             captured=prompt.device.type == "cuda")[width]

    return seconds(models[0], 1, "draft") / seconds(decoder.target, k + 1, "target")


def most_jobs(before: int | None, after: int | None) -> int | None:
    """The larger count, or None when jobs cannot be counted."""
    return None if before is None or after is None else max(before, after)


def batched(prompts: list, size: int) -> list[list]:
    return [prompts[i : i + size] for i in range(0, len(prompts), size)]


def encode(tokenizer, texts: list[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize a batch with left padding: [B, T] input ids and attention mask on ``device``."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return left_pad([tokenizer(text).input_ids for text in texts], pad_id or 0, device)


def generate_or_explain(call, input_ids, mask, batch, cfg, eos):
    """One side's call on a batch, seeded by ``batch_seed``; a prompt the library rejects (empty, too long) is named
    in the error."""
    try:
        return call(input_ids, mask, cfg.max_new_tokens, eos, batch_seed(cfg.seed, batch))
    except ValueError as err:
        ids = ", ".join(str(p.id) for p in batch)
        raise ValueError(f"prompt(s) {ids}: {err}") from err


def batch_seed(seed: int, batch: list) -> int:
    """The seed of a batch's calls (baseline and measured side alike): the run's ``seed`` mixed with the batch's prompt
    ids, so each prompt draws its own random numbers. Every call seeded with ``seed`` itself would give each prompt at
    batch size 1 the same numbers in the same order (a step draws a fixed count of them, whatever it accepts):
    prompts' acceptances would then be correlated, and a run's tau pooled over prompts would carry one random
    stream's luck (docs/verification.md). A function of the ids, so a resumed run seeds its prompts as before."""
    key = "\0".join([str(seed), *(str(prompt.id) for prompt in batch)])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def make_row(setting: Setting, condition: Condition, provenance: Provenance, prompt, round_number: int,
             prompt_tokens: int, i: int, batch: list, measured: Measured, base: specdec.GenerationOutput,
             log_likelihoods: tuple[float, float] | None = None) -> Row:
    """The row (docs/results-schema.md) of row ``i`` of the ``batch`` of prompts that both sides decoded in round
    ``round_number``; ``log_likelihoods``: the target's mean log-likelihood of each side's output, for a lossy
    rule."""
    return Row(
        identity=replace(setting.identity, batch_size=len(batch)),
        options=setting.options,
        condition=condition,
        provenance=provenance,
        prompt=PromptColumns(prompt_id=str(prompt.id), prompt_hash=prompt.hash, prompt_tokens=prompt_tokens,
                             category=prompt.category, round=round_number, batch_hash=batch[0].hash),
        metrics=measured.metrics(base.stats, i),
        outputs=Outputs.of(measured.tokens[i], base.tokens[i], setting.sampling.is_greedy, log_likelihoods),
    )


def check_loaded_setting(out_dir: Path, done_rows: list[dict], identity: RunIdentity) -> None:
    """Rows kept from before must name the pair, device and dtype this run loaded (``device=auto`` can resolve to
    another device on another machine): checked before any prompt is decoded."""
    difference = rundir.identity_difference(done_rows, {name: getattr(identity, name) for name in LOADED_COLUMNS})
    if difference:
        raise ConfigError(f"run directory {out_dir} holds rows decoded with another pair, device or dtype "
                          f"({difference}); one run directory holds one setting: use a new hydra.run.dir")


def running_means(rows: list[dict]) -> dict:
    """Progress-bar postfix: mean acceptance rate and speedup over the prompts done so far."""
    def mean(key):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return f"{sum(values) / len(values):.2f}" if values else "n/a"

    return {"acc": mean("acceptance_rate"), "speedup": mean("speedup")}
