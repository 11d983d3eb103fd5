"""Verification rules side by side on the same drafts: tau (tokens per target call) of each rule and its gain over
the classic one, with bootstrap intervals over prompts. Counts only: tau does not depend on the machine's load.

    python -m experiments.verification_study                          # every comparison, embedded pair
    python -m experiments.verification_study --comparisons block --prompts 16 --seeds 0
    python -m experiments.verification_study --pair gpt2-medium-shaped --bias 1 --comparisons block,chains

Each comparison pairs a rule with its baseline rule on the same drafter, temperature and k (docs/verification.md):
``block`` (BlockVerification vs Speculative on a chain, T = 1 and 0.7, k = 2, 4, 8), ``chains`` (4 chains vs 1
chain, ``ModelDrafter(num_drafts=4)``, T = 1, k = 4) and ``traversal`` (traversal vs top-down verification of the
dynamic tree, T = 1). Held-out prompts of the embedded pair, EOS ignored, every seed on every prompt. ``--pair``
takes another pair; ``--bias`` drafts the chains with ``specdec.SyntheticDrafter`` (the target through a fixed
random logit bias: a draft of controlled acceptance), for pairs whose own draft means nothing (the shaped pairs).
The gain's interval resamples prompts (each prompt keeps its seeds), both rules' counts together. Writes one JSON
line per (comparison, setting, rule, seed) to --out as each run ends, seed by seed, and skips runs already there (a
stopped sweep resumes); --report prints the table of what --out holds.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import specdec
from specdec.batching import left_pad

BOOTSTRAP = 2000


@dataclass(frozen=True)
class Arm:
    """One rule on one drafter: ``drafter(pair, bias)`` and its strategy; ``bias`` None drafts with the pair's draft,
    a number with ``specdec.SyntheticDrafter(pair.target, bias)`` (the comparisons in ``SYNTHETIC`` only)."""

    label: str
    drafter: Callable[[specdec.ModelPair, float | None], specdec.Drafter]
    strategy: specdec.AcceptanceStrategy


def chains(n: int) -> Callable[[specdec.ModelPair, float | None], specdec.Drafter]:
    """A drafter of n independent chains (one chain for n = 1), by the pair's draft or the synthetic one."""
    def build(pair, bias):
        if bias is None:
            return specdec.ModelDrafter(pair.draft, num_drafts=n)
        return specdec.SyntheticDrafter(pair.target, bias, num_drafts=n)
    return build


chain = chains(1)


def block_settings() -> list[tuple[float, int, Arm, Arm]]:
    """[(temperature, k, rule, baseline rule)]: block vs token-wise on a chain."""
    settings = [(1.0, 8), (1.0, 4), (0.7, 8), (0.7, 4), (1.0, 2), (0.7, 2)]  # the largest expected gains first
    return [(t, k, Arm("block", chain, specdec.BlockVerification()), Arm("token-wise", chain, specdec.Speculative()))
            for t, k in settings]


def chains_settings() -> list[tuple[float, int, Arm, Arm]]:
    """4 independent chains (one tree) vs one chain, token-wise speculative sampling on both."""
    return [(1.0, 4, Arm("4 chains", chains(4), specdec.Speculative()), Arm("1 chain", chain, specdec.Speculative()))]


def dynamic_tree(pair, bias):
    return specdec.DynamicTreeDrafter(pair.draft)  # the defaults of configs/drafter/dynamic_tree.yaml


def traversal_settings() -> list[tuple[float, int, Arm, Arm]]:
    """Traversal vs top-down verification of the same dynamic trees (up to 5 levels, 16 nodes)."""
    return [(1.0, 5, Arm("traversal", dynamic_tree, specdec.Traversal()),
             Arm("top-down", dynamic_tree, specdec.Speculative()))]


COMPARISONS = {"block": block_settings, "chains": chains_settings, "traversal": traversal_settings}
SYNTHETIC = ("block", "chains")  # the comparisons whose drafter can be the synthetic one (--bias)


def counts(pair, bias: float | None, arm: Arm, ids, mask, temperature: float, k: int, tokens: int,
           seed: int) -> list[tuple[int, int]]:
    """[(emitted, target calls)] per prompt."""
    decoder = specdec.Decoder(pair.target, arm.drafter(pair, bias), arm.strategy, specdec.FixedLength(k),
                              specdec.SamplingConfig(temperature=temperature), time_phases=False)
    out = decoder.generate(ids, mask, max_new_tokens=tokens, seed=seed)
    return [(row.emitted, row.target_calls) for row in out.stats.rows]


