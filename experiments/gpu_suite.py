"""The GPU suite: the headline figures of a GPU in one command, planned for a 15-minute lease (issue 36).

    python -m experiments.gpu_suite --out "$OUT"                 # the short plan: at most 8 minutes on one H100
    python -m experiments.gpu_suite --plan full --out "$OUT"     # every figure, ~9 minutes (a longer lease)
    python -m experiments.gpu_suite --sections speculative       # the preflight, then some sections only
    python -m experiments.gpu_suite --smoke --out /tmp/smoke     # the plan rehearsed on CPU, tiny models, ~20 s
    python -m experiments.gpu_suite --profile 4 --out "$OUT"     # a torch.profiler trace of the device step, k = 4

The short plan, in order (the most wanted first, so a short lease loses the least):

0. ``preflight`` (~30 s, tiny models, float64): the device step (``Decoder(compile=True, step="device")``)
   captures its step, replays it, reuses the kept capture in a later call with the host loop's greedy tokens, and
   a sampled call on a kept capture emits what the same seed emits on a fresh one. If it fails, the suite says why
   and skips every item that runs the device step, rather than paying a compile for each.
1. ``bandwidth``: a device-to-device copy (bytes read + written): the memory bound's rate.
2. ``ar_batch1``: compiled autoregressive ``gpt2-xl-shaped`` at batch 1 (``lean_compiled``: the lean forward,
   compiled, the step on the device) beside the bound (weight bytes / bandwidth per token), with transformers'
   static-cache ``generate`` (``hf_static``, which transformers compiles itself on CUDA) as the peer.
3. ``cost_ratio``: draft step / target step, each compiled forward timed as a CUDA graph replay, as the device step
   runs it (``harness.cost_profile``).
4. ``speculative``: our fastest path at synthetic acceptance 0.7 for each k of the plan (2..6, the likely best
   first), speedup over the same path's autoregressive baseline, beside the prediction from measured costs. The
   compiled forward serves every k with one graph (``specdec.cache.width_dynamic``), so a k after the first costs a
   capture, not a compile: each row says what its first call cost (``first_call_s``, ``compiles``).
5. ``embedded``: the shipped pair, ours vs transformers' assisted generation at the same algorithm, greedy, k = 4,
   and whether every method emitted identical tokens.

Then, only with the time left: ``ar_batches`` (batches 8 and 64), ``spec_acceptances`` (0.6 and 0.8 at the k
values 0.7 measured), ``study`` (one short ``experiment=gpt2_xl_study`` job, W&B offline where wandb is installed),
``host_reads`` (host reads per step of the device step and of the host loop). The full plan measures more modes and
peers in the same sections, on a longer budget.

Each section has a share of the suite's budget (the rest have none: they get what the headline left); time a section
leaves unused goes to the next. Inside a section each item (a method's first call, a k) is first estimated (the
longest item of its kind so far, or a first guess) and skipped with a line saying so when it does not fit. An item
or a section that fails is recorded with its error and the suite goes on. Both files (Markdown and JSON) are written
again after every item, so a run stopped at its time limit leaves what it measured. Timing as in
``experiments.harness``: warm-up first, methods interleaved, the device synchronised before every clock read.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import transformers

import specdec
from experiments.bench import comparison_methods, comparison_row
from experiments.harness import (
    Decoded, HostReads, Method, Report, Tally, argument_parser, compile_forward, compilations,
    cost_profile, default_out_dir, load_bench_pair, markdown, names_from, random_prompts,
    run_interleaved, time_interleaved, transformers_generate, transformers_static_generate, warm_up,
)
from experiments.refusal import check_writable
from experiments.shapes_bench import copy_bandwidth, decode_rate, pooled_acceptance, weight_bytes
from specdec import Clock
from specdec.batching import left_pad
from specdec.costs import CostModel
from specdec.models import ModelPair
from specdec.profile import time_forwards

REPO = Path(__file__).resolve().parents[1]

# The JSON's headline keys (issues 24 and 36), null where their item was skipped or failed.
HEADLINE_KEYS = (
    "device", "preflight", "copy_bandwidth_tbps", "ar_batch1_tok_s", "ar_batch1_share_of_bound",
    "hf_best_ar_batch1_tok_s", "draft_target_cost_ratio", "spec_speedup_a07_best", "spec_speedup_a07_best_k",
    "spec_measured_over_predicted_a07", "spec_ks_measured", "embedded_ours_over_hf_assisted",
    "identical_greedy_tokens",
)
HEADLINE_ACCEPTANCE = 0.7

# Our autoregressive modes: name -> specdec.Decoder options.
AR_MODES = {
    "lean_compiled": dict(forward="lean", compile=True, step="device"),
    "lean": dict(forward="lean", compile=False, step="host"),
    "eager": dict(forward="transformers", compile=False, step="host"),
    "compiled": dict(forward="transformers", compile=True, step="host"),
}
HF_PEERS = ("hf_static", "hf_static_compiled", "hf_generate")  # transformers' autoregressive paths, batch 1
# The order first calls are paid in: the headline's two first (ours fastest, transformers' fastest), the costliest
# to compile last, so a short budget skips those.
AR_PRIORITY = ("lean_compiled", "hf_static", "eager", "lean", "hf_generate", "compiled", "hf_static_compiled")


@dataclass(frozen=True)
class Plan:
    """What the suite measures, in which order, and the seconds it may spend."""

    name: str
    sections: tuple[str, ...]  # after the preflight, in order: the headline's, then the rest
    device: str
    pair: str  # the pair of the autoregressive and speculative sections: a load_pair preset, or "tiny"
    dtype: str
    compile: bool  # our fastest path compiled (the smoke run's CPU plan runs it uncompiled: inductor takes seconds
    # per shape there; the device step then runs as tests/test_device_step.py runs it)
    threads: int | None  # torch CPU threads (None: torch's choice)
    modes: tuple[str, ...]  # our autoregressive modes (AR_MODES)
    peers: tuple[str, ...]  # transformers' autoregressive paths (HF_PEERS)
    batch_sizes: tuple[int, ...]  # the first is the ar_batch1 section's, the rest ar_batches'
    prompt_tokens: int  # random tokens per prompt
    ar_new_tokens: int
    ar_rounds: int
    ks: tuple[int, ...]  # in the order measured: the likely best k of acceptance 0.7 first
    more_acceptances: tuple[float, ...]  # spec_acceptances: measured at the k values 0.7 measured
    spec_prompts: int
    spec_new_tokens: int
    cost_repeats: int
    reads_new_tokens: int  # the longer call of the host_reads section (the shorter: a quarter)
    embedded_dtypes: tuple[str, ...]  # the first gives the headline
    embedded_prompts: int
    embedded_new_tokens: int
    study_overrides: tuple[str, ...]
    budget_seconds: float  # the whole suite, the preflight and model loading included
    shares: dict = field(default_factory=dict)  # section -> seconds it may count on
    first_call_guess: dict = field(default_factory=dict)  # "compiled"/"eager" -> seconds of a first call not yet seen
    preflight_dtype: str = "float64"  # the preflight's tiny models: no near-tie can flip a greedy token


HEADLINE_SECTIONS = ("bandwidth", "ar_batch1", "cost_ratio", "speculative", "embedded")
REST_SECTIONS = ("ar_batches", "spec_acceptances", "study", "host_reads")
STUDY_OVERRIDES = ("pair=gpt2-xl-shaped", "strategy=synthetic", "strategy.acceptance=0.7", "sampling=greedy",
                   "draft_length.k=4", "num_prompts=3", "max_new_tokens=64", "warmup=1", "dtype=bfloat16")

SHORT = Plan(  # one H100: ~420 s of sections, the preflight and loading included, ~20 s of imports: 8 minutes
    name="short", sections=(*HEADLINE_SECTIONS, *REST_SECTIONS), device="cuda", pair="gpt2-xl-shaped",
    dtype="bfloat16", compile=True, threads=None, modes=("lean_compiled",), peers=("hf_static",),
    batch_sizes=(1, 8, 64), prompt_tokens=32, ar_new_tokens=128, ar_rounds=3, ks=(3, 4, 5, 2, 6),
    more_acceptances=(0.6, 0.8), spec_prompts=4, spec_new_tokens=128, cost_repeats=20, reads_new_tokens=64,
    embedded_dtypes=("float32",), embedded_prompts=6, embedded_new_tokens=64, study_overrides=STUDY_OVERRIDES,
    budget_seconds=420.0,
    # The headline's shares (the rest have none): the preflight compiles tiny models four times; ar_batch1 pays two
    # first compiled GPT-2 XL calls (ours ~45 s, transformers' ~60 s; the H200's first compiled call took 44 s);
    # speculative compiles one verification graph, then captures per k; embedded compiles two small pairs' paths.
    shares={"preflight": 40, "bandwidth": 15, "ar_batch1": 125, "cost_ratio": 25, "speculative": 110,
            "embedded": 75},
    first_call_guess={"compiled": 60.0, "eager": 5.0},
)
FULL = replace(  # a longer lease: every mode and peer, every k, both embedded dtypes; ~9 minutes
    SHORT, name="full", modes=tuple(AR_MODES), peers=HF_PEERS, ks=(3, 4, 5, 2, 6, 1, 7, 8),
    embedded_dtypes=("float32", "bfloat16"), embedded_prompts=8, budget_seconds=520.0,
    shares={"preflight": 40, "bandwidth": 15, "ar_batch1": 170, "cost_ratio": 20, "speculative": 130,
            "embedded": 90},
)
PLANS = {"short": SHORT, "full": FULL}


def smoke(plan: Plan) -> Plan:
    """``plan`` rehearsed on CPU: the same sections, modes, peers, k values and acceptances, on tiny models and
    budgets, uncompiled (``--compile`` compiles on CPU too)."""
    return replace(
        plan, device="cpu", pair="tiny", dtype="float32", compile=False, threads=1, batch_sizes=(1, 2),
        prompt_tokens=8, ar_new_tokens=4, ar_rounds=1, spec_prompts=1, spec_new_tokens=6, cost_repeats=2,
        reads_new_tokens=24, embedded_dtypes=plan.embedded_dtypes[:1], embedded_prompts=1, embedded_new_tokens=4,
        study_overrides=("pair=embedded", "device=cpu", "dtype=float32", "compile=false", "strategy=synthetic",
                         "strategy.acceptance=0.7", "sampling=greedy", "draft_length.k=2", "num_prompts=1",
                         "max_new_tokens=4", "warmup=1"),
        budget_seconds=120.0,
        shares={"preflight": 10, "bandwidth": 1, "ar_batch1": 10, "cost_ratio": 2, "speculative": 10,
                "embedded": 20},
        first_call_guess={"compiled": 2.0, "eager": 1.0},
    )


# --- budgets ------------------------------------------------------------------------------------------------------


class Budget:
    """The seconds one section may spend, on ``now``'s clock, and the lines of what it skipped or what failed."""

    def __init__(self, seconds: float, now: Callable[[], float]):
        self.now, self.deadline, self.skipped, self.failed = now, now() + seconds, [], []

    def left(self) -> float:
        return self.deadline - self.now()

    def allows(self, what: str, estimate: float) -> bool:
        """Whether ``what``, estimated at ``estimate`` seconds, fits what is left; if not, a line says so."""
        if estimate <= self.left():
            return True
        self.skip(what, f"needs ~{estimate:.0f} s, {max(self.left(), 0):.0f} s left in the section")
        return False

    def skip(self, what: str, why: str) -> None:
        line = f"skipped {what}: {why}"
        print(f"[gpu_suite] {line}", flush=True)
        self.skipped.append(line)


