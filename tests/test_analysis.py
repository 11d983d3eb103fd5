"""analysis/: loading results in the docs/results-schema.md format, summaries, pivots, plots and the report."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from analysis import (
    DamagedRunWarning,
    PartialRunWarning,
    ResultsError,
    confidence_interval,
    load_runs,
    load_wandb_runs,
    per_position_long,
    pivot_metric,
    predicted_speedup,
    summarize_runs,
    to_markdown,
)
from analysis.report import main, pivot_axes, write_report
from analysis.summarize import varying_axes
from experiments.common.loggers import table_cell
from specdec.results import METRIC_COLUMNS

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Per-prompt speedup offsets: run mean = base, sample standard deviation 0.1.
OFFSETS = (-0.1, 0.0, 0.1)
# (strategy, k, base speedup, acceptance rates of the three prompts); the last run is killed after 2 prompts.
SWEEP = (
    ("speculative", 2, 1.4, (0.8, 0.8, 0.8)),
    ("speculative", 4, 1.6, (0.7, 0.7, 0.7)),
    ("typical", 2, 1.5, (0.9, 0.9, 0.9)),
    ("typical", 4, 1.9, (0.6, 0.7, 0.9)),
    ("typical", 6, 1.2, (0.5, 0.5)),
)


def make_row(run_id, prompt_id, strategy="speculative", k=4, speedup=1.5, acceptance=0.8, **overrides):
    """A complete row of the results schema with self-consistent counts and timings (both runs emit the same
    tokens, so the speculative run took baseline seconds / speedup)."""
    drafted, accepted = 10 * k, round(10 * k * acceptance)
    emitted, target_calls = accepted + 10, 10
    baseline_tokens_per_s = 50.0
    row = dict(
        run_id=run_id, group="sweep-a", pair="embedded", drafter="model", strategy=strategy,
        lossless=strategy not in ("typical", "topk", "synthetic"),
        draft_length="fixed", k=k, sampling="greedy", temperature=0.0, top_k=None, top_p=None, min_p=None,
        max_new_tokens=64, seed=0, batch_size=1, data="tiny", device="cpu", dtype="float32",
        prompt_id=prompt_id, prompt_tokens=12,
        emitted=emitted, drafted=drafted, accepted=accepted, target_calls=target_calls, draft_calls=k * 10,
        acceptance_rate=acceptance, mean_accepted_length=emitted / target_calls,
        per_position_acceptance=[acceptance] * (k - 1) + [None],  # the last position never reached
        expected_acceptance=None,
        draft_seconds=0.1, target_seconds=0.5, other_seconds=0.05, spec_seconds=1.0 / speedup, baseline_seconds=1.0,
        baseline_emitted=emitted, spec_tokens_per_s=baseline_tokens_per_s * speedup,
        baseline_tokens_per_s=baseline_tokens_per_s, speedup=speedup, cost_ratio=0.1,
        predicted_speedup=1.0, ttft_seconds=0.01, itl_seconds=0.01, baseline_ttft_seconds=0.01,
        baseline_itl_seconds=0.02,
    )
    return row | overrides


def write_run(run_dir, rows, finished=True, config=None):
    """A run directory as experiments.run writes it; no summary.json marks a killed run."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config or {"model": {"target": {"name": "tiny"}}}))
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({"prompts": len(rows)}))
    return run_dir


def write_sweep(sweep_dir):
    """SWEEP as numbered job directories; the last job has no summary.json."""
    for job, (strategy, k, base, acceptances) in enumerate(SWEEP):
        rows = [make_row(f"run{job}", f"p{i}", strategy, k, base + OFFSETS[i], acceptance)
                for i, acceptance in enumerate(acceptances)]
        write_run(sweep_dir / str(job), rows, finished=job < len(SWEEP) - 1, config={"job": job})
    (sweep_dir / "multirun.yaml").write_text("hydra: {}\n")
    return sweep_dir


@pytest.fixture
def sweep(tmp_path):
    return write_sweep(tmp_path / "sweep")


def load_sweep(sweep):
    with pytest.warns(PartialRunWarning):
        return load_runs(sweep)