def tau_and_gain(rule: torch.Tensor, base: torch.Tensor, seed: int = 0) -> dict:
    """rule, base [P, S, 2] (emitted, calls) per prompt and seed -> pooled tau of each, the gain tau/tau_base - 1,
    and 95% bootstrap intervals over prompts."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(rule.shape[0], (BOOTSTRAP, rule.shape[0]), generator=g)  # [R, P]

    def taus(c: torch.Tensor) -> torch.Tensor:
        sums = c[pick].sum((1, 2))  # [R, 2]
        return sums[:, 0] / sums[:, 1]

    def tau(c: torch.Tensor) -> float:
        return float(c[..., 0].sum() / c[..., 1].sum())

    resampled_gain = taus(rule) / taus(base) - 1
    low, high = resampled_gain.quantile(torch.tensor([0.025, 0.975], dtype=resampled_gain.dtype)).tolist()
    return {"tau": tau(rule), "tau_base": tau(base), "gain": tau(rule) / tau(base) - 1, "gain_low": low,
            "gain_high": high}


def plan(names: list[str], seeds: list[int]) -> list[tuple[str, float, int, Arm, int]]:
    """Every run, seed by seed (a cut-off sweep still has each setting once); within a seed the comparisons take
    turns, each in its own order (its likeliest gains first)."""
    settings = {name: COMPARISONS[name]() for name in names}
    turns = range(max(len(listed) for listed in settings.values()))
    return [(name, *settings[name][turn][:2], arm, seed) for seed in seeds for turn in turns for name in names
            if turn < len(settings[name]) for arm in settings[name][turn][2:]]


def done_runs(path: Path, pair: str = "embedded", bias: float | None = None) -> dict[tuple, list]:
    """(comparison, temperature, k, rule, seed) -> counts, of the runs already in ``path`` on ``pair`` with the
    drafter of ``bias`` (lines without a pair are the embedded pair's own draft's)."""
    if not path.exists():
        return {}
    runs = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if (row.get("pair", "embedded"), row.get("bias")) == (pair, bias):
            runs[row["comparison"], row["temperature"], row["k"], row["rule"], row["seed"]] = row["counts"]
    return runs


def report(names: list[str], runs: dict[tuple, list]) -> list[str]:
    """The table of every setting whose two rules share at least one seed."""
    lines = ["| comparison | T | k | rule | tau | baseline | tau | gain [95% CI] | seeds x prompts |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        for temperature, k, rule, base in COMPARISONS[name]():
            seeds = sorted({key[4] for key in runs if key[:4] == (name, temperature, k, rule.label)}
                           & {key[4] for key in runs if key[:4] == (name, temperature, k, base.label)})
            if not seeds:
                continue
            measured = [torch.tensor([runs[name, temperature, k, arm.label, seed] for seed in seeds],
                                     dtype=torch.float64).transpose(0, 1) for arm in (rule, base)]  # [P, S, 2]
            r = tau_and_gain(*measured)
            lines.append(f"| {name} | {temperature} | {k} | {rule.label} | {r['tau']:.3f} | {base.label} | "
                         f"{r['tau_base']:.3f} | {100 * r['gain']:+.1f}% [{100 * r['gain_low']:+.1f}, "
                         f"{100 * r['gain_high']:+.1f}] | {len(seeds)} x {measured[0].shape[0]} |")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser("experiments.verification_study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comparisons", default="block,chains,traversal")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--pair", default="embedded", help="a pair preset of specdec.load_pair (e.g. gpt2-xl-shaped)")
    parser.add_argument("--bias", type=float, default=None,
                        help="draft with specdec.SyntheticDrafter(pair.target, BIAS) instead of the pair's draft "
                             f"(comparisons {', '.join(SYNTHETIC)}; for the random-weight shaped pairs)")
    parser.add_argument("--out", type=Path, default=Path("verification_study.jsonl"))
    parser.add_argument("--report", action="store_true", help="print the table of the runs in --out; run nothing")
    args = parser.parse_args(argv)
    names = args.comparisons.split(",")
    unknown = [name for name in names if name not in COMPARISONS]
    if unknown:
        raise SystemExit(f"unknown comparisons {unknown}; known: {', '.join(COMPARISONS)}")
    if args.bias is not None and set(names) - set(SYNTHETIC):
        raise SystemExit(f"--bias={args.bias} drafts chains with the synthetic drafter: comparisons "
                         f"{', '.join(SYNTHETIC)} only, got {args.comparisons}")
    if args.bias is not None and not 0 <= args.bias < float("inf"):
        raise SystemExit(f"--bias must be a finite number >= 0, got {args.bias}")
    if not args.report:
        run_all(names, [int(s) for s in args.seeds.split(",")], args.prompts, args.tokens, args.out, args.pair,
                args.bias)
    print("\n".join(report(names, done_runs(args.out, args.pair, args.bias))))


def run_all(names: list[str], seeds: list[int], prompts: int, tokens: int, out: Path, pair_name: str = "embedded",
            bias: float | None = None) -> None:
    """Every planned run not yet in ``out``, each appended to it as it ends (a stopped sweep resumes)."""
    torch.set_grad_enabled(False)
    pair = specdec.load_pair(pair_name, device="cpu", dtype="float32")
    texts = [prompt.text for prompt in specdec.load_prompts("embedded_heldout", limit=prompts)]
    ids, mask = left_pad([pair.tokenizer(text).input_ids for text in texts], pair.tokenizer.pad_token_id)
    done = done_runs(out, pair_name, bias)
    with out.open("a") as log:
        for name, temperature, k, arm, seed in plan(names, seeds):
            if (name, temperature, k, arm.label, seed) in done:
                continue
            rows = counts(pair, bias, arm, ids, mask, temperature, k, tokens, seed)
            log.write(json.dumps({"comparison": name, "pair": pair_name, "bias": bias, "temperature": temperature,
                                  "k": k, "rule": arm.label, "seed": seed, "prompts": prompts, "tokens": tokens,
                                  "counts": rows}) + "\n")
            log.flush()
            print(f"{name} T={temperature} k={k} {arm.label} seed {seed}: tau "
                  f"{sum(e for e, _ in rows) / sum(c for _, c in rows):.3f}", flush=True)


if __name__ == "__main__":
    main()
