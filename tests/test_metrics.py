"""The field's acceptance metrics: the accepted-per-step histogram (StepLog -> RowStats -> the row record -> the
summary, vLLM's acceptance length, the report's definitions table and plot), and synthetic acceptance on a
per-position schedule (a list, or a decay) through the loop and on trees."""

from __future__ import annotations

import math

import pytest
import torch

import specdec
from analysis import summarize_runs
from analysis.report import main
from conftest import left_pad, random_prompts
from test_analysis import PNG_SIGNATURE, make_row, write_run
from specdec.results import Metrics
from specdec.tree import tree_shape


def decode(target, draft, strategy, k=4, temperature=0.0, new_tokens=40, lengths=(4, 7, 5, 6)):
    ids, mask = left_pad(random_prompts(list(lengths), seed=8))
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), strategy, specdec.FixedLength(k),
                              specdec.SamplingConfig(temperature=temperature))
    return decoder.generate(ids, mask, max_new_tokens=new_tokens, seed=1)


def test_the_histogram_counts_every_drafting_step_and_agrees_with_the_per_position_counts(target, draft):
    out = decode(target, draft, specdec.Speculative(), k=4)
    for row in out.stats.rows:
        h = row.steps_by_accepted  # [k+1]
        assert len(h) == 5 and sum(j * count for j, count in enumerate(h)) == row.accepted
        assert row.target_calls - 1 <= sum(h) <= row.target_calls  # a last step may draft nothing
        # position i is reached in the steps that kept i - 1 drafts or more, kept in those that kept i or more
        # (steps that drafted fewer than k: only near the budget, where they are counted at their own depth)
        assert row.position_accepts == [sum(h[i:]) for i in range(1, 5)]
    assert out.stats.totals.steps_by_accepted == [sum(c) for c in zip(*(r.steps_by_accepted for r in out.stats.rows))]


def test_draft_equal_to_target_keeps_every_draft_of_every_step(target):
    out = decode(target, target, specdec.Greedy(), k=3, new_tokens=33, lengths=(5,))
    histogram = out.stats.rows[0].steps_by_accepted
    assert histogram[:3] == [0, 0, 0] and histogram[3] > 0  # steps near the budget draft fewer, and keep them all


def test_the_row_record_the_summary_and_vllms_acceptance_length(target, draft):
    out = decode(target, draft, specdec.Speculative(), k=4)
    metrics = Metrics.measure(out.stats, out.stats, row=0, tree=False)
    h = out.stats.rows[0].steps_by_accepted
    assert metrics.accepted_histogram == h
    rows = [make_row("a", f"p{i}", accepted_histogram=[3, 1, 0, 2]) for i in range(3)]
    rows.append(make_row("a", "p3", accepted_histogram=[0, 0, 0, 4]))
    summary = summarize_runs(load(rows))
    assert summary["accepted_histogram"][0] == [9, 3, 0, 10]
    per_prompt = [1 + (1 + 6) / 6] * 3 + [1 + 12 / 4]  # 1 + sum_j j h_j / sum_j h_j
    assert summary["vllm_acceptance_length_mean"][0] == pytest.approx(sum(per_prompt) / 4)
    assert summary["vllm_acceptance_length_ci_low"][0] < summary["vllm_acceptance_length_mean"][0]


def load(rows):
    from analysis.load import RunRows, build_frame

    return build_frame([RunRows(source="run", rows=rows, partial=False)])


def test_rows_without_a_histogram_still_load_and_summarize(tmp_path):
    rows = [{key: value for key, value in make_row("a", f"p{i}").items() if key != "accepted_histogram"}
            for i in range(3)]
    run = write_run(tmp_path / "old", rows)
    assert main([str(run)]) == 0
    summary = summarize_runs(load(rows))
    assert summary["accepted_histogram"][0] == [] and math.isnan(summary["vllm_acceptance_length_mean"][0])


