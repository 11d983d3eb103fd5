"""The GPU suite: every figure issue 24 asks of a GPU, from one command, in under 9 minutes on one H100.

    python -m experiments.gpu_suite                  # writes docs/bench/gpu-<kind>.md and .json (kind: nvidia-h100)
    python -m experiments.gpu_suite --out "$OUT"     # the same two files under $OUT
    python -m experiments.gpu_suite --sections ar_batch1,speculative   # some sections only
    python -m experiments.gpu_suite --smoke --out /tmp/smoke          # every section on CPU, tiny models and budgets

Sections, in order (the most wanted first, so a short lease loses the least):

1. ``bandwidth``: a device-to-device copy of a large buffer (bytes read + written), the memory bound's rate.
2. ``ar_batch1``: autoregressive tokens/s of ``gpt2-xl-shaped`` at batch 1, ours in four modes (``eager``:
   transformers' forward; ``compiled``: the same, compile=True, host loop; ``lean``: specdec.lean's forward, eager;
   ``lean_compiled``: lean, compile=True, the step on the device), beside the bound (weights bytes / bandwidth per
   token) and transformers' own fastest path as the peer (``hf_static``: generate() over a static cache, which
   transformers compiles itself on CUDA; ``hf_static_compiled``: its docs' recipe, torch.compile on the model's
   forward; ``hf_generate``: plain generate()).
3. ``speculative``: our fastest path (``lean_compiled``) at synthetic acceptance 0.6, 0.7, 0.8 for each k (GPT-2
   small drafting), speedup over the same path's autoregressive baseline, beside the prediction from measured costs
   (the draft step and the verification of k + 1 tokens, each compiled forward timed on its own,
   ``harness.cost_profile``); and the best k's tokens/s over transformers' fastest autoregressive path.
4. ``embedded``: the shipped pair, ours (eager and compiled) vs transformers' assisted generation at the same
   algorithm, greedy, k = 4, and whether every method emitted identical tokens.
5. ``host_reads``: host reads per step of the device step (counted as tests/test_device_step.py counts them) and of
   the host loop.
6. ``study``: one short ``experiment=gpt2_xl_study`` job, W&B offline, as a subprocess.
7. ``ar_batches``: the autoregressive modes at the larger batch sizes.

Each section has a share of the suite's budget; time a section leaves unused goes to the next. Inside a section each
item (a method's first call, which compiles; a k) is first estimated (from the longest item of its kind so far, or
a first guess) and skipped with a line saying so when it does not fit what is left. A section that fails records its
error in the JSON and the Markdown and the suite goes on. A time line per section says what it took. Timing as in
``experiments.harness``: warm-up first, methods interleaved, the device synchronised before every clock read.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers

import specdec
from experiments.bench import comparison_table
from experiments.harness import (
    Decoded, HostReads, Method, Report, argument_parser, compile_forward, cost_profile, default_out_dir,
    load_bench_pair, markdown, measured_cost_speedup, names_from, random_prompts, time_interleaved,
    transformers_generate, transformers_static_generate, warm_up,
)
from experiments.refusal import check_writable
from experiments.shapes_bench import copy_bandwidth, decode_rate, pooled_acceptance, weight_bytes
from specdec import Clock
from specdec.models import ModelPair

REPO = Path(__file__).resolve().parents[1]

# The JSON's headline keys (issue 24), null where their section was skipped or failed.
HEADLINE_KEYS = (
    "device", "copy_bandwidth_tbps", "ar_batch1_tok_s", "ar_batch1_share_of_bound", "hf_best_ar_batch1_tok_s",
    "draft_target_cost_ratio", "spec_speedup_a07_best", "spec_speedup_a07_best_k", "spec_measured_over_predicted_a07",
    "embedded_ours_over_hf_assisted", "identical_greedy_tokens",
)

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
    """What the suite measures and the seconds it may spend."""

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
    acceptances: tuple[float, ...]
    ks: tuple[int, ...]  # in the order measured: the likely best k of acceptance 0.7 first
    spec_prompts: int
    spec_new_tokens: int
    cost_repeats: int
    reads_new_tokens: int  # the longer call of the host_reads section (the shorter: a quarter)
    embedded_dtypes: tuple[str, ...]  # the first gives the headline
    embedded_prompts: int
    embedded_new_tokens: int
    study_overrides: tuple[str, ...]
    budget_seconds: float  # the whole suite, model loading included
    shares: dict = field(default_factory=dict)  # section -> seconds it may count on
    first_call_guess: dict = field(default_factory=dict)  # "compiled"/"eager" -> seconds of a first call not yet seen


FULL = Plan(  # one H100 or H200: 520 s of sections, ~30 s of imports and loading, inside a 600 s device call
    device="cuda", pair="gpt2-xl-shaped", dtype="bfloat16", compile=True, threads=None, modes=tuple(AR_MODES),
    peers=HF_PEERS, batch_sizes=(1, 8, 64), prompt_tokens=32, ar_new_tokens=128, ar_rounds=3,
    acceptances=(0.6, 0.7, 0.8), ks=(3, 4, 5, 2, 6, 1, 7, 8), spec_prompts=4, spec_new_tokens=128, cost_repeats=20,
    reads_new_tokens=64, embedded_dtypes=("float32", "bfloat16"), embedded_prompts=8, embedded_new_tokens=64,
    study_overrides=("pair=gpt2-xl-shaped", "strategy=synthetic", "strategy.acceptance=0.7", "sampling=greedy",
                     "draft_length.k=4", "num_prompts=3", "max_new_tokens=64", "warmup=1", "dtype=bfloat16"),
    budget_seconds=520.0,
    shares={"bandwidth": 5, "ar_batch1": 170, "speculative": 150, "embedded": 60, "host_reads": 15, "study": 75,
            "ar_batches": 40},
    first_call_guess={"compiled": 60.0, "eager": 5.0},  # the H200's first compiled GPT-2 XL call took 44 s
)
SMOKE = Plan(  # CPU, tiny models, ~15 s
    device="cpu", pair="tiny", dtype="float32", compile=False, threads=1, modes=("lean_compiled", "lean", "eager"),
    peers=("hf_static", "hf_generate"), batch_sizes=(1, 2), prompt_tokens=6, ar_new_tokens=4, ar_rounds=1,
    acceptances=(0.6, 0.7, 0.8), ks=(2, 1), spec_prompts=1, spec_new_tokens=6, cost_repeats=2,
    reads_new_tokens=24, embedded_dtypes=("float32",), embedded_prompts=1, embedded_new_tokens=4,
    study_overrides=("pair=embedded", "device=cpu", "dtype=float32", "compile=false", "strategy=synthetic",
                     "strategy.acceptance=0.7", "sampling=greedy", "draft_length.k=2", "num_prompts=1",
                     "max_new_tokens=4", "warmup=1"),
    budget_seconds=120.0,
    shares={"bandwidth": 1, "ar_batch1": 15, "speculative": 15, "embedded": 20, "host_reads": 5, "study": 45,
            "ar_batches": 5},
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
        line = f"skipped {what}: needs ~{estimate:.0f} s, {max(self.left(), 0):.0f} s left in the section"
        print(f"[gpu_suite] {line}", flush=True)
        self.skipped.append(line)
        return False


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
    """One run of the suite: the plan, the models, what every section measured (``results``), the Markdown."""

    def __init__(self, plan: Plan, now: Callable[[], float] = time.monotonic):
        self.plan, self.now = plan, now
        self.started = now()
        self.report = Report()
        self.results: dict = {key: None for key in HEADLINE_KEYS}
        self.tables: dict[str, list[dict]] = {}
        self.records: dict[str, SectionRecord] = {}
        self.estimates = Estimates()
        self.pair: ModelPair | None = None
        self.clock: Clock | None = None
        self.bandwidth: float | None = None  # bytes/s
        self.fastest_ar: str | None = None  # our fastest autoregressive mode at batch 1

    def left(self) -> float:
        return self.plan.budget_seconds - (self.now() - self.started)

    def run(self, sections: dict[str, Callable[[Suite, Budget], None]],
            after_section: Callable[[], object] = lambda: None) -> None:
        """Run each section in turn within its budget, then ``after_section``; a failure is recorded, and the next
        section runs."""
        names = list(sections)
        for index, name in enumerate(names):
            later = sum(self.plan.shares.get(later_name, 0.0) for later_name in names[index + 1:])
            record = self.records[name] = SectionRecord(budget_seconds=section_budget(self.left(), later))
            budget = Budget(record.budget_seconds, self.now)
            start = self.now()
            try:
                sections[name](self, budget)
                record.status = "done"
            except Exception as err:  # a section's failure must not cost the others their figures
                traceback.print_exc()
                record.status, record.error = "failed", f"{type(err).__name__}: {first_line(err)}"
                self.report.add(f"**Section `{name}` failed**: {record.error}")
            record.seconds, record.skipped, record.failed = self.now() - start, budget.skipped, budget.failed
            print(time_line(name, record), flush=True)
            after_section()

    def attempt(self, budget: Budget, what: str, kind: str, guess: float, work: Callable[[], object]):
        """Run ``work`` if its estimate (by ``kind``) fits the budget, and learn its time. None when skipped, or when
        it raised: the error is recorded and the section goes on."""
        if not budget.allows(what, self.estimates.of(kind, guess)):
            return None
        start = self.now()
        try:
            value = work()
        except Exception as err:  # one method's failure (a compile that breaks, say) must not cost the others
            traceback.print_exc()
            budget.failed.append(f"{what}: {type(err).__name__}: {first_line(err)}")
            return None
        self.estimates.add(kind, self.now() - start)
        return value

    def first_call_guess(self, compiled: bool) -> float:
        return self.plan.first_call_guess["compiled" if compiled else "eager"]

    def payload(self) -> dict:
        """The JSON: headline keys first, then the plan, the sections' records and every table's rows."""
        return {**self.results, "plan": asdict(self.plan), "sections": {name: asdict(record) for name, record
                                                                        in self.records.items()},
                "tables": self.tables}


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
    suite.report.table("## Memory bound (a 2 GiB device-to-device copy, bytes read + written; CUDA only)", [row])


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
    interleaved per round after each method's first call; the methods whose first call does not fit are skipped."""
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
        what = f"{name} at batch {size}"
        tally = suite.attempt(budget, f"{what} (first call)", f"first:{name}", suite.first_call_guess(method.compiled),
                              lambda: warm_up(method, rounds, clock))
        if tally is not None:
            methods[name], tallies[name] = method, tally
    if methods:  # a few calls each, cheaper than any first call: never skipped once the first calls are paid
        time_interleaved(methods, rounds, clock, tallies)
    rows = [ar_row(suite, name, size, tallies.get(name)) for name in candidates]
    reference = tallies.get("eager")
    for row, name in zip(rows, candidates):
        timed = tallies.get(name)
        row["tokens_equal_eager"] = (timed.outputs == reference.outputs if timed and reference and timed.outputs
                                     and reference.outputs else None)
    release(*(decoder for _, decoder in candidates.values() if decoder is not None))
    suite.tables[f"ar_batch{size}"] = rows
    note = ("`tok_s` is emitted tokens per second over the timed rounds, end to end (prefill, and for the device "
            "step its two eager steps and the capture of its graph, included); `decode_tok_s` the same after each "
            "call's first step (ours only: transformers reports no step times); `first_call_s` is each method's "
            "untimed first call (compilation included); `tokens_equal_eager`: the same greedy tokens as our eager "
            "transformers mode (bf16 kernels may break near-ties differently: the embedded pair's fp32 check is "
            "the correctness figure).")
    suite.report.table(f"## Autoregressive, batch {size} ({plan.pair}, {plan.dtype}, {plan.prompt_tokens}-token "
                       f"prompts, {plan.ar_new_tokens} new tokens, {plan.ar_rounds} rounds)", rows, note)
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


