"""Pooled figures (totals over a run's prompts, with bootstrap intervals) beside per-prompt means, and the prompts too
short to time: in summary.json, on the console, in analysis/ and its report."""

from __future__ import annotations

import math

import pytest
from test_analysis import make_row, write_run

from analysis import load_runs, summarize_runs
from analysis.report import main as report_main
from experiments.common.summary import format_table
from specdec.results import (BOOTSTRAP_SAMPLES, MIN_PROMPTS_FOR_INTERVAL, bootstrap_totals, pooled, pooled_figure,
                             summarize_rows, too_short)


def timed_row(prompt_id, spec_seconds, baseline_seconds, emitted, baseline_emitted=None, batch_size=1, **counts):
    """A row with the columns pooled figures read."""
    return dict(prompt_id=prompt_id, spec_seconds=spec_seconds, baseline_seconds=baseline_seconds, emitted=emitted,
                baseline_emitted=emitted if baseline_emitted is None else baseline_emitted, batch_size=batch_size,
                **{"accepted": 3, "drafted": 4, "target_calls": 5} | counts)


def test_pooled_speedup_is_total_time_over_total_time_for_the_same_tokens():
    """Three prompts emitting the same tokens in both runs: total baseline seconds over total speculative seconds
    (9 / 4.5 = 2), where the per-prompt mean of the ratios is (4 + 1 + 1) / 3 = 2 only by chance: a fourth, short
    prompt with a huge ratio swings the mean and barely moves the pooled figure."""
    rows = [timed_row("a", 1.0, 4.0, 10), timed_row("b", 2.0, 2.0, 10), timed_row("c", 1.5, 3.0, 10)]
    assert pooled_figure(rows, "speedup")["value"] == pytest.approx(9.0 / 4.5)
    swung = rows + [timed_row("d", 0.001, 0.05, 1)]  # 50x, one token
    assert pooled_figure(swung, "speedup")["value"] == pytest.approx(9.05 / 4.501)  # 2.01; the mean of ratios: 14.25


def test_pooled_speedup_is_time_per_token_where_the_runs_emit_different_tokens():
    rows = [timed_row("a", 1.0, 3.0, emitted=10, baseline_emitted=20), timed_row("b", 1.0, 1.0, 10, 10)]
    # baseline: 4 s for 30 tokens; speculative: 2 s for 20 tokens
    assert pooled_figure(rows, "speedup")["value"] == pytest.approx((4 / 30) / (2 / 20))
    assert pooled_figure(rows, "spec_tokens_per_s")["value"] == pytest.approx(20 / 2)
    assert pooled_figure(rows, "baseline_tokens_per_s")["value"] == pytest.approx(30 / 4)


def test_a_batch_counts_its_seconds_once():
    """Rows of one batch repeat the batch's seconds; each adds seconds / batch_size, so the batch counts once."""
    batch = [timed_row(p, 2.0, 6.0, 10, batch_size=2) for p in ("a", "b")]
    alone = [timed_row("c", 1.0, 1.0, 10)]
    figures = pooled(batch + alone)
    assert (figures["spec_seconds"], figures["baseline_seconds"]) == (3.0, 7.0)
    assert figures["speedup"]["value"] == pytest.approx(7.0 / 3.0)


def test_pooled_counts_follow_the_metric_definitions():
    rows = [timed_row("a", 1, 1, emitted=9, accepted=6, drafted=8, target_calls=3),
            timed_row("b", 1, 1, emitted=2, accepted=0, drafted=4, target_calls=2)]
    assert pooled_figure(rows, "acceptance_rate")["value"] == pytest.approx(6 / 12)
    assert pooled_figure(rows, "mean_accepted_length")["value"] == pytest.approx(11 / 5)


def test_the_bootstrap_interval_holds_the_figure_is_reproducible_and_needs_three_prompts():
    rows = [timed_row(str(i), 1.0 + 0.1 * i, 2.0, 10) for i in range(8)]
    figure = pooled_figure(rows, "speedup")
    assert figure["ci_low"] < figure["value"] < figure["ci_high"] and figure["prompts"] == 8
    assert pooled_figure(rows, "speedup") == figure  # seeded: the same rows, the same interval
    assert figure["ci_low"] >= 2.0 / 1.7 and figure["ci_high"] <= 2.0 / 1.0  # within the prompts' own ratios
    few = pooled_figure(rows[: MIN_PROMPTS_FOR_INTERVAL - 1], "speedup")
    assert math.isnan(few["ci_low"]) and math.isnan(few["ci_high"]) and not math.isnan(few["value"])