def test_load_runs_one_row_per_run_and_prompt(sweep):
    frame = load_sweep(sweep)
    assert len(frame) == 3 * 4 + 2
    assert list(frame.columns[:3]) == ["run_id", "group", "pair"]
    assert list(frame.columns[-2:]) == ["run_dir", "partial"]
    assert frame["run_id"].unique().tolist() == [f"run{job}" for job in range(5)]
    assert frame.groupby("run_id").size().tolist() == [3, 3, 3, 3, 2]
    first = frame.iloc[0]
    assert (first["strategy"], first["k"], first["prompt_id"]) == ("speculative", 2, "p0")
    assert first["speedup"] == pytest.approx(1.3)
    assert first["per_position_acceptance"] == [0.8, None]
    assert first["run_dir"] == str((sweep / "0").resolve())
    assert frame["top_k"].isna().all()


def test_partial_run_is_flagged_and_warned(sweep):
    with pytest.warns(PartialRunWarning, match=re.escape(str((sweep / "4").resolve()))):
        frame = load_runs(sweep)
    assert frame.groupby("run_id")["partial"].first().tolist() == [False] * 4 + [True]


def test_run_dirs_and_sweeps_can_be_mixed_and_loaded_once(sweep):
    frame = load_runs(sweep / "0", sweep / "1", sweep / "0")
    assert frame["run_id"].unique().tolist() == ["run0", "run1"]


def test_sweep_jobs_load_in_numeric_order(tmp_path):
    for job in (10, 2, 1):
        write_run(tmp_path / str(job), [make_row(f"run{job}", "p0")])
    assert load_runs(tmp_path)["run_id"].tolist() == ["run1", "run2", "run10"]


def test_config_keys_become_columns(tmp_path):
    write_run(tmp_path / "0", [make_row("a", "p0"), make_row("a", "p1")])
    frame = load_runs(tmp_path, config_keys=("model.target.name",))
    assert frame["model.target.name"].tolist() == ["tiny", "tiny"]
    with pytest.raises(ResultsError, match=re.escape(str((tmp_path / "0").resolve())) + ".*'model.draft'"):
        load_runs(tmp_path, config_keys=("model.draft",))


def test_per_position_long_form(sweep):
    long = per_position_long(load_sweep(sweep))
    assert list(long.columns) == ["run_id", "prompt_id", "position", "acceptance"]
    run1 = long[(long["run_id"] == "run1") & (long["prompt_id"] == "p0")]
    assert run1["position"].tolist() == [1, 2, 3, 4]
    assert run1["acceptance"].iloc[:3].tolist() == [0.7, 0.7, 0.7]
    assert math.isnan(run1["acceptance"].iloc[3])


def test_confidence_interval_matches_hand_computation():
    # sample 0.6, 0.7, 0.9: mean 2.2/3, s^2 = (1.66 - 2.2^2/3) / 2 = 0.07/3, t_{0.975, 2} = 4.302652729749462
    half = 4.302652729749462 * math.sqrt(0.07 / 3) / math.sqrt(3)
    mean, low, high = confidence_interval([0.6, 0.7, 0.9])
    assert mean == pytest.approx(2.2 / 3)
    assert (low, high) == (pytest.approx(2.2 / 3 - half), pytest.approx(2.2 / 3 + half))
    mean, low, high = confidence_interval([0.5, None, 0.7])  # two prompts: t = 12.7, no interval worth printing
    assert mean == pytest.approx(0.6) and math.isnan(low) and math.isnan(high)
    mean, low, high = confidence_interval([0.4])
    assert mean == 0.4 and math.isnan(low) and math.isnan(high)


def test_confidence_interval_respects_the_metrics_range():
    """Three spread-out acceptance rates: the raw t interval reaches below 0 and above 1; the reported one stops
    at the range, and only for metrics that have one."""
    values = [0.02, 0.5, 0.98]
    mean, raw_low, raw_high = confidence_interval(values)
    assert raw_low < 0 and raw_high > 1
    assert confidence_interval(values, metric="acceptance_rate") == (mean, 0.0, 1.0)
    assert confidence_interval([-1.0, 0.0, 4.0], metric="speedup")[1] == 0.0


