"""The cost model against the loop: what ``cost_optimal``'s start-up table prices each draft length at, beside what
the loop's own steps take, in fresh processes.

    python -m experiments.cost_check                                  # batch 1, T = 1, k = 0..8, 4 calls each
    python -m experiments.cost_check --batch-size 16 --temperature 0 --processes 6

Each process measures the table as the policy does at start-up (``specdec.costs.measure_costs``, at the batch size),
then decodes the same ``--calls`` batches with every fixed k = 0..``--k-max`` (k = 0: the plain loop), interleaved
in the orders of a balanced design after a warm-up call each, EOS ignored, and keeps the seconds of each timed step's
verification and drafting as the policy sees them (``StepTimes``: the steps that drafted all k). A draft
length is chosen on the prices of the widths against each other, so the table gives, per k, the loop's price of a
verification of k + 1 tokens over one token's against the table's (``price error``): where they differ, the
policy ranks the draft lengths by a profile the loop does not have. The drafting seconds per step are the loop's
beside the table's forwards (the loop also samples each drafted token, which the table does not time).

Rows of a speculating call finish unevenly and leave, so its later forwards compute fewer rows; the table is read
at the mean rows fed by each k's steps. ``--processes N`` runs N fresh processes one after another: on a
CPU the forwards' prices by width move between processes and from one second to the next (docs/load.md), and the
last table lists each process's largest price error.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import torch

import specdec
from experiments.common.harness import (
    Report, add_pair_options, argument_parser, load_pair_here, parse_pair_options,
    positive_int, single_temperature, time_interleaved, warm_up_method,
)
from experiments.common.processes import add_process_options, run_in_processes
from experiments.load_bench import call_batches, policy_method
from specdec.costs import CostModel, measure_costs


class StepTimes(specdec.FixedLength):
    """Fixed k that keeps, of each decode step that drafted all k tokens, its verification's and drafting's seconds
    as the policies see them (``StepOutcome``) and the rows it fed: not the prefill's step, nor the shorter steps the
    loop takes near ``max_new_tokens``."""

    def __init__(self, k: int):
        super().__init__(k)
        self.steps: list[tuple[float, float, int]] = []

    def observe(self, outcome) -> None:
        if outcome.k == self.k and math.isfinite(outcome.target_seconds):
            self.steps.append((outcome.target_seconds, outcome.draft_seconds, len(outcome.num_accepted)))

    def costs(self) -> dict[str, float]:
        """The mean step's verification and drafting seconds, and rows fed."""
        verify, draft, rows = (statistics.fmean(column) for column in zip(*self.steps))
        return {"verify": verify, "draft": draft, "rows": rows}


def plain_costs(tally, batch_size: int) -> dict[str, float]:
    """The plain loop's seconds per forward after the prefill; its rows finish together (EOS ignored)."""
    forwards = sum(stats.target_forwards for stats in tally.stats)
    return {"verify": sum(stats.target_step_seconds for stats in tally.stats) / forwards, "draft": 0.0,
            "rows": float(batch_size)}


def compare(costs: CostModel, loop: dict[int, dict[str, float]]) -> list[dict]:
    """Per k, the table's and the loop's verification (ms), the price of k + 1 tokens over one token in each and
    the loop's error against the table's, and the drafting per step (ms)."""
    plain_table, plain_loop = costs.verify(0, loop[0]["rows"]), loop[0]["verify"]
    rows = []
    for k, measured in loop.items():
        table_verify = costs.verify(k, measured["rows"])
        table_price, loop_price = table_verify / plain_table, measured["verify"] / plain_loop
        table_draft = costs.draft_chain(k, measured["rows"])
        rows.append({"k": k, "rows fed": round(measured["rows"], 2), "table verify ms": round(1000 * table_verify, 3),
                     "loop verify ms": round(1000 * measured["verify"], 3), "table price": round(table_price, 3),
                     "loop price": round(loop_price, 3), "price error": round(loop_price / table_price - 1, 3),
                     "table draft ms": round(1000 * table_draft, 3),
                     "loop draft ms": round(1000 * measured["draft"], 3)})
    return rows


def check_here(args: argparse.Namespace) -> tuple[str, list[dict]]:
    """This process's table and loop, compared (``compare``)."""
    pair, clock, where = load_pair_here(args, args.batch_size * (args.first_call + args.calls))
    policies = {k: StepTimes(k) for k in range(1, args.k_max + 1)}
    methods = {k: policy_method(pair, policies.get(k), args.temperature, args.max_new_tokens)
               for k in range(args.k_max + 1)}
    batches = call_batches(pair.prompts, args.batch_size, args.calls, args.first_call)
    with torch.no_grad():
        costs = measure_costs(pair.target, pair.draft, args.batch_size, args.k_max)
        tallies = {k: warm_up_method(method, batches, clock) for k, method in methods.items()}
        for policy in policies.values():
            policy.steps.clear()  # the timed calls' steps only
        time_interleaved(methods, batches, clock, tallies, first_call=args.first_call)
    loop = {0: plain_costs(tallies[0], args.batch_size), **{k: policy.costs() for k, policy in policies.items()}}
    return where, compare(costs, loop)


def largest_error(rows: list[dict]) -> dict:
    worst = max(rows, key=lambda row: abs(row["price error"]))
    return {"largest price error": worst["price error"], "at k": worst["k"]}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser("experiments.cost_check", __doc__)
    parser.add_argument("--pair", default="embedded", help="a load_pair preset with a shared tokenizer")
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--temperature", type=single_temperature, default="1")
    parser.add_argument("--k-max", type=positive_int, default=8, help="the draft lengths checked: 0..k_max")
    parser.add_argument("--calls", type=positive_int, default=4, help="timed calls per draft length")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    add_process_options(parser)
    add_pair_options(parser, "cost_check.md and cost_check.json")
    args = parse_pair_options(parser, argv, "cost_check")
    parser.check(lambda: check_room(args.k_max, args.max_new_tokens))
    return args


def check_room(k_max: int, max_new_tokens: int) -> None:
    """Every k is timed on the steps that draft all of it, after the prefill's: a call whose first step emits k + 1
    tokens must leave room for one more such step."""
    if 2 * (k_max + 1) > max_new_tokens:
        raise ValueError(f"--k-max {k_max} with --max-new-tokens {max_new_tokens}: a call must have room for a step "
                         f"drafting all k after the first; need 2 (k_max + 1) <= --max-new-tokens")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.processes > 1:
        results = run_in_processes("experiments.cost_check", args, "cost_check.json", args.calls)
        where, processes = results[0]["where"], [result["processes"][0] for result in results]
    else:
        where, table = check_here(args)
        processes = [table]
    report = Report()
    report.add(f"# The start-up cost table against the loop: {where}; batch {args.batch_size}, T = {args.temperature}, "
               f"{args.calls} calls per draft length, {args.max_new_tokens} new tokens per row, EOS ignored")
    for index, table in enumerate(processes):
        report.table(f"## Process {index + 1}" if len(processes) > 1 else "## Per draft length", table)
    if len(processes) > 1:
        report.table("## Each process's largest price error",
                     [{"process": index + 1, **largest_error(table)} for index, table in enumerate(processes)])
    report.write(Path(args.out) / "cost_check.md", {"args": vars(args), "where": where, "processes": processes})
    print(f"\nwritten to {args.out}/cost_check.md")


if __name__ == "__main__":
    main()
