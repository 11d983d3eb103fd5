"""End-to-end runs of experiments.run on a tiny random GPT-2 pair: rows, sweeps, resume, bad input, W&B."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, REPO, tiny_overrides
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from experiments import run as run_app
from experiments.common import runner
from experiments.common.config_checks import ConfigError
from experiments.common.loggers import WandbLogger, WandbWarning
from experiments.common.summary import format_table
from specdec.results import METRIC_COLUMNS, summarize_rows


def schema_columns() -> list[str]:
    """Every column named in the tables of docs/results-schema.md."""
    columns = []
    for line in (REPO / "docs" / "results-schema.md").read_text().splitlines():
        cell = line.split("|")[1].strip() if line.startswith("|") else ""
        if cell and cell != "column" and not set(cell) <= set("-: "):
            columns += [name.strip() for name in cell.split(",")]
    return columns


SCHEMA = schema_columns()


def main(argv: list[str], monkeypatch) -> None:
    """Run the Hydra app in-process, as `python -m experiments.run ARGV` would."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "experiments" / "run.py"), *argv])
    run_app.main()


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def job_dirs(sweep_dir: Path) -> list[Path]:
    """A sweep's job directories, without its hidden ones (.running/, .submitit/)."""
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def compose_run(overrides, run_dir: Path):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("run", overrides=list(overrides), return_hydra_config=True)
    job = runner.Job(run_dir, run_dir.name, dict(cfg.hydra.runtime.choices), run_dir.parent)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, job


def test_schema_parse_found_the_columns():
    assert len(SCHEMA) == len(set(SCHEMA)) >= 40 and {"run_id", "top_p", "speedup", "baseline_itl_seconds"} <= set(SCHEMA)


def test_default_run_with_wandb_offline(tiny, tmp_path, monkeypatch, capsys, loads):
    run_dir = tmp_path / "run"
    main([*tiny_overrides(tiny), "logger=wandb", f"hydra.run.dir={run_dir}"], monkeypatch)
    rows = rows_of(run_dir)
    assert [row["prompt_id"] for row in rows] == ["p0", "p1", "p2", "p3"] and loads["pair"] == 1
    for row in rows:
        assert set(SCHEMA) <= set(row), set(SCHEMA) - set(row)
        assert row["k"] == 4 and len(row["per_position_acceptance"]) == 4 and row["device"] == "cpu"
        assert row["strategy"] == "speculative" and row["sampling"] == "greedy" and row["batch_size"] == 1
        assert row["acceptance_rate"] == pytest.approx(row["accepted"] / row["drafted"])
        assert row["mean_accepted_length"] == pytest.approx(row["emitted"] / row["target_calls"])
        baseline_per_token = row["baseline_seconds"] / row["baseline_emitted"]
        assert row["speedup"] == pytest.approx(baseline_per_token / (row["spec_seconds"] / row["emitted"]))
        assert 0 < row["emitted"] <= 8 and row["draft_seconds"] > 0 and row["cost_ratio"] > 0
    assert len({row["run_id"] for row in rows}) == 1 and rows[0]["group"] == "run"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["draft_length"]["k"] == 4 and "hydra" not in config
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["prompts"] == 4
    assert summary["metrics"]["speedup"]["n"] == 4 and summary["metrics"]["acceptance_rate"]["ci_low"] is not None
    out = capsys.readouterr().out
    assert "speedup" in out and "95% CI" in out and "acceptance_rate" in out
    wandb_runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1 and rows[0]["run_id"] in wandb_runs[0].name


def test_rows_hold_the_schemas_metrics_and_documented_settings(tiny, tmp_path):
    """A row's metric columns are specdec.results.METRIC_COLUMNS, in order; every other column is documented in
    docs/results-schema.md or is an option's own parameter (<group>_<key>)."""
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0), "drafter=ngram",
                             "strategy=typical"], run_dir))
    [row] = rows_of(run_dir)
    assert [column for column in row if column in METRIC_COLUMNS] == list(METRIC_COLUMNS)
    others = [column for column in row if column not in METRIC_COLUMNS and column not in SCHEMA]
    assert others and all(column.startswith(("strategy_", "draft_length_", "drafter_")) for column in others), others