def test_summarize_runs(sweep):
    summary = summarize_runs(load_sweep(sweep))
    assert len(summary) == 5
    assert summary["n_prompts"].tolist() == [3, 3, 3, 3, 2]
    assert summary["partial"].tolist() == [False] * 4 + [True]
    assert {"strategy", "k", "pair", "sampling", "seed"} <= set(summary.columns)
    assert not {"prompt_id", "prompt_tokens", "speedup"} & set(summary.columns)
    typical4 = summary.set_index("run_id").loc["run3"]
    # speedups 1.8, 1.9, 2.0: s = 0.1
    half = 4.302652729749462 * 0.1 / math.sqrt(3)
    assert typical4["speedup_mean"] == pytest.approx(1.9)
    assert typical4["speedup_ci_low"] == pytest.approx(1.9 - half)
    assert typical4["speedup_ci_high"] == pytest.approx(1.9 + half)
    assert typical4["acceptance_rate_ci_high"] == pytest.approx(  # 1.11 by the t formula: clipped to the range
        min(1.0, 2.2 / 3 + 4.302652729749462 * math.sqrt(0.07 / 3) / math.sqrt(3)))
    assert typical4["spec_tokens_per_s_mean"] == pytest.approx(50 * 1.9)
    assert typical4["per_position_acceptance_mean"][:3] == pytest.approx([2.2 / 3] * 3)
    assert math.isnan(typical4["per_position_acceptance_mean"][3])
    assert typical4["predicted_speedup"] == pytest.approx(float(predicted_speedup(2.2 / 3, 4, 0.1)))


def test_predicted_speedup():
    assert float(predicted_speedup(0.5, 2, 0.0)) == pytest.approx((1 - 0.5**3) / 0.5)
    assert float(predicted_speedup(0.5, 2, 0.25)) == pytest.approx(1.75 / 1.5)
    # a = 1: every draft accepted, k + 1 tokens per target call
    assert predicted_speedup([1.0, 1.0], [3, 4], [0.1, 0.0]).tolist() == pytest.approx([4 / 1.3, 5.0])


def test_pivot_metric(sweep):
    frame = load_sweep(sweep)
    summary = summarize_runs(frame)
    for data in (summary, frame):
        table = pivot_metric(data, "speedup", rows="strategy", cols="k")
        assert table.index.tolist() == ["speculative", "typical"]
        assert table.columns.tolist() == [2, 4, 6]
        assert table.loc["typical", 4] == pytest.approx(1.9)
        assert table.loc["speculative", 2] == pytest.approx(1.4)
        assert math.isnan(table.loc["speculative", 6])
    typical = summary[summary["strategy"] == "typical"]
    assert pivot_metric(typical, "n_prompts", "k")["n_prompts"].tolist() == [3, 3, 2]
    with pytest.raises(ResultsError, match="pivot cell strategy=speculative holds 2 runs"):
        pivot_metric(summary, "speedup", rows="strategy")
    with pytest.raises(ResultsError, match="'bogus'"):
        pivot_metric(summary, "bogus", rows="strategy", cols="k")


def test_to_markdown():
    table = pd.DataFrame({"k=2": [1.23456, float("nan")], "k=4": [1234.5, 0.5]},
                         index=pd.Index(["a|b", "c"], name="strategy"))
    assert to_markdown(table) == ("| strategy | k=2 | k=4 |\n| --- | --- | --- |\n"
                                  "| a\\|b | 1.23 | 1,234 |\n| c |  | 0.5 |\n")


def test_pivot_axes_put_k_across_and_other_axes_down():
    summary = pd.DataFrame([{"strategy": strategy, "k": k, "temperature": temperature, "pair": "p"}
                            for strategy in "ab" for k in (2, 4) for temperature in (0.0, 1.0)])
    summary["run_dir"] = [f"run{i}" for i in range(len(summary))]
    assert pivot_axes(summary) == (["strategy", "temperature"], "k")
    one_axis = summary[(summary["strategy"] == "a") & (summary["temperature"] == 0)]
    assert pivot_axes(one_axis) == (["k"], None)


def test_varying_axes_leave_out_relabellings():
    presets = (("greedy", 0.0), ("t1", 1.0))
    summary = pd.DataFrame([{"strategy": strategy, "k": k, "sampling": sampling, "temperature": temperature}
                            for strategy in "ab" for k in (2, 4) for sampling, temperature in presets])
    assert varying_axes(summary) == ["strategy", "k", "sampling"]  # the preset names its temperature
    assert varying_axes(summary[summary["strategy"] == "a"], exclude=("k",)) == ["sampling"]


