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
    load_bench.main(["--batch-sizes", "1,2", "--temperatures", "0", "--calls", "2", "--min-rows", "1",
                     "--max-new-tokens", "6", "--ks", "1,2", "--out", str(out), *extra])
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
        assert fixed[verdict["best fixed"]] == max(fixed.values())  # the table's speedups are rounded: ties count
        assert verdict["cost_optimal"] == rows["cost_optimal"]["speedup"]
        steps = [int(n) for n in rows["cost_optimal"]["steps by k (0..)"].split(", ")]
        assert len(steps) == 9 and sum(steps) > 0  # k = 0..8 (its k_max), each step counted once per row


def test_the_json_keeps_the_cost_model_cost_optimal_chose_from_in_each_setting(tmp_path):
    """The start-up table and its corrections, per batch size: every width 1..k_max + 1 at rows 1, 2, ... up to the
    batch, and the corrections learned from the calls' steps."""
    result = run(tmp_path)
    for setting in result["calls"]:
        chosen = setting["cost_optimal"]
        rows = [str(r) for r in (1, 2) if r <= setting["batch"]]
        assert list(chosen["costs"]["target"]) == rows
        assert all(list(widths) == [str(n) for n in range(1, 10)] for widths in chosen["costs"]["target"].values())
        assert all(seconds > 0 for widths in chosen["costs"]["target"].values() for seconds in widths.values())
        assert chosen["target_scale"] > 0 and chosen["draft_scale"] > 0
        assert chosen["overheads"]["plain"] is not None and chosen["overheads"]["drafting"] is not None


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


def test_processes_pool_their_calls_each_paired_with_its_own_plain_loop(tmp_path, stand_in_processes):
    """Two processes, the second's cost_optimal calls twice as slow as the first's: the pooled speedup is that of
    all calls together (not the mean of the two), and the verdict lists each process's share of the best."""
    first = run(tmp_path)

    def change(result):
        for setting in result["calls"]:
            calls = setting["calls"]["cost_optimal"]
            calls["seconds"] = [2 * seconds for seconds in calls["seconds"]]
        result["verdicts"] = [{**v, "cost_optimal / best": "0.500 [0.4, 0.6]"} for v in result["verdicts"]]
    first_calls = stand_in_processes(first, "load_bench.json", change)
    pooled = run(tmp_path / "pooled", "--processes", "2")
    assert first_calls == [0, 2]  # the second process's calls come after the first's 2: their own prompts, seeds and rows of the design
    for setting, alone in zip(pooled["calls"], first["calls"]):
        plain, chosen = setting["calls"]["plain"], setting["calls"]["cost_optimal"]
        assert plain["tokens"] == alone["calls"]["plain"]["tokens"] * 2 and len(chosen["seconds"]) == 4
        expected = (sum(chosen["tokens"]) / sum(chosen["seconds"])) / (sum(plain["tokens"]) / sum(plain["seconds"]))
        row = next(r for r in pooled["rows"] if r["batch"] == setting["batch"] and r["policy"] == "cost_optimal")
        assert row["speedup"] == round(expected, 3)
        assert chosen["steps_by_k"] == [2 * n for n in alone["calls"]["cost_optimal"]["steps_by_k"]]
    for verdict, alone in zip(pooled["verdicts"], first["verdicts"]):
        assert verdict["each process"] == f"{alone['cost_optimal / best'].split(' ')[0]}, 0.500"


def test_a_pooled_interval_resamples_the_processes_and_then_their_calls():
    """Three processes whose calls agree within each but not between them (the policy 1.0x, 1.1x and 1.2x the plain
    loop): resampled call by call the interval is narrow around 1.1; resampled by process first it reaches towards
    the slowest and the fastest process, as a bench run again in other processes would."""
    def process(ratio):
        seconds = [1.0 + 0.01 * i for i in range(8)]  # [8 calls]
        return (load_bench.Calls([64] * 8, seconds, 512, 512, [0, 8]),
                load_bench.Calls([64] * 8, [s / ratio for s in seconds], 512, 256, [0, 0, 8]))

    (base, policy), *others = [process(ratio) for ratio in (1.0, 1.1, 1.2)]
    for other_base, other_policy in others:
        base, policy = base.joined(other_base), policy.joined(other_policy)
    assert policy.process_of_call == [0] * 8 + [1] * 8 + [2] * 8 and policy.steps_by_k == [0, 0, 24]
    point, low, high = load_bench.paired_speedup(policy, base)
    calls_only = load_bench.paired_speedup(load_bench.Calls(**{**vars(policy), "process_of_call": []}),
                                           load_bench.Calls(**{**vars(base), "process_of_call": []}))
    assert point == pytest.approx(calls_only[0]) and 1.09 < point < 1.11
    assert calls_only[2] - calls_only[1] < 0.08
    assert low < 1.04 and high > 1.16


@pytest.mark.parametrize("shares, expected", [
    ([0.99] * 8, "yes"),  # every call at 0.99 of the best: the interval too
    ([1.25, 0.8] * 4, "by its estimate"),  # 0.976 by the point, the calls at 0.8 and 1.25: the interval reaches below
    ([0.9] * 8, "no"),
])
def test_within_three_percent_says_whether_the_interval_or_only_the_point_meets_it(shares, expected):
    """The verdict's "within 3% of best": "yes" only where cost_optimal / best's whole interval is at or above 0.97;
    a point above with an interval reaching below is "by its estimate"."""
    seconds = [1.0 + 0.01 * i for i in range(8)]  # [8 calls]
    base = load_bench.Calls([64] * 8, seconds, 512, 512, [0, 8])
    best = load_bench.Calls([64] * 8, [s / 1.2 for s in seconds], 512, 256, [0, 0, 8])
    chosen = load_bench.Calls([64] * 8, [s / 1.2 / share for s, share in zip(seconds, shares)], 512, 256, [0, 0, 8])
    calls = {"plain": base, "k=2": best, "heuristic": base, "cost_optimal": chosen}
    verdict = load_bench.verdict(16, 0.0, calls)
    assert verdict["best fixed"] == "k=2"
    assert verdict["within 3% of best"] == expected


def test_small_batches_take_more_calls_until_they_decode_min_rows(tmp_path, stand_in_processes):
    """--min-rows 4 with --calls 2: 4 calls at batch 1, 2 at batch 2; a second process starts after the most calls
    any setting took, so no call of the first repeats."""
    result = run(tmp_path, "--min-rows", "4")
    assert [len(setting["calls"]["plain"]["seconds"]) for setting in result["calls"]] == [4, 2]
    first_calls = stand_in_processes(result, "load_bench.json", lambda copy: None)
    run(tmp_path / "pooled", "--min-rows", "4", "--processes", "2")
    assert first_calls == [0, 4]


def test_call_batches_from_a_first_call_take_the_prompts_after_the_last_calls_cycled():
    prompts = [[p] for p in range(5)]
    assert load_bench.call_batches(prompts, 2, 2) == [[[0], [1]], [[2], [3]]]
    assert load_bench.call_batches(prompts, 2, 2, first_call=2) == [[[4], [0]], [[1], [2]]]


@pytest.mark.slow
def test_processes_run_the_bench_afresh_in_each(tmp_path):
    result = run(tmp_path, "--processes", "2", "--batch-sizes", "1")
    assert {path.name for path in (tmp_path / "out").iterdir()} >= {"process-0", "process-1", "load_bench.json"}
    assert all(len(calls["seconds"]) == 4 for setting in result["calls"] for calls in setting["calls"].values())
    assert len(result["verdicts"][0]["each process"].split(", ")) == 2
