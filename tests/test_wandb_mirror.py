"""What reaches W&B. Real offline runs of experiments.run are read back from their transaction logs with wandb's own
reader (`wandb leet inspect --json`, wandb-core's decoder of .wandb files): their history steps equal rows.jsonl
(under `prompt/`), their config config.yaml with the device, dtype and k the run resolved, their run summary the
run's pooled figures of summary.json under plain names (and summary.json whole), and the `rows` table they log
equals rows.jsonl.
`analysis.load_wandb_runs` then reads the same runs, through an API object built from those files, into the frame
`load_runs` builds from the run directories. What only a W&B server does (upload, its run listing and filters,
merging a resumed run's files) is out of reach here; the README says so."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from conftest import REPO, tiny_overrides

from analysis import load_runs, load_wandb_runs
from experiments import run as run_app
from experiments import runner
from experiments.loggers import PROMPT_PREFIX, is_scalar_number, run_summary, table_cell
from specdec.results import PROVENANCE_COLUMNS

PROJECT = "specdec"
HIDDEN = ("_runtime", "_step", "_timestamp", "_wandb")  # W&B's own bookkeeping keys


@dataclass
class LoggedRun:
    """One offline run as its transaction log records it."""

    run_dir: Path
    run_id: str
    project: str
    group: str
    start_time: str
    config: dict
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    exit_code: int | None = None
    artifacts: dict[str, dict] = field(default_factory=dict)  # name -> the artifact record


def read_log(run_dir: Path) -> LoggedRun:
    """Replay the records of an offline run's .wandb file as W&B does: summary updates merged in order."""
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    [run] = [record["run"] for record in records if record["type"] == "run"]
    logged = LoggedRun(run_dir, run["run_id"], run["project"], run["run_group"], run["start_time"],
                       without_hidden(run["config"]["update"]))
    for record in records:
        if record["type"] == "history":
            logged.history.append(record["history"]["item"])
        elif record["type"] == "config":  # what the run resolved once its pair loaded
            logged.config.update(without_hidden(record["config"].get("update", {})))
        elif record["type"] == "summary":
            logged.summary.update(record["summary"].get("update", {}))
            for key in record["summary"].get("remove", []):
                logged.summary.pop(key, None)
        elif record["type"] == "exit":
            logged.exit_code = record["exit"].get("exit_code", 0)
        elif record["type"] == "artifact":
            logged.artifacts[record["artifact"]["name"]] = record["artifact"]
    logged.summary = without_hidden(logged.summary)
    return logged


def without_hidden(data: dict) -> dict:
    return {key: value for key, value in data.items() if not key.startswith(HIDDEN)}


def logged_runs(wandb_root: Path) -> list[LoggedRun]:
    return sorted((read_log(path) for path in (wandb_root / "wandb").glob("offline-run-*")),
                  key=lambda run: run.start_time)


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def expected_step(row: dict, index: int) -> dict:
    """What WandbLogger.log_row sends for a row: every number but booleans (nulls are not sent), each position of
    per_position_acceptance as its own key, all under `prompt/`, and the prompt index."""
    step = {f"{PROMPT_PREFIX}{key}": value for key, value in row.items() if is_scalar_number(value)}
    for position, value in enumerate(row["per_position_acceptance"], 1):
        if value is not None:
            step[f"{PROMPT_PREFIX}per_position_acceptance/{position}"] = value
    return step | {"prompt_index": index}


def row_steps(run: LoggedRun) -> list[dict]:
    """The history steps of prompt rows, without W&B's bookkeeping (the tables are a step of their own)."""
    return [without_hidden(item) for item in run.history if not any(key.startswith("rows.") for key in item)]


def table_of(run: LoggedRun) -> dict:
    """The `rows` table as W&B's artifact holds it (the JSON a server serves for `artifact.get("rows")`)."""
    manifest = run.artifacts[f"run-{run.run_id}-rows"]["manifest"]
    [entry] = [entry for entry in manifest["contents"] if entry["path"] == "rows.table.json"]
    return json.loads(Path(entry["local_path"]).read_text())


