"""The GPU suite's sections, each ``section(suite, budget)``, in ``SECTIONS`` (the preflight's first), and the
profile of one captured step (``profile_step``); the module docstring of ``experiments.gpu_suite`` says what each
measures."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

import specdec
from experiments.bench import comparison_methods, comparison_row
from experiments.gpu.models import decoder_method, device_name, release
from experiments.gpu.plan import AR_MODES, AR_PRIORITY, HEADLINE_ACCEPTANCE, HF_PEERS, SuitePlan
from experiments.gpu.preflight import preflight_section
from experiments.gpu.schedule import Budget, Suite
from experiments.harness import (
    Decoded, HostReads, Method, Tally, compilations, compile_forward, cost_profile, load_bench_pair,
    random_prompts, run_interleaved, time_interleaved, transformers_generate,
    transformers_static_generate, warm_up_method,
)
from experiments.shapes_bench import copy_bandwidth, decode_rate, pooled_acceptance, weight_bytes
from specdec import Clock
from specdec.batching import left_pad
from specdec.costs import CostModel
from specdec.models import ModelPair
from specdec.profile import time_forwards
from specdec.trace import step_timeline

REPO = Path(__file__).resolve().parents[2]
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
                              suite.first_call_guess(method.compiled), lambda: warm_up_method(method, rounds, clock),
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


def ar_method(pair: ModelPair, plan: SuitePlan, mode: str, ids: torch.Tensor):
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
    tallies = {alpha: warm_up_method(methods[alpha], run.batches, clock) for alpha in acceptances}
    tallies["baseline"] = Tally() if run.baseline_warm else warm_up_method(run.baseline_method, run.batches, clock)
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


def embedded_row(plan: SuitePlan, dtype: str, compiled: bool) -> dict:
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
