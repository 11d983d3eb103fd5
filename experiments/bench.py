"""Benchmark specdec against transformers, profile the pair's costs, and measure batch scaling.

    python -m experiments.bench                       # embedded pair (the README table)
    python -m experiments.bench --pair gpt2-xl-shaped # GPT-2 small -> XL shapes, random weights: costs only
    python -m experiments.bench --pair gpt2-xl        # the real pair, where the hub is reachable

Everything is measured as ``experiments.common.harness`` measures: one process, after warm-up, methods interleaved per
prompt (the order changing per prompt, balanced), the device synchronised before every clock read. Prints Markdown
tables and writes them with a JSON copy to --out.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

import specdec
from experiments.common.harness import (
    Decoded, Method, Pair, Report, add_pair_options, argument_parser, cost_profile, load_bench_pair,
    markdown, parse_pair_options, positive_int, positive_ints, run_interleaved, temperatures,
    transformers_configuration, transformers_generate,
)
from specdec import Clock
from specdec.batching import left_pad
from specdec.costs import CostModel


def ours(pair: Pair, k: int | None, temperature: float, max_new_tokens: int, batch: list[list[int]], seed: int,
         stop_at_eos: bool = True, compile: bool = False) -> Decoded:
    """Our decoding of one batch."""
    ids, mask = left_pad(batch, device=pair.target.device)
    out = specdec.generate(pair.target, ids, draft=pair.draft if k else None, attention_mask=mask, k=k or 1,
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           eos_token_id=pair.eos_token_id if stop_at_eos else None, seed=seed, compile=compile)
    return Decoded.of(out)


HF_METHODS = ["hf_generate", "hf_assisted", "hf_assisted_default"]


def comparison_methods(pair: Pair, k: int, temperature: float, max_new_tokens: int, compiled: bool) -> dict:
    """Ours (eager; with ``compiled`` also compiled), transformers' generate(), and its assisted generation at the
    same algorithm and at its defaults."""
    eos = pair.eos_token_id
    methods = {
        "ours_baseline": Method(lambda b, i: ours(pair, None, temperature, max_new_tokens, b, i)),
        "ours_speculative": Method(lambda b, i: ours(pair, k, temperature, max_new_tokens, b, i)),
        "hf_generate": Method(lambda b, i: transformers_generate(
            pair.target, pair.draft, b, max_new_tokens, None, temperature, i, eos)),
        "hf_assisted": Method(lambda b, i: transformers_generate(
            pair.target, pair.draft, b, max_new_tokens, k, temperature, i, eos)),
        "hf_assisted_default": Method(lambda b, i: transformers_generate(
            pair.target, pair.draft, b, max_new_tokens, 1, temperature, i, eos, assistant_setting="default")),
    }
    if compiled:
        methods["ours_baseline_compiled"] = Method(
            lambda b, i: ours(pair, None, temperature, max_new_tokens, b, i, compile=True), compiled=True)
        methods["ours_speculative_compiled"] = Method(
            lambda b, i: ours(pair, k, temperature, max_new_tokens, b, i, compile=True), compiled=True)
    return methods


def comparison_table(pair: Pair, ks: list[int], temperatures: list[float], max_new_tokens: int, clock: Clock,
                     compiled: bool = False, rounds: int = 1) -> list[dict]:
    """Ours against transformers (``comparison_methods``), every method interleaved per prompt; each prompt is
    decoded ``rounds`` times per method (prompt by prompt, round after round)."""
    rows = []
    batches = [[p] for p in pair.prompts] * rounds
    for temperature in temperatures:
        for k in ks:
            methods = comparison_methods(pair, k, temperature, max_new_tokens, compiled)
            tallies = run_interleaved(methods, batches, clock, timed_models=(pair.draft, pair.target))
            rows.append(comparison_row(tallies, temperature, k, compiled))
            print(markdown([rows[-1]]), flush=True)
    return rows


def comparison_row(tallies: dict, temperature: float, k: int, compiled: bool) -> dict:
    def rate(name: str) -> float:
        return tallies[name].tokens_per_s

    outputs = [t.outputs for t in tallies.values()]
    row = {
        "temperature": temperature,
        "k": k,
        **{f"{name}_tok_s": round(t.tokens_per_s, 1) for name, t in tallies.items()},
        "spec_vs_hf_assisted": round(rate("ours_speculative") / rate("hf_assisted"), 2),
        "baseline_vs_hf_generate": round(rate("ours_baseline") / rate("hf_generate"), 2),
        "spec_speedup": round(rate("ours_speculative") / rate("ours_baseline"), 2),
        "ours_spec_overhead": round(tallies["ours_speculative"].overhead, 3),
        "hf_assisted_overhead": round(tallies["hf_assisted"].overhead, 3),
    }
    if compiled:
        row["compiled_spec_vs_hf_assisted"] = round(rate("ours_speculative_compiled") / rate("hf_assisted"), 2)
        row["compiled_spec_speedup"] = round(rate("ours_speculative_compiled") / rate("ours_baseline_compiled"), 2)
        row["compiled_warmup_s"] = round(tallies["ours_baseline_compiled"].warmup_seconds
                                         + tallies["ours_speculative_compiled"].warmup_seconds, 1)
        row["compilations_while_timed"] = tallies["ours_speculative_compiled"].compilations_while_timed
    row["identical_tokens"] = all(o == outputs[0] for o in outputs) if temperature == 0 else "n/a (sampled)"
    return row


def baseline_summary(rows: list[dict]) -> str:
    """The baselines do not depend on k, so each row of a temperature measures the same ratio again: their mean
    is the steadier figure on a noisy machine."""
    lines = []
    for temperature in dict.fromkeys(row["temperature"] for row in rows):
        ratios = [row["ours_baseline_tok_s"] / row["hf_generate_tok_s"] for row in rows if row["temperature"] == temperature]
        lines.append(f"Baseline vs `generate()` at temperature {temperature}: mean {statistics.mean(ratios):.3f} over "
                     f"{len(ratios)} interleaved measurements (min {min(ratios):.2f}, max {max(ratios):.2f}).")
    return "\n".join(lines)


def cost_row(costs: CostModel) -> dict:
    """The cost profile in milliseconds per forward, and the cost ratio c."""
    row = {"draft_forward_1_ms": 1000 * costs.draft_step(),
           **{f"target_forward_{n}_ms": 1000 * seconds for n, seconds in costs.target.seconds[1].items()},
           "cost_ratio": costs.cost_ratio()}
    return {key: round(value, 3) for key, value in row.items()}


def predicted_table(costs: CostModel, ks: list[int]) -> list[dict]:
    """Predicted speedup per alpha and k, twice: Leviathan's formula (verifying k+1 tokens costs one target step)
    and the same expected tokens per step over the measured costs (``CostModel.speedup``)."""
    rows = []
    for alpha in (0.6, 0.7, 0.8):
        formula = {f"k={k}": round(specdec.predicted_speedup(alpha, k, costs.cost_ratio()), 2) for k in ks}
        measured = {f"k={k}": round(costs.speedup(alpha, k), 2) for k in ks}
        rows += [{"alpha": alpha, "verify cost": "1 step (formula)", **formula},
                 {"alpha": alpha, "verify cost": "measured", **measured}]
    return rows


def batch_scaling(pair: Pair, k: int, batch_sizes: list[int], max_new_tokens: int, clock: Clock,
                  rounds: int = 1) -> list[dict]:
    """Speculative and baseline tokens/s per batch size (greedy), every size and method interleaved per round
    (a shared machine's speed drifts, and sizes measured one after another would drift apart), after a warm-up.

    Every batch size decodes the same work: the first max(batch_sizes) prompts (cycled), split into batches of
    that size, once per round. EOS is ignored so that every row emits max_new_tokens: rows that stop after a token
    or two would shrink the batch at once, and the table would measure the prompts instead of the batch size. Rows
    still finish at different steps (those that accept more drafts sooner) and leave the batch; ``spec_live_rows``
    is the share of the full batch's row-steps in which a row was still generating.
    """
    work = [pair.prompts[i % len(pair.prompts)] for i in range(max(batch_sizes))]

    def decode_work(size: int, draft_length: int | None) -> Method:
        def run(_, seed: int) -> Decoded:
            parts = [ours(pair, draft_length, 0.0, max_new_tokens, work[start : start + size], seed,
                          stop_at_eos=False) for start in range(0, len(work), size)]
            return Decoded([row for part in parts for row in part.tokens],
                           tuple(stats for part in parts for stats in part.stats))
        return Method(run)

    methods = {}
    for size in batch_sizes:
        methods[("spec", size)] = decode_work(size, k)
        methods[("baseline", size)] = decode_work(size, None)
    tallies = run_interleaved(methods, [None] * rounds, clock, timed_models=(pair.draft, pair.target))
    rows = []
    for size in batch_sizes:
        spec = tallies[("spec", size)]
        # a row's target calls count its prefill, which target_forwards (verification passes) leaves out
        live = (sum(s.target_calls - len(s.rows) for s in spec.stats)
                / sum(len(s.rows) * s.target_forwards for s in spec.stats))
        rows.append({"batch": size, "spec_tok_s": spec.tokens_per_s,
                     "baseline_tok_s": tallies[("baseline", size)].tokens_per_s,
                     "spec_overhead": round(spec.overhead, 3), "spec_live_rows": round(live, 2)})
    for row in rows:
        for name in ("spec", "baseline"):
            row[f"{name}_vs_batch_1"] = round(row[f"{name}_tok_s"] / rows[0][f"{name}_tok_s"], 2)
        row["spec_tok_s"], row["baseline_tok_s"] = round(row["spec_tok_s"], 1), round(row["baseline_tok_s"], 1)
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    """Every value is checked here, before any model loads."""
    parser = argument_parser("experiments.bench", __doc__)
    parser.add_argument("--pair", default="embedded", help="a load_pair preset: embedded, gpt2-xl-shaped, ...")
    parser.add_argument("--prompts", type=positive_int, default=24, help="prompts per configuration")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="times each prompt is decoded per method in the comparison with transformers")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--ks", type=positive_ints, default="1,2,3,4,5,6,7,8", help="draft lengths to compare")
    parser.add_argument("--temperatures", type=temperatures, default="0,1", help="sampling temperatures to compare")
    parser.add_argument("--batch-sizes", type=positive_ints, default="1,4,8,16")
    parser.add_argument("--repeats", type=positive_int, default=20, help="timed repeats per forward in the cost profile")
    parser.add_argument("--batch-rounds", type=positive_int, default=3, help="times the batch-scaling work is decoded")
    parser.add_argument("--skip-comparison", action="store_true", help="cost profile and batch scaling only")
    parser.add_argument("--compiled", action="store_true", help="also compare our compiled path (compile=True)")
    add_pair_options(parser, "bench.md and bench.json")
    return parse_pair_options(parser, argv, "bench")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_bench_pair(args.pair, args.prompts, args.device, args.dtype)
    clock = Clock(pair.target.device)
    device = f"{pair.target.device} {next(pair.target.parameters()).dtype}, torch threads {torch.get_num_threads()}"
    report = Report()
    report.add(f"# specdec benchmark: {pair.name}\n\n{device}; {args.prompts} prompts x {args.max_new_tokens} new "
               f"tokens, {args.rounds} round(s) in the comparison", echo=False)

    prompt = torch.tensor([pair.prompts[0]], device=pair.target.device)  # [1, T]
    costs = cost_profile(pair, prompt, range(1, 10), args.repeats, clock)  # verifying k drafts feeds k + 1
    report.table("## Cost profile (ms per forward, batch 1)", [cost_row(costs)])
    if not pair.meaningful_acceptance:
        report.table("## Predicted speedup (random weights, so predicted only; measured c and verify costs)",
                     predicted_table(costs, args.ks))
    if not args.skip_comparison:
        with torch.no_grad():
            rows = comparison_table(pair, args.ks, args.temperatures, args.max_new_tokens, clock, args.compiled,
                                    args.rounds)
        summary = baseline_summary(rows)
        report.table("## Ours vs transformers (tokens/s, batch 1)", rows,
                     f"{summary}\n\n{transformers_configuration(pair.target, HF_METHODS)}", echo=False)
        print(summary, flush=True)
    with torch.no_grad():
        scaling = batch_scaling(pair, 4, args.batch_sizes, args.max_new_tokens, clock, args.batch_rounds)
    report.table("## Batch scaling (greedy, k = 4, EOS ignored; the same prompts at every batch size)", scaling)

    out = Path(args.out)
    report.write(out / "bench.md", {"args": vars(args), "sections": report.sections})
    print(f"\nwritten to {out}/bench.md")


if __name__ == "__main__":
    main()