def speculative_section(suite: Suite, budget: Budget) -> None:
    """Per k (likely best first): the costs a prediction needs, then our fastest path's baseline and each
    acceptance interleaved per prompt."""
    plan, pair, clock = suite.plan, suite.pair, suite.clock
    vocab = pair.target.config.vocab_size
    profile_prompt = torch.tensor(random_prompts(1, plan.prompt_tokens, vocab, seed=99), device=pair.target.device)
    batches = [[prompt] for prompt in random_prompts(plan.spec_prompts, plan.prompt_tokens, vocab)]
    baseline = specdec.Decoder(pair.target, None, compile=plan.compile, step="device", time_phases=False)
    rows = []
    try:
        for k in plan.ks:
            guess = suite.first_call_guess(True) * 2  # a new target width to compile, then every decoder's first call
            measured = suite.attempt(budget, f"k = {k}", "spec_k", guess,
                                     lambda: speculative_rows(suite, baseline, k, batches, profile_prompt))
            rows += measured or []
    finally:
        release(baseline)
    suite.tables["speculative"] = rows
    headline_speculative(suite, rows)
    suite.report.table(
        f"## Speculative at synthetic acceptance (batch 1, {plan.spec_prompts} prompts x {plan.spec_new_tokens} "
        f"tokens; our fastest path: lean forward, compile={plan.compile}, the step on the device)", rows,
        "`speedup`: tokens/s over the baseline's, end to end; `decode_speedup`: the same after each call's first step "
        "(the prefill's), which is what the predictions model; `predicted`: Leviathan's expected tokens per step "
        "over the measured costs (draft step, verification of k + 1 tokens; on CUDA each forward timed as a replay of "
        "its CUDA graph, as the device step runs it); `measured_over_predicted` = decode_speedup / predicted.")


