"""specdec.results, the one results schema: the typed row record against the documentation and specdec.stats,
the readers resume and analysis share (rows, config, summary, failure) on damaged files, the interval, and the
Markdown table writer."""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace

import pytest
from conftest import REPO

from specdec.results import (
    CONDITION_COLUMNS,
    DUPLICATE,
    IDENTITY_COLUMNS,
    INTERVAL_METRICS,
    LIST_COLUMNS,
    METRIC_COLUMNS,
    METRIC_RANGES,
    NOT_A_ROW,
    OTHER_RUN,
    OUTPUT_COLUMNS,
    PROMPT_COLUMNS,
    PROVENANCE_COLUMNS,
    UNREADABLE,
    Condition,
    Metrics,
    Outputs,
    PromptColumns,
    Provenance,
    Row,
    RunIdentity,
    confidence_interval,
    describe_pieces,
    markdown_table,
    pooled,
    read_config,
    read_failure,
    read_rows,
    read_rows_file,
    read_summary,
    schema_tables,
    type_problem,
    leviathan_speedup,
)
from specdec.stats import DecodeStats, RowStats

SCHEMA_DOC = REPO / "docs" / "results-schema.md"


def test_the_documented_tables_are_generated_from_the_record():
    """docs/results-schema.md holds schema_tables() verbatim: a column added, renamed, retyped or re-explained in
    the record without the doc fails here (regenerate with `python -c "from specdec.results import
    schema_tables; print(schema_tables())"`)."""
    text = SCHEMA_DOC.read_text()
    generated = text.split("<!-- generated: specdec.results.schema_tables() -->\n")[1].split("<!-- end generated")[0]
    assert generated == schema_tables()
    assert "| prompt_hash | str |" in generated and "| speedup | float |" in generated


def test_the_column_lists_are_the_records_fields_and_do_not_overlap():
    groups = (IDENTITY_COLUMNS, CONDITION_COLUMNS, PROVENANCE_COLUMNS, PROMPT_COLUMNS, METRIC_COLUMNS,
              OUTPUT_COLUMNS)
    records = (RunIdentity, Condition, Provenance, PromptColumns, Metrics, Outputs)
    assert [list(g) for g in groups] == [[f.name for f in fields(r)] for r in records]
    every = [name for group in groups for name in group]
    assert len(every) == len(set(every))
    assert LIST_COLUMNS == ("per_position_acceptance", "per_position_attempts", "per_position_accepted",
                            "accepted_histogram", "k_histogram", "tokens", "baseline_tokens")


def test_interval_metrics_are_metrics_with_a_range():
    assert set(INTERVAL_METRICS) <= set(METRIC_COLUMNS)
    assert set(METRIC_RANGES) == set(INTERVAL_METRICS)
    assert METRIC_RANGES["acceptance_rate"] == (0.0, 1.0)


def stats(rows: list[RowStats], wall: float, forwards: tuple[int, int] = (6, 4)) -> DecodeStats:
    """A call's stats: draft steps take 0.1 s per forward and target steps 1 s, so the cost ratio is 0.1."""
    draft_forwards, target_forwards = forwards
    return DecodeStats(rows=rows, draft_forwards=draft_forwards, target_forwards=target_forwards,
                       draft_seconds=0.1 * draft_forwards + 0.05, target_seconds=1.0 * target_forwards + 0.5,
                       wall_seconds=wall, ttft_seconds=0.5, first_step_emitted=2,
                       draft_step_seconds=0.1 * draft_forwards, target_step_seconds=1.0 * target_forwards,
                       expected_overlap_sum=3.0, expected_overlap_count=4)


def test_metrics_are_built_from_decode_stats_by_its_definitions():
    spec = stats([RowStats(9, 8, 6, 3, [3, 3], [3, 2], [0, 2, 2]), RowStats(4, 0, 0, 4, [0, 0], [0, 0])], wall=2.0)
    base = stats([RowStats(9, 0, 0, 9, [], []), RowStats(4, 0, 0, 4, [], [])], wall=6.5, forwards=(0, 12))
    first = Metrics.measure(spec, base, row=0, tree=False)
    assert (first.emitted, first.drafted, first.accepted, first.target_calls) == (9, 8, 6, 3)
    assert first.acceptance_rate == 6 / 8 and first.mean_accepted_length == 3.0
    assert first.per_position_acceptance == [1.0, 2 / 3]
    assert first.draft_calls == 6 and first.expected_acceptance == 0.75 and first.baseline_emitted == 9
    assert first.speedup == pytest.approx((6.5 / 13) / (2.0 / 13))  # the batch's seconds per token
    assert first.cost_ratio == pytest.approx(0.1)
    assert first.predicted_speedup == pytest.approx((1 + 0.75 + 0.75**2) / (2 * 0.1 + 1))
    assert first.other_seconds == pytest.approx(2.0 - 0.65 - 4.5) and first.spec_tokens_per_s == 13 / 2.0
    nothing_drafted = Metrics.measure(spec, base, row=1, tree=False)
    assert math.isnan(nothing_drafted.acceptance_rate) and math.isnan(nothing_drafted.predicted_speedup)
    assert math.isnan(Metrics.measure(spec, base, row=0, tree=True).predicted_speedup)  # chains only