def test_per_position_acceptance_pools_the_counts_and_keeps_them():
    rows = [timed_row("a", 1, 1, 5, per_position_accepted=[3, 1], per_position_attempts=[4, 3]),
            timed_row("b", 1, 1, 5, per_position_accepted=[1, 0, 0], per_position_attempts=[4, 1, 0]),
            timed_row("c", 1, 1, 5, per_position_accepted=[2, 2], per_position_attempts=[2, 2])]
    positions = pooled(rows)["per_position_acceptance"]
    assert [p["value"] for p in positions][:2] == pytest.approx([6 / 10, 3 / 6]) and math.isnan(positions[2]["value"])
    assert [p["attempts"] for p in positions] == [10, 6, 0]
    assert positions[0]["ci_low"] <= 0.6 <= positions[0]["ci_high"]


def test_short_prompts_are_counted_named_and_left_out_of_the_per_prompt_timings():
    long_rows = [timed_row(f"long{i}", 1.0, 2.0, 20, target_calls=6) | {"speedup": 2.0} for i in range(3)]
    short = [timed_row("short", 0.01, 0.5, 3, target_calls=1) | {"speedup": 50.0},  # ended in the prefill's call
             timed_row("eos", 0.01, 0.01, 2, baseline_emitted=1) | {"speedup": 0.5}]  # the baseline said EOS at once
    assert [too_short(row) for row in long_rows + short] == [False] * 3 + [True, True]
    summary = summarize_rows(long_rows + short)
    assert summary["short_prompts"]["count"] == 2 and summary["short_prompts"]["prompt_ids"] == ["short", "eos"]
    assert summary["metrics"]["speedup"]["mean"] == 2.0 and summary["metrics"]["speedup"]["n"] == 3
    assert summary["metrics"]["acceptance_rate"]["n"] == 0  # no acceptance_rate column here: nothing to mean
    assert summary["pooled"]["speedup"]["prompts"] == 5  # pooled: every prompt, by its tokens and time
    table = format_table(summary, "title")
    assert "too short to time: 2 of 5 prompts (short, eos)" in table


def test_the_console_table_leads_with_the_pooled_figure():
    rows = [timed_row(str(i), 1.0, 1.5 + i, 10, target_calls=4) | {"speedup": (1.5 + i)} for i in range(4)]
    table = format_table(summarize_rows(rows), "title")
    header, speedup = table.splitlines()[1], next(line for line in table.splitlines() if line.startswith("speedup"))
    assert header.split()[1] == "pooled" and "per-prompt mean" in header
    assert speedup.split()[1] == f"{(1.5 + 2.5 + 3.5 + 4.5) / 4:.3f}"  # total time over total time: 12 / 4


def test_summarize_runs_and_the_report_lead_with_pooled_figures(tmp_path):
    """A run whose per-prompt mean speedup is 2.0 but whose pooled speedup is 1.25: the report's headline and its
    runs table say 1.25 and label it pooled; summary.csv holds both."""
    rows = [make_row("a", "p0", speedup=3.0, baseline_seconds=0.3, spec_seconds=0.1),
            make_row("a", "p1", speedup=1.5, baseline_seconds=1.5, spec_seconds=1.0),
            make_row("a", "p2", speedup=1.5, baseline_seconds=1.5, spec_seconds=1.0)]
    run = write_run(tmp_path / "run", rows)
    summary = summarize_runs(load_runs(run)).iloc[0]
    assert summary["speedup_mean"] == pytest.approx(2.0) and summary["speedup_pooled"] == pytest.approx(3.3 / 2.1)
    assert summary["speedup_pooled_ci_low"] <= summary["speedup_pooled"] <= summary["speedup_pooled_ci_high"]
    assert report_main([str(run)]) == 0
    report = (run / "report.md").read_text()
    assert f"**Fastest lossless:** strategy=speculative, k=4, pooled speedup {3.3 / 2.1:.2f}×" in report
    assert "| speedup (pooled) | speedup (per-prompt mean) |" in report


def test_the_report_names_the_prompts_too_short_to_time(tmp_path):
    rows = [make_row("a", f"p{i}") for i in range(3)] + [make_row("a", "tiny", target_calls=1)]
    run = write_run(tmp_path / "run", rows)
    assert report_main([str(run)]) == 0
    report = (run / "report.md").read_text()
    assert "- **Too short to time:** 1 of 4 (run, prompt) rows" in report
    assert "strategy=speculative, k=4: tiny" in report