class Estimates:
    """How long an item of each kind takes: the longest one measured so far, else a first guess."""

    def __init__(self):
        self.longest: dict[str, float] = {}

    def of(self, kind: str, guess: float) -> float:
        return self.longest.get(kind, guess)

    def add(self, kind: str, seconds: float) -> None:
        self.longest[kind] = max(seconds, self.longest.get(kind, 0.0))


def section_budget(left: float, later_shares: float) -> float:
    """A section's seconds: what the suite has left less what the sections after it count on, so a section's
    unused time goes to the next."""
    return max(left - later_shares, 0.0)


# --- the suite ----------------------------------------------------------------------------------------------------


@dataclass
class SectionRecord:
    """What a section did, for the JSON and the time line."""

    seconds: float = 0.0
    budget_seconds: float = 0.0
    status: str = "started"  # then "done" or "failed"
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # items that raised (the section went on)
    error: str | None = None  # the section itself raised


class Suite:
    """One run of the suite: the plan, the models, what every item measured (``results``, ``tables``), the
    Markdown blocks shown so far (``blocks``), and whether the device step may run (``device_step_refused``: None,
    or why not)."""

    def __init__(self, plan: Plan, now: Callable[[], float] = time.monotonic,
                 checkpoint: Callable[[], object] = lambda: None):
        self.plan, self.now, self.checkpoint = plan, now, checkpoint
        self.started = now()
        self.header = ""
        self.results: dict = {key: None for key in HEADLINE_KEYS}
        self.tables: dict[str, list[dict]] = {}
        self.blocks: dict[str, str] = {}  # table name -> its Markdown (heading, table, note), in first-shown order
        self.records: dict[str, SectionRecord] = {}
        self.estimates = Estimates()
        self.loaded: ModelPair | None = None
        self.clock: Clock | None = None  # the pair's device's, once it is loaded
        self.bandwidth: float | None = None  # bytes/s
        self.costs: CostModel | None = None  # the draft's step and the target's forwards, as the step runs them
        self.fastest_ar: str | None = None  # our fastest autoregressive mode at batch 1
        self.device_step_refused: str | None = None  # why the preflight failed, once it has
        self.speculative: SpeculativeRun | None = None  # the speculative sections' prompts, baseline and rows

    @property
    def pair(self) -> ModelPair:
        """The plan's pair, loaded on first use (the preflight runs before it)."""
        if self.loaded is None:
            start = time.monotonic()
            self.loaded = load_models(self.plan)
            self.clock = Clock(self.loaded.target.device)
            print(f"[gpu_suite] {self.plan.pair} loaded in {time.monotonic() - start:.1f} s", flush=True)
        return self.loaded

    def left(self) -> float:
        return self.plan.budget_seconds - (self.now() - self.started)

    def run(self, sections: dict[str, Callable[[Suite, Budget], None]]) -> None:
        """Run each section in turn within its budget; a failure is recorded, and the next section runs. The files
        are written after every item (``attempt``) and every section."""
        names = list(sections)
        for index, name in enumerate(names):
            later = sum(self.plan.shares.get(later_name, 0.0) for later_name in names[index + 1:])
            record = self.records[name] = SectionRecord(budget_seconds=section_budget(self.left(), later))
            budget = Budget(record.budget_seconds, self.now)
            record.skipped, record.failed = budget.skipped, budget.failed  # the same lists: written as they grow
            start = self.now()
            try:
                sections[name](self, budget)
                record.status = "done"
            except Exception as err:  # a section's failure must not cost the others their figures
                traceback.print_exc()
                record.status, record.error = "failed", f"{type(err).__name__}: {first_line(err)}"
            record.seconds = self.now() - start
            print(time_line(name, record), flush=True)
            self.checkpoint()

    def attempt(self, budget: Budget, what: str, kind: str, guess: float, work: Callable[[], object],
                device_step: bool = False):
        """Run ``work`` if the device step may run (where it needs it) and its estimate (by ``kind``) fits the
        budget, learn its time, and write the files. None when skipped, or when it raised: the error is recorded
        and the section goes on."""
        if device_step and self.device_step_refused is not None:
            budget.skip(what, f"the preflight failed ({self.device_step_refused})")
            return None
        if not budget.allows(what, self.estimates.of(kind, guess)):
            return None
        start = self.now()
        try:
            value = work()
        except Exception as err:  # one method's failure (a compile that breaks, say) must not cost the others
            traceback.print_exc()
            budget.failed.append(f"{what}: {type(err).__name__}: {first_line(err)}")
            value = None
        else:
            self.estimates.add(kind, self.now() - start)
        self.checkpoint()
        return value

    def first_call_guess(self, compiled: bool) -> float:
        return self.plan.first_call_guess["compiled" if compiled else "eager"]

    def show(self, name: str, heading: str, rows: list[dict], note: str = "", echo: bool = True) -> None:
        """A table's Markdown block (written with the files; replaced when shown again), printed if ``echo``."""
        block = f"{heading}\n\n{markdown(rows)}" + (f"\n\n{note}" if note else "")
        self.blocks[name] = block
        if echo:
            print(block, flush=True)

    def payload(self) -> dict:
        """The JSON: headline keys first, then the plan, the sections' records and every table's rows."""
        return {**self.results, "plan": asdict(self.plan), "sections": {name: asdict(record) for name, record
                                                                        in self.records.items()},
                "tables": self.tables}

    def markdown(self) -> str:
        """The header, every table shown so far, the failed sections, the headline and the time lines."""
        failures = [f"**Section `{name}` failed**: {record.error}" for name, record in self.records.items()
                    if record.error]
        report = Report()
        report.sections = [self.header, *self.blocks.values(), *failures, headline_table(self), sections_table(self)]
        return report.text()


