"""experiments.cost_check: the start-up cost table beside the loop's own steps, per draft length. What it must get
right: each k's seconds per verification and per step's drafting from the calls' DecodeStats (the prefill left
out), the rows those forwards computed, and each width's price over one token's in the loop against the table's."""

from __future__ import annotations

import json

import pytest

from experiments.common import processes
from experiments import cost_check
from specdec.costs import CostModel, CostTable


def run(tmp_path, *extra):
    out = tmp_path / "out"
    cost_check.main(["--calls", "2", "--k-max", "2", "--max-new-tokens", "6", "--temperature", "0",
                     "--out", str(out), *extra])
    return json.loads((out / "cost_check.json").read_text())


def test_a_width_the_loop_prices_apart_from_the_table_shows_as_its_price_error():
    """The loop takes 1.2 times the table's seconds at every width but the 5 tokens of k = 4, where it takes 1.5
    times: only k = 4's price over one token is off, by 1.5 / 1.2 - 1."""
    table = CostTable({1: {n: 0.01 + 0.002 * n for n in range(1, 10)}, 4: {n: 0.02 + 0.008 * n for n in range(1, 10)}})
    costs = CostModel(table, CostTable({1: {1: 0.001, 2: 0.0015}, 4: {1: 0.002, 2: 0.003}}))
    loop = {k: {"verify": (1.5 if k == 4 else 1.2) * costs.verify(k, 2.5), "draft": 2 * costs.draft_chain(k, 2.5),
                "rows": 2.5} for k in range(6)}
    rows = cost_check.compare(costs, loop)
    assert [row["k"] for row in rows] == list(range(6))
    assert [row["price error"] for row in rows] == [0.0, 0.0, 0.0, 0.0, 0.25, 0.0]
    expected_price = round(costs.verify(3, 2.5) / costs.verify(0, 2.5), 3)  # read at the rows per forward
    assert rows[3]["table price"] == rows[3]["loop price"] == expected_price
    assert rows[2]["loop draft ms"] == round(2 * rows[2]["table draft ms"], 3) and rows[0]["table draft ms"] == 0.0
    assert cost_check.largest_error(rows) == {"largest price error": 0.25, "at k": 4}


def test_each_draft_length_timed_in_the_loop_at_the_rows_its_steps_fed(tmp_path):
    """At batch 1 every step feeds one row; at batch 2 the plain loop's rows finish together (EOS ignored) and a
    drafting call's steps feed one or two rows. Each k's loop price is its verification over the plain loop's."""
    for batch in (1, 2):
        result = run(tmp_path / str(batch), "--batch-size", str(batch))
        (table,) = result["processes"]
        assert [row["k"] for row in table] == [0, 1, 2]
        assert table[0]["rows fed"] == batch and table[0]["price error"] == 0.0
        assert all(1 <= row["rows fed"] <= batch for row in table)
        assert all(row["loop verify ms"] > 0 and row["table verify ms"] > 0 for row in table)
        assert all(row["loop draft ms"] > 0 and row["table draft ms"] > 0 for row in table[1:])
        prices = [row["loop verify ms"] / table[0]["loop verify ms"] for row in table]  # of the rounded ms
        assert [row["loop price"] for row in table] == pytest.approx(prices, abs=2e-3)


def test_step_times_keep_only_the_steps_that_drafted_all_k():
    """Near max_new_tokens the loop drafts fewer than k; those steps, and the prefill's, are not k's."""
    from experiments.common.harness import load_bench_pair
    from specdec.batching import left_pad

    pair = load_bench_pair("embedded", 2, "cpu", "float32")
    policy = cost_check.StepTimes(4)
    decoder = cost_check.specdec.Decoder(pair.target, cost_check.specdec.ModelDrafter(pair.draft), draft_length=policy)
    ids, mask = left_pad(pair.prompts[:1])
    output = decoder.generate(ids, mask, max_new_tokens=16)
    full = output.stats.totals.steps_by_k[4] - 1  # the prefill's step drafted 4 too; its forward is the prompt's
    assert 0 < len(policy.steps) == full < output.stats.target_forwards  # and a shorter step came near the end
    assert all(rows == 1 and verify > 0 and draft > 0 for verify, draft, rows in policy.steps)


def test_processes_each_measure_afresh_and_the_summary_names_each_ones_largest_error(tmp_path, stand_in_processes):
    first = run(tmp_path)

    def change(result):
        result["processes"][0][2]["price error"] = -0.4
    first_calls = stand_in_processes(first, "cost_check.json", change)
    pooled = run(tmp_path / "pooled", "--processes", "2")
    assert first_calls == [0, 2]  # the second process's calls come after the first's 2: their own prompts, seeds and rows of the design
    assert pooled["processes"][0] == first["processes"][0] and pooled["processes"][1][2]["price error"] == -0.4
    summary = (tmp_path / "pooled" / "out" / "cost_check.md").read_text()
    assert "| 2 | -0.4 | 2 |" in summary


@pytest.mark.parametrize("argv, named", [
    (["--batch-size", "0"], "--batch-size: expected an integer >= 1, got '0'"),
    (["--k-max", "x"], "--k-max: expected an integer >= 1, got 'x'"),
    (["--temperature", "-1"], "--temperature: expected a temperature >= 0"),
    (["--pair", "gpt5"], "--pair 'gpt5': unknown preset 'gpt5'"),
    (["--k-max", "8", "--max-new-tokens", "17"], "--k-max 8 with --max-new-tokens 17: a call must have room"),
])
def test_bad_options_are_refused_in_one_line_before_any_model_loads(argv, named, capsys):
    with pytest.raises(SystemExit) as refused:
        cost_check.parse_args(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert refused.value.code == 2 and len(lines) == 1 and named in lines[0], lines


@pytest.mark.parametrize("bench, argv", [
    ("cost_check", ["--batch-size", "4", "--temperature", "0.5", "--k-max", "3", "--calls", "5", "--threads", "1"]),
    ("load_bench", ["--batch-sizes", "1,16", "--temperatures", "0,1", "--ks", "2,4", "--calls", "3"]),
])
def test_a_fresh_process_parses_the_benchs_own_options_back_with_its_own_out_and_order(bench, argv, tmp_path):
    """``--processes``: each child parses to the parent's options but for its own --out and the design's rows after
    the last child's calls."""
    from experiments import load_bench

    parse = {"cost_check": cost_check.parse_args, "load_bench": load_bench.parse_args}[bench]
    parent = parse([*argv, "--processes", "3", "--out", str(tmp_path / "out")])
    child = parse(processes.fresh_process_argv(parent, tmp_path / "out" / "process-2", 2, parent.calls))
    calls = parent.calls
    assert vars(child) == {**vars(parent), "processes": 1, "out": str(tmp_path / "out" / "process-2"),
                           "first_call": 2 * calls}
