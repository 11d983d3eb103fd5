"""Issue 43, the run app: rows read back on resume are checked for internal consistency (a tampered row is set
aside and its prompt decoded again), and the drafter options the run app hands the library are refused in one line
(a checkpoint directory that does not exist, a tree given as a word)."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_overrides
from test_cli_validation import compose_run as compose_config
from test_experiments import compose_run
from test_rundir import FOUR, assert_each_prompt_once, killed_run, resume_line, rows_of

from experiments import runner
from experiments.config_checks import ConfigError, validate


def tampered(row: dict, edit: str) -> dict:
    if edit == "changed id":
        return {**row, "prompt_id": "p3"}  # its prompt_hash is still another prompt's
    if edit == "tokens longer than emitted":
        return {**row, "tokens": [*row["tokens"], row["tokens"][-1]]}
    return {**row, "tokens": [(token + 1) % 50 for token in row["tokens"]]}  # greedy: identical_output disagrees


@pytest.mark.parametrize("edit", ["changed id", "tokens longer than emitted", "tokens changed"])
def test_a_tampered_row_is_set_aside_on_resume_and_its_prompt_decoded_again(tiny, tmp_path, capsys, edit):
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    first, second = rows_of(run_dir)
    (run_dir / "rows.jsonl").write_text(json.dumps(tampered(first, edit)) + "\n" + json.dumps(second) + "\n")
    capsys.readouterr()
    runner.run(*compose_run(overrides, run_dir))
    assert_each_prompt_once(run_dir, FOUR)
    assert "1 row(s) kept, 1 set aside in rows.set-aside.jsonl (1 row(s) whose columns disagree), 3 prompt(s) " \
           "left" in resume_line(capsys.readouterr().err)
    redone = {row["prompt_hash"]: row for row in rows_of(run_dir)}[first["prompt_hash"]]
    assert redone["tokens"] == first["tokens"] and redone["prompt_id"] == first["prompt_id"]


@pytest.mark.parametrize("overrides, named", [
    (["drafter=eagle", "drafter.checkpoint=/no/such/dir"], "drafter: /no/such/dir holds no trained drafter"),
    (["drafter=medusa", "drafter.checkpoint=/no/such/dir"], "drafter: /no/such/dir holds no trained drafter"),
    (["drafter=eagle", "drafter.tree=big"], "tree must be [node_budget, depth, top_k] (three integers) or None, got "
                                            "'big'"),
])
def test_the_run_app_refuses_bad_drafter_options_in_one_line(tiny, overrides, named):
    with pytest.raises(ConfigError) as error:
        validate(compose_config([*tiny_overrides(tiny), *overrides]))
    assert named in str(error.value) and "\n" not in str(error.value)