def time_line(name: str, record: SectionRecord) -> str:
    skipped = f", {len(record.skipped)} item(s) skipped" if record.skipped else ""
    failed = f", {len(record.failed)} item(s) failed" if record.failed else ""
    return (f"[gpu_suite] section {name}: {record.status} in {record.seconds:.1f} s "
            f"(budget {record.budget_seconds:.0f} s{skipped}{failed})")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# --- models -------------------------------------------------------------------------------------------------------


def load_models(plan: Plan) -> ModelPair:
    """The pair of the autoregressive and speculative sections: a load_pair preset, or (``tiny``, the smoke run's) a
    random GPT-2 pair small enough for CPU tests."""
    if plan.pair != "tiny":
        return specdec.load_pair(plan.pair, device=plan.device, dtype=plan.dtype)
    models = [tiny_gpt2(layers, seed) for layers, seed in ((1, 0), (2, 1))]
    return ModelPair(draft=models[0], target=models[1], tokenizer=None, name="tiny")


def tiny_gpt2(layers: int, seed: int) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=256, n_positions=256, n_embd=64, n_layer=layers, n_head=2,
                                     bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval().requires_grad_(False)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def device_kind(name: str) -> str:
    """The device tool's kind from a device name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100"; "cpu" stays."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    return "-".join(words[:2]) if words and words[0] == "nvidia" and len(words) > 1 else "-".join(words) or "unknown"


def release(*decoders: specdec.Decoder) -> None:
    """Free the decoders' buffers and compiled forwards, and the allocator's cached blocks with them."""
    for decoder in decoders:
        decoder.release()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def decoder_method(decoder: specdec.Decoder, prompts: torch.Tensor, new_tokens: int, compiled: bool) -> Method:
    """Our decoder on the same [B, T] prompts every call, EOS ignored."""
    return Method(lambda _, seed: Decoded.of(decoder.generate(prompts, None, new_tokens, None, seed)), compiled)


# --- the preflight ------------------------------------------------------------------------------------------------


class GraphCounter:
    """While active (``with GraphCounter(counting) as graphs``), counts the CUDA graphs captured and replayed, by
    wrapping ``torch.cuda.CUDAGraph``'s own methods: what the preflight sees of the device step without reaching
    inside it. Inactive (``counting=False``, off CUDA) it counts nothing."""

    def __init__(self, counting: bool):
        self.counting, self.captures, self.replays = counting, 0, 0

    def __enter__(self) -> GraphCounter:
        if self.counting:
            graph = torch.cuda.CUDAGraph
            self.originals = capture_begin, replay = graph.capture_begin, graph.replay

            def counted_capture_begin(cuda_graph, *args, **kwargs):
                self.captures += 1
                return capture_begin(cuda_graph, *args, **kwargs)

            def counted_replay(cuda_graph, *args, **kwargs):
                self.replays += 1
                return replay(cuda_graph, *args, **kwargs)

            graph.capture_begin, graph.replay = counted_capture_begin, counted_replay
        return self

    def __exit__(self, *exc) -> None:
        if self.counting:
            torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.replay = self.originals

    def counts(self) -> tuple[int, int]:
        return self.captures, self.replays


def preflight_section(suite: Suite, budget: Budget) -> None:
    """The device step proven on this device before any figure relies on it (see the module docstring). A failed
    check, or an error, refuses the device step to every later item, and the JSON's ``preflight`` says why."""
    start = time.monotonic()
    try:
        rows = preflight_checks(suite.plan)
    except Exception as err:  # a compile or a capture that breaks is the preflight's finding, not a crash
        traceback.print_exc()
        rows = [{"check": "the checks ran", "passed": False, "detail": f"{type(err).__name__}: {first_line(err)}"}]
    failed = [row for row in rows if not row["passed"]]
    if failed:
        suite.device_step_refused = f"{failed[0]['check']}: {failed[0]['detail']}"
        suite.results["preflight"] = f"failed: {suite.device_step_refused}"
    else:
        suite.results["preflight"] = "passed"
    suite.tables["preflight"] = rows
    suite.show("preflight", f"## Preflight: the device step on {suite.plan.device} (tiny GPT-2 pair, "
               f"{suite.plan.preflight_dtype}, compile={suite.plan.compile}, k = 3): {suite.results['preflight']} "
               f"in {time.monotonic() - start:.1f} s", rows,
               "Captures and replays are counted on CUDA only (CUDA graphs); elsewhere the step runs its Python "
               "each time, and the token checks still hold. A failed preflight skips every item that runs the "
               "device step.")


