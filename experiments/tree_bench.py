"""Token trees against chains that verify the same number of tokens, and the verify cost of trees of 1..64 nodes.

    python -m experiments.tree_bench                         # embedded pair, fp32, greedy
    python -m experiments.tree_bench --dtype bfloat16
    python -m experiments.tree_bench --verify-costs gpt2-xl-shaped --dtype bfloat16   # GPT-2 XL shapes
    python -m experiments.tree_bench --dtype bfloat16 --chains 4,8 --trees 2-1-1,2-1-1-1 --dynamic 10-6-2,16-5-4

Part 1 (the pair): each group verifies N draft nodes per target call: the chain with k = N, and trees with N nodes
(--chains and --trees replace the default groups; --dynamic adds dynamic trees, ``DynamicTreeDrafter``, of
node_budget-depth-top_k, each row's tree its own).
Every method decodes every held-out prompt in one process, interleaved with the autoregressive baseline of the same loop
(the order balanced per prompt), after a warm-up call each. Columns: tau = tokens per target call, the target's and the
draft's time per call, tokens/s, and the speedup over the baseline. At temperature 0 every method must emit the
baseline's tokens (checked).
Part 2 (--verify-costs PAIR): the target's time to verify a tree of N nodes (one forward of N + 1 tokens under the
tree mask) against one decode step, so the speedup of a tree on that hardware can be predicted: a tree of N nodes
beats a chain of k when tau_tree / tau_chain > cost(N) / cost(k) (draft costs aside).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import specdec
from experiments.common.harness import (
    Decoded, Method, Report, argument_parser, bench_clock, load_bench_pair, positive_int, positive_ints,
    random_prompts, run_interleaved, single_temperature,
)
from experiments.common.refusal import built_before_measuring, check_device, check_pair, check_writable
from specdec import Clock
from specdec.batching import left_pad
from specdec.dynamic_tree import check_tree_size
from specdec.profile import time_forwards, time_tree_forwards
from specdec.tree import check_branching, tree_shape

# Groups of methods that verify the same number N of draft nodes per target call: a chain of k = N, then trees.
DEFAULT_GROUPS = {
    4: [(2, 1), (4,)],
    6: [(2, 2), (3, 1), (2, 1, 1)],
    8: [(2, 1, 1, 1), (4, 1)],
    14: [(2, 2, 1, 1)],
}
VERIFY_NODE_COUNTS = [1, 2, 4, 8, 16, 32, 64]


def parse_args(argv=None) -> argparse.Namespace:
    p = argument_parser("experiments.tree_bench", __doc__)
    p.add_argument("--pair", default="embedded")
    p.add_argument("--prompts", type=positive_int, default=8)
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--temperature", type=single_temperature, default=0.0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--verify-costs", metavar="PAIR", default=None,
                   help="also time tree verification on this pair's target (e.g. gpt2-xl-shaped)")
    p.add_argument("--chains", type=positive_ints, default=None, help="chains of these k (replaces the groups)")
    p.add_argument("--trees", type=tree_branchings, default=None, help="static trees, e.g. 2-1-1,2-2-1-1 (replaces the "
                   "groups)")
    p.add_argument("--dynamic", type=dynamic_sizes, default=[], help="dynamic trees node_budget-depth-top_k, e.g. "
                   "10-6-2,16-5-4")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--out", type=Path, default=None, help="write the tables (Markdown) and a JSON copy here")
    args = p.parse_args(argv)
    p.check(lambda: check_device("--device", args.device),
            lambda: check_pair("--pair", args.pair, args.device, args.dtype),
            *([lambda: check_pair("--verify-costs", args.verify_costs, args.device, args.dtype)]
              if args.verify_costs else []),
            *([lambda: check_writable("--out", args.out.parent)] if args.out else []))
    return args


def branchings(text: str) -> list[tuple[int, ...]]:
    """'2-1-1,2-2-1-1' -> [(2, 1, 1), (2, 2, 1, 1)]."""
    return [tuple(positive_ints(part.replace("-", ","))) for part in text.split(",")]


def tree_branchings(text: str) -> list[tuple[int, ...]]:
    """``branchings``, each a static tree that can be verified (``specdec.tree.check_branching``)."""
    shapes = branchings(text)
    for shape in shapes:
        try:
            check_branching(shape)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return shapes


def dynamic_sizes(text: str) -> list[tuple[int, int, int]]:
    """'10-6-2,16-5-4' -> [(10, 6, 2), (16, 5, 4)], each a valid (node_budget, depth, top_k)."""
    sizes = branchings(text)
    for size in sizes:
        if len(size) != 3:
            raise argparse.ArgumentTypeError(f"expected node_budget-depth-top_k, got {'-'.join(map(str, size))!r}")
        try:
            check_tree_size(*size)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return sizes


def groups_from(args) -> dict:
    """Nodes per call -> trees: the default groups, or those --chains and --trees give (a chain of k in group k)."""
    if args.chains is None and args.trees is None:
        return DEFAULT_GROUPS
    groups: dict[int, list] = {k: [] for k in args.chains or []}
    for branching in args.trees or []:
        groups.setdefault(tree_shape(branching).num_nodes, []).append(branching)
    return dict(sorted(groups.items()))


def tree_label(branching: tuple[int, ...]) -> str:
    return "tree " + "-".join(map(str, branching))


def decoders(pair, groups: dict, temperature: float, dynamic: list = (), chains: bool = True
             ) -> dict[str, tuple[specdec.Decoder, int]]:
    """Name -> (decoder, nodes verified per call): the baseline, then per group the chain (unless ``chains`` is
    False: --trees without --chains) and its trees, then the dynamic trees."""
    sampling = specdec.SamplingConfig(temperature=temperature)
    made = {"baseline": (specdec.Decoder(pair.target, None, specdec.Speculative(), sampling=sampling), 0)}

    def add(name: str, drafter, depth: int, nodes: int) -> None:
        made[name] = (specdec.Decoder(pair.target, drafter, specdec.Speculative(), specdec.FixedLength(depth),
                                      sampling), nodes)

    for nodes, trees in groups.items():
        if chains:
            add(f"chain k={nodes}", specdec.ModelDrafter(pair.draft), nodes, nodes)
        for branching in trees:
            add(tree_label(branching), specdec.TreeDrafter(pair.draft, branching), len(branching), nodes)
    for node_budget, depth, top_k in dynamic:
        add(f"dynamic {node_budget}-{depth}-{top_k}", specdec.DynamicTreeDrafter(pair.draft, node_budget, depth, top_k),
            depth, node_budget)
    return made


def compare(pair, groups: dict, args, clock: Clock) -> list[dict]:
    """One row per method: tau, costs per call, tokens/s and speedup, from one interleaved run (the methods built
    first: a tree the pair's vocabulary cannot hold is refused before any is measured)."""
    chains = args.chains is not None or args.trees is None
    made = built_before_measuring("python -m experiments.tree_bench",
                                  lambda: decoders(pair, groups, args.temperature, args.dynamic, chains=chains))

    def method(decoder: specdec.Decoder) -> Method:
        def run(batch: list[list[int]], index: int) -> Decoded:
            ids, mask = left_pad(batch, device=pair.target.device)
            return Decoded.of(decoder.generate(ids, mask, args.max_new_tokens, pair.eos_token_id, seed=index))
        return Method(run)

    methods = {name: method(decoder) for name, (decoder, _) in made.items()}
    tallies = run_interleaved(methods, [[p] for p in pair.prompts], clock, timed_models=(pair.draft, pair.target))
    baseline = tallies["baseline"]
    rows = []
    for name, (_, nodes) in made.items():
        tally = tallies[name]
        runs = tally.stats
        calls = sum(s.target_forwards for s in runs)  # verification passes (the prefill's first token excluded)
        rows.append({
            "method": name,
            "nodes per call": nodes,
            "tau": round(sum(s.emitted for s in runs) / sum(s.target_calls for s in runs), 3),
            "target ms/call": round(1000 * sum(s.target_step_seconds for s in runs) / calls, 2),
            "draft ms/call": round(1000 * sum(s.draft_step_seconds for s in runs) / calls, 2),
            "tokens/s": round(tally.tokens_per_s, 1),
            "speedup": round(tally.tokens_per_s / baseline.tokens_per_s, 3),
            "same tokens as baseline": tally.outputs == baseline.outputs if args.temperature == 0 else "n/a (sampled)",
        })
    return rows


def verify_costs(name: str, args, clock: Clock) -> list[dict]:
    """The target's time per tree verification of N nodes and per chain forward of N + 1 tokens, as multiples of
    one decode step."""
    pair = load_bench_pair(name, 1, args.device, args.dtype)
    prompt = torch.tensor(random_prompts(1, 128, pair.target.config.vocab_size), device=pair.target.device)  # [1, 128]
    step = time_forwards(pair.target, prompt, [1], repeats=args.repeats, clock=clock)[1]
    chains = time_forwards(pair.target, prompt, [n + 1 for n in VERIFY_NODE_COUNTS], repeats=args.repeats, clock=clock)
    trees = time_tree_forwards(pair.target, prompt, VERIFY_NODE_COUNTS, repeats=args.repeats, clock=clock)
    return [{"nodes N": n, "tree verify ms": round(1000 * trees[n], 2),
             "chain of N+1 ms": round(1000 * chains[n + 1], 2), "tree verify / decode step": round(trees[n] / step, 2)}
            for n in VERIFY_NODE_COUNTS]


def main(argv=None) -> None:
    args = parse_args(argv)
    clock = bench_clock(args)
    pair = load_bench_pair(args.pair, args.prompts, args.device, args.dtype)
    setting = (f"{pair.name}, {args.dtype}, {args.device}, temperature {args.temperature}, {args.prompts} held-out "
               f"prompts x {args.max_new_tokens} tokens, batch 1, speculative sampling")
    report = Report()
    rows = compare(pair, groups_from(args), args, clock)
    report.table(f"## Trees against chains verifying the same number of nodes ({setting})", rows)
    results = {"setting": setting, "compare": rows}
    if args.verify_costs:
        costs = verify_costs(args.verify_costs, args, clock)
        report.table(f"## Verify cost of a tree of N nodes ({args.verify_costs}, {args.dtype}, {args.device}, median "
                     f"of {args.repeats})", costs)
        results["verify_costs"] = costs
    if args.out:
        report.write(args.out.with_suffix(".md"), results)


if __name__ == "__main__":
    main()