@pytest.mark.parametrize("n", [30, 5000])  # 5000: several resamples per draw, and resamples split across draws
def test_bootstrap_totals_resample_the_rows_with_replacement(n):
    """Each resample's totals are n rows drawn with replacement: their mean over resamples is the column totals,
    their spread sqrt(n) times the rows' standard deviation (the multinomial's), and a constant column stays n x it."""
    import numpy as np

    values = np.stack([np.random.default_rng(1).exponential(size=n), np.full(n, 2.0)], axis=1)  # [n, 2]
    totals = bootstrap_totals(values)  # [samples, 2]
    assert totals.shape == (BOOTSTRAP_SAMPLES, 2)
    spread = math.sqrt(n) * values[:, 0].std()
    assert abs(totals[:, 0].mean() - values[:, 0].sum()) < 4 * spread / math.sqrt(BOOTSTRAP_SAMPLES)
    assert totals[:, 0].std() == pytest.approx(spread, rel=0.1)
    assert np.allclose(totals[:, 1], 2.0 * n)
    assert np.array_equal(bootstrap_totals(values), totals)  # seeded


def test_the_bootstrap_over_prompts_and_rounds_carries_the_round_to_round_spread():
    """Rounds that disagree within prompts whose sums agree: resampling prompts alone sees no spread; the two-stage
    bootstrap (prompts, then each drawn prompt's rounds) has Var(total) = (2 - 1/P) R sum_p sigma_p^2, sigma_p^2
    the population variance of prompt p's rounds; rounds that agree give the plain bootstrap over prompts."""
    import numpy as np

    prompts, rounds = 6, 3
    values = np.array([[p + 1.0 + d] for p in range(prompts) for d in (-0.5 * (p % 2 + 1), 0.0, 0.5 * (p % 2 + 1))])
    labels = [p for p in range(prompts) for _ in range(rounds)]
    sums = values.reshape(prompts, rounds).sum(1)
    shifted = values + (sums.max() - np.repeat(sums, rounds))[:, None] / rounds  # every prompt's sum equal
    totals = bootstrap_totals(shifted, labels)[:, 0]
    sigma2 = shifted.reshape(prompts, rounds).var(axis=1, ddof=0)
    assert totals.mean() == pytest.approx(shifted.sum(), rel=0.01)
    assert totals.std() == pytest.approx(math.sqrt((2 - 1 / prompts) * rounds * sigma2.sum()), rel=0.1)
    agreeing = np.repeat(sums[:, None] / rounds, rounds, axis=0)  # [P*R, 1] rounds equal within each prompt
    expected = math.sqrt(prompts) * sums.std(ddof=0)  # the plain bootstrap of P prompt sums
    assert bootstrap_totals(agreeing, labels)[:, 0].std() == pytest.approx(expected, rel=0.1)


def test_the_rows_of_one_batch_are_one_unit_of_the_interval():
    """At batch 16 the rows of a call share its timings: 8 calls are 8 observations of the speedup, not 128. The
    interval over batches is as wide as a bootstrap of the 8 calls' own speedups gives, and about sqrt(16) times
    the one that took the rows as independent (as it did before rows carried their batch)."""
    import numpy as np

    speedups = [1.00, 1.10, 0.95, 1.20, 1.05, 0.90, 1.15, 1.02]  # each call's
    rows = [timed_row(f"p{call}-{row}", 16.0 / speedup, 16.0, 64, batch_size=16, batch_hash=f"p{call}-0")
            for call, speedup in enumerate(speedups) for row in range(16)]
    batched = pooled_figure(rows, "speedup")
    as_rows = pooled_figure([{k: v for k, v in row.items() if k != "batch_hash"} for row in rows], "speedup")
    generator = np.random.default_rng(1)
    drawn = generator.integers(0, 8, (4000, 8))  # the calls, resampled
    spec = (1.0 / np.array(speedups))[drawn].sum(1)
    reference = np.percentile(8 / spec, [2.5, 97.5])  # speedup = total baseline time / total spec time per token
    width = batched["ci_high"] - batched["ci_low"]
    assert width == pytest.approx(reference[1] - reference[0], rel=0.2)
    assert width > 3 * (as_rows["ci_high"] - as_rows["ci_low"])
    assert batched["value"] == as_rows["value"]