def preflight_checks(plan: Plan) -> list[dict]:
    """The preflight's checks, each a row {check, passed, detail}: greedy calls on a fresh and on a kept capture
    emit the host loop's tokens (with one capture, then none, and replays, on CUDA); a sampled call on a kept
    capture, after a call with another seed, emits what its seed emitted on the fresh capture."""
    device, dtype = torch.device(plan.device), getattr(torch, plan.preflight_dtype)
    target, draft = (tiny_gpt2(layers, seed).to(device=device, dtype=dtype) for layers, seed in ((2, 1), (1, 0)))
    prompts = random_prompts(4, 9, target.config.vocab_size, seed=21)
    batches = [left_pad([prompts[0][:5], prompts[1]], device=device),  # ragged: [2, 9] with its mask
               left_pad([prompts[2][:7], prompts[3][:2]], device=device)]  # [2, 7]: the same captured shapes

    def decoder(sampling: specdec.SamplingConfig, step: str = "device", compiled: bool = plan.compile):
        return specdec.Decoder(target, specdec.ModelDrafter(draft, compile=compiled), specdec.Speculative(),
                               specdec.FixedLength(3), sampling, compile=compiled, step=step)

    greedy, sampled = specdec.SamplingConfig(), specdec.SamplingConfig(temperature=1.0)
    on_device, host = decoder(greedy), decoder(greedy, "host", False)
    rows = [check("the device step is chosen", on_device.steps_on_device,
                  "Decoder(compile=..., step='device') runs it" if on_device.steps_on_device else "not chosen")]
    counting = device.type == "cuda"
    with GraphCounter(counting) as graphs:
        for capture, (ids, mask) in zip(("fresh", "kept"), batches):
            before = graphs.counts()
            tokens = on_device.generate(ids, mask, max_new_tokens=16).tokens
            captures, replays = (after - earlier for after, earlier in zip(graphs.counts(), before))
            expected = host.generate(ids, mask, max_new_tokens=16).tokens
            rows.append(check(f"greedy on a {capture} capture: the host loop's tokens", tokens == expected,
                              first_difference(tokens, expected)))
            if counting:
                wanted = 1 if capture == "fresh" else 0
                rows.append(check(f"greedy on a {capture} capture: {wanted} capture(s), replays",
                                  captures == wanted and replays > 0, f"{captures} capture(s), {replays} replay(s)"))
        ids, mask = batches[0]
        seeded = decoder(sampled)
        before = graphs.counts()
        first = seeded.generate(ids, mask, max_new_tokens=16, seed=4).tokens  # captures
        other = seeded.generate(ids, mask, max_new_tokens=16, seed=9).tokens  # the kept capture, another seed
        again = seeded.generate(ids, mask, max_new_tokens=16, seed=4).tokens  # the kept capture, the first seed
        captures, replays = (after - earlier for after, earlier in zip(graphs.counts(), before))
    rows.append(check("sampled on a kept capture: the fresh capture's tokens for the same seed", again == first,
                      first_difference(again, first)))
    rows.append(check("sampled: another seed, other tokens", other != first,
                      "the seeds gave different tokens" if other != first else "seeds 4 and 9 gave the same tokens"))
    if counting:
        rows.append(check("sampled: 1 capture for three calls, replays", captures == 1 and replays > 0,
                          f"{captures} capture(s), {replays} replay(s)"))
    release(on_device, seeded)
    return rows


def check(name: str, passed: bool, detail: str) -> dict:
    return {"check": name, "passed": bool(passed), "detail": detail}


def first_difference(tokens: list[list[int]], expected: list[list[int]]) -> str:
    """Where two batches of token rows first differ, in words ("equal" where they do not)."""
    for row, (got, wanted) in enumerate(zip(tokens, expected)):
        if got != wanted:
            at = next((i for i, (a, b) in enumerate(zip(got, wanted)) if a != b), min(len(got), len(wanted)))
            return f"row {row} differs from token {at} ({got[at:at + 4]} vs {wanted[at:at + 4]})"
    return "equal" if len(tokens) == len(expected) else f"{len(tokens)} rows vs {len(expected)}"


# --- sections -----------------------------------------------------------------------------------------------------


def bandwidth_section(suite: Suite, budget: Budget) -> None:
    device = suite.pair.target.device
    suite.bandwidth = copy_bandwidth(device, suite.clock)
    per_token = weight_bytes(suite.pair.target)
    row = {"device": device_name(device), "target_weight_gb": round(per_token / 1e9, 3),
           "copy_bandwidth_tb_s": None, "batch_1_bound_tok_s": None}
    if suite.bandwidth:
        suite.results["copy_bandwidth_tbps"] = round(suite.bandwidth / 1e12, 3)
        row.update(copy_bandwidth_tb_s=suite.results["copy_bandwidth_tbps"],
                   batch_1_bound_tok_s=round(suite.bandwidth / per_token, 1))
    suite.tables["bandwidth"] = [row]
    suite.show("bandwidth", "## Memory bound (a 2 GiB device-to-device copy, bytes read + written; CUDA only)", [row])


def ar_batch1_section(suite: Suite, budget: Budget) -> None:
    size = suite.plan.batch_sizes[0]
    rows = autoregressive_rows(suite, budget, size, with_peers=True)
    ours = [row for row in rows if row["method"] in AR_MODES and row["tok_s"] is not None]
    peers = [row for row in rows if row["method"] in HF_PEERS and row["tok_s"] is not None]
    if ours:
        best = max(ours, key=lambda row: row["tok_s"])
        suite.fastest_ar = best["method"]
        suite.results["ar_batch1_tok_s"] = best["tok_s"]
        suite.results["ar_batch1_share_of_bound"] = best.get("share_of_bound")
    if peers:
        suite.results["hf_best_ar_batch1_tok_s"] = max(row["tok_s"] for row in peers)


def ar_batches_section(suite: Suite, budget: Budget) -> None:
    for size in suite.plan.batch_sizes[1:]:
        autoregressive_rows(suite, budget, size, with_peers=False)


def autoregressive_rows(suite: Suite, budget: Budget, size: int, with_peers: bool) -> list[dict]:
    """Tokens/s of each of our modes (and, ``with_peers``, transformers' paths) on ``size`` random prompts,
    interleaved per round after each method's first call; the methods whose first call does not fit (or that run
    the device step after a failed preflight) are skipped."""
    plan, pair, clock = suite.plan, suite.pair, suite.clock
    prompts = random_prompts(size, plan.prompt_tokens, pair.target.config.vocab_size, seed=size)
    ids = torch.tensor(prompts, device=pair.target.device)  # [B, T]
    candidates = {name: ar_method(pair, plan, name, ids) for name in plan.modes}
    if with_peers:
        candidates.update({name: peer for name, peer in peer_methods(pair.target, prompts, plan.ar_new_tokens).items()
                           if name in plan.peers})
    methods, tallies = {}, {}
    rounds = [None] * plan.ar_rounds
    for name in sorted(candidates, key=AR_PRIORITY.index):
        method = candidates[name][0]
        tally = suite.attempt(budget, f"{name} at batch {size} (first call)", f"first:{name}",
                              suite.first_call_guess(method.compiled), lambda: warm_up(method, rounds, clock),
                              device_step=AR_MODES.get(name, {}).get("step") == "device")
        if tally is not None:
            methods[name], tallies[name] = method, tally
    if methods:  # a few calls each, cheaper than any first call: never skipped once the first calls are paid
        time_interleaved(methods, rounds, clock, tallies)
    rows = [ar_row(suite, name, size, tallies.get(name)) for name in candidates]
    reference = next((tallies[name] for name in ("eager", *plan.peers) if name in tallies), None)
    for row, name in zip(rows, candidates):
        timed = tallies.get(name)
        row["tokens_equal_reference"] = (timed.outputs == reference.outputs if timed and reference and timed.outputs
                                         and reference.outputs else None)
    release(*(decoder for _, decoder in candidates.values() if decoder is not None))
    suite.tables[f"ar_batch{size}"] = rows
    note = ("`tok_s` is emitted tokens per second over the timed rounds, end to end (prefill, and for the device "
            "step its eager steps and the capture of its graph, included); `decode_tok_s` the same after each "
            "call's first step (ours only: transformers reports no step times); `first_call_s` is each method's "
            "untimed first call (compilation included); `tokens_equal_reference`: the same greedy tokens as our "
            "eager transformers mode where it ran, else transformers' (bf16 kernels may break near-ties "
            "differently: the preflight and the embedded pair's fp32 check are the correctness figures).")
    suite.show(f"ar_batch{size}", f"## Autoregressive, batch {size} ({plan.pair}, {plan.dtype}, {plan.prompt_tokens}"
               f"-token prompts, {plan.ar_new_tokens} new tokens, {plan.ar_rounds} rounds)", rows, note)
    suite.checkpoint()
    return rows