@pytest.fixture(scope="module")
def offline_sweep(tiny, tmp_path_factory) -> dict:
    """A real two-job sweep with logger=wandb, offline, and its W&B files under their own root."""
    root = tmp_path_factory.mktemp("mirror")
    sweep_dir = root / "sweep"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (("WANDB_MODE", "offline"), ("WANDB_DIR", str(root)), ("WANDB_SILENT", "true"),
                            ("WANDB_DATA_DIR", str(root / "wandb-data"))):
            patch.setenv(name, value)
        patch.setattr(sys, "argv", [str(REPO / "experiments" / "run.py"), "-m", "draft_length.k=2,3",
                                    *tiny_overrides(tiny, num_prompts=3, max_new_tokens=6, warmup=0), "logger=wandb",
                                    f"hydra.sweep.dir={sweep_dir}"])
        run_app.main()
    return {"sweep_dir": sweep_dir, "runs": logged_runs(root), "root": root}


def test_history_config_and_summary_equal_the_run_files(offline_sweep):
    sweep_dir, runs = offline_sweep["sweep_dir"], offline_sweep["runs"]
    assert len(runs) == 2
    for job in ("0", "1"):
        rows = rows_of(sweep_dir / job)
        [run] = [run for run in runs if run.run_id == rows[0]["run_id"]]
        assert (run.project, run.group, run.exit_code) == (PROJECT, "sweep", 0)
        assert row_steps(run) == [expected_step(row, index) for index, row in enumerate(rows)]
        config = yaml.safe_load((sweep_dir / job / "config.yaml").read_text())
        resolved = {"device": "cpu", "dtype": "float32", "k": rows[0]["k"], "requested": {"device": "cpu",
                                                                                        "dtype": "float32"}}
        provenance = {name: rows[0][name] for name in PROVENANCE_COLUMNS}  # what produced the rows
        assert run.config == config | resolved | {"provenance": provenance}  # the config as the run resolved it
        summary = json.loads((sweep_dir / job / "summary.json").read_text())
        last_values = {key: value for step in row_steps(run) for key, value in step.items()}
        tables = {key for key in run.summary if key.startswith(("rows.", "per_position_acceptance.",
                                                                 "accepted_histogram."))}  # where W&B keeps tables
        assert without(run.summary, tables) == last_values | run_summary(summary)


def test_the_run_summary_holds_the_run_s_pooled_figures_under_their_plain_names(offline_sweep):
    """What W&B's runs table shows: the run's speedup, not the last prompt's (which stays in the history, under
    prompt/), and per-position acceptance and the accepted histogram as summary.json pools them."""
    sweep_dir, runs = offline_sweep["sweep_dir"], offline_sweep["runs"]
    for job in ("0", "1"):
        rows = rows_of(sweep_dir / job)
        [run] = [run for run in runs if run.run_id == rows[0]["run_id"]]
        pooled = json.loads((sweep_dir / job / "summary.json").read_text())["pooled"]
        for name in ("speedup", "acceptance_rate", "mean_accepted_length", "spec_tokens_per_s",
                     "vllm_acceptance_length", "spec_bench_speedup"):
            assert run.summary[name] == pooled[name]["value"]
            assert run.summary[f"{name}/ci_low"] == pooled[name]["ci_low"]
        assert run.summary["predicted_speedup"] == pooled["predicted_speedup"]["value"]
        drafting_calls = sum(sum(row["accepted_histogram"]) for row in rows)
        assert run.summary["vllm_acceptance_length"] == 1 + sum(row["accepted"] for row in rows) / drafting_calls
        assert run.summary["prompt/speedup"] == rows[-1]["speedup"] != run.summary["speedup"]
        positions = pooled["per_position_acceptance"]
        assert [run.summary[f"per_position_acceptance/{i}"] for i in range(1, len(positions) + 1)] == [
            position["value"] for position in positions]
        assert [run.summary[f"per_position_attempts/{i}"] for i in range(1, len(positions) + 1)] == [
            position["attempts"] for position in positions]
        histogram = [run.summary[f"accepted_histogram/{j}"] for j in range(len(pooled["accepted_histogram"]))]
        summed = [sum(h) for h in zip(*(row["accepted_histogram"] for row in rows))]
        assert histogram == pooled["accepted_histogram"] == summed


def without(data: dict, keys: set) -> dict:
    return {key: value for key, value in data.items() if key not in keys}