def test_steps_not_timed_by_phase_take_the_profiled_cost_ratio_and_say_so():
    """The device step times no phase (NaN seconds): its rows take the run's profiled ratio, marked 'profile', and
    get Leviathan's prediction from it; timed steps keep their own ratio whatever the profile says."""
    spec = stats([RowStats(9, 8, 6, 3, [3, 3], [3, 2], [0, 2, 2])], wall=2.0)
    untimed = replace(spec, draft_step_seconds=math.nan, target_step_seconds=math.nan)
    base = stats([RowStats(9, 0, 0, 9, [], [])], wall=6.5, forwards=(0, 12))
    timed = Metrics.measure(spec, base, row=0, tree=False, profiled_cost_ratio=0.3)
    assert timed.cost_ratio == pytest.approx(0.1) and timed.cost_ratio_source == "steps"
    profiled = Metrics.measure(untimed, base, row=0, tree=False, profiled_cost_ratio=0.3)
    assert profiled.cost_ratio == 0.3 and profiled.cost_ratio_source == "profile"
    assert profiled.predicted_speedup == pytest.approx((1 + 0.75 + 0.75**2) / (2 * 0.3 + 1))
    neither = Metrics.measure(untimed, base, row=0, tree=False)
    assert math.isnan(neither.cost_ratio) and neither.cost_ratio_source is None
    assert math.isnan(neither.predicted_speedup)


def a_row(prompt_id: str = "p0", speedup: float = 1.5, **options) -> Row:
    identity = RunIdentity("run-1", "g", "embedded", "specdec", None, "model", "speculative", True, "fixed", 2,
                           "greedy", 0.0, None, None, None, 8, 0, 1, "embedded_heldout", "cpu", "float32", False,
                           "auto", True, None, 1)
    spec = stats([RowStats(9, 8, 6, 3, [3, 3], [3, 2], [0, 2, 2])], wall=1.0)
    metrics = Metrics.measure(spec, spec, 0, False)
    provenance = Provenance("abc123", False, "0.1", "2.13.0+cpu", "5.23.0", "0" * 16, "1" * 16, "cpu", 2)
    return Row(identity, options, Condition("host-a", 1, 0.5, 0.7), provenance,
               PromptColumns(prompt_id, "0123456789ab", 5, None, 0, "0123456789ab"),
               Metrics(**{**{f.name: getattr(metrics, f.name) for f in fields(Metrics)}, "speedup": speedup}),
               Outputs.of([1, 2], [1, 2], greedy=True))


def test_a_row_is_flat_in_column_order_with_undefined_metrics_as_null():
    row = a_row(speedup=math.nan, strategy_lenience=1.0).to_json()
    assert list(row) == [*IDENTITY_COLUMNS, "strategy_lenience", *CONDITION_COLUMNS, *PROVENANCE_COLUMNS,
                         *PROMPT_COLUMNS,
                         *METRIC_COLUMNS, *OUTPUT_COLUMNS]
    assert row["speedup"] is None and row["prompt_hash"] == "0123456789ab"
    assert json.loads(json.dumps(row, allow_nan=False)) == row


def test_pooled_metrics_follow_row_stats():
    """The pooled counts are RowStats' definitions over the summed counts. (summary.json's `pooled` now also holds
    the pooled timings and an interval for each figure: tests/test_pooled.py.)"""
    rows = [{"emitted": 9, "drafted": 8, "accepted": 6, "target_calls": 3, "baseline_emitted": 9},
            {"emitted": 4, "drafted": 0, "accepted": 0, "target_calls": 4, "baseline_emitted": None}]
    totals = RowStats(13, 8, 6, 7, [], [])
    figures = pooled(rows)
    assert figures["acceptance_rate"]["value"] == totals.acceptance_rate
    assert figures["mean_accepted_length"]["value"] == totals.mean_accepted_length
    assert (figures["emitted"], figures["baseline_emitted"]) == (13, 9)
    nothing_drafted = pooled([{"emitted": 1, "drafted": 0, "accepted": 0, "target_calls": 1}])
    assert math.isnan(nothing_drafted["acceptance_rate"]["value"])


