"""Choose a static token tree for a pair on this machine from measurements, then measure the choice beside the
prediction.

    python -m experiments.tree_search                                   # embedded pair, fp32, greedy, 16 nodes
    python -m experiments.tree_search --dtype bfloat16
    python -m experiments.tree_search --pair gpt2-xl-shaped --dtype bfloat16 --acceptance 0.9,0.8,0.7,0.6,0.5

1. Acceptance. A real pair, at temperature 0: on the profile prompts, the target's greedy continuation and, at each
   of its tokens, that token's rank among the draft's choices there (one draft forward over the whole sequence).
   Replaying these traces says exactly how many drafts each step of any static tree keeps: a step starting at
   token j keeps depth i while the rank of token j + i - 1 is within the tree's branching b_i (the draft's top-b_i
   children at depth i). Printed as per-position acceptance by rank. A ``*-shaped`` pair (random weights) is judged
   by ``SyntheticAcceptance`` on a per-position schedule a_i instead, where a node at depth i is kept with
   probability a_i, so depth i is reached with probability prod_{t<=i} (1 - (1 - a_t)^b_t).
2. Costs, on this machine (``specdec.costs.CostModel``, the library's one cost model): the target's forward verifying N nodes (tree mask) or k + 1 tokens (chain), the draft's
   forward of each level's width (rounds of specdec.profile's timers, fitted non-decreasing), and the loop's own
   time per step beyond its forwards, timed inside short runs of the baseline, a chain and a tree on the profile
   prompts.
3. Search: every branching (b_1, ..., b_d) with at most --node-budget nodes (d <= --max-depth). For each, the
   predicted tokens per step (the traces replayed, or the schedule's expectation, with the budget's last steps
   drafting less as the loop does) and time per step give the predicted decode speedup over the baseline, the
   same loop without a drafter. The best tree wins; the best chain (a ``ModelDrafter`` of k) is kept beside it.
4. Check: the chosen tree, the best chain and the hand-picked trees of docs/bench/trees-cpu.md (--compare) run
   interleaved with the baseline on held-out prompts (not the profile ones), as ``experiments.harness`` runs
   benches. Beside each: the search's prediction (profile prompts), the prediction for the held-out prompts
   themselves (their own greedy traces, taken before any timing, over the same costs), and the measured tau and
   decode speedup (the time per token after each call's first step, the phase the costs model), and the
   end-to-end speedup.
5. Writes ``configs/drafter/<--config-name>.yaml`` (a ``drafter=tree`` option with the chosen branching; run it with
   ``draft_length.k`` >= its depth) and the report (Markdown and JSON) to --out.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch

import specdec
from experiments.harness import (
    Decoded, Method, Report, argument_parser, bench_clock, default_out_dir, fractions, load_bench_pair,
    positive_int, positive_ints, random_prompts, run_interleaved,
)
from experiments.refusal import check_device, check_pair, check_writable
from specdec import Clock
from specdec.batching import left_pad
from specdec.costs import CostModel, CostTable, monotone
from specdec.models import SHAPED_PRESETS
from specdec.profile import time_forwards, time_tree_forwards
from specdec.train.losses import walk_trace
from specdec.tree import MAX_TREE_NODES

REPO = Path(__file__).resolve().parents[1]
# The best chain (k = 8, a branching of ones) and hand-picked trees (fp32: 2-1-1-1, bf16: 2-1-1) of
# docs/bench/trees-cpu.md, and the default tree option.
HAND_PICKED = "1-1-1-1-1-1-1-1,2-1-1-1,2-1-1,2-2-1-1"
CALIBRATION_CHAIN, CALIBRATION_TREE = (1, 1, 1, 1), (2, 2, 1)  # whose runs give the loop's time per step
CALIBRATION_PROMPTS = 4  # profile prompts the calibration runs decode
COST_CONTEXT = 128  # tokens in the cache when forwards are timed (about a prompt and its continuation)
WRITTEN_BY = "# Token tree chosen by `python -m experiments.tree_search`"  # how the options it writes begin


def parse_args(argv=None) -> argparse.Namespace:
    """Every value is checked here, before any model loads."""
    p = argument_parser("experiments.tree_search", __doc__)
    p.add_argument("--pair", default="embedded")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--node-budget", type=positive_int, default=16, help="most nodes a tree may verify per call")
    p.add_argument("--max-depth", type=positive_int, default=10, help="most levels a tree may have")
    p.add_argument("--profile-prompts", type=positive_int, default=16, help="prompts the acceptance is measured on")
    p.add_argument("--prompts", type=positive_int, default=24, help="held-out prompts the choice is measured on")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--acceptance", type=fractions, default=None,
                   help="a *-shaped pair's synthetic per-position acceptance a_1,a_2,... (the last repeats)")
    p.add_argument("--decay", type=float, default=None,
                   help="with one --acceptance: a_i = a * decay^(i-1) (default 1: the same at every depth)")
    p.add_argument("--compare", type=branchings_arg, default=HAND_PICKED,
                   help="hand-picked shapes measured beside the choice, e.g. 2-1-1,2-2-1-1 (all ones: a chain)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats per forward (costs)")
    p.add_argument("--config-name", default="tree_searched", help="writes <config-dir>/<name>.yaml")
    p.add_argument("--config-dir", type=Path, default=REPO / "configs" / "drafter",
                   help="where the chosen tree's drafter option is written (default: configs/drafter)")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for tree_search.md/.json (default: outputs/tree_search/<date_time>)")
    args = p.parse_args(argv)
    shaped = args.pair in SHAPED_PRESETS
    if shaped and args.acceptance is None:
        p.error(f"--pair {args.pair} has random weights: give its synthetic per-position --acceptance")
    if not shaped and args.acceptance is not None:
        p.error(f"--acceptance is for *-shaped pairs; {args.pair}'s acceptance is measured")
    if not shaped and args.decay is not None:
        p.error(f"--decay applies to a *-shaped pair's --acceptance; {args.pair}'s acceptance is measured, so "
                f"--decay {args.decay} would mean nothing")
    multiple = args.acceptance is not None and len(args.acceptance) > 1
    if args.decay is not None and (not 0 < args.decay <= 1 or (multiple and args.decay != 1)):
        p.error(f"--decay must be in (0, 1] and applies to a single --acceptance, got {args.decay}")
    args.decay = 1.0 if args.decay is None else args.decay
    if not args.config_name.replace("_", "").replace("-", "").isalnum():
        p.error(f"--config-name must be letters, digits, - and _, got {args.config_name!r}")
    if args.node_budget > MAX_TREE_NODES:
        p.error(f"--node-budget must be at most {MAX_TREE_NODES}, got {args.node_budget}")
    if args.node_budget < 2:
        p.error(f"--node-budget must be at least 2 (a tree has a node with 2 children; 1 node is a chain), got "
                f"{args.node_budget}")
    option = args.config_dir / f"{args.config_name}.yaml"
    if option.exists() and not (option.is_file() and option.read_text(errors="replace").startswith(WRITTEN_BY)):
        p.error(f"--config-name {args.config_name}: {option} exists and was not written by this search (a shipped "
                f"option?); choose another name, or another --config-dir")
    args.out = args.out or default_out_dir("tree_search")
    p.check(lambda: check_device("--device", args.device),
            lambda: check_pair("--pair", args.pair, args.device, args.dtype),
            lambda: check_writable("--config-dir", args.config_dir),
            lambda: check_writable("--out", args.out))
    return args


def branchings_arg(text: str) -> list[tuple[int, ...]]:
    """'2-1-1,2-2-1-1' -> [(2, 1, 1), (2, 2, 1, 1)]."""
    return [tuple(positive_ints(part.replace("-", ","))) for part in text.split(",")] if text else []


# --- shapes -----------------------------------------------------------------------------------------------------


def num_nodes(branching: tuple[int, ...]) -> int:
    """b_1 + b_1 b_2 + ... : the nodes a step verifies."""
    return sum(math.prod(branching[:depth]) for depth in range(1, len(branching) + 1))


def level_widths(branching: tuple[int, ...]) -> list[int]:
    """[d] nodes at each level."""
    return [math.prod(branching[:depth]) for depth in range(1, len(branching) + 1)]


def all_branchings(node_budget: int, max_depth: int) -> list[tuple[int, ...]]:
    """Every branching with at most ``node_budget`` nodes and ``max_depth`` levels (chains, all ones, included)."""
    found, frontier = [], [((), 0, 1)]  # (branching, nodes so far, width of its last level)
    while frontier:
        branching, nodes, width = frontier.pop()
        for b in range(1, node_budget + 1):
            grown = nodes + width * b
            if grown > node_budget or len(branching) == max_depth:
                break
            found.append(branching + (b,))
            frontier.append((branching + (b,), grown, width * b))
    return sorted(found, key=lambda shape: (num_nodes(shape), shape))


def is_chain(branching: tuple[int, ...]) -> bool:
    return all(b == 1 for b in branching)


def label(branching: tuple[int, ...]) -> str:
    return f"chain k={len(branching)}" if is_chain(branching) else "tree " + "-".join(map(str, branching))


# --- acceptance -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Steps:
    """What a decode of the prompts makes of a shape: tokens and target calls, in all and after the first step."""

    tokens: float
    calls: float
    decode_tokens: float  # after each call's first step (its target forward is the prefill)
    decode_calls: float

    @property
    def tau(self) -> float:
        return self.tokens / self.calls

    @property
    def decode_tau(self) -> float:
        return self.decode_tokens / self.decode_calls


class RankTraces:
    """Greedy traces: per profile prompt, the rank (1 = the draft's argmax) of each token of the target's greedy
    continuation among the draft's choices at its position, and the call's token budget."""

    def __init__(self, ranks: list[list[int]], max_new_tokens: int):
        self.ranks, self.max_new_tokens = ranks, max_new_tokens

    def steps(self, branching: tuple[int, ...]) -> Steps:
        """Replay each trace as the loop decodes it: a step drafts min(d, budget left - 1) levels and keeps depth i
        while the rank of the i-th next token is within b_i; an EOS ends the trace (the trace's end)."""
        tokens = calls = decode_tokens = decode_calls = 0
        for ranks in self.ranks:
            steps = walk_trace(len(ranks), len(branching), lambda done, i: ranks[done + i] <= branching[i],
                               budget=self.max_new_tokens)
            tokens, calls = tokens + len(ranks), calls + len(steps)
            decode_tokens += sum(step.kept + 1 for step in steps[1:])
            decode_calls += len(steps) - 1
        return Steps(tokens, calls, decode_tokens, decode_calls)

    def by_rank(self, depth: int, ranks: int) -> list[dict]:
        """Per-position acceptance by rank: for each depth i, over the steps a chain would reach it (every earlier
        token the draft's first choice), the share whose i-th token is the draft's r-th choice, and of any of its top
        r (a tree with b_i = r keeps depth i exactly then)."""
        rows = []
        for position in range(1, depth + 1):
            reached = [trace[j + position - 1] for trace in self.ranks for j in range(len(trace) - position + 1)
                       if all(rank == 1 for rank in trace[j : j + position - 1])]
            row = {"depth i": position, "chains reaching it": len(reached)}
            for r in range(1, ranks + 1):
                row[f"rank {r}"] = round(sum(rank == r for rank in reached) / max(len(reached), 1), 3)
            row[f"top {ranks}"] = round(sum(rank <= ranks for rank in reached) / max(len(reached), 1), 3)
            rows.append(row)
        return rows


class Schedule:
    """Synthetic per-position acceptance a_i (the last repeated), as ``SyntheticAcceptance`` judges a tree."""

    def __init__(self, rates: list[float], decay: float, prompts: int, max_new_tokens: int):
        self.strategy = specdec.SyntheticAcceptance(rates[0] if len(rates) == 1 else tuple(rates), decay=decay)
        self.prompts, self.max_new_tokens = prompts, max_new_tokens

    def rates(self, depth: int) -> list[float]:
        return self.strategy.rates(depth, torch.device("cpu")).tolist()

    def kept_distribution(self, branching: tuple[int, ...], depth: int) -> list[float]:
        """[depth + 1] P(a step drafting ``depth`` levels keeps exactly j drafts)."""
        reach, probabilities = 1.0, []
        for b, rate in zip(branching[:depth], self.rates(depth)):
            next_reach = reach * (1 - (1 - rate) ** b)  # some child of the reached node accepted
            probabilities.append(reach - next_reach)
            reach = next_reach
        return probabilities + [reach]

    def steps(self, branching: tuple[int, ...]) -> Steps:
        """Expected target calls to emit the budget (the last steps draft less), by recursion over tokens left."""
        budget = self.max_new_tokens
        calls = [0.0] * (budget + 1)  # calls[r]: expected calls to emit r more tokens
        for left in range(1, budget + 1):
            kept = self.kept_distribution(branching, min(len(branching), left - 1))
            calls[left] = 1 + sum(p * calls[left - min(j + 1, left)] for j, p in enumerate(kept))
        first = self.kept_distribution(branching, min(len(branching), budget - 1))
        first_tokens = sum(p * min(j + 1, budget) for j, p in enumerate(first))
        return Steps(self.prompts * budget, self.prompts * calls[budget], self.prompts * (budget - first_tokens),
                     self.prompts * (calls[budget] - 1))

    def table(self, depth: int) -> list[dict]:
        return [{"depth i": i, "a_i": round(rate, 4)} for i, rate in enumerate(self.rates(depth), start=1)]


def greedy_traces(pair, prompts: list[list[int]], max_new_tokens: int) -> RankTraces:
    """The target's greedy continuation of each prompt and each continuation token's rank among the draft's."""
    decoder = specdec.Decoder(pair.target, None, specdec.Speculative())
    ranks = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=pair.target.device)
            continuation = decoder.generate(ids, None, max_new_tokens, pair.eos_token_id).tokens[0]
            sequence = torch.tensor([prompt + continuation], device=pair.target.device)
            logits = pair.draft(sequence).logits[0, len(prompt) - 1 : -1].float()  # [L, V] at each token's position
            chosen = logits.gather(1, torch.tensor(continuation, device=logits.device).unsqueeze(1))  # [L, 1]
            ranks.append(((logits > chosen).sum(1) + 1).tolist())
    return RankTraces(ranks, max_new_tokens)


# --- costs ------------------------------------------------------------------------------------------------------


def forward_costs(pair, shapes: list[tuple[int, ...]], repeats: int, clock: Clock) -> CostModel:
    """Every forward the shapes need (``interleaved_costs``), over a cache of ``COST_CONTEXT`` random tokens, at
    batch 1, as the library's cost model (``specdec.costs``); the loop's overheads are calibrated apart
    (``calibrate_overheads``)."""
    vocab = pair.target.config.vocab_size
    prompt = torch.tensor(random_prompts(1, COST_CONTEXT, vocab), device=pair.target.device)  # [1, C]
    chains = sorted({len(s) + 1 for s in shapes if is_chain(s)} | {1})
    trees = sorted({num_nodes(s) for s in shapes if not is_chain(s)})
    draft_trees = sorted({w - 1 for s in shapes if not is_chain(s) for w in level_widths(s)[:-1] if w > 1})
    target_chain, target_tree = interleaved_costs(pair.target, prompt, chains, trees, repeats, clock)
    draft_chain, draft_tree = interleaved_costs(pair.draft, prompt, [1], draft_trees, repeats, clock)
    tables = [CostTable.of_widths(costs) if costs else None
              for costs in (monotone(target_chain), draft_chain, monotone(target_tree), monotone(draft_tree))]
    weight = next(pair.target.parameters())
    return CostModel(*tables, setting=f"{weight.device.type}, {str(weight.dtype).removeprefix('torch.')}")


def interleaved_costs(model, prompt: torch.Tensor, widths: list[int], node_counts: list[int], repeats: int,
                      clock: Clock) -> tuple[dict[int, float], dict[int, float]]:
    """Seconds of a causal forward of each of ``widths`` tokens and of a tree verification of each of
    ``node_counts`` nodes (``specdec.profile``: the root and N nodes under a tree mask, as the loop runs it; the cost
    depends on N, not the shape), over a cache holding ``prompt`` [1, C]: the fastest of ``repeats`` rounds, since
    load on a shared machine only ever adds time (and slows the runs it predicts alike). Each round takes every
    forward in turn, so a machine whose speed drifts moves them all alike."""
    chain_rounds, tree_rounds = [], []
    for _ in range(repeats):
        chain_rounds.append(time_forwards(model, prompt, widths, repeats=1, warmup=1, clock=clock))
        if node_counts:
            tree_rounds.append(time_tree_forwards(model, prompt, node_counts, repeats=1, warmup=1, clock=clock))
    return ({n: min(r[n] for r in chain_rounds) for n in widths},
            {n: min(r[n] for r in tree_rounds) for n in node_counts})


# --- decoding ---------------------------------------------------------------------------------------------------


def decoder_for(pair, branching: tuple[int, ...] | None, strategy) -> specdec.Decoder:
    """The baseline (None), a chain of k (``ModelDrafter``) or a tree (``TreeDrafter``), greedy."""
    if branching is None:
        return specdec.Decoder(pair.target, None, strategy)
    drafter = specdec.ModelDrafter(pair.draft) if is_chain(branching) else specdec.TreeDrafter(pair.draft, branching)
    return specdec.Decoder(pair.target, drafter, strategy, specdec.FixedLength(len(branching)))


def decode_method(decoder: specdec.Decoder, pair, max_new_tokens: int) -> Method:
    def run(batch: list[list[int]], index: int) -> Decoded:
        ids, mask = left_pad(batch, device=pair.target.device)
        return Decoded.of(decoder.generate(ids, mask, max_new_tokens, pair.eos_token_id, seed=index))
    return Method(run)


def calibrate_overheads(pair, prompts, strategy, costs: CostModel, args, clock: Clock) -> None:
    """The loop's seconds per step beyond its forwards, per kind of step: short runs on the profile prompts with
    every forward of both models timed inside them, (wall - forwards) / target calls. Measured apart from the
    forwards, so that a burst of load on a shared machine during these few runs cannot move the forward costs."""
    runs = {"baseline": None, "chain": CALIBRATION_CHAIN, "tree": CALIBRATION_TREE}
    methods = {kind: decode_method(decoder_for(pair, shape, strategy), pair, args.max_new_tokens)
               for kind, shape in runs.items()}
    tallies = run_interleaved(methods, [[p] for p in prompts], clock, timed_models=(pair.draft, pair.target))
    for kind, tally in tallies.items():
        costs.overhead[kind] = (tally.seconds - tally.forward_seconds) / sum(s.target_calls for s in tally.stats)


def cost_rows(costs: CostModel) -> list[dict]:
    """One row per width n: the target's forward of n tokens and its tree of n nodes, the draft's tree of n nodes."""
    tables = {"target, n tokens": costs.target, "target, tree of n nodes": costs.target_tree,
              "draft, n tokens": costs.draft, "draft, tree of n nodes": costs.draft_tree}
    columns = {name: table.seconds[1] if table is not None else {} for name, table in tables.items()}
    widths = sorted(set().union(*columns.values()))
    return [{"n": n, **{name: round(1000 * seconds[n], 2) if n in seconds else "" for name, seconds in
                        columns.items()}} for n in widths]


# --- search and check -------------------------------------------------------------------------------------------


def prediction(branching: tuple[int, ...], acceptance, costs: CostModel) -> dict:
    steps = acceptance.steps(branching)
    speedup = steps.decode_tau * costs.baseline_step() / costs.step(branching)
    return {"shape": label(branching), "nodes": num_nodes(branching), "predicted tau": round(steps.tau, 3),
            "step ms": round(1000 * costs.step(branching), 2), "predicted speedup": round(speedup, 3)}


def search(acceptance, costs: CostModel, shapes: list[tuple[int, ...]]) -> list[tuple[float, tuple[int, ...]]]:
    """(predicted decode speedup, shape) for every shape, best first."""
    scored = [(acceptance.steps(s).decode_tau * costs.baseline_step() / costs.step(s), s) for s in shapes]
    return sorted(scored, key=lambda item: -item[0])


def measure(pair, shapes: list[tuple[int, ...]], strategy, prompts, max_new_tokens: int, clock: Clock) -> dict:
    """Each shape and the baseline, interleaved per prompt: measured tau, decode and end-to-end speedups."""
    methods = {"baseline": decode_method(decoder_for(pair, None, strategy), pair, max_new_tokens)}
    methods.update({label(s): decode_method(decoder_for(pair, s, strategy), pair, max_new_tokens) for s in shapes})
    tallies = run_interleaved(methods, [[p] for p in prompts], clock)
    base = tallies["baseline"]
    base_decode = decode_seconds_per_token(base.stats)
    measured = {}
    for shape in shapes:
        tally = tallies[label(shape)]
        measured[shape] = {
            "tau": sum(s.emitted for s in tally.stats) / sum(s.target_calls for s in tally.stats),
            "decode tau": sum(s.decode_tokens for s in tally.stats) / sum(s.target_calls - 1 for s in tally.stats),
            "decode speedup": base_decode / decode_seconds_per_token(tally.stats),
            "speedup": tally.tokens_per_s / base.tokens_per_s,
            "same tokens as baseline": tally.outputs == base.outputs,
        }
    return measured


def decode_seconds_per_token(stats: list) -> float:
    return sum(s.wall_seconds - s.ttft_seconds for s in stats) / sum(s.decode_tokens for s in stats)


def write_config(branching: tuple[int, ...], directory: Path, name: str, setting: str, predicted: float) -> Path:
    """<directory>/<name>.yaml: a drafter=tree option with the chosen branching."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(
        f"{WRITTEN_BY} ({setting}): predicted decode speedup "
        f"{predicted:.2f}x.\n"
        f"# Run it with draft_length.k >= {len(branching)} (a step drafts min(k, {len(branching)}) levels), "
        f"e.g. drafter={name} draft_length.k={len(branching)}.\n"
        "_target_: specdec.TreeDrafter.from_pair  # TreeDrafter.from_pair(pair, compile=False, branching, "
        "label=\"draft\")\n"
        "_partial_: true  # completed by the runner once the pair is loaded\n"
        f"branching: [{', '.join(map(str, branching))}]  # children per node at each depth: "
        f"{num_nodes(branching)} nodes, {len(branching)} levels\n")
    return path


def main(argv=None) -> None:
    args = parse_args(argv)
    clock = bench_clock(args)
    shaped = args.pair in SHAPED_PRESETS
    pair = load_bench_pair(args.pair, args.profile_prompts + args.prompts, args.device, args.dtype)
    profile, held_out = pair.prompts[: args.profile_prompts], pair.prompts[args.profile_prompts :]
    setting = (f"{pair.name}, {args.dtype}, {args.device}, greedy, node budget {args.node_budget}, "
               f"{args.profile_prompts} profile and {len(held_out)} held-out prompts x {args.max_new_tokens} tokens")
    report = Report()
    report.add(f"# Tree search ({setting})")
    if shaped:
        acceptance = Schedule(args.acceptance, args.decay, args.prompts, args.max_new_tokens)
        strategy = acceptance.strategy
        report.table("## Synthetic per-position acceptance", acceptance.table(args.max_depth))
    else:
        acceptance = greedy_traces(pair, profile, args.max_new_tokens)
        strategy = specdec.Speculative()
        report.table("## Per-position acceptance by rank (profile prompts, greedy traces)",
                     acceptance.by_rank(min(args.max_depth, 8), 4),
                     "A chain keeps depth i with the rank-1 share; a tree with b_i children at depth i with the "
                     "top-b_i share.")
    shapes = all_branchings(args.node_budget, args.max_depth)
    costs = forward_costs(pair, shapes + args.compare + [CALIBRATION_CHAIN, CALIBRATION_TREE], args.repeats, clock)
    calibrate_overheads(pair, profile[:CALIBRATION_PROMPTS], strategy, costs, args, clock)
    report.table("## Costs (ms, the fastest of --repeats, batch 1)", cost_rows(costs),
                 "The loop's time per step beyond its forwards: " + ", ".join(
                     f"{kind} {1000 * seconds:.2f} ms" for kind, seconds in costs.overhead.items()) + ".")
    ranked = search(acceptance, costs, shapes)
    best_tree = next(s for _, s in ranked if not is_chain(s))
    best_chain = next(s for _, s in ranked if is_chain(s))
    report.table(f"## Best predicted of {len(shapes)} shapes",
                 [prediction(s, acceptance, costs) for _, s in ranked[:12]])
    checked = list(dict.fromkeys([best_tree, best_chain, *args.compare]))
    # The held-out prompts' own traces (a schedule is the same everywhere): what the model predicts for the very
    # prompts measured, taken before any of them is timed.
    held_out_acceptance = acceptance if shaped else greedy_traces(pair, held_out, args.max_new_tokens)
    measured = measure(pair, checked, strategy, held_out, args.max_new_tokens, clock)
    rows = []
    for shape in checked:
        predicted = prediction(shape, held_out_acceptance, costs)
        got = measured[shape]
        at_measured_tau = got["decode tau"] * costs.baseline_step() / costs.step(shape)  # the costs' prediction alone
        rows.append({"method": label(shape), "nodes": num_nodes(shape),
                     "predicted speedup (profile)": prediction(shape, acceptance, costs)["predicted speedup"],
                     "predicted tau": predicted["predicted tau"], "measured tau": round(got["tau"], 3),
                     "predicted speedup": predicted["predicted speedup"],
                     "measured decode speedup": round(got["decode speedup"], 3),
                     "measured / predicted": round(got["decode speedup"] / predicted["predicted speedup"], 3),
                     "measured / predicted at measured tau": round(got["decode speedup"] / at_measured_tau, 3),
                     "end-to-end speedup": round(got["speedup"], 3),
                     "same tokens as baseline": "n/a (synthetic)" if shaped else got["same tokens as baseline"],
                     "role": "chosen tree" if shape == best_tree else "best chain" if shape == best_chain
                     else "hand-picked"})
    report.table("## Prediction and measurement (held-out prompts, interleaved with the baseline)", rows,
                 "Speedups are over the same loop without a drafter; decode = after each call's first step, the "
                 "phase the costs model. The search ranks shapes by the profile prompts' prediction; the "
                 "prediction beside each measurement is for the held-out prompts themselves (a real pair: their own "
                 "greedy traces replayed, taken before any was timed; a synthetic schedule: its expectation) over "
                 "the same costs. The last ratio checks the costs alone: the prediction at the tau measured after "
                 "the first step (synthetic acceptance on a few prompts draws a tau of its own).")
    config = write_config(best_tree, args.config_dir, args.config_name, setting,
                          rows[0]["predicted speedup (profile)"])
    report.add(f"Wrote `{config}` (branching {list(best_tree)}).")
    report.write(args.out / "tree_search.md", {"setting": setting, "costs": costs.to_json(), "checked": rows,
                                          "chosen": list(best_tree)})


if __name__ == "__main__":
    main()
