"""experiments.load_bench: every draft-length policy on the same calls at each batch size, in one process. What it
must get right: each policy decodes the same prompts as the plain loop (greedy: the same tokens, checked call by
call, and a policy that differs is refused, not timed), the speedups are of the same calls, and the verdict compares
cost_optimal with the fastest fixed k and the heuristic it measured."""

from __future__ import annotations

import json
import pytest

from experiments import load_bench
from experiments.common.harness import Decoded, Method


def run(tmp_path, *extra):
    out = tmp_path / "out"
    load_bench.main(["--batch-sizes", "1,2", "--temperatures", "0", "--calls", "2", "--max-new-tokens", "6",
                     "--ks", "1,2", "--out", str(out), *extra])
    return json.loads((out / "load_bench.json").read_text())


def test_every_policy_at_every_batch_size_with_a_verdict_on_the_fastest_fixed_k(tmp_path):
    result = run(tmp_path)
    policies = ["plain", "k=1", "k=2", "heuristic", "cost_optimal"]
    for batch in (1, 2):
        rows = {row["policy"]: row for row in result["rows"] if row["batch"] == batch}
        assert list(rows) == policies
        assert rows["plain"]["speedup"] == 1.0 and rows["plain"]["tokens/target call"] == 1.0
        assert rows["k=2"]["tokens/target call"] > 1.0  # the embedded pair's draft is accepted
        fixed = {name: rows[name]["speedup"] for name in ("plain", "k=1", "k=2")}
        verdict = next(v for v in result["verdicts"] if v["batch"] == batch)
        assert verdict["best fixed"] == max(fixed, key=fixed.get)
        assert verdict["cost_optimal"] == rows["cost_optimal"]["speedup"]
        steps = [int(n) for n in rows["cost_optimal"]["steps by k (0..)"].split(", ")]
        assert len(steps) == 9 and sum(steps) > 0  # k = 0..8 (its k_max), each step counted once per row


def test_a_policy_whose_greedy_tokens_differ_is_refused_before_its_speedup_is_reported(tmp_path, monkeypatch):
    honest = load_bench.policy_method

    def method(pair, policy, temperature, max_new_tokens):
        real = honest(pair, policy, temperature, max_new_tokens)
        if not isinstance(policy, load_bench.specdec.HeuristicLength):
            return real

        def decode(batch, index):
            decoded = real.decode(batch, index)
            return Decoded([row[:-1] + [row[-1] + 1] for row in decoded.tokens], decoded.stats)
        return Method(decode)

    monkeypatch.setattr(load_bench, "policy_method", method)
    with pytest.raises(AssertionError, match="policy heuristic: greedy tokens differ"):
        run(tmp_path)
    assert not (tmp_path / "out" / "load_bench.json").exists()