def test_an_eager_run_reports_no_compile_time(tiny, tmp_path):
    run_dir = tmp_path / "run"
    summary = runner.run(*compose_run(tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=1), run_dir))
    rows = rows_of(run_dir)
    assert [row["compile_seconds"] for row in rows] == [None] and summary["compile_seconds"] is None
    assert rows[0]["cost_ratio_source"] == ("steps" if rows[0]["cost_ratio"] is not None else None)


@pytest.mark.slow
def test_a_compiled_run_compiles_in_its_warm_up_and_reports_it_apart(tiny, tmp_path, capsys):
    """Batches of 2 then 1 (a batch shape the first batch never shows): the warm-up decodes the widest batch of each
    size to the end, so no prompt's timing includes a compilation; every row and the summary carry its seconds."""
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(tiny, num_prompts=3, batch_size=2, max_new_tokens=6, warmup=1), "compile=true"]
    summary = runner.run(*compose_run(overrides, run_dir))
    rows = rows_of(run_dir)
    assert len(rows) == 3 and all(row["compile"] is True for row in rows)
    assert len({row["compile_seconds"] for row in rows}) == 1 and rows[0]["compile_seconds"] > 0
    assert summary["compile_seconds"] == rows[0]["compile_seconds"]
    assert "while prompts were timed" not in capsys.readouterr().err
    # Its steps ran on the device, untimed by phase: the cost ratio was profiled once, and predicts the speedup.
    assert {row["cost_ratio_source"] for row in rows} == {"profile"} and len({row["cost_ratio"] for row in rows}) == 1
    assert rows[0]["cost_ratio"] > 0 and all(row["predicted_speedup"] is not None for row in rows
                                             if row["acceptance_rate"] is not None)


def test_default_config_on_the_embedded_pair(tmp_path, monkeypatch, capsys):
    """The shipped pair and prompts, everything else default but the size."""
    run_dir = tmp_path / "run"
    main(["num_prompts=2", "max_new_tokens=8", "device=cpu", f"hydra.run.dir={run_dir}"], monkeypatch)
    rows = rows_of(run_dir)
    assert [row["prompt_id"] for row in rows] == ["heldout-000", "heldout-001"]
    assert {row["pair"] for row in rows} == {"embedded"} and {row["data"] for row in rows} == {"embedded_heldout"}
    assert all(set(SCHEMA) <= set(row) and row["emitted"] == 8 for row in rows)
    assert "speedup" in capsys.readouterr().out


def test_k8_and_identical_pair_accepts_everything_at_temperature_0(tiny, tmp_path, monkeypatch):
    """Draft == target at temperature 0: every draft is accepted, so tau = k + 1 on full steps."""
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tiny, **{"pair.draft": tiny["target"], "max_new_tokens": 18, "num_prompts": 2})
    main([*overrides, "draft_length.k=8", f"hydra.run.dir={run_dir}"], monkeypatch)
    for row in rows_of(run_dir):
        assert row["k"] == 8 and row["acceptance_rate"] == 1.0 and row["expected_acceptance"] == 1.0
        assert row["emitted"] == 18 and row["target_calls"] == 2  # 9 with the prefill, then 9
        assert row["predicted_speedup"] is not None