def ar_method(pair: ModelPair, plan: Plan, mode: str, ids: torch.Tensor):
    """Our ``mode`` (``AR_MODES``) as a method and its decoder; compiled only where the plan compiles."""
    options = {**AR_MODES[mode], "compile": AR_MODES[mode]["compile"] and plan.compile}
    decoder = specdec.Decoder(pair.target, None, time_phases=False, **options)
    return decoder_method(decoder, ids, plan.ar_new_tokens, options["compile"]), decoder


def peer_methods(target: torch.nn.Module, prompts: list[list[int]], new_tokens: int) -> dict:
    """transformers' autoregressive paths on the same prompts: name -> (method, None). (torch.compile only wraps
    the forward here: nothing compiles before the first call.)"""
    compiled_forward = compile_forward(target)
    return {
        "hf_static": (Method(lambda _, i: transformers_static_generate(target, prompts, new_tokens), True), None),
        "hf_static_compiled": (Method(lambda _, i: transformers_static_generate(target, prompts, new_tokens,
                                                                                compiled_forward), True), None),
        "hf_generate": (Method(lambda _, i: transformers_generate(target, target, prompts, new_tokens)), None),
    }


def ar_row(suite: Suite, name: str, size: int, tally) -> dict:
    """A method's row: tokens/s end to end and (ours, whose stats say when the first step ended) after the first
    step, the steady state the bound is about; each beside the bound where the bandwidth was measured."""
    timed = tally is not None and tally.tokens > 0
    decode = round(decode_rate(tally.stats), 1) if timed and tally.stats else None
    row = {"method": name, "batch": size, "tok_s": round(tally.tokens_per_s, 1) if timed else None,
           "decode_tok_s": decode, "first_call_s": round(tally.warmup_seconds, 1) if tally else None}
    if suite.bandwidth:
        bound = size * suite.bandwidth / weight_bytes(suite.pair.target)  # every step reads every weight once
        row["bound_tok_s"] = round(bound, 1)
        row["share_of_bound"] = round(row["tok_s"] / bound, 3) if timed else None
        row["decode_share_of_bound"] = round(decode / bound, 3) if decode else None
    if timed and tally.compilations_while_timed:
        row["compilations_while_timed"] = tally.compilations_while_timed
    return row


def captures_forwards(suite: Suite) -> bool:
    """Whether forwards are timed as CUDA graph replays, as the device step runs them (CUDA, compiled, and the
    preflight passed); else each compiled (or eager) forward is timed on its own."""
    return suite.pair.target.device.type == "cuda" and suite.plan.compile and suite.device_step_refused is None


def cost_ratio_section(suite: Suite, budget: Budget) -> None:
    """c = one draft step / one target step: each model's one-token forward, as the device step runs it."""
    plan, pair = suite.plan, suite.pair
    prompt = profile_prompt(suite)
    captured = captures_forwards(suite)
    # A compile of the draft's one-token graph at most: the target's ran in ar_batch1 (a profile runs the decode
    # steps' graphs, specdec.cache.width_dynamic).
    costs = suite.attempt(budget, "the cost ratio", "costs", suite.first_call_guess(plan.compile) / 4,
                          lambda: cost_profile(pair, prompt, [1], plan.cost_repeats, suite.clock, plan.compile,
                                               captured))
    if costs is None:
        return
    suite.costs = costs
    suite.results["draft_target_cost_ratio"] = round(costs.cost_ratio(), 3)
    row = {"draft_ms": round(1000 * costs.draft_step(), 3), "target_ms": round(1000 * costs.target_step(), 3),
           "cost_ratio": round(costs.cost_ratio(), 3), "captured": captured, "compiled": plan.compile}
    suite.tables["cost_ratio"] = [row]
    suite.show("cost_ratio", "## Cost ratio: draft step / target step (one token each, batch 1)", [row],
               "Medians of each forward over a cached prompt; `captured`: timed as CUDA graph replays, as the device "
               "step runs them (on CUDA once the preflight passed).")


def profile_prompt(suite: Suite) -> torch.Tensor:
    vocab = suite.pair.target.config.vocab_size
    return torch.tensor(random_prompts(1, suite.plan.prompt_tokens, vocab, seed=99), device=suite.pair.target.device)


class SpeculativeRun:
    """The speculative sections' shared parts: the prompts, our fastest path's autoregressive baseline (warmed up
    once), and the rows so far (one table: the headline acceptance's, then the others')."""

    def __init__(self, suite: Suite):
        plan, pair = suite.plan, suite.pair
        vocab = pair.target.config.vocab_size
        self.batches = [[prompt] for prompt in random_prompts(plan.spec_prompts, plan.prompt_tokens, vocab)]
        self.baseline = specdec.Decoder(pair.target, None, compile=plan.compile, step="device", time_phases=False)
        self.baseline_method = self.method(suite, self.baseline)
        self.baseline_warm = False
        self.rows: list[dict] = suite.tables.setdefault("speculative", [])

    def method(self, suite: Suite, decoder: specdec.Decoder) -> Method:
        device, new_tokens = suite.pair.target.device, suite.plan.spec_new_tokens
        return Method(lambda batch, seed: Decoded.of(decoder.generate(torch.tensor(batch, device=device), None,
                                                                      new_tokens, None, seed)), compiled=True)


def speculative_section(suite: Suite, budget: Budget) -> None:
    """Per k (likely best first), at the headline acceptance: the first call (a capture, and at the first k a
    compile), the verification's cost, then the baseline and speculative interleaved per prompt."""
    run = suite.speculative = SpeculativeRun(suite)
    try:
        for index, k in enumerate(suite.plan.ks):
            kind = "spec_k:first" if index == 0 else "spec_k"  # the first k compiles; the later ones capture
            guess = suite.first_call_guess(True) * (1.0 if index == 0 else 0.25)
            rows = suite.attempt(budget, f"k = {k} at acceptance {HEADLINE_ACCEPTANCE}", kind, guess,
                                 lambda: speculative_rows(suite, run, k, (HEADLINE_ACCEPTANCE,)), device_step=True)
            if rows:
                run.rows += rows
                suite.results["spec_ks_measured"] = [*(suite.results["spec_ks_measured"] or []), k]
                headline_speculative(suite, run.rows)
                show_speculative(suite, run.rows, echo=False)
    finally:
        release(run.baseline)
    show_speculative(suite, run.rows)


def spec_acceptances_section(suite: Suite, budget: Budget) -> None:
    """The other acceptances at the k values the headline measured, the baseline interleaved again."""
    run = suite.speculative or SpeculativeRun(suite)
    try:
        for k in suite.results["spec_ks_measured"] or []:
            rows = suite.attempt(budget, f"k = {k} at acceptances {suite.plan.more_acceptances}", "spec_k",
                                 suite.first_call_guess(True) * 0.5,
                                 lambda: speculative_rows(suite, run, k, suite.plan.more_acceptances),
                                 device_step=True)
            if rows:
                run.rows += rows
                show_speculative(suite, run.rows, echo=False)
    finally:
        release(run.baseline)
    show_speculative(suite, run.rows)


