"""Every drafter family on one baseline, in one interleaved run: the pair's draft model (and distilled drafts), EAGLE
heads (chains and EAGLE-2 dynamic trees) and Medusa heads (chains and trees), n-gram lookup.

    python -m experiments.drafter_bench --out docs/bench/trained-drafters-cpu   # embedded pair, CPU, greedy

Per method: tau (tokens per target call), per-position acceptance a_i, the cost of its draft work per step against
one target step (c = draft seconds per step / target seconds per step, both from the loop's own phase timers), the
tokens per second and the speedup over our autoregressive baseline, all from one run in which the methods take
turns on each prompt after a warm-up (``experiments.common.harness``), and whether each emitted the baseline's tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import specdec
from experiments.common.harness import (
    Decoded, Method, Report, argument_parser, bench_clock, load_bench_pair, positive_int, positive_ints,
    run_interleaved,
)
from specdec import Clock, left_pad
from specdec.checkpoints import read_drafter_config


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser("experiments.drafter_bench", __doc__)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=positive_int, default=64)
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--ks", type=positive_ints, default=[2, 3, 4, 5, 6], help="chain lengths, each measured")
    parser.add_argument("--eagle", default="embedded", help="an EAGLE head's checkpoint (or 'embedded')")
    parser.add_argument("--medusa", default="embedded", help="Medusa heads' checkpoint (or 'embedded')")
    parser.add_argument("--distilled", nargs="*", default=[], type=Path, help="distilled draft checkpoints")
    parser.add_argument("--eagle-tree", default="16,5,4", help="node_budget,depth,top_k of EAGLE-2's trees")
    parser.add_argument("--medusa-tree", default="3,2,1", help="Medusa's tree branching")
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.json")
    return parser.parse_args(argv)


def families(pair, args) -> dict[str, tuple[specdec.Drafter | None, int]]:
    """Name -> (drafter, k): the baseline, each family at each k (trees at their depth)."""
    target = pair.target
    eagle = specdec.EagleDrafter.from_pair(pair, checkpoint=args.eagle)
    medusa = specdec.MedusaDrafter.from_pair(pair, checkpoint=args.medusa)
    eagle_tree = tuple(int(n) for n in args.eagle_tree.split(","))
    medusa_tree = [int(n) for n in args.medusa_tree.split(",")]
    made = {"baseline": (None, 0)}
    for k in args.ks:
        made[f"draft model k={k}"] = (specdec.ModelDrafter(pair.draft), k)
        for path in args.distilled:
            loss = read_drafter_config(path, "model")["training"].get("loss", path.name)
            made[f"draft distilled ({loss}) k={k}"] = (specdec.ModelDrafter.from_pair(pair, checkpoint=str(path)), k)
        made[f"EAGLE chain k={k}"] = (specdec.EagleDrafter(eagle.head, target), k)
        if k <= medusa.heads.num_heads:
            made[f"Medusa chain k={k}"] = (specdec.MedusaDrafter(medusa.heads, target), k)
        made[f"n-gram k={k}"] = (specdec.NGramDrafter(), k)
    made[f"EAGLE-2 tree {args.eagle_tree}"] = (specdec.EagleDrafter(eagle.head, target, tree=eagle_tree),
                                               eagle_tree[1])
    made[f"Medusa tree {args.medusa_tree}"] = (specdec.MedusaDrafter(medusa.heads, target, tree=medusa_tree),
                                              len(medusa_tree))
    return made


def compare(pair, args, clock: Clock) -> list[dict]:
    """One row per method, from one interleaved run."""
    decoders = {name: specdec.Decoder(pair.target, drafter, specdec.Speculative(), specdec.FixedLength(max(k, 1)))
                for name, (drafter, k) in families(pair, args).items()}

    def method(decoder: specdec.Decoder) -> Method:
        def run(batch: list[list[int]], index: int) -> Decoded:
            ids, mask = left_pad(batch, device=pair.target.device)
            return Decoded.of(decoder.generate(ids, mask, args.max_new_tokens, None, seed=index))
        return Method(run)

    tallies = run_interleaved({name: method(d) for name, d in decoders.items()}, [[p] for p in pair.prompts], clock)
    baseline = tallies["baseline"]
    return [row(name, tallies[name], baseline) for name in decoders]


def row(name: str, tally, baseline) -> dict:
    """tau, a_i, the draft's cost per step against the target's, tokens/s and speedup of one method."""
    runs = tally.stats
    steps = sum(s.target_forwards for s in runs)  # decode steps (the prefill's excluded)
    attempts = [sum(col) for col in zip(*(s.totals.position_attempts for s in runs))]
    accepts = [sum(col) for col in zip(*(s.totals.position_accepts for s in runs))]
    draft_per_step = sum(s.draft_step_seconds for s in runs) / steps
    target_per_step = sum(s.target_step_seconds for s in runs) / steps
    return {
        "method": name,
        "tau": round(sum(s.emitted for s in runs) / sum(s.target_calls for s in runs), 3),
        "a_i": " ".join(f"{a / n:.2f}" for a, n in zip(accepts, attempts) if n),
        "draft ms/step": round(1000 * draft_per_step, 2),
        "target ms/step": round(1000 * target_per_step, 2),
        "draft / target": round(draft_per_step / target_per_step, 3),
        "tokens/s": round(tally.tokens_per_s, 1),
        "speedup": round(tally.tokens_per_s / baseline.tokens_per_s, 3),
        "baseline's tokens": tally.outputs == baseline.outputs,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    clock = bench_clock(args)
    pair = load_bench_pair(args.pair, args.prompts, args.device, args.dtype)
    setting = (f"{pair.name}, {args.dtype}, {args.device}, greedy, {args.prompts} held-out prompts x "
               f"{args.max_new_tokens} tokens (EOS ignored), batch 1, speculative sampling's rule")
    rows = compare(pair, args, clock)
    report = Report()
    report.table(f"## Drafter families on one baseline ({setting})", rows)
    best = {}
    for entry in rows[1:]:
        family = entry["method"].rsplit(" k=", 1)[0]
        if family not in best or entry["speedup"] > best[family]["speedup"]:
            best[family] = entry
    report.table("## Each family at its best k or tree", list(best.values()))
    if args.out:
        report.write(args.out.with_suffix(".md"), {"setting": setting, "rows": rows})


if __name__ == "__main__":
    main()
