"""Parts of one's own from the command line: docs/experiments.md's walk-through (its file, its config option and its
commands, run as written on a tiny pair), and the drafters the runner builds with or without a pair."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from conftest import REPO, tiny_overrides
from test_experiments import compose_run, job_dirs, main, rows_of

from analysis.report import main as report_main
from experiments import runner
from experiments.config_checks import ConfigError

WALKTHROUGH = "## Your own parts, from the file to a sweep report"


def walkthrough_blocks() -> list[tuple[str, list[str]]]:
    """The fenced blocks of docs/experiments.md's walk-through, each as (language, lines)."""
    text = (REPO / "docs" / "experiments.md").read_text()
    section = text.split(WALKTHROUGH)[1].split("\n## ")[0]
    blocks, current = [], None
    for line in section.splitlines():
        if line.startswith("```"):
            if current is None:
                current = (line[3:].strip(), [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[1].append(line)
    return blocks


def files_and_commands(root: Path) -> list[list[str]]:
    """Write the walk-through's files under ``root`` (each block that opens with its path as a comment) and return
    its `python -m experiments.run` commands, each as its arguments."""
    commands = []
    for language, lines in walkthrough_blocks():
        if language in ("python", "yaml"):
            path = root / lines[0].removeprefix("# ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
        elif language == "bash":
            commands += [shlex.split(line)[3:] for line in lines if line.startswith("python -m experiments.run")]
    return commands


@pytest.fixture
def walkthrough(tmp_path, monkeypatch) -> list[list[str]]:
    """The walk-through's files in a working directory on the import path, and its commands."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_parts", raising=False)
    return files_and_commands(tmp_path)


@pytest.mark.slow
def test_the_walkthrough_runs_as_written_and_its_report_names_the_parts(walkthrough, tiny, tmp_path, monkeypatch):
    by_target, by_targets, sweep, _ = walkthrough
    assert sweep[0] == "-m" and "hydra.searchpath=[file://my_configs]" in sweep
    size = tiny_overrides(tiny, num_prompts=3, max_new_tokens=6, warmup=0)

    main([*by_target, *size, f"hydra.run.dir={tmp_path / 'strategy'}"], monkeypatch)
    rows = rows_of(tmp_path / "strategy")
    assert {(row["strategy"], row["lossless"], row["strategy_threshold"]) for row in rows} == {
        ("threshold", False, 0.2)}
    assert all(isinstance(row["log_likelihood"], float) and row["log_likelihood"] < 0 for row in rows)

    main([*by_targets, *size, f"hydra.run.dir={tmp_path / 'parts'}"], monkeypatch)
    rows = rows_of(tmp_path / "parts")
    assert {(row["drafter"], row["draft_length"], row["k"]) for row in rows} == {("echo", "alternate", 4)}
    assert all(row["identical_output"] is True for row in rows)  # lossless speculative, at temperature 0

    sweep_dir = tmp_path / "sweep"
    main([*sweep, *size, f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    assert sorted(rows_of(job)[0]["strategy"] for job in job_dirs(sweep_dir)) == ["speculative", "threshold"]
    assert report_main([str(sweep_dir)]) == 0
    report = (sweep_dir / "report.md").read_text()
    assert "**Fastest lossless:** strategy=speculative" in report and "**Fastest lossy:** strategy=threshold" in report
    assert "| speculative | yes |" in report and "| threshold | **no** |" in report


def test_a_drafter_class_that_declares_no_pair_is_built_before_any_model_loads(walkthrough, tiny, tmp_path, loads):
    cfg, job = compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0),
                            "drafter._target_=my_parts.Echo"], tmp_path / "run")
    setting = runner.build_setting(cfg, job, runner.validate(cfg)[0])
    assert type(setting.drafter).__name__ == "Echo" and setting.identity.drafter == "echo" and loads["pair"] == 0


def test_a_drafter_that_reads_the_pair_without_declaring_it_says_so_in_one_line(walkthrough, tiny, tmp_path, loads):
    (tmp_path / "pair_readers.py").write_text(
        "import specdec\n\n\n"
        "class Reader(specdec.Drafter):\n"
        "    name = 'reader'\n\n"
        "    @classmethod\n"
        "    def from_pair(cls, pair, compile=False, forward='auto', **options):\n"
        "        return specdec.ModelDrafter(pair.draft)\n")
    cfg, job = compose_run([*tiny_overrides(tiny), "drafter._target_=pair_readers.Reader"], tmp_path / "run")
    with pytest.raises(ConfigError) as error:
        runner.run(cfg, job)
    message = str(error.value)
    assert "\n" not in message and loads["pair"] == 0
    assert "drafter._target_='pair_readers.Reader': Reader was built without a model pair" in message
    assert "declares needs_pair = True" in message


def test_a_drafter_that_declares_a_pair_is_built_from_the_loaded_one(walkthrough, tiny, tmp_path):
    (tmp_path / "pair_users.py").write_text(
        "import specdec\n\n\n"
        "class Small(specdec.ModelDrafter):\n"
        "    name = 'small'\n")
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=2, max_new_tokens=6, warmup=0),
                             "drafter._target_=pair_users.Small"], run_dir))
    rows = rows_of(run_dir)
    assert {row["drafter"] for row in rows} == {"small"} and all(row["drafted"] > 0 for row in rows)


def test_a_drafter_target_that_is_no_drafter_is_refused(tiny, tmp_path):
    cfg, job = compose_run([*tiny_overrides(tiny), "drafter._target_=specdec.SamplingConfig"], tmp_path / "run")
    with pytest.raises(ConfigError, match="must be a drafter class .* or its factory"):
        runner.run(cfg, job)


def test_rows_name_each_part_by_its_own_name(tiny, tmp_path):
    """A built-in option reached by another file name still says what it is: the row takes the part's `name`."""
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0), "drafter=tree_searched",
                             "draft_length.k=8"], run_dir))
    [row] = rows_of(run_dir)
    assert (row["drafter"], row["strategy"], row["draft_length"]) == ("tree", "speculative", "fixed")
    assert json.loads(json.dumps(row))["drafter_branching"] == "1-1-1-1-1-1-1-2"