def test_rows_table_equals_rows_jsonl(offline_sweep):
    for run in offline_sweep["runs"]:
        [job_dir] = [d for d in offline_sweep["sweep_dir"].glob("[0-9]") if rows_of(d)[0]["run_id"] == run.run_id]
        rows = rows_of(job_dir)
        table = table_of(run)
        assert table["columns"] == list(rows[0])
        assert table["data"] == [[table_cell(value) for value in row.values()] for row in rows]
        assert run.artifacts[f"run-{run.run_id}-rows"]["type"] == "run_table"


class OfflineApi:
    """wandb.Api over offline run files, standing in for the server after `wandb sync`: `runs` lists the runs of a
    project (filtered by group), one per run id, the latest file's state and config winning as a resumed run's do;
    `artifact` gives the `run_table` artifact the run logged, whose `get` builds the wandb.Table from its JSON."""

    def __init__(self, runs: list[LoggedRun]):
        self.by_id = {run.run_id: run for run in runs}  # start order: a resumed run's latest file last

    def runs(self, path: str, filters: dict | None = None):
        entity, project = path.split("/")
        return [SimpleNamespace(id=run.run_id, entity=entity, project=project, url=f"file://{run.run_dir}",
                                state="finished" if run.exit_code == 0 else "failed", config=run.config)
                for run in self.by_id.values()
                if run.project == project and (not filters or run.group == filters["group"])]

    def artifact(self, name: str, type: str | None = None):  # noqa: A002 - wandb's own name for it
        import wandb

        path, _, alias = name.partition(":")
        run_id = path.split("/")[-1].removeprefix("run-").removesuffix("-rows")
        run = self.by_id[run_id]
        assert alias == "latest" and run.artifacts[f"run-{run_id}-rows"]["type"] == type
        table = wandb.Table.from_json(table_of(run), None)
        return SimpleNamespace(get=lambda key: table if key == "rows" else None)


def test_load_wandb_runs_reads_the_frame_load_runs_builds(offline_sweep, monkeypatch):
    import wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(wandb, "Api", lambda: OfflineApi(offline_sweep["runs"]))
    from_wandb = load_wandb_runs(PROJECT, group="sweep", entity="offline", config_keys=("draft_length.k",))
    from_files = load_runs(offline_sweep["sweep_dir"], config_keys=("draft_length.k",))
    order = ["run_id", "prompt_id"]
    from_wandb, from_files = (frame.drop(columns="run_dir").sort_values(order, ignore_index=True)
                              for frame in (from_wandb, from_files))
    pd.testing.assert_frame_equal(from_wandb, from_files)
    assert not from_wandb["partial"].any() and len(from_wandb) == 6
    assert isinstance(from_wandb["per_position_acceptance"].iloc[0], list)


class Killed(Exception):
    pass


def test_a_resumed_run_mirrors_each_prompt_once(tiny, tmp_path, monkeypatch):
    """Killed after two prompts, then resumed (as a requeued job is): the W&B run, reopened under the same id, gets
    the remaining prompts as steps that continue the prompt index, and the full table and summary at the end."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    run_dir = tmp_path / "run"
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("run", overrides=[*tiny_overrides(tiny, num_prompts=4, max_new_tokens=6, warmup=0),
                                        "logger=wandb"], return_hydra_config=True)
    job = runner.Job(run_dir, "run", dict(cfg.hydra.runtime.choices), tmp_path)
    with open_dict(cfg):
        del cfg["hydra"]

    def kill_after_two(row):
        if row["prompt_id"] == "p1":
            raise Killed

    with pytest.raises(Killed):
        runner.run(cfg, job, after_row=kill_after_two)
    runner.run(cfg, job)
    rows = rows_of(run_dir)
    first, second = logged_runs(tmp_path)
    assert first.run_id == second.run_id == rows[0]["run_id"] and (first.exit_code, second.exit_code) == (1, 0)
    steps = row_steps(first) + row_steps(second)
    assert steps == [expected_step(row, index) for index, row in enumerate(rows)]
    assert [row["prompt_id"] for row in rows] == ["p0", "p1", "p2", "p3"]
    assert table_of(second)["data"] == [[table_cell(value) for value in row.values()] for row in rows]
    assert run_summary(json.loads((run_dir / "summary.json").read_text())).items() <= second.summary.items()