def test_outputs_say_whether_the_runs_agree_only_where_they_must():
    assert Outputs.of([1, 2], [1, 2], greedy=True).identical_output is True
    assert Outputs.of([1, 2], [1, 3], greedy=True).identical_output is False
    assert Outputs.of([1, 2], [1, 3], greedy=False).identical_output is None
    lossy = Outputs.of([1], [2], greedy=True, log_likelihoods=(-1.5, -1.0))
    assert (lossy.log_likelihood, lossy.baseline_log_likelihood) == (-1.5, -1.0)


def line(row: dict) -> bytes:
    return json.dumps(row).encode() + b"\n"


def test_the_rows_reader_keeps_one_row_per_prompt_of_one_run_and_counts_the_rest(tmp_path):
    """Every damage the issue found, in one file: merged rows kept; a non-UTF-8 line, a torn piece, `{}`, a row
    without run_id, a row of another run and a repeated prompt left out, each with its line and reason; a
    hand-edited numeric prompt_id read as its string."""
    a, b, c = ({"run_id": "r", "prompt_id": f"p{i}", "prompt_hash": f"h{i}", "speedup": i} for i in range(3))
    data = (line(a).rstrip(b"\n") + line(b)  # 1: two rows merged on one line
            + b"\xff\xfe\x00\x01 not text\n"  # 2
            + b'{"run_id": "torn' + line(c)  # 3: a torn row the next one was appended to
            + b"{}\n"  # 4
            + line({"prompt_id": "p7"})  # 5
            + line({"run_id": "other", "prompt_id": "p8"})  # 6
            + line({**a, "speedup": 99})  # 7: p0 again
            + b"\n[1, 2]\n"  # 9
            + line({"run_id": "r", "prompt_id": 4}))  # 10
    (tmp_path / "rows.jsonl").write_bytes(data)
    found = read_rows_file(tmp_path)
    assert found.rows == [a, b, c, {"run_id": "r", "prompt_id": "4"}] and found.problem is None
    assert [(piece.line, piece.reason) for piece in found.set_aside] == [
        (2, UNREADABLE), (3, UNREADABLE), (4, NOT_A_ROW), (5, NOT_A_ROW), (6, OTHER_RUN), (7, DUPLICATE),
        (9, UNREADABLE)]
    assert found.set_aside[0].raw == b"\xff\xfe\x00\x01 not text" and found.last_line == 10
    assert describe_pieces(found.set_aside) == ("3 unreadable line piece(s), 2 object(s) without run_id or "
                                                "prompt_id, 1 row(s) of another run, 1 duplicate row(s)")


def test_rows_without_a_hash_are_known_by_their_id(tmp_path):
    """Rows written before rows carried prompt_hash: one per prompt_id (3 and "3" are one prompt)."""
    (tmp_path / "rows.jsonl").write_bytes(line({"run_id": "r", "prompt_id": 3}) + line({"run_id": "r",
                                                                                         "prompt_id": "3"}))
    found = read_rows_file(tmp_path)
    assert found.rows == [{"run_id": "r", "prompt_id": "3"}] and [p.reason for p in found.set_aside] == [DUPLICATE]


def test_the_rows_reader_of_an_absent_file_or_a_directory(tmp_path):
    assert read_rows(tmp_path) == [] and read_rows_file(tmp_path).problem is None
    (tmp_path / "rows.jsonl").mkdir()
    found = read_rows_file(tmp_path)
    assert found.rows == [] and found.problem == f"{tmp_path / 'rows.jsonl'} is a directory, not a file"