def speculative_rows(suite: Suite, baseline: specdec.Decoder, k: int, batches: list, prompt: torch.Tensor) -> list:
    plan, pair, clock = suite.plan, suite.pair, suite.clock
    captured = pair.target.device.type == "cuda"  # time each forward as the device step's graph runs it
    costs = cost_profile(pair, prompt, sorted({1, k + 1}), plan.cost_repeats, clock, plan.compile, captured)
    if suite.results["draft_target_cost_ratio"] is None:
        suite.results["draft_target_cost_ratio"] = round(costs.cost_ratio, 3)
    decoders = {"baseline": baseline}
    for alpha in plan.acceptances:
        decoders[alpha] = specdec.Decoder(pair.target, specdec.ModelDrafter(pair.draft, compile=plan.compile),
                                          specdec.SyntheticAcceptance(alpha), specdec.FixedLength(k),
                                          compile=plan.compile, step="device", time_phases=False)
    methods = {name: Method(lambda batch, seed, decoder=decoder: Decoded.of(decoder.generate(
        torch.tensor(batch, device=pair.target.device), None, plan.spec_new_tokens, None, seed)), compiled=True)
        for name, decoder in decoders.items()}
    tallies = {name: warm_up(method, batches, clock) for name, method in methods.items()}
    time_interleaved(methods, batches, clock, tallies)
    release(*(decoder for name, decoder in decoders.items() if name != "baseline"))
    base = tallies["baseline"]
    rows = []
    for alpha in plan.acceptances:
        spec = tallies[alpha]
        measured_alpha = pooled_acceptance(spec.stats)
        decode_speedup = decode_rate(spec.stats) / decode_rate(base.stats)
        predicted = measured_cost_speedup(measured_alpha, k, costs)
        rows.append({
            "acceptance": alpha, "k": k, "measured_acceptance": round(measured_alpha, 3),
            "baseline_tok_s": round(base.tokens_per_s, 1), "spec_tok_s": round(spec.tokens_per_s, 1),
            "speedup": round(spec.tokens_per_s / base.tokens_per_s, 3), "decode_speedup": round(decode_speedup, 3),
            "predicted": round(predicted, 3), "measured_over_predicted": round(decode_speedup / predicted, 3),
            "draft_ms": round(1000 * costs.draft_step, 3), "target_ms": round(1000 * costs.target_step, 3),
            "verify_ms": round(1000 * costs.verify(k), 3), "first_call_s": round(spec.warmup_seconds, 1),
            "compilations_while_timed": spec.compilations_while_timed,
        })
    print(markdown(rows), flush=True)
    return rows