def test_the_report_states_the_definitions_and_plots_the_histogram(tmp_path):
    # accepted as the histogram counts it (sum_j j h_j = 20), as every real row has it
    rows = [make_row("a", f"p{i}", k=3, accepted_histogram=[1, 2, 3, 4], accepted=20) for i in range(3)]
    run = write_run(tmp_path / "run", rows)
    assert main([str(run)]) == 0
    report = (run / "report.md").read_text()
    section = report.split("## Acceptance, as the field reports it")[1].split("## Plots")[0]
    assert "mean acceptance length (AL) = 1 + accepted / drafts" in section and "#mean accepted tokens (τ)" in section
    assert "0: 10%, 1: 20%, 2: 30%, 3: 40%" in section  # the three prompts' histograms summed, as shares
    assert "| 3 [3, 3] |" in section  # vLLM's AL pooled: 1 + 3 x (2 + 6 + 12) / (3 x 10)
    assert (run / "accepted_histogram.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "](accepted_histogram.png)" in report


# --- synthetic acceptance on a per-position schedule ---------------------------------------------------------------


@pytest.mark.parametrize("strategy, rates", [
    (specdec.SyntheticAcceptance([0.9, 0.5, 0.2]), [0.9, 0.5, 0.2, 0.2]),  # the last rate repeats
    (specdec.SyntheticAcceptance(0.9, decay=0.7), [0.9, 0.63, 0.441, 0.3087]),
], ids=["list", "decay"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_synthetic_acceptance_follows_its_schedule_through_the_loop(target, draft, strategy, rates, temperature):
    """Each position's conditional acceptance is within 4.5 binomial standard deviations of its rate."""
    out = decode(target, draft, strategy, k=4, temperature=temperature, new_tokens=110, lengths=(4, 7, 5, 6) * 8)
    totals = out.stats.totals
    for attempts, accepts, rate in zip(totals.position_attempts, totals.position_accepts, rates):
        assert attempts >= 100
        assert abs(accepts / attempts - rate) < 4.5 * (rate * (1 - rate) / attempts) ** 0.5


def test_a_tree_node_is_accepted_at_its_depths_rate():
    shape = tree_shape((2, 1, 1))
    batch = 40_000
    strategy = specdec.SyntheticAcceptance([0.8, 0.5, 0.3])
    verdict = strategy.tree_verdict_from_ids(shape, torch.zeros(batch, shape.num_nodes, dtype=torch.long),
                                             torch.zeros(batch, shape.num_nodes + 1, dtype=torch.long),
                                             torch.Generator().manual_seed(0))
    reached = [1 - (1 - 0.8) ** 2, 0.5, 0.3]  # depth 1: either of two children; deeper: the one child
    expected = 1.0
    for depth, rate in enumerate(reached, start=1):
        expected *= rate
        assert float((verdict.num_accepted >= depth).double().mean()) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("options, error, message", [
    (dict(acceptance=[]), ValueError, r"a non-empty list of them .* got \[\]"),
    (dict(acceptance=[0.9, 1.2]), ValueError, r"synthetic acceptance at position 2 must be in \[0, 1\], got 1.2"),
    (dict(acceptance=[0.9, 0.8], decay=0.5), ValueError, r"decay=0.5 applies to a single rate"),
    (dict(acceptance=0.9, decay=0.0), ValueError, r"synthetic acceptance decay must be in \(0, 1\], got 0.0"),
    (dict(acceptance=[0.9, "x"]), TypeError, r"synthetic acceptance at position 2 must be"),
])
def test_bad_schedules_are_refused_in_one_line(options, error, message):
    with pytest.raises(error, match=message):
        specdec.SyntheticAcceptance(**options)


def test_a_configs_list_is_a_schedule():
    from omegaconf import OmegaConf

    strategy = specdec.SyntheticAcceptance(OmegaConf.create([0.9, 0.8]))
    assert strategy.acceptance == (0.9, 0.8) and hash(strategy)
    assert strategy.rates(3, torch.device("cpu")).tolist() == pytest.approx([0.9, 0.8, 0.8])
