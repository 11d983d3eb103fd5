"""The table serving engines want: vLLM's ``num_speculative_tokens_per_batch_size`` from a batch sweep.

    python -m experiments.run -m batch_size=1,4,16,64 draft_length.k=1,2,3,4,6 num_prompts=256 stop_at_eos=false
    python -m analysis.vllm_table multirun/<sweep>        # writes <sweep>/vllm_speculative_tokens.json

For each batch size the sweep measured, the fixed k of the best pooled speedup over the plain loop, or 0 where no k
beat it (speculation does not pay there); as vLLM's speculative config reads it, a JSON list of
``[start_bs, end_bs, k]`` (both ends inclusive), contiguous from batch size 1 to the largest measured, each
measured batch size's k holding until the next one, neighbours with the same k merged. Use it as
``--speculative-config '{"num_speculative_tokens": K, "num_speculative_tokens_per_batch_size": <the list>}'`` with
K the largest k in it. Only runs of ``draft_length=fixed`` that finished count.

    python -m experiments.load_bench                      # the policies side by side in one process
    python -m analysis.vllm_table outputs/load_bench/<time>/load_bench.json --temperature 0

reads the fixed k measured beside the plain loop on the same calls instead, at one temperature, and writes the table
beside the file.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from specdec.results import read_summary

OUTPUT = "vllm_speculative_tokens.json"


def best_k_by_batch(sweep: Path) -> dict[int, tuple[int, float]]:
    """batch size -> (k, pooled speedup) of the fastest finished fixed-k run; k = 0 where none beats 1.0x."""
    best: dict[int, tuple[int, float]] = {}
    for run in sorted(p for p in Path(sweep).iterdir() if p.is_dir()):
        summary = read_summary(run).value
        if not summary or summary.get("status") != "complete" or summary.get("draft_length") != "fixed":
            continue
        speedup = summary["pooled"]["speedup"]["value"]
        if not isinstance(speedup, (int, float)) or not math.isfinite(speedup):
            continue
        batch_size, k = int(summary["batch_size"]), int(summary["k"])
        if batch_size not in best or speedup > best[batch_size][1]:
            best[batch_size] = (k, speedup)
    return {b: (k if speedup > 1.0 else 0, speedup) for b, (k, speedup) in sorted(best.items())}


def best_k_in_bench(bench: Path, temperature: float) -> dict[int, tuple[int, float]]:
    """batch size -> (k, speedup) of the fastest fixed k in an ``experiments.load_bench`` result at ``temperature``;
    k = 0 where the plain loop was fastest."""
    best: dict[int, tuple[int, float]] = {}
    for row in json.loads(Path(bench).read_text())["rows"]:
        if row["T"] != temperature or not (row["policy"] == "plain" or row["policy"].startswith("k=")):
            continue
        k = 0 if row["policy"] == "plain" else int(row["policy"].removeprefix("k="))
        if row["batch"] not in best or row["speedup"] > best[row["batch"]][1]:
            best[row["batch"]] = (k, row["speedup"])
    return dict(sorted(best.items()))


def batch_ranges(best_k: dict[int, int]) -> list[list[int]]:
    """[[start_bs, end_bs, k], ...] contiguous from 1 to the largest batch size, each measured size's k holding up
    to the next measured size, neighbours with the same k merged."""
    sizes = sorted(best_k)
    ranges: list[list[int]] = []
    for i, size in enumerate(sizes):
        start = 1 if i == 0 else size
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else size
        if ranges and ranges[-1][2] == best_k[size]:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, best_k[size]])
    return ranges


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.vllm_table", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="a sweep directory (multirun/<date>/<time>) of fixed-k runs, or an "
                                                 "experiments.load_bench result (load_bench.json)")
    parser.add_argument("--temperature", type=float, default=0.0, help="for a load_bench result: the temperature whose "
                                                                       "measurements to use (default 0)")
    args = parser.parse_args(argv)
    if args.sweep.is_file():
        best = best_k_in_bench(args.sweep, args.temperature)
        if not best:
            parser.error(f"sweep: {args.sweep} holds no measurement at temperature {args.temperature}")
        out = args.sweep.parent / OUTPUT
    elif args.sweep.is_dir():
        best = best_k_by_batch(args.sweep)
        if not best:
            parser.error(f"sweep: {args.sweep} holds no finished draft_length=fixed run with a pooled speedup")
        out = args.sweep / OUTPUT
    else:
        parser.error(f"sweep: {args.sweep} is neither a sweep directory nor a load_bench.json")
    ranges = batch_ranges({b: k for b, (k, _) in best.items()})
    out.write_text(json.dumps(ranges) + "\n")
    for batch_size, (k, speedup) in best.items():
        print(f"batch {batch_size}: k = {k} (best fixed-k speedup {speedup:.3f}x)")
    print(f"num_speculative_tokens_per_batch_size: {json.dumps(ranges)} -> {out}")


if __name__ == "__main__":
    main()