@pytest.mark.parametrize("case", ["no_runs", "empty_rows", "missing_metric", "type_conflict", "duplicate_run_id",
                                  "missing_path", "rows_is_a_directory"])
def test_bad_input_errors_name_the_path(tmp_path, case):
    bad = tmp_path / "bad"
    if case == "no_runs":
        bad.mkdir()
    elif case == "empty_rows":
        write_run(bad, [])
    elif case == "missing_metric":
        write_run(tmp_path / "good", [make_row("a", "p0")])
        row = make_row("b", "p0")
        del row["speedup"]
        write_run(bad, [row])
    elif case == "type_conflict":
        write_run(tmp_path / "good", [make_row("a", "p0")])
        write_run(bad, [make_row("b", "p0") | {"k": "4"}])
    elif case == "rows_is_a_directory":
        (bad / "rows.jsonl").mkdir(parents=True)
    elif case == "duplicate_run_id":
        write_run(tmp_path / "good", [make_row("a", "p0")])
        write_run(bad, [make_row("a", "p0")])
    with pytest.raises(ResultsError) as error:
        load_runs(tmp_path if case in ("missing_metric", "type_conflict", "duplicate_run_id") else bad)
    message = str(error.value)
    assert str(bad.resolve() if bad.exists() and case != "no_runs" else bad) in message
    assert "\n" not in message


def test_half_written_last_row_of_a_killed_run_is_dropped(tmp_path):
    run = write_run(tmp_path / "run", [make_row("a", "p0")], finished=False)
    with open(run / "rows.jsonl", "a") as rows:
        rows.write('{"run_id": "a", "pro')
    with pytest.warns(PartialRunWarning) as caught:
        assert len(load_runs(run)) == 1
    assert any("half-written" in str(warning.message) for warning in caught)


def test_two_rows_merged_on_one_line_are_both_loaded_as_resume_keeps_them(tmp_path):
    run = write_run(tmp_path / "run", [make_row("a", "p0"), make_row("a", "p1"), make_row("a", "p2")])
    rows_file = run / "rows.jsonl"
    rows_file.write_text(rows_file.read_text().replace("}\n", "}", 1))  # the first row lost its newline
    assert load_runs(run)["prompt_id"].tolist() == ["p0", "p1", "p2"]


def test_damaged_rows_are_left_out_in_one_warning_and_each_prompt_counts_once(tmp_path):
    """What resume sets aside, analysis leaves out, with the same reader: a line that is not UTF-8, a torn piece,
    `{}`, a row of another run, a repeated prompt (the first written counts); a numeric prompt_id is its string."""
    run = write_run(tmp_path / "run", [make_row("a", f"p{i}", speedup=1.0 + i) for i in range(3)])
    with open(run / "rows.jsonl", "ab") as rows:
        rows.write(b"\xff\xfe\x00\x89PNG\n" + b'{"run_id": "a", \n' + b"{}\n"
                   + "".join(json.dumps(row) + "\n" for row in (make_row("b", "p5"), make_row("a", "p1", speedup=9.0),
                                                                make_row("a", 7, speedup=4.0))).encode())
    with pytest.warns(DamagedRunWarning) as caught:
        frame = load_runs(run)
    assert frame["prompt_id"].tolist() == ["p0", "p1", "p2", "7"] and frame["speedup"].tolist() == [1, 2, 3, 4]
    [message] = [str(warning.message) for warning in caught if warning.category is DamagedRunWarning]
    assert message == (f"{run.resolve() / 'rows.jsonl'}: left out 2 unreadable line piece(s), 1 object(s) without "
                       "run_id or prompt_id, 1 row(s) of another run, 1 duplicate row(s) (line(s) 4, 5, 6, 7, 8); "
                       "each prompt counts once")
    assert summarize_runs(frame)["n_prompts"].tolist() == [4]


def corrupt(name: str, content: bytes):
    def damage(job: Path) -> None:
        (job / name).write_bytes(content)
    return damage


def append_line(content: bytes):
    def damage(job: Path) -> None:
        with open(job / "rows.jsonl", "ab") as rows:
            rows.write(content + b"\n")
    return damage


def rows_directory(job: Path) -> None:
    (job / "rows.jsonl").unlink()
    (job / "rows.jsonl").mkdir()


def duplicate_row(job: Path) -> None:
    with open(job / "rows.jsonl", "a") as rows:
        rows.write((job / "rows.jsonl").read_text().splitlines()[0] + "\n")


