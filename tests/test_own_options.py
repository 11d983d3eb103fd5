"""Config options of one's own on the command line, through the real entry point: docs/experiments.md's walk-through
(its files written as the page shows them, its sweeps run as written, each as its own process), options found on
Hydra's search path passing the pre-launch check, and a group's key that cannot be set in a sweep refused in one
line that names the option to write instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFIGS, REPO, tiny_overrides
from test_custom_parts import files_and_commands
from test_experiments import job_dirs, rows_of

from experiments.refusal import check_group_options

SIZE = ["num_prompts=2", "max_new_tokens=8", "warmup=0", "device=cpu", "dtype=float32", "threads=1"]


def run_app(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m experiments.run ARGV`` in ``cwd``, as a user runs it (the repository on the import path)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{cwd}"}
    return subprocess.run([sys.executable, "-m", "experiments.run", *argv], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=600)


def one_refusal(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def my_configs(tmp_path) -> Path:
    """A directory holding my_configs/drafter/my_head.yaml, as the walk-through writes it."""
    files_and_commands(tmp_path)
    return tmp_path


def test_an_option_on_the_search_path_passes_and_one_nowhere_is_named(my_configs, monkeypatch):
    monkeypatch.chdir(my_configs)
    assert check_group_options(["hydra.searchpath=[file://my_configs]", "drafter=my_head"], CONFIGS) is None
    assert check_group_options(["-m", "hydra.searchpath=[file://my_configs]", "drafter=my_head,ngram",
                                "strategy=threshold,speculative"], CONFIGS) is None
    assert check_group_options(["--config-dir", "my_configs", "drafter=my_head"], CONFIGS) is None
    problem = check_group_options(["drafter=my_head"], CONFIGS)
    assert problem.startswith("drafter=my_head is not an option of drafter; options: ") and "eagle, " in problem
    problem = check_group_options(["hydra.searchpath=[file://my_configs]", "drafter=my_hed"], CONFIGS)
    assert problem.endswith("did you mean drafter=my_head?") and "my_head" in problem.split("options: ")[1]


@pytest.mark.parametrize("argv, named", [
    (["-m", "drafter=eagle,ngram", "drafter.checkpoint=/heads/a"],
     "drafter.checkpoint=/heads/a cannot be set while drafter is swept (drafter=eagle,ngram): Hydra composes the "
     "sweep before it chooses each drafter; write the option with its checkpoint as one of your own, "
     "my_configs/drafter/my_eagle.yaml holding the two lines 'defaults: [eagle]' and 'checkpoint: /heads/a', and "
     "sweep it by name beside the others: -m 'hydra.searchpath=[file://my_configs]' drafter=my_eagle,ngram"),
    (["-m", "drafter=ngram,medusa", "drafter.checkpoint=/h"], "my_configs/drafter/my_medusa.yaml"),
    (["drafter=ngram", "drafter.checkpoint=/h"],
     "drafter.checkpoint=/h: drafter=ngram has no key checkpoint (its keys: max_ngram, min_ngram); a key of your own "
     "is added with +drafter.checkpoint=..."),
    (["drafter.checkpoint=/h"], "drafter=model has no key checkpoint"),
])
def test_a_key_a_chosen_option_lacks_is_named_with_the_way_out(argv, named):
    assert named in check_group_options(argv, CONFIGS)


@pytest.mark.parametrize("argv", [["drafter=eagle", "drafter.checkpoint=/h"], ["-m", "drafter=eagle",
                                  "drafter.checkpoint=/h"], ["-m", "drafter=ngram,eagle", "draft_length.k=2,4"],
                                  ["drafter=ngram", "+drafter.checkpoint=/h"], ["sampling.temperature=0.5"]])
def test_keys_the_chosen_option_holds_pass(argv):
    assert check_group_options(argv, CONFIGS) is None


@pytest.mark.slow
def test_a_checkpoint_beside_a_swept_drafter_is_one_line_from_the_entry_point(tmp_path):
    done = run_app(["-m", "drafter=eagle,ngram", f"drafter.checkpoint={tmp_path}", *SIZE,
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert one_refusal(done).startswith(f"config error: drafter.checkpoint={tmp_path} cannot be set while drafter "
                                        f"is swept")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_the_walkthrough_sweeps_run_as_written_from_the_command_line(my_configs, tiny):
    """The page's two sweeps, each as its own process: the strategy of one's own (on the tiny pair), and the head
    of one's own (my_head: eagle with its checkpoint) beside n-gram and early exit (on the embedded pair)."""
    commands = files_and_commands(my_configs)
    strategies, drafters = [argv for argv in commands if argv[0] == "-m"]
    assert drafters[-1] == "drafter=my_head,ngram,early_exit"

    done = run_app([*strategies, *tiny_overrides(tiny, num_prompts=2, max_new_tokens=6, warmup=0),
                    f"hydra.sweep.dir={my_configs / 'strategies'}"], my_configs)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(rows_of(job)[0]["strategy"] for job in job_dirs(my_configs / "strategies")) == [
        "speculative", "threshold"]

    done = run_app([*drafters, *SIZE, f"hydra.sweep.dir={my_configs / 'drafters'}"], my_configs)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [row for job in job_dirs(my_configs / "drafters") for row in rows_of(job)]
    assert sorted({row["drafter"] for row in rows}) == ["eagle", "early_exit", "ngram"]
    assert all(row["identical_output"] is True for row in rows)  # lossless at temperature 0, every drafter
    report = (my_configs / "drafters" / "report.md").read_text()
    assert all(name in report for name in ("eagle", "early_exit", "ngram"))