def speculative_rows(suite: Suite, run: SpeculativeRun, k: int, acceptances: tuple[float, ...]) -> list[dict]:
    """One k at ``acceptances``: each decoder's first call timed apart (what a new k costs: its compilations and
    its capture), the verification of k + 1 tokens profiled, then every method interleaved."""
    plan, pair, clock = suite.plan, suite.pair, suite.clock
    decoders, first_calls = {}, {}
    for alpha in acceptances:
        decoders[alpha] = specdec.Decoder(pair.target, specdec.ModelDrafter(pair.draft, compile=plan.compile),
                                          specdec.SyntheticAcceptance(alpha), specdec.FixedLength(k),
                                          compile=plan.compile, step="device", time_phases=False)
        graphs_before, start = compilations(), clock.now()
        run.method(suite, decoders[alpha]).decode(run.batches[0], 0)
        first_calls[alpha] = (clock.now() - start, compilations() - graphs_before)
    verify = verification_seconds(suite, k)
    methods = {"baseline": run.baseline_method, **{alpha: run.method(suite, decoder)
                                                   for alpha, decoder in decoders.items()}}
    tallies = {alpha: warm_up(methods[alpha], run.batches, clock) for alpha in acceptances}
    tallies["baseline"] = Tally() if run.baseline_warm else warm_up(run.baseline_method, run.batches, clock)
    run.baseline_warm = True
    time_interleaved(methods, run.batches, clock, tallies)
    release(*decoders.values())
    base = tallies["baseline"]
    rows = []
    for alpha in acceptances:
        spec = tallies[alpha]
        measured_alpha = pooled_acceptance(spec.stats)
        decode_speedup = decode_rate(spec.stats) / decode_rate(base.stats)
        first_call_s, compiles = first_calls[alpha]
        row = {
            "acceptance": alpha, "k": k, "measured_acceptance": round(measured_alpha, 3),
            "baseline_tok_s": round(base.tokens_per_s, 1), "spec_tok_s": round(spec.tokens_per_s, 1),
            "speedup": round(spec.tokens_per_s / base.tokens_per_s, 3), "decode_speedup": round(decode_speedup, 3),
            "predicted": None, "measured_over_predicted": None, "verify_ms": None,
            "first_call_s": round(first_call_s, 2), "compiles": compiles,
            "steady_call_s": round(spec.seconds / len(spec.stats), 3),
            "compilations_while_timed": spec.compilations_while_timed,
        }
        if suite.costs is not None and verify is not None:
            costs = CostModel.at_batch_one(suite.costs.draft_step(), {**suite.costs.target.seconds[1], k + 1: verify})
            predicted = costs.speedup(measured_alpha, k)
            row.update(predicted=round(predicted, 3), measured_over_predicted=round(decode_speedup / predicted, 3),
                       verify_ms=round(1000 * verify, 3))
        rows.append(row)
    return rows


def verification_seconds(suite: Suite, k: int) -> float | None:
    """The target's forward of k + 1 tokens as the step runs it (where the cost ratio was measured: the prediction
    needs both)."""
    if suite.costs is None:
        return None
    plan = suite.plan
    seconds = time_forwards(suite.pair.target, profile_prompt(suite), [k + 1], plan.cost_repeats,
                            cache_layout="static" if plan.compile else "dynamic", compile=plan.compile,
                            clock=suite.clock, label="target", forward="lean" if captures_forwards(suite) else "auto",
                            captured=captures_forwards(suite))
    return seconds[k + 1]


def headline_speculative(suite: Suite, rows: list[dict]) -> None:
    """The best k at the headline acceptance by end-to-end speedup, and its measured decode speedup over the
    prediction."""
    headline = [row for row in rows if row["acceptance"] == HEADLINE_ACCEPTANCE]
    if not headline:
        return
    best = max(headline, key=lambda row: row["speedup"])
    suite.results.update(spec_speedup_a07_best=best["speedup"], spec_speedup_a07_best_k=best["k"],
                         spec_measured_over_predicted_a07=best["measured_over_predicted"])
    hf_best = suite.results["hf_best_ar_batch1_tok_s"]  # the same prompt and output lengths, batch 1
    if hf_best:
        suite.results["spec_a07_best_over_hf_best_ar"] = round(best["spec_tok_s"] / hf_best, 3)


def show_speculative(suite: Suite, rows: list[dict], echo: bool = True) -> None:
    plan = suite.plan
    suite.show(
        "speculative", f"## Speculative at synthetic acceptance (batch 1, {plan.spec_prompts} prompts x "
        f"{plan.spec_new_tokens} tokens; our fastest path: lean forward, compile={plan.compile}, the step on the "
        f"device)", rows or [{"k": "none measured"}],
        "`speedup`: tokens/s over the baseline's, end to end; `decode_speedup`: the same after each call's first step "
        "(the prefill's), which is what the predictions model; `predicted`: Leviathan's expected tokens per step "
        "over the measured costs (draft step, verification of k + 1 tokens; on CUDA each forward timed as a replay of "
        "its CUDA graph, as the device step runs it); `measured_over_predicted` = decode_speedup / predicted; "
        "`first_call_s`: the k's first call (its compilations, `compiles` graphs, and its capture); "
        "`steady_call_s`: a timed call's mean.", echo)


def embedded_section(suite: Suite, budget: Budget) -> None:
    """The embedded pair as experiments.bench compares it (ours eager; transformers' generate() and assisted
    generation at the same algorithm and at its defaults), with ours compiled as a user runs it: one Decoder per
    method, reused across calls (its captures kept). Greedy, k = 4, batch 1."""
    plan = suite.plan
    compiled = plan.compile and suite.device_step_refused is None
    if plan.compile and not compiled:
        budget.skip("the embedded pair's compiled methods", f"the preflight failed ({suite.device_step_refused})")
    rows = suite.tables.setdefault("embedded", [])
    for dtype in plan.embedded_dtypes:
        measured = suite.attempt(budget, f"embedded pair in {dtype}", "embedded", suite.first_call_guess(compiled),
                                 lambda: embedded_row(plan, dtype, compiled))
        if measured is not None:
            rows.append(measured)
            first = rows[0]  # our fastest speculative path: the compiled one where it ran
            suite.results["embedded_ours_over_hf_assisted"] = first.get("compiled_spec_vs_hf_assisted",
                                                                        first["spec_vs_hf_assisted"])
            suite.results["identical_greedy_tokens"] = first["identical_tokens"]
            show_embedded(suite, rows, echo=False)
    show_embedded(suite, rows)


def show_embedded(suite: Suite, rows: list[dict], echo: bool = True) -> None:
    plan = suite.plan
    suite.show("embedded", f"## The embedded pair: ours vs transformers (greedy, k = 4, batch 1, "
               f"{plan.embedded_prompts} prompts x {plan.embedded_new_tokens} tokens)",
               rows or [{"dtype": "none measured"}],
               "`compiled_spec_vs_hf_assisted`: our compiled speculative path over transformers' assisted "
               "generation at the same algorithm (num_assistant_tokens=4, constant schedule, confidence "
               "threshold 0); `identical_tokens`: every method, ours and transformers', emitted the same tokens. "
               f"transformers {transformers.__version__}.", echo)


def embedded_row(plan: Plan, dtype: str, compiled: bool) -> dict:
    pair = load_bench_pair("embedded", plan.embedded_prompts, plan.device, dtype)
    methods = comparison_methods(pair, 4, 0.0, plan.embedded_new_tokens, compiled=False)
    decoders = {}
    if compiled:
        decoders = {"ours_baseline_compiled": specdec.Decoder(pair.target, None, compile=True),
                    "ours_speculative_compiled": specdec.Decoder(
                        pair.target, specdec.ModelDrafter(pair.draft, compile=True), specdec.Speculative(),
                        specdec.FixedLength(4), compile=True)}
        methods.update({name: kept_decoder_method(pair, decoder, plan.embedded_new_tokens)
                        for name, decoder in decoders.items()})
    batches = [[prompt] for prompt in pair.prompts]
    with torch.no_grad():
        tallies = run_interleaved(methods, batches, Clock(pair.target.device), timed_models=(pair.draft, pair.target))
    release(*decoders.values())
    return {"dtype": dtype, **comparison_row(tallies, 0.0, 4, compiled)}