def headline_speculative(suite: Suite, rows: list[dict]) -> None:
    """The best k at acceptance 0.7 by end-to-end speedup, and its measured decode speedup over the prediction."""
    at_07 = [row for row in rows if row["acceptance"] == 0.7]
    if not at_07:
        return
    best = max(at_07, key=lambda row: row["speedup"])
    suite.results.update(spec_speedup_a07_best=best["speedup"], spec_speedup_a07_best_k=best["k"],
                         spec_measured_over_predicted_a07=best["measured_over_predicted"])
    hf_best = suite.results["hf_best_ar_batch1_tok_s"]  # the same prompt and output lengths, batch 1
    if hf_best:
        suite.results["spec_a07_best_over_hf_best_ar"] = round(best["spec_tok_s"] / hf_best, 3)


def embedded_section(suite: Suite, budget: Budget) -> None:
    """The embedded pair through experiments.bench's comparison (ours eager and compiled, transformers' generate()
    and assisted generation at the same algorithm and at its defaults), greedy, k = 4, batch 1."""
    plan = suite.plan
    rows = []
    for dtype in plan.embedded_dtypes:
        measured = suite.attempt(budget, f"embedded pair in {dtype}", "embedded", suite.first_call_guess(True) / 2,
                                 lambda: embedded_row(plan, dtype))
        if measured is not None:
            rows.append(measured)
    suite.tables["embedded"] = rows
    if rows:
        first = rows[0]  # our fastest speculative path: the compiled one where the plan compiles
        suite.results["embedded_ours_over_hf_assisted"] = first.get("compiled_spec_vs_hf_assisted",
                                                                    first["spec_vs_hf_assisted"])
        suite.results["identical_greedy_tokens"] = first["identical_tokens"]
    suite.report.table(f"## The embedded pair: ours vs transformers (greedy, k = 4, batch 1, {plan.embedded_prompts} "
                       f"prompts x {plan.embedded_new_tokens} tokens)", rows or [{"dtype": "none measured"}],
                       "`compiled_spec_vs_hf_assisted`: our compiled speculative path over transformers' assisted "
                       "generation at the same algorithm (num_assistant_tokens=4, constant schedule, confidence "
                       "threshold 0); `identical_tokens`: every method, ours and transformers', emitted the same "
                       "tokens.")