@pytest.mark.slow
def test_issue_sweep_strategy_by_k_in_process(tiny, tmp_path, monkeypatch):
    """The issue's sweep shape, `-m strategy=greedy,speculative draft_length.k=...`, through Hydra's sweeper."""
    sweep_dir = tmp_path / "sweep"
    overrides = tiny_overrides(tiny, num_prompts=2, max_new_tokens=6, warmup=0)
    main(["-m", "strategy=greedy,speculative", "draft_length.k=1,2", *overrides, "logger=wandb",
          f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    jobs = job_dirs(sweep_dir)
    assert [p.name for p in jobs] == ["0", "1", "2", "3"] and (sweep_dir / "multirun.yaml").exists()
    settings = set()
    for job in jobs:
        rows = rows_of(job)
        assert len(rows) == 2 and (job / "summary.json").exists()
        assert {row["group"] for row in rows} == {"sweep"}
        settings.add((rows[0]["strategy"], rows[0]["k"]))
    assert settings == {("greedy", 1), ("greedy", 2), ("speculative", 1), ("speculative", 2)}
    assert len({rows_of(job)[0]["run_id"] for job in jobs}) == 4
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 4


@pytest.mark.slow
def test_every_drafter_and_draft_length_policy_runs_through_the_app(tiny, tmp_path, monkeypatch):
    """Each drafter and policy option is built by the runner (with the models it asks for) and decodes."""
    sweep_dir = tmp_path / "sweep"
    overrides = tiny_overrides(tiny, num_prompts=2, max_new_tokens=6, warmup=0)
    main(["-m", "drafter=model,ngram,early_exit", "draft_length=fixed,heuristic,confidence,cost_optimal", *overrides,
          f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    settings = set()
    for job in job_dirs(sweep_dir):
        rows = rows_of(job)
        assert len(rows) == 2 and all(row["emitted"] == 6 for row in rows)
        settings.add((rows[0]["drafter"], rows[0]["draft_length"]))
    assert settings == {(d, p) for d in ("model", "ngram", "early_exit")
                        for p in ("fixed", "heuristic", "confidence", "cost_optimal")}


@pytest.mark.slow
def test_issue_sweep_as_a_subprocess(tiny, tmp_path):
    """`python -m experiments.run -m ...` from the repository root exactly as a user types it, with W&B offline."""
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "experiments.run", "-m", "strategy=greedy,speculative", "draft_length.k=1,2",
               *tiny_overrides(tiny, num_prompts=2, max_new_tokens=6), "logger=wandb", f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(len(rows_of(sweep_dir / str(n))) for n in range(4)) == [2, 2, 2, 2]


@pytest.mark.slow
def test_sweep_skips_greedy_strategy_when_sampling(tiny, tmp_path, monkeypatch, capsys, loads):
    sweep_dir = tmp_path / "sweep"
    overrides = tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0)
    main(["-m", "strategy=greedy,speculative", "sampling=t1", *overrides, f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    skipped = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert skipped["status"] == "skipped" and not (sweep_dir / "0" / "rows.jsonl").exists()
    assert len(rows_of(sweep_dir / "1")) == 1 and loads["pair"] == 1
    message = [line for line in capsys.readouterr().err.splitlines() if "skipping" in line]
    assert len(message) == 1 and "strategy=greedy" in message[0] and "temperature" in message[0]


def test_the_runs_warm_up_lasts_until_cost_optimal_has_calibrated(tiny, tmp_path, monkeypatch):
    """A calibration (2 rounds of k = 0..3) longer than a warm-up call of 8 tokens at batch 2: the run's warm-up
    repeats the call until it is done, so the timed calls start from the policy's own choices."""
    settled = []

    def recording_settle(decode, measuring):
        added = runner_settle(decode, measuring)
        settled.append((added, measuring()))
        return added

    runner_settle = runner.settle
    monkeypatch.setattr(runner, "settle", recording_settle)
    main([*tiny_overrides(tiny, batch_size=2, num_prompts=4, warmup=1), "draft_length=cost_optimal",
          "draft_length.calibration_rounds=2", f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch)
    assert settled[0] == (0, False)  # the baseline measures nothing
    added, still_measuring = settled[1]
    assert added >= 1 and not still_measuring
    assert len(rows_of(tmp_path / "run")) == 4


def test_batched_rows_are_per_prompt(tiny, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    main([*tiny_overrides(tiny, batch_size=4, num_prompts=6, max_new_tokens=6), f"hydra.run.dir={run_dir}"], monkeypatch)
    rows = rows_of(run_dir)
    assert [row["prompt_id"] for row in rows] == [f"p{i}" for i in range(6)]
    assert [row["batch_size"] for row in rows] == [4, 4, 4, 4, 2, 2]
    assert len({row["spec_seconds"] for row in rows[:4]}) == 1  # timing is shared within a batch
    lengths = {row["prompt_id"]: row["prompt_tokens"] for row in rows}
    assert lengths["p0"] == 5 and lengths["p5"] == 7  # padding is not counted
    assert all(row["accepted"] <= row["drafted"] and row["emitted"] <= 6 for row in rows)


def test_each_prompt_draws_its_own_random_numbers(tiny, tmp_path, monkeypatch):
    """At temperature 1 and batch size 1, four prompts of the same tokens are four samples: with one seed for every
    call each drew the same random numbers and emitted the same tokens, so a run's tau pooled over prompts carried
    one random stream's luck (docs/verification.md: 2.91 against 2.67-2.69 with other seeds). At temperature 0 the
    seed changes nothing: batch sizes 1 and 4 give each prompt the same tokens and counts."""
    prompts = tmp_path / "same.jsonl"  # texts differ in spacing only (a set refuses repeated texts): the same tokens
    prompts.write_text("".join(json.dumps({"id": f"copy{i}", "text": "the" + " " * (i + 1) + "first time he said"})
                               + "\n" for i in range(4)))
    overrides = tiny_overrides(tiny, **{"data.source": prompts, "max_new_tokens": 12, "warmup": 0})
    main([*overrides, "sampling=t1", f"hydra.run.dir={tmp_path / 't1'}"], monkeypatch)
    for side in ("tokens", "baseline_tokens"):
        assert len({tuple(row[side]) for row in rows_of(tmp_path / "t1")}) == 4
    counts = []
    for batch_size in (1, 4):
        main([*overrides, f"batch_size={batch_size}", f"hydra.run.dir={tmp_path / f'b{batch_size}'}"], monkeypatch)
        counts.append([(row["tokens"], row["accepted"], row["target_calls"])
                       for row in rows_of(tmp_path / f"b{batch_size}")])
    assert counts[0] == counts[1]
    assert len({tuple(tokens) for tokens, _, _ in counts[0]}) == 1  # the four prompts are one prompt's tokens


class Killed(Exception):
    pass


def kill_after(n: int):
    count = {"rows": 0}

    def after_row(row):
        count["rows"] += 1
        if count["rows"] == n:
            raise Killed

    return after_row


@pytest.mark.parametrize("how", ["same_run_dir", "resume_true", "resume_path"])
def test_killed_run_resumes_each_prompt_exactly_once(tiny, tmp_path, how):
    first_dir = tmp_path / "outputs" / "first"
    overrides = tiny_overrides(tiny, num_prompts=4, max_new_tokens=4, warmup=0)
    cfg, job = compose_run(overrides, first_dir)
    with pytest.raises(Killed):
        runner.run(cfg, job, after_row=kill_after(2))
    assert len(rows_of(first_dir)) == 2 and not (first_dir / "summary.json").exists()
    with open(first_dir / "rows.jsonl", "a") as rows_file:  # killed in the middle of writing the third row
        rows_file.write('{"run_id": "torn')

    second_dir = {"same_run_dir": first_dir, "resume_true": tmp_path / "outputs" / "second",
                  "resume_path": tmp_path / "elsewhere"}[how]
    resume = {"same_run_dir": "false", "resume_true": "true", "resume_path": str(first_dir)}[how]
    cfg, job = compose_run([*overrides, f"resume={resume}"], second_dir)
    summary = runner.run(cfg, job)
    rows = rows_of(first_dir)
    assert sorted(row["prompt_id"] for row in rows) == [f"p{i}" for i in range(4)]
    assert len({row["run_id"] for row in rows}) == 1 and summary["prompts"] == 4
    assert (first_dir / "summary.json").exists() and not (second_dir / "rows.jsonl").exists() or second_dir == first_dir


def damage_lost_newline(path: Path) -> None:
    path.write_text(path.read_text().rstrip("\n"))  # an intact last row without its newline (kill, editor, copy)


def damage_corrupt_middle_line(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"run_id": "garbled\n' + lines[1])


def damage_merged_rows(path: Path) -> None:
    path.write_text(path.read_text().replace("}\n", "}", 1))  # the first two rows on one line


@pytest.mark.parametrize("damage, kept, set_aside", [
    (damage_lost_newline, 2, 0), (damage_corrupt_middle_line, 2, 1), (damage_merged_rows, 2, 0),
])
def test_resume_keeps_every_row_that_parses(tiny, tmp_path, capsys, damage, kept, set_aside):
    """A damaged rows.jsonl loses no row: rows that parse are kept (two on one line included), what does not
    parse is set aside in a side file, the resume says what it found, and every prompt ends up decoded once."""
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tiny, num_prompts=4, max_new_tokens=4, warmup=0)
    cfg, job = compose_run(overrides, run_dir)
    with pytest.raises(Killed):
        runner.run(cfg, job, after_row=kill_after(2))
    damage(run_dir / "rows.jsonl")
    capsys.readouterr()
    cfg, job = compose_run(overrides, run_dir)
    summary = runner.run(cfg, job)
    rows = rows_of(run_dir)
    assert sorted(row["prompt_id"] for row in rows) == ["p0", "p1", "p2", "p3"] and summary["status"] == "complete"
    report = [line for line in capsys.readouterr().err.splitlines() if "row(s) kept" in line]
    assert len(report) == 1 and f"{kept} row(s) kept" in report[0] and "2 prompt(s) left" in report[0]
    side = run_dir / "rows.set-aside.jsonl"
    if set_aside:
        assert side.read_text() == '{"run_id": "garbled\n'
        assert "1 set aside in rows.set-aside.jsonl (1 unreadable line piece(s))" in report[0]
    else:
        assert not side.exists()


def test_resume_elsewhere_removes_the_run_directory_hydra_made(tiny, tmp_path):
    """resume=true continues another directory; the new one Hydra created (its .hydra/ and run.log) goes."""
    first_dir, second_dir = tmp_path / "outputs" / "first", tmp_path / "outputs" / "second"
    overrides = tiny_overrides(tiny, num_prompts=3, max_new_tokens=4, warmup=0)
    cfg, job = compose_run(overrides, first_dir)
    with pytest.raises(Killed):
        runner.run(cfg, job, after_row=kill_after(1))
    (second_dir / ".hydra").mkdir(parents=True)
    (second_dir / "run.log").write_text("")
    cfg, job = compose_run([*overrides, "resume=true"], second_dir)
    runner.run(cfg, job)
    assert not second_dir.exists() and len(rows_of(first_dir)) == 3


def test_single_run_with_incompatible_settings_fails_with_exit_2(tiny, tmp_path, monkeypatch, capsys, loads):
    """Skipping is for sweeps; a single run that cannot decode anything is an error, before any model loads."""
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main([*tiny_overrides(tiny, num_prompts=1), "strategy=greedy", "sampling=t1", f"hydra.run.dir={run_dir}"],
             monkeypatch)
    assert exit_info.value.code == 2 and loads["pair"] == 0
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("config error")]
    assert "strategy=greedy" in line and "temperature" in line and "a single run refuses it" in line


def test_resume_true_without_an_unfinished_run_starts_fresh(tiny, tmp_path, capsys):
    run_dir = tmp_path / "outputs" / "new"
    cfg, job = compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0), "resume=true"], run_dir)
    runner.run(cfg, job)
    assert len(rows_of(run_dir)) == 1 and "starting a new run" in capsys.readouterr().err


def test_rerun_into_a_run_dir_with_another_config_is_refused(tiny, tmp_path, loads):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0)
    runner.run(*compose_run(overrides, run_dir))
    with pytest.raises(ConfigError, match=r"draft_length\.k: 4 -> 2"):
        runner.run(*compose_run([*overrides, "draft_length.k=2"], run_dir))
    assert loads["pair"] == 1 and len(rows_of(run_dir)) == 1


BAD = [
    (["draft_length.k=0"], "draft_length.k=0"),
    (["draft_length.k=-3"], "draft_length.k=-3"),
    (["draft_length.k=2.5"], "draft_length.k=2.5"),
    (["sampling=t1", "sampling.temperature=-0.5"], "sampling.temperature=-0.5"),
    (["sampling=t07_topp09", "sampling.top_p=1.5"], "sampling.top_p=1.5"),
    (["sampling.top_p=0"], "sampling.top_p=0"),
    (["sampling.top_k=0"], "sampling.top_k=0"),
    (["data.source=/no/such/prompts.jsonl"], "data.source='/no/such/prompts.jsonl'"),
    (["device=tpu"], "device='tpu'"),
    (["dtype=float8"], "dtype='float8'"),
    (["max_new_tokens=0"], "max_new_tokens=0"),
    (["batch_size=0"], "batch_size=0"),
    (["num_prompts=0"], "num_prompts=0"),
    (["strategy.lenience=0"], "strategy.lenience=0"),
    (["strategy=topk", "strategy.n=0"], "strategy.n=0"),
    (["strategy=typical", "strategy.delta=-1"], "strategy.delta=-1"),
    (["strategy=typical", "strategy.epsilon=abc"], "strategy.epsilon='abc'"),
    (["strategy.lenience=true"], "strategy.lenience=True"),
    (["logger=wandb", "logger.mode=sometimes"], "logger.mode='sometimes'"),
    (["resume=/no/such/run"], "resume='/no/such/run'"),
    (["drafter=ngram", "drafter.max_ngram=0"], "max_ngram must be an integer >= 1, got 0"),
    (["drafter=ngram", "drafter.min_ngram=5"], "drafter:"),
    (["drafter=early_exit", "drafter.num_layers=0"], "drafter.num_layers=0"),
]
if not torch.cuda.is_available():
    BAD.append((["device=cuda"], "device='cuda'"))


@pytest.mark.parametrize("bad,named", BAD, ids=[" ".join(bad) for bad, _ in BAD])
def test_bad_input_fails_in_one_line_before_any_model_loads(bad, named, tiny, tmp_path, loads):
    cfg, job = compose_run([*tiny_overrides(tiny), *bad], tmp_path / "run")
    with pytest.raises(ConfigError) as error:
        runner.run(cfg, job)
    assert named in str(error.value) and "\n" not in str(error.value)
    assert loads == {"pair": 0, "prompts": 0} and not (tmp_path / "run" / "rows.jsonl").exists()


@pytest.mark.parametrize("lines, named", [
    (['{"id": "a", "text": "one"}', '{"id": "a", "text": "two"}'],
     "prompt ids must be unique (rows and reports name prompts by them); repeated: a"),
    (['{"id": "a", "text": "one"}', '{"id": "b", "text": "one"}'], "prompts.jsonl:2: the same text as line 1"),
    ([], "the prompt set is empty"),
    (['{"id": "a", "text": "  "}'], "empty 'text': a prompt needs at least one token"),
    (['{"id": "a", "text": "fine"}', '{"id": "b", "text"'], "not valid JSON"),
])
def test_bad_prompt_files_fail_in_one_line_before_any_model_loads(lines, named, tiny, tmp_path, loads):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(line + "\n" for line in lines))
    cfg, job = compose_run([*tiny_overrides(tiny), f"data.source={prompts}"], tmp_path / "run")
    with pytest.raises(ConfigError) as error:
        runner.run(cfg, job)
    assert named in str(error.value) and str(prompts) in str(error.value) and "\n" not in str(error.value)
    assert loads["pair"] == 0


def test_early_exit_deeper_than_the_target_fails_in_one_line_right_after_loading(tiny, tmp_path, loads):
    cfg, job = compose_run([*tiny_overrides(tiny), "drafter=early_exit", "drafter.num_layers=99"], tmp_path / "run")
    with pytest.raises(ConfigError, match=r"drafter: num_layers must be an integer in \[1, \d+\]") as error:
        runner.run(cfg, job)
    assert "\n" not in str(error.value) and loads["pair"] == 1
    assert not (tmp_path / "run" / "rows.jsonl").exists() or not rows_of(tmp_path / "run")


@pytest.mark.parametrize("bad,named", [(["draft_length.k=0"], "draft_length.k=0"),
                                       (["sampling.temperature=-1"], "sampling.temperature=-1"),
                                       (["device=cuda:7"], "device='cuda:7'")])
def test_main_prints_one_line_and_exits_nonzero(bad, named, tiny, tmp_path, monkeypatch, capsys, loads):
    with pytest.raises(SystemExit) as exit_info:
        main([*tiny_overrides(tiny), *bad, f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("config error: ") and named in errors[0], errors
    assert loads == {"pair": 0, "prompts": 0}


def test_missing_prompt_file_path_is_named(tmp_path, loads):
    cfg, job = compose_run(["data=file"], tmp_path / "run")
    with pytest.raises(ConfigError, match="data.source is required"):
        runner.run(cfg, job)
    assert loads["pair"] == 0


def test_unknown_group_option_is_rejected_by_hydra(tmp_path, monkeypatch, capsys, loads):
    with pytest.raises(SystemExit) as exit_info:
        main(["strategy=medusa", f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch)
    assert exit_info.value.code != 0 and "medusa" in capsys.readouterr().err and loads["pair"] == 0


class FakeConfig(dict):
    def update(self, values, allow_val_change=False):
        super().update(values)


class FakeRun:
    def __init__(self, fail_on):
        self.fail_on, self.logged, self.summary, self.finished = fail_on, [], {}, False
        self.config = FakeConfig()

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, data):
        if self.fail_on == "log":
            raise ConnectionError("network down")
        self.logged.append(data)

    def finish(self, exit_code=0):
        self.finished = True


def fake_wandb(fail_on: str | None) -> types.ModuleType:
    module = types.ModuleType("wandb")
    module.runs = []

    def init(**kwargs):
        if fail_on == "init":
            raise RuntimeError("no credentials")
        module.runs.append(FakeRun(fail_on))
        module.runs[-1].kwargs = kwargs
        return module.runs[-1]

    module.init, module.Settings = init, lambda **kwargs: kwargs
    module.Table = lambda columns, data: {"columns": columns, "data": data}
    return module


@pytest.mark.parametrize("fail_on", ["init", "log", None])
def test_wandb_failures_warn_once_and_the_run_goes_on(fail_on, tiny, tmp_path, monkeypatch):
    wandb = fake_wandb(fail_on)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    run_dir = tmp_path / "run"
    cfg, job = compose_run([*tiny_overrides(tiny, num_prompts=3, max_new_tokens=4, warmup=0), "logger=wandb",
                            "group=g1"], run_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.run(cfg, job)
    ours = [w for w in caught if issubclass(w.category, WandbWarning)]
    assert len(rows_of(run_dir)) == 3 and (run_dir / "summary.json").exists()
    if fail_on is None:
        assert not ours
        run = wandb.runs[0]
        assert run.kwargs["group"] == "g1" and run.kwargs["mode"] == "offline" and run.kwargs["config"]["group"] == "g1"
        assert [step["prompt_index"] for step in run.logged[:3]] == [0, 1, 2] and "rows" in run.logged[3]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert run.summary["speedup"] == summary["pooled"]["speedup"]["value"] > 0 and run.finished
        assert run.summary["per_prompt/speedup"] == summary["metrics"]["speedup"]["mean"]
        provenance = run.config.pop("provenance")  # the run's code and weights, as summary.json names them
        assert provenance["git_commit"] == summary["provenance"]["git_commit"]
        assert run.config == {"device": "cpu", "dtype": "float32", "k": 4,
                              "requested": {"device": "cpu", "dtype": "float32"}}
        assert run.kwargs["settings"]["init_timeout"] == 15.0  # not W&B's 90 s: an unreachable server costs seconds
    else:
        assert len(ours) == 1 and fail_on in str(ours[0].message)


def test_unreachable_wandb_server_costs_one_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    """A real wandb.init, online, against a closed local port with an API key set: within the bounded init
    timeout W&B gives up, one warning says so, and the logger stays quiet afterwards."""
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = WandbLogger(mode="online", init_timeout=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.start("unreachable1", "group", "name", {"a": 1}, tmp_path)
        logger.log_row({"speedup": 1.0}, 0)
        logger.finish([{"speedup": 1.0}], {"status": "complete"})
    ours = [w for w in caught if issubclass(w.category, WandbWarning)]
    assert len(ours) == 1 and "W&B init failed" in str(ours[0].message) and logger.failed


@pytest.mark.parametrize("timeout", [0, -1, "10", True])
def test_wandb_init_timeout_must_be_positive_seconds(timeout):
    with pytest.raises(ValueError, match=f"init_timeout must be a number of seconds > 0, got {timeout!r}"):
        WandbLogger(init_timeout=timeout)


def test_wandb_logger_disabled_mode_needs_no_account(tmp_path):
    logger = WandbLogger(mode="disabled")
    logger.start("id1", "group", "name", {"a": 1}, tmp_path)
    logger.log_row({"speedup": 1.5, "per_position_acceptance": [1.0, None]}, 0)
    logger.finish([{"speedup": 1.5}], {"metrics": {"speedup": {"mean": 1.5}}})
    assert not logger.failed


def test_summary_statistics():
    means = summarize_rows([{"speedup": v, "prompt_id": str(i)} for i, v in enumerate([1.0, 2.0, 3.0, None])])
    metric = means["metrics"]["speedup"]
    assert (metric["mean"], metric["n"]) == (2.0, 3)
    assert metric["ci_high"] - 2.0 == pytest.approx(4.3026527 * 1.0 / 3**0.5)  # t_{0.975, 2}
    one = summarize_rows([{"speedup": 2.0, "prompt_id": "a"}])["metrics"]["speedup"]
    assert math.isnan(one["ci_low"])  # no interval from one prompt


def test_run_summary_prints_no_interval_for_two_prompts_and_clips_to_the_range():
    """Two prompts: the summary says why there is no interval instead of printing [-2.59, 4.07]; three spread-out
    acceptance rates: the interval stops at [0, 1]."""
    two = [{"acceptance_rate": 0.1, "speedup": 1.0, "prompt_id": "a"},
           {"acceptance_rate": 0.9, "speedup": 2.0, "prompt_id": "b"}]
    table = format_table(summarize_rows(two), "title")
    assert "n/a (< 3 prompts)" in table and "-" not in table.split("acceptance_rate")[1].splitlines()[0]
    three = [{"acceptance_rate": value, "prompt_id": str(value)} for value in (0.02, 0.5, 0.98)]
    metric = summarize_rows(three)["metrics"]["acceptance_rate"]
    assert (metric["ci_low"], metric["ci_high"]) == (0.0, 1.0)


@pytest.mark.parametrize("flags, argv, key", [([], ["hydra.run.dir=/proc/specdec-no/run"], "hydra.run.dir"),
                                              (["-m"], ["draft_length.k=1,2", "hydra.sweep.dir=/proc/specdec-no/sweep"],
                                               "hydra.sweep.dir")])
def test_unwritable_run_directory_fails_in_one_line(flags, argv, key, tiny, monkeypatch, capsys, loads):
    """Before this, Hydra created the directory itself and printed a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main([*flags, *tiny_overrides(tiny, num_prompts=1), *argv], monkeypatch)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and loads["pair"] == 0 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("config error")]
    assert f"{key}='/proc/specdec-no/" in line and "cannot be created or written" in line


@pytest.mark.parametrize("strategy, lossless", [("synthetic", False), ("speculative", True)])
def test_rows_say_whether_the_strategy_is_lossless(strategy, lossless, tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0),
                             f"strategy={strategy}"], run_dir))
    [row] = rows_of(run_dir)
    assert row["strategy"] == strategy and row["lossless"] is lossless
