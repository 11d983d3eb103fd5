"""specdec.results, the one results schema: its columns against the documentation, the rows.jsonl reader both
sides use, the interval, and the Markdown table writer."""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO

from specdec.results import (
    INTERVAL_METRICS,
    METRIC_COLUMNS,
    METRIC_RANGES,
    PROMPT_COLUMNS,
    confidence_interval,
    markdown_table,
    parse_rows,
    read_rows,
)


def documented_tables() -> dict[str, list[str]]:
    """Header line -> the column names in the first cell of each row, for each table of docs/results-schema.md."""
    tables, header = {}, None
    for line in (REPO / "docs" / "results-schema.md").read_text().splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cell = line.split("|")[1].strip()
        if header is None:
            header = line
            tables[header] = []
        elif not set(cell) <= set("-: "):
            tables[header] += [name.strip() for name in cell.split(",")]
    return tables


def test_the_documented_metrics_are_the_schemas_in_its_order():
    tables = documented_tables()
    assert list(tables["| column | meaning |"]) == list(METRIC_COLUMNS)
    assert set(PROMPT_COLUMNS) <= set(tables["| column | type | meaning |"])


def test_interval_metrics_are_metrics_with_a_range():
    assert set(INTERVAL_METRICS) <= set(METRIC_COLUMNS)
    assert set(METRIC_RANGES) == set(INTERVAL_METRICS)
    assert METRIC_RANGES["acceptance_rate"] == (0.0, 1.0)


def test_parse_rows_keeps_every_row_that_parses_and_numbers_the_rest():
    a, b, c = ({"run_id": "r", "prompt_id": f"p{i}"} for i in range(3))
    text = (json.dumps(a) + json.dumps(b) + "\n"  # two rows merged on one line
            + '{"run_id": "torn' + json.dumps(c) + "\n"  # a torn row the next one was appended to
            + "\n[1, 2]\n")  # a blank line, and JSON that is not a row
    rows, unparsed = parse_rows(text)
    assert rows == [a, b, c]
    assert unparsed == [(2, '{"run_id": "torn'), (4, "[1, 2]")]


def test_read_rows_of_a_directory_without_rows_is_empty(tmp_path):
    assert read_rows(tmp_path) == []
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"a": 2')
    assert read_rows(tmp_path) == [{"a": 1}]


def test_confidence_interval_skips_what_is_not_a_finite_number():
    values = [0.6, None, math.nan, math.inf, 0.7, 0.9]
    assert confidence_interval(values) == pytest.approx(confidence_interval([0.6, 0.7, 0.9]))
    assert all(math.isnan(v) for v in confidence_interval([None, math.nan]))


def test_markdown_table_escapes_pipes_and_ends_without_a_newline():
    assert markdown_table(["a", "b|c"], [[1, "x|y"], [2.5, True]]) == (
        "| a | b\\|c |\n| --- | --- |\n| 1 | x\\|y |\n| 2.5 | True |")