def kept_decoder_method(pair, decoder: specdec.Decoder, new_tokens: int) -> Method:
    """One of our Decoders on each batch (token lists, left-padded), stopping at the pair's EOS."""
    def decode(batch, seed):
        ids, mask = left_pad(batch, device=pair.target.device)
        return Decoded.of(decoder.generate(ids, mask, new_tokens, pair.eos_token_id, seed))
    return Method(decode, compiled=True)


def host_reads_section(suite: Suite, budget: Budget) -> None:
    """Reads per step: the difference between a long and a short call's reads over the difference of their steps
    (a call's first and last reads are a constant), on the device step and on the host loop."""
    pair, plan = suite.pair, suite.plan
    prompts = torch.tensor(random_prompts(1, plan.prompt_tokens, pair.target.config.vocab_size, seed=5),
                           device=pair.target.device)  # [1, T]
    rows = []
    for step in ("device", "host"):
        compiled = step == "device" and plan.compile
        decoder = specdec.Decoder(pair.target, specdec.ModelDrafter(pair.draft, compile=compiled),
                                  specdec.Greedy(), specdec.FixedLength(3), compile=compiled, step=step,
                                  time_phases=False)
        row = suite.attempt(budget, f"host reads, {step} step", f"reads:{step}", suite.first_call_guess(compiled),
                            lambda: count_reads(decoder, prompts, plan.reads_new_tokens), device_step=step == "device")
        release(decoder)
        if row is not None:
            rows.append({"step": step, **row})
    suite.tables["host_reads"] = rows
    suite.results["host_reads_per_step"] = next((row["reads_per_step"] for row in rows if row["step"] == "device"),
                                                None)
    suite.show("host_reads", "## Host reads per step (greedy, k = 3, batch 1)", rows or [{"step": "none measured"}],
               "Counted as tests/test_device_step.py counts them (item, tolist, bool, int, float, index).")


def count_reads(decoder: specdec.Decoder, prompts: torch.Tensor, new_tokens: int) -> dict:
    decoder.generate(prompts, None, new_tokens, None, 0)  # warm: compiles, allocates
    counts = {}
    for tokens in (max(new_tokens // 4, 2), new_tokens):
        with HostReads() as reads:
            out = decoder.generate(prompts, None, tokens, None, 0)
        counts[tokens] = (reads.count, out.stats.target_forwards + 1)  # steps: the prefill's and the rest
    (short_reads, short_steps), (long_reads, long_steps) = counts.values()
    return {"steps_short": short_steps, "steps_long": long_steps, "reads_short": short_reads,
            "reads_long": long_reads,
            "reads_per_step": round((long_reads - short_reads) / max(long_steps - short_steps, 1), 2)}


def study_section(suite: Suite, budget: Budget) -> None:
    """One short study job as a subprocess, W&B offline (``WANDB_MODE=offline``, its files in the run directory),
    within the section's budget. Its run directory is a new scratch directory (never a resumed run, and never the
    output folder, whose files a GPU lease brings back only a few of); where wandb is not installed the job runs
    with ``logger=none`` and the row says so; without hydra (the GPU image has none) it is skipped."""
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-suite-study-"))
    logger = "wandb" if importlib.util.find_spec("wandb") is not None else "none"
    command = [sys.executable, "-m", "experiments.run", "experiment=gpt2_xl_study", *suite.plan.study_overrides,
               f"logger={logger}", f"hydra.run.dir={run_dir}"]
    row = {"command": " ".join(["python", *command[1:]]), "logger": logger if logger == "wandb" else
           "none (wandb is not installed)", "run_dir": str(run_dir), "exit_code": None}
    if importlib.util.find_spec("hydra") is None:
        budget.skip("the study job", "hydra is not installed (docs/gpu-session.md: the bundle that carries it)")
    elif suite.plan.compile and suite.device_step_refused is not None:
        budget.skip("the study job", f"the preflight failed ({suite.device_step_refused})")
    elif budget.allows("the study job", suite.first_call_guess(True)):
        environment = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}
        try:
            done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True,
                                  timeout=max(budget.left(), 1.0))
            row["exit_code"] = done.returncode
            row["output_tail"] = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        except subprocess.TimeoutExpired:
            row["exit_code"] = "timed out"
        row.update(study_summary(run_dir))
    suite.tables["study"] = [row]
    suite.results["study_ok"] = row["exit_code"] == 0 and row.get("wandb_offline_runs", 0) > 0
    shown = {key: value for key, value in row.items() if key != "output_tail"}
    suite.show("study", "## The GPT-2 XL study preset, one job (W&B offline where wandb is installed)", [shown],
               f"Last lines of its output:\n\n```\n{row.get('output_tail', '')}\n```")


def study_summary(run_dir: Path) -> dict:
    """What the job's summary.json and rows say, and how many W&B offline runs it left."""
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    speedup = summary.get("metrics", {}).get("speedup", {}).get("mean")
    speedup = round(speedup, 3) if isinstance(speedup, float) else speedup
    return {"status": summary.get("status"), "compile": summary.get("compile"),
            "compile_seconds": summary.get("compile_seconds"), "speedup_mean": speedup,
            "wandb_offline_runs": len(list(run_dir.glob("wandb/offline-run-*")))}


SECTIONS = {
    "preflight": preflight_section,
    "bandwidth": bandwidth_section,
    "ar_batch1": ar_batch1_section,
    "cost_ratio": cost_ratio_section,
    "speculative": speculative_section,
    "embedded": embedded_section,
    "ar_batches": ar_batches_section,
    "spec_acceptances": spec_acceptances_section,
    "study": study_section,
    "host_reads": host_reads_section,
}


# --- the profile of one captured step -----------------------------------------------------------------------------

PROFILE_NEW_TOKENS = 32  # the profiled call: about ten replayed steps at acceptance 0.7, k = 4


def profile_step(suite: Suite, k: int, out: Path) -> dict:
    """A torch.profiler trace of a call on a kept capture at k (synthetic acceptance 0.7, our fastest path), and
    its summary: device time against gaps per replayed step, and the kernels that cost most (``step_timeline``).
    Writes ``trace-k<k>.json.gz`` (the Chrome trace); ``main`` writes the summary (``profile-k<k>.md``, ``.json``)."""
    pair, plan = suite.pair, suite.plan
    decoder = specdec.Decoder(pair.target, specdec.ModelDrafter(pair.draft, compile=plan.compile),
                              specdec.SyntheticAcceptance(HEADLINE_ACCEPTANCE), specdec.FixedLength(k),
                              compile=plan.compile, step="device", time_phases=False)
    prompt = profile_prompt(suite)
    for seed in (0, 1):  # compiles and captures; then runs on the kept capture, warm
        decoder.generate(prompt, None, PROFILE_NEW_TOKENS, None, seed)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if prompt.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        output = decoder.generate(prompt, None, PROFILE_NEW_TOKENS, None, 2)
    release(decoder)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / f"trace-k{k}.json"
    profiler.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    with trace.open("rb") as plain, gzip.open(f"{trace}.gz", "wb") as packed:
        shutil.copyfileobj(plain, packed)
    trace.unlink()
    summary = {"k": k, "acceptance": HEADLINE_ACCEPTANCE, "target_forwards": output.stats.target_forwards,
               "emitted": sum(map(len, output.tokens)), **step_timeline(events)}
    top = summary.pop("top_kernels")
    suite.tables["profile"] = [summary]
    suite.tables["profile_kernels"] = top
    suite.show("profile", f"## One call on a kept capture at k = {k} (synthetic acceptance {HEADLINE_ACCEPTANCE}, "
               f"{PROFILE_NEW_TOKENS} new tokens), profiled", [summary],
               "The window runs from the first CUDA graph launch to the end of the last device activity; `busy_us`: "
               "the union of kernel, copy and set intervals in it; `gap_us` = window - busy (the device idle between "
               "kernels: launch latency inside graphs, and the host between replays); per step: over the graph "
               "launches (each launch replays one step). Chrome trace: `trace-k<k>.json.gz` (chrome://tracing, "
               "Perfetto).")
    suite.show("profile_kernels", "## The kernels that cost most in the window", top or [{"kernel": "none (no "
                                                                                          "device kernels traced)"}])
    return suite.payload()