REPORT_DAMAGE = [
    ("non-UTF-8 line", append_line(b"\xff\xfe\x00 \x89PNG"), "5 runs, 14 (run, prompt) rows",
     "**Left out:** {rows}: left out 1 unreadable line piece(s) (line(s) 4); each prompt counts once"),
    ("binary rows", corrupt("rows.jsonl", bytes(range(256)) * 8), "4 runs, 11 (run, prompt) rows",
     "**Unreadable job** `{job}`: {rows} holds no readable row ("),
    ("rows is a directory", rows_directory, "4 runs, 11 (run, prompt) rows",
     "**Unreadable job** `{job}`: {rows} is a directory, not a file"),
    ("corrupt summary", corrupt("summary.json", b'{"prompts": 3, "metr'), "5 runs, 14 (run, prompt) rows",
     "**Left out:** {job}/summary.json is not valid JSON"),
    ("corrupt failure mark", corrupt("failure.json", b"\x00\x00\x01"), "5 runs, 14 (run, prompt) rows",
     "**Failed job** `{job}`: unreadable failure mark: {job}/failure.json is not valid JSON"),
    ("duplicate row", duplicate_row, "5 runs, 14 (run, prompt) rows",
     "**Left out:** {rows}: left out 1 duplicate row(s) (line(s) 4); each prompt counts once"),
]


@pytest.mark.parametrize("damage, counts, said", [case[1:] for case in REPORT_DAMAGE],
                         ids=[case[0] for case in REPORT_DAMAGE])
def test_the_report_survives_a_damaged_run_and_says_what_it_left_out(sweep, tmp_path, capsys, damage, counts, said):
    """Issue 28 item 11: each of these was a traceback. The damaged job is job 1 of the five."""
    job = (sweep / "1").resolve()
    damage(job)
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert said.format(job=job, rows=job / "rows.jsonl") in report
    assert counts in report
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(line.startswith(("warning: ", "wrote ")) for line in err.splitlines())


@pytest.mark.parametrize("out", ["a file", "/proc/specdec-no/report"])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(sweep, tmp_path, capsys, out):
    target = tmp_path / "taken" if out == "a file" else Path(out)
    if out == "a file":
        target.write_text("not a directory")
    assert main([str(sweep), "--out", str(target)]) == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert error.startswith(f"error: --out {target}: cannot be created or written (") and "choose another" in error
    assert not list(sweep.glob("*.csv"))  # refused before anything was written


def test_a_write_refused_while_writing_the_report_is_one_line_and_exit_2(sweep, tmp_path, capsys, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", "summary.csv")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full_disk)
    assert main([str(sweep), "--out", str(tmp_path / "report")]) == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert error == (f"error: cannot write the report into {tmp_path / 'report'}: No space left on device "
                     "(summary.csv); choose another --out")


def test_a_report_on_rows_where_no_metric_was_measured_states_the_gap(tmp_path):
    """Issue 28 item 11: all-null metrics were a traceback (a plot's argmax over nothing)."""
    rows = [make_row("a", f"p{i}") | {metric: None for metric in METRIC_COLUMNS} for i in range(3)]
    run = write_run(tmp_path / "run", rows)
    assert main([str(run)]) == 0
    report = (run / "report.md").read_text()
    assert ("**No values:** speedup, acceptance_rate, mean_accepted_length, spec_tokens_per_s, baseline_tokens_per_s, "
            "cost_ratio are null in every row") in report
    assert "**Fastest:** no run has a measured speedup." in report
    assert (run / "speedup.png").read_bytes()[:8] == PNG_SIGNATURE


class FakeApi:
    """wandb.Api with two runs of one group: a finished one and a crashed one."""

    def __init__(self, tables):
        self.tables = tables

    def runs(self, path, filters=None):
        assert (path, filters) == ("team/specdec", {"group": "sweep-a"})
        return [SimpleNamespace(id=run_id, entity="team", project="specdec", url=f"https://wandb/{run_id}",
                                state=state, config={"model": {"target": {"name": "tiny"}}})
                for run_id, state in (("a", "finished"), ("b", "crashed"))]

    def artifact(self, name, type=None):
        """The logger's ``rows`` table: list cells as JSON text (experiments.common.loggers.table_cell)."""
        run_id = re.fullmatch(r"team/specdec/run-(\w+)-rows:latest", name).group(1)
        rows = self.tables[run_id]
        data = [[table_cell(value) for value in row.values()] for row in rows]
        return SimpleNamespace(get=lambda key: SimpleNamespace(columns=list(rows[0]), data=data))


def test_load_wandb_runs_into_the_same_schema(monkeypatch):
    tables = {"a": [make_row("a", "p0"), make_row("a", "p1")], "b": [make_row("b", "p0", k=2)]}
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(Api=lambda: FakeApi(tables)))
    with pytest.warns(PartialRunWarning, match="https://wandb/b"):
        frame = load_wandb_runs("specdec", group="sweep-a", entity="team", config_keys=("model.target.name",))
    assert frame["run_id"].tolist() == ["a", "a", "b"]
    assert frame["partial"].tolist() == [False, False, True]
    assert frame["run_dir"].tolist() == ["https://wandb/a"] * 2 + ["https://wandb/b"]
    assert frame["model.target.name"].unique().tolist() == ["tiny"]
    assert frame["per_position_acceptance"].iloc[0] == [0.8, 0.8, 0.8, None]  # a list again, not JSON text
    assert summarize_runs(frame)["k"].tolist() == [4, 2]