@pytest.mark.parametrize("content, problem", [
    (b"", "is empty (cut short while it was written)"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff", "is not UTF-8 text (binary or damaged)"),
    (b"pair:\n  preset: embedded\n  draft: [unclosed", "is not valid YAML"),
    (b"- a list\n", "holds a list, not a mapping of settings"),
    (b"seed: 2001-13-45\n", "is not valid YAML"),  # YAML's date type raises ValueError
])
def test_the_config_reader_says_what_is_wrong_in_one_line(tmp_path, content, problem):
    (tmp_path / "config.yaml").write_bytes(content)
    value, found = read_config(tmp_path)
    assert value is None and found.startswith(str(tmp_path / "config.yaml")) and problem in found
    assert "\n" not in found


def test_the_config_reader_of_an_absent_a_directory_and_a_good_file(tmp_path):
    assert read_config(tmp_path) == (None, None)
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    assert read_config(tmp_path) == ({"seed": 0}, None)
    (tmp_path / "config.yaml").unlink()
    (tmp_path / "config.yaml").mkdir()
    assert "is a directory" in read_config(tmp_path).problem


@pytest.mark.parametrize("content, problem", [
    (b'{"prompts": 3, "metr', "is not valid JSON"),
    (b"\x00\xff\xfe", "is not UTF-8 text"),
    (b"[1, 2]", "holds a list, not a JSON object"),
    (b"[" * 100_000, "is not valid JSON"),  # nesting deep enough to exhaust the recursion limit
])
def test_summary_and_failure_readers_survive_damage(tmp_path, content, problem):
    for name, reader in (("summary.json", read_summary), ("failure.json", read_failure)):
        (tmp_path / name).write_bytes(content)
        value, found = reader(tmp_path)
        assert value is None and problem in found and "\n" not in found


def test_a_failure_mark_needs_an_error_and_an_exit_code(tmp_path):
    (tmp_path / "failure.json").write_text(json.dumps({"exit_code": "2"}))
    assert "lacks a string 'error' and an integer 'exit_code'" in read_failure(tmp_path).problem
    (tmp_path / "failure.json").write_text(json.dumps({"exit_code": 2, "error": "config error: k=0"}))
    assert read_failure(tmp_path) == ({"exit_code": 2, "error": "config error: k=0"}, None)


def test_column_types_come_from_the_record():
    row = a_row().to_json()
    assert type_problem(row) is None and type_problem(row | {"speedup": None, "top_k": None}) is None
    assert type_problem(row | {"k": "four"}) == "column k holds 'four' (str) where the schema has int"
    assert type_problem(row | {"k": True}) == "column k holds True (bool) where the schema has int"
    assert type_problem(row | {"strategy": None}) == "column strategy holds None (NoneType) where the schema has str"
    assert "where the schema has list[float | None]" in type_problem(row | {"per_position_acceptance": "0.5"})
    assert type_problem({"strategy_lenience": "anything"}) is None  # an option's parameter: not in the record


def test_confidence_interval_of_values_near_floats_maximum_does_not_overflow():
    mean, low, high = confidence_interval([1e308, 1e308, 1e308], metric="speedup")
    assert mean == pytest.approx(1e308) and (low, high) == (pytest.approx(1e308), pytest.approx(1e308))
    assert confidence_interval([1e308, -1e308, 1e308])[2] == math.inf


def test_confidence_interval_skips_what_is_not_a_finite_number():
    values = [0.6, None, math.nan, math.inf, 0.7, 0.9, "1.0", True]
    assert confidence_interval(values) == pytest.approx(confidence_interval([0.6, 0.7, 0.9]))
    assert all(math.isnan(v) for v in confidence_interval([None, math.nan]))


def test_markdown_table_escapes_pipes_and_ends_without_a_newline():
    assert markdown_table(["a", "b|c"], [[1, "x|y"], [2.5, True]]) == (
        "| a | b\\|c |\n| --- | --- |\n| 1 | x\\|y |\n| 2.5 | True |")


def test_the_predicted_speedup_takes_the_k_the_steps_drafted_not_the_configured_one():
    """Four Medusa heads under draft_length.k=8 draft 4 a step: two steps of 4 drafts predict at k = 4."""
    spec = stats([RowStats(9, 8, 6, 3, [2, 2, 1, 1, 0, 0, 0, 0], [2, 2, 1, 1, 0, 0, 0, 0],
                           [0, 0, 1, 0, 1, 0, 0, 0, 0])], wall=2.0)
    metrics = Metrics.measure(spec, spec, row=0, tree=False)
    alpha = 6 / 8
    assert metrics.predicted_speedup == pytest.approx(sum(alpha**i for i in range(5)) / (4 * 0.1 + 1))
    assert leviathan_speedup(1.0, 2.5, 0.0) == 3.5 and math.isnan(leviathan_speedup(math.nan, 4, 0.1))
    assert leviathan_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)  # an integer k: eq. 1 as it stands