def step_timeline(events: list[dict]) -> dict:
    """Device time against gaps in a trace's replayed steps (Kineto's Chrome-trace events, times in us): the window
    from the first ``cudaGraphLaunch`` (else the first device event) to the end of the last device event; busy, the
    union of device intervals (kernels, copies, sets) in it; gaps, the rest; per step, each over the launches."""
    device = [event for event in events if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and "dur" in event]
    launches = sorted(event["ts"] for event in events if event.get("cat") == "cuda_runtime"
                      and str(event.get("name", "")).startswith("cudaGraphLaunch"))
    empty = {"graph_launches": len(launches), "window_us": 0.0, "busy_us": 0.0, "gap_us": 0.0, "busy_share": None,
             "step_us": None, "kernel_us_per_step": None, "kernels_per_step": None, "top_kernels": []}
    if not device:
        return empty
    start = launches[0] if launches else min(event["ts"] for event in device)
    window = [event for event in device if event["ts"] >= start]
    if not window:
        return empty
    end = max(event["ts"] + event["dur"] for event in window)
    busy = union_length([(event["ts"], event["ts"] + event["dur"]) for event in window])
    kernels = [event for event in window if event["cat"] == "kernel"]
    steps = max(len(launches), 1)
    totals: dict[str, list[float]] = {}
    for event in kernels:
        totals.setdefault(event["name"], []).append(event["dur"])
    kernel_time = sum(sum(durations) for durations in totals.values())
    top = sorted(totals.items(), key=lambda item: -sum(item[1]))[:15]
    return {
        "graph_launches": len(launches), "window_us": round(end - start, 1), "busy_us": round(busy, 1),
        "gap_us": round(end - start - busy, 1), "busy_share": round(busy / (end - start), 3) if end > start else None,
        "step_us": round((end - start) / steps, 1), "kernel_us_per_step": round(kernel_time / steps, 1),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "top_kernels": [{"kernel": name[:90], "count": len(durations), "total_us": round(sum(durations), 1),
                         "share_of_kernel_time": round(sum(durations) / kernel_time, 3)} for name, durations in top],
    }


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by [start, end) intervals (overlaps counted once)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


# --- the command --------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    """The arguments, each checked before anything loads: a refusal is one line and exit 2 (argparse's)."""
    from specdec.models import PRESETS

    parser = argument_parser("experiments.gpu_suite", __doc__)
    parser.add_argument("--plan", choices=tuple(PLANS), default="short",
                        help="short: the headline in 8 minutes on an H100 (default); full: every figure")
    parser.add_argument("--smoke", action="store_true", help="the plan rehearsed on CPU with tiny models and budgets")
    parser.add_argument("--compile", action="store_true",
                        help="compile on CPU too (the smoke plan does not by default; it measures what a k compiles)")
    parser.add_argument("--pair", choices=("tiny", *PRESETS), default=None,
                        help="the pair of the main sections: a load_pair preset or 'tiny' (default: the plan's)")
    parser.add_argument("--out", default=None,
                        help="directory for gpu-<kind>.md and .json (default docs/bench; --smoke: outputs/gpu_suite/)")
    parser.add_argument("--sections", type=names_from(SECTIONS, "sections"), default=None,
                        help="comma-separated sections to run after the preflight, in the plan's order (default: the "
                             "plan's)")
    parser.add_argument("--budget", type=positive_seconds, default=None,
                        help="seconds for the whole suite (default: the plan's)")
    parser.add_argument("--profile", type=k_to_profile, default=None, metavar="K",
                        help="instead of the suite: a torch.profiler trace of a call on a kept capture at this k")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("the GPU suite needs CUDA (torch sees no GPU); --smoke runs it on CPU")
    args.out = args.out or str(default_out_dir("gpu_suite") if args.smoke else REPO / "docs" / "bench")
    parser.check(lambda: check_writable("--out", args.out))
    return args


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return seconds


def k_to_profile(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 16:
        raise argparse.ArgumentTypeError(f"expected a k from 1 to 16, got {text!r}")
    return int(text)


def plan_from(args: argparse.Namespace) -> Plan:
    """The plan the (checked) arguments ask for."""
    plan = smoke(PLANS[args.plan]) if args.smoke else PLANS[args.plan]
    if args.budget is not None:
        plan = replace(plan, budget_seconds=args.budget)
    if args.pair is not None:
        plan = replace(plan, pair=args.pair)
    if args.compile:
        plan = replace(plan, compile=True)
    if args.sections is not None:
        plan = replace(plan, sections=tuple(name for name in plan.sections if name in args.sections))
    return plan


def main(argv=None) -> dict:
    args = parse_args(argv)
    plan = plan_from(args)
    out = Path(args.out)
    if plan.threads:
        torch.set_num_threads(plan.threads)
    name = device_name(torch.device(plan.device))
    path = out / (f"gpu-{device_kind(name)}.md" if args.profile is None else f"profile-k{args.profile}.md")
    suite = Suite(plan, checkpoint=lambda: write(suite, path))
    suite.results["device"] = name
    suite.header = header(plan, name)
    start = time.monotonic()
    with torch.inference_mode():
        if args.profile is not None:
            profile_step(suite, args.profile, out)
        else:
            suite.run({section: SECTIONS[section] for section in ("preflight", *plan.sections)})
    payload = write(suite, path)
    print(f"[gpu_suite] {time.monotonic() - start:.0f} s in all; wrote {path} and its .json", flush=True)
    return payload


def write(suite: Suite, path: Path) -> dict:
    """The Markdown and the JSON, written again after every item and section, so a run stopped at its time limit
    still leaves what it measured."""
    payload = suite.payload()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(suite.markdown())
    path.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    return payload


def header(plan: Plan, name: str) -> str:
    gpu = f"{name}, " if name != "cpu" else ""
    return (f"# GPU suite: {name}\n\n{datetime.date.today().isoformat()}; {gpu}torch {torch.__version__}, "
            f"transformers {transformers.__version__} (figures of transformers' methods are this version's); plan "
            f"`{plan.name}`, pair `{plan.pair}` in {plan.dtype}, compile={plan.compile}. Written by "
            f"`python -m experiments.gpu_suite`; the JSON beside this file holds every figure.")


def headline_table(suite: Suite) -> str:
    rows = [{"key": key, "value": suite.results.get(key)} for key in (*HEADLINE_KEYS, "spec_a07_best_over_hf_best_ar",
                                                                      "host_reads_per_step", "study_ok")]
    fastest = f"; our fastest autoregressive mode at batch 1: `{suite.fastest_ar}`" if suite.fastest_ar else ""
    return (f"## Headline figures (null: not measured)\n\n{markdown(rows)}\n\n(Targets in issues 24 and 36"
            f"{fastest}.)")


def sections_table(suite: Suite) -> str:
    rows = [{"section": name, "status": record.status, "seconds": round(record.seconds, 1),
             "budget_seconds": round(record.budget_seconds), "skipped": "; ".join(record.skipped),
             "failed": "; ".join(record.failed), "error": record.error or ""} for name, record in suite.records.items()]
    return f"## Sections (time lines)\n\n{markdown(rows)}" if rows else "## Sections\n\nnone run"


if __name__ == "__main__":
    main()