def test_load_wandb_runs_offline_or_unreachable_is_one_line(monkeypatch):
    def unreachable():
        raise ConnectionError("Max retries exceeded\nwith url: api.wandb.ai")

    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(Api=unreachable))
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ResultsError, match="team/specdec: WANDB_MODE=offline"):
        load_wandb_runs("specdec", entity="team")
    monkeypatch.delenv("WANDB_MODE")
    with pytest.raises(ResultsError, match=r"^W&B project specdec: cannot list runs \(ConnectionError: Max "
                                           r"retries exceeded\)$"):
        load_wandb_runs("specdec")


def test_report_writes_markdown_tables_and_plots(sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    assert f"warning: {(sweep / '4').resolve()}: no summary.json" in capsys.readouterr().err
    report = (out / "report.md").read_text()
    for png in ("speedup.png", "acceptance.png", "per_position.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == PNG_SIGNATURE
        assert f"]({png})" in report
    for csv in ("summary.csv", "pivot_speedup.csv", "pivot_acceptance_rate.csv", "pivot_mean_accepted_length.csv"):
        assert (out / csv).stat().st_size > 0
    # Pooled speedups are harmonic means of the prompts' here (equal baseline seconds and tokens). The lossless
    # speculative k=4 (1.5, 1.6, 1.7: 1.596) beats k=2 (1.3, 1.4, 1.5: 1.395); the lossy typical k=4 (1.8, 1.9, 2.0:
    # 1.896) is crowned apart, beating typical k=2 (1.4, 1.5, 1.6: 1.496).
    assert ("**Fastest lossless:** strategy=speculative, k=4, pooled speedup 1.60× over the autoregressive baseline "
            "(95% bootstrap CI") in report
    assert "1.14× the next lossless (strategy=speculative, k=2: 1.40×)" in report
    assert "**Fastest lossy:** strategy=typical, k=4, pooled speedup 1.90×" in report
    assert "1.27× the next lossy (strategy=typical, k=2: 1.50×)" in report
    assert "**Partial run**" in report and str((sweep / "4").resolve()) in report
    assert "| strategy | lossless | k=2 | k=4 | k=6 |" in report and "| typical | no | 1.5 | 1.9 | 1.15 |" in report
    assert "| strategy=typical, k=4 (lossy) |" in report and "| strategy=speculative, k=4 |" in report  # every table


def test_report_defaults_to_the_first_dir_and_handles_a_single_run(tmp_path):
    run = write_run(tmp_path / "run", [make_row("a", "p0", speedup=1.2), make_row("a", "p1", speedup=1.4)])
    assert main([str(run)]) == 0
    report = (run / "report.md").read_text()
    assert "**Fastest lossless:** strategy=speculative, k=4, pooled speedup 1.29×" in report  # 2 / (1/1.2 + 1/1.4)
    assert "A single setting was run" in report


@pytest.mark.slow
def test_report_script_reports_a_bad_path_in_one_line(tmp_path):
    missing = tmp_path / "missing"
    result = subprocess.run([sys.executable, "-m", "analysis.report", str(missing)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr == f"error: {missing}: no such file or directory\n"


def test_report_names_jobs_that_failed_were_skipped_or_left_no_rows(sweep, tmp_path):
    """Every job directory of a sweep is accounted for: a failed job with its error (its rows, if any, still load),
    a skipped job with its reason, a job that left nothing but Hydra's files; Hydra's own .hydra/config.yaml is no job."""
    (sweep / "4" / "failure.json").write_text(json.dumps({"exit_code": 1, "error": "RuntimeError: CUDA out of memory"}))
    (sweep / "5").mkdir()
    (sweep / "5" / "failure.json").write_text(json.dumps({"exit_code": 2, "error": "config error: k=0"}))
    (sweep / "5" / "rows.jsonl").write_text("")  # opened as decoding starts, before the failure
    (sweep / "6" / ".hydra").mkdir(parents=True)
    (sweep / "6" / ".hydra" / "config.yaml").write_text("{}\n")
    (sweep / "6" / "summary.json").write_text(json.dumps({"status": "skipped", "reason": "greedy needs t=0"}))
    (sweep / "7" / ".hydra").mkdir(parents=True)
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    jobs = [line for line in report.splitlines() if line.startswith("- **")]
    assert jobs == [
        f"- **Failed job** `{(sweep / '4').resolve()}`: RuntimeError: CUDA out of memory (2 row(s) kept)",
        f"- **Failed job** `{(sweep / '5').resolve()}`: config error: k=0 (0 row(s) kept)",
        f"- **Skipped job** `{(sweep / '6').resolve()}`: greedy needs t=0",
        f"- **Job without rows** `{(sweep / '7').resolve()}`: no summary.json and no rows: killed before its first "
        "prompt finished, or still running",
    ]
    assert "5 runs, 14 (run, prompt) rows" in report  # job 4's two rows load, flagged partial


def test_report_of_a_sweep_where_every_job_failed_names_them(tmp_path):
    for job in ("0", "1"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "failure.json").write_text(json.dumps({"exit_code": 2, "error": f"config error: job {job}"}))
    assert main([str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert report.count("**Failed job**") == 2 and "No job wrote rows: nothing to compare." in report


def test_rows_measured_beside_other_jobs_or_on_several_machines_are_no_setting_and_the_report_warns(tmp_path):
    """host and concurrent_jobs describe where a row was measured: runs are never told apart by them, and the report
    says which timings were shared and that machines differ."""
    runs = [("a", 2, "node1", [1, 1, 1]), ("b", 4, "node2", [1, 3, 2]), ("c", 6, "node1", [None, None, None])]
    for run_id, k, host, counts in runs:
        write_run(tmp_path / "sweep" / run_id, [make_row(run_id, f"p{i}", k=k, host=host, concurrent_jobs=count)
                                                for i, count in enumerate(counts)])
    frame = load_runs(tmp_path / "sweep")
    summary = summarize_runs(frame)
    assert varying_axes(summary) == ["k"]
    assert summary["most_concurrent_jobs"].tolist()[:2] == [1, 3] and math.isnan(summary["most_concurrent_jobs"][2])
    assert summary["hosts"].tolist() == ["node1", "node2", "node1"]
    assert main([str(tmp_path / "sweep")]) == 0
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert ("**Warning: distorted timings.** 2 of 9 rows (1 of 3 runs) were decoded while other jobs of the sweep ran "
            "on the same machine (up to 3 at once)") in report
    assert "- 3 rows could not count the jobs beside them" in report
    assert "- Runs ran on 2 machines (node1, node2)" in report
    assert "| partial | concurrent jobs | hosts |" in report


def test_summary_csv_columns_are_documented(sweep, tmp_path):
    """docs/experiments.md holds summary_csv_table() verbatim, and every column of a report's summary.csv is a
    setting or one the table names."""
    from analysis.summarize import config_columns, documented, summary_csv_table

    text = (REPO / "docs" / "experiments.md").read_text()
    generated = text.split("<!-- generated: analysis.summarize.summary_csv_table() -->\n")[1].split("<!-- end")[0]
    assert generated == summary_csv_table()
    write_report([str(sweep)], str(tmp_path))
    summary = pd.read_csv(tmp_path / "summary.csv")
    settings = set(config_columns(summary))
    assert [column for column in summary.columns if column not in settings and not documented(column)] == []
