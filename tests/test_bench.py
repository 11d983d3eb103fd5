"""The benchmark's measuring parts on a tiny pair: what it counts, and that its comparisons compare like with like.
(Speed itself is never asserted: the script reports it.)"""

from __future__ import annotations

import pytest
import torch
from conftest import random_prompts, tiny_gpt2

from experiments import bench
from specdec.cache import KVCache


class TickingClock:
    """Each reading is one tick later than the last, so hooks' durations count clock readings exactly."""

    def __init__(self):
        self.ticks = 0

    def now(self) -> float:
        self.ticks += 1
        return float(self.ticks)


def tiny_pair() -> bench.Pair:
    target, draft = tiny_gpt2(0, layers=2), tiny_gpt2(1, layers=1)
    return bench.Pair("tiny", draft, target, random_prompts([5, 7, 6], seed=3), None, True)


def test_forward_timer_counts_a_body_call_inside_its_model_once():
    model = tiny_gpt2(0, layers=1)
    timer = bench.ForwardTimer(TickingClock(), model)
    cache = KVCache(model, 1, torch.device("cpu"), "target")
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        cache.prefill(ids, torch.ones_like(ids))  # the body alone: one timed call
        cache.forward(ids[:, :1], torch.ones_like(ids[:, :1]))  # the model, whose body runs inside: one timed call
    timer.remove()
    assert timer.seconds == 2.0 and timer.depth == 0


def test_comparison_runs_all_four_methods_and_finds_identical_greedy_tokens():
    pair = tiny_pair()
    [row] = bench.comparison_table(pair, ks=[3], temperatures=[0.0], max_new_tokens=10, clock=TickingClock())
    assert row["identical_tokens"] is True
    assert {"ours_baseline_tok_s", "ours_speculative_tok_s", "hf_generate_tok_s", "hf_assisted_tok_s"} <= set(row)


def test_baseline_summary_averages_each_temperatures_rows():
    rows = [{"temperature": 0.0, "ours_baseline_tok_s": 99.0, "hf_generate_tok_s": 100.0},
            {"temperature": 0.0, "ours_baseline_tok_s": 103.0, "hf_generate_tok_s": 100.0},
            {"temperature": 1.0, "ours_baseline_tok_s": 90.0, "hf_generate_tok_s": 100.0}]
    assert bench.baseline_summary(rows).splitlines() == [
        "Baseline vs `generate()` at temperature 0.0: mean 1.010 over 2 interleaved measurements (min 0.99, max 1.03).",
        "Baseline vs `generate()` at temperature 1.0: mean 0.900 over 1 interleaved measurements (min 0.90, max 0.90).",
    ]


def test_batch_scaling_decodes_the_same_rows_at_every_batch_size(monkeypatch):
    pair = tiny_pair()
    calls = []
    original = bench.ours

    def counting(pair, k, temperature, max_new_tokens, batch, seed, stop_at_eos=True, stats=None):
        calls.append((k, len(batch), stop_at_eos))
        return original(pair, k, temperature, max_new_tokens, batch, seed, stop_at_eos, stats)

    monkeypatch.setattr(bench, "ours", counting)
    rows = bench.batch_scaling(pair, 2, [1, 2, 4], max_new_tokens=6, clock=TickingClock(), rounds=2)
    assert [row["batch"] for row in rows] == [1, 2, 4]
    assert rows[0]["spec_live_rows"] == 1.0  # a lone row generates until it is done
    assert all(0 < row["spec_live_rows"] <= 1 for row in rows)
    for size in (1, 2, 4):
        rows_decoded = sum(batch for _, batch, _ in calls if batch == size)
        assert rows_decoded == (1 + 2) * 2 * 4  # 4 rows, warm-up and two rounds, speculative and baseline each
    assert not any(stop for _, _, stop in calls)


@pytest.mark.parametrize("argv, message", [
    (["--ks", "2,0"], "--ks: expected an integer >= 1, got '0'"),
    (["--batch-sizes", "1,x"], "--batch-sizes: expected an integer >= 1, got 'x'"),
    (["--temperatures", "0,-1"], "--temperatures: expected comma-separated temperatures >= 0"),
    (["--batch-rounds", "0"], "--batch-rounds: expected an integer >= 1"),
])
def test_bad_arguments_stop_before_any_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err