def embedded_row(plan: Plan, dtype: str) -> dict:
    pair = load_bench_pair("embedded", plan.embedded_prompts, plan.device, dtype)
    with torch.no_grad():
        [row] = comparison_table(pair, [4], [0.0], plan.embedded_new_tokens, Clock(pair.target.device),
                                 compiled=plan.compile)
    return {"dtype": dtype, **row}


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
                            lambda: count_reads(decoder, prompts, plan.reads_new_tokens))
        release(decoder)
        if row is not None:
            rows.append({"step": step, **row})
    suite.tables["host_reads"] = rows
    suite.results["host_reads_per_step"] = next((row["reads_per_step"] for row in rows if row["step"] == "device"),
                                                None)
    suite.report.table("## Host reads per step (greedy, k = 3, batch 1)", rows or [{"step": "none measured"}],
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
    with ``logger=none`` and the row says so."""
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-suite-study-"))
    logger = "wandb" if importlib.util.find_spec("wandb") is not None else "none"
    command = [sys.executable, "-m", "experiments.run", "experiment=gpt2_xl_study", *suite.plan.study_overrides,
               f"logger={logger}", f"hydra.run.dir={run_dir}"]
    row = {"command": " ".join(["python", *command[1:]]), "logger": logger if logger == "wandb" else
           "none (wandb is not installed)", "run_dir": str(run_dir), "exit_code": None}
    if budget.allows("the study job", suite.first_call_guess(True)):
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
    suite.report.table("## The GPT-2 XL study preset, one job (W&B offline where wandb is installed)", [shown],
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
    "bandwidth": bandwidth_section,
    "ar_batch1": ar_batch1_section,
    "speculative": speculative_section,
    "embedded": embedded_section,
    "host_reads": host_reads_section,
    "study": study_section,
    "ar_batches": ar_batches_section,
}


# --- the command --------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser("experiments.gpu_suite", __doc__)
    parser.add_argument("--smoke", action="store_true", help="every section on CPU with tiny models and budgets")
    parser.add_argument("--out", default=None,
                        help="directory for gpu-<kind>.md and .json (default docs/bench; --smoke: outputs/gpu_suite/)")
    parser.add_argument("--sections", type=names_from(SECTIONS, "sections"), default=",".join(SECTIONS),
                        help="comma-separated sections to run, in the suite's order (default: all)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole suite (default: the plan's)")
    args = parser.parse_args(argv)
    if args.budget is not None and not 0 < args.budget < math.inf:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget}")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("the GPU suite needs CUDA (torch sees no GPU); --smoke runs it on CPU")
    args.out = args.out or str(default_out_dir("gpu_suite") if args.smoke else REPO / "docs" / "bench")
    parser.check(lambda: check_writable("--out", args.out))
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    if args.budget is not None:
        plan = Plan(**{**asdict(plan), "budget_seconds": args.budget})
    out = Path(args.out)
    allow_many_shapes()
    if plan.threads:
        torch.set_num_threads(plan.threads)
    suite = Suite(plan)
    start = time.monotonic()
    suite.pair = load_models(plan)
    suite.clock = Clock(suite.pair.target.device)
    name = device_name(suite.pair.target.device)
    suite.results["device"] = name
    kind = device_kind(name)
    print(f"[gpu_suite] {name}: models loaded in {time.monotonic() - start:.1f} s", flush=True)
    suite.report.add(header(plan, name))
    chosen = {section: SECTIONS[section] for section in SECTIONS if section in args.sections}
    path = out / f"gpu-{kind}.md"
    with torch.inference_mode():
        suite.run(chosen, after_section=lambda: write(suite, path))
    payload = write(suite, path)
    print(f"[gpu_suite] {time.monotonic() - start:.0f} s in all; wrote {path} and its .json", flush=True)
    return payload


def write(suite: Suite, path: Path) -> dict:
    """The Markdown (sections so far, then the headline and the time lines) and the JSON, written again after every
    section, so a run stopped at its time limit still leaves what it measured."""
    payload = suite.payload()
    report = Report()
    report.sections = [*suite.report.sections, headline_table(suite), sections_table(suite)]
    report.write(path, payload)
    return payload


def allow_many_shapes() -> None:
    """One compiled forward meets many shapes here (three batch sizes, k + 1 for eight k): past dynamo's limit of
    recompilations (8 by default) it would fall back to eager silently. (``cache_size_limit`` is its older name.)"""
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)


def header(plan: Plan, name: str) -> str:
    gpu = f"{name}, " if name != "cpu" else ""
    return (f"# GPU suite: {name}\n\n{datetime.date.today().isoformat()}; {gpu}torch {torch.__version__}, "
            f"transformers {transformers.__version__}; pair `{plan.pair}` in {plan.dtype}, compile={plan.compile}. "
            f"Written by "
            f"`python -m experiments.gpu_suite`; the JSON beside this file holds every figure.")


def headline_table(suite: Suite) -> str:
    rows = [{"key": key, "value": suite.results.get(key)} for key in (*HEADLINE_KEYS, "spec_a07_best_over_hf_best_ar",
                                                                      "host_reads_per_step", "study_ok")]
    fastest = f"; our fastest autoregressive mode at batch 1: `{suite.fastest_ar}`" if suite.fastest_ar else ""
    return f"## Headline figures (null: not measured)\n\n{markdown(rows)}\n\n(Targets in issue 24{fastest}.)"


def sections_table(suite: Suite) -> str:
    rows = [{"section": name, "status": record.status, "seconds": round(record.seconds, 1),
             "budget_seconds": round(record.budget_seconds), "skipped": "; ".join(record.skipped),
             "failed": "; ".join(record.failed), "error": record.error or ""} for name, record in suite.records.items()]
    return f"## Sections (time lines)\n\n{markdown(rows)}" if rows else "## Sections\n\nnone run"


if __name__ == "__main__":
    main()
