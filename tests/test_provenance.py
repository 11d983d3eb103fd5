"""Results a researcher can publish: every row and summary.json name the code, versions and weights that produced
them; rounds repeat each prompt's interleaved pair and the spread between rounds is reported beside the interval;
vLLM's acceptance length is in summary.json by vLLM's definition; reports name the EOS convention, pool runs that
differ only in seed, and never merge runs of other code or other weights."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers
from conftest import REPO, tiny_overrides
from test_experiments import compose_run, rows_of
from transformers import AutoModelForCausalLM

from analysis.report import write_report
from experiments.common import runner
from experiments.common.provenance import tensors_hash


@pytest.fixture(scope="module")
def rounds_run(tiny, tmp_path_factory) -> Path:
    """One run of the tiny pair: 3 prompts, each decoded in 3 rounds."""
    run_dir = tmp_path_factory.mktemp("rounds") / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=3, max_new_tokens=6, warmup=0), "rounds=3"], run_dir))
    return run_dir


def test_the_first_row_and_summary_carry_the_commit_the_versions_and_the_weights_hashes(tiny, rounds_run):
    first, summary = rows_of(rounds_run)[0], json.loads((rounds_run / "summary.json").read_text())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    weights = {role: tensors_hash(AutoModelForCausalLM.from_pretrained(tiny[role], dtype=torch.float32))
               for role in ("target", "draft")}
    expected = {"git_commit": commit.strip(), "torch_version": torch.__version__,
                "transformers_version": transformers.__version__, "target_weights": weights["target"],
                "drafter_weights": weights["draft"]}
    assert weights["target"] != weights["draft"] and len(weights["target"]) == 16
    for record in (first, summary["provenance"]):
        assert {name: record[name] for name in expected} == expected
        assert isinstance(record["git_dirty"], bool) and record["torch_threads"] == 1 and record["processor"]
    assert set(summary["provenance"]["load_average"]) == {"start", "end"} and summary["provenance"]["differs"] == []
    assert first["load_before"] is None or first["load_before"] >= 0


def test_rounds_repeat_each_prompt_and_summary_json_gives_the_spread_between_rounds(rounds_run):
    rows, summary = rows_of(rounds_run), json.loads((rounds_run / "summary.json").read_text())
    assert sorted((row["prompt_id"], row["round"]) for row in rows) == sorted(
        (prompt_id, r) for prompt_id in {row["prompt_id"] for row in rows} for r in range(3))
    assert summary["rounds"] == 3 and summary["prompts"] == 3 and summary["rows"] == 9
    speedups = summary["between_rounds"]["speedup"]
    assert summary["between_rounds"]["replicates"] == 3 and len(speedups["values"]) == 3
    by_round = []
    for r in range(3):
        mine = [row for row in rows if row["round"] == r]
        by_round.append((sum(row["baseline_seconds"] for row in mine) / sum(row["baseline_emitted"] for row in mine))
                        / (sum(row["spec_seconds"] for row in mine) / sum(row["emitted"] for row in mine)))
    assert speedups["values"] == pytest.approx(by_round)
    assert speedups["min"] == pytest.approx(min(by_round)) and speedups["sd"] == pytest.approx(pd.Series(by_round).std())
    # greedy rounds decode the same tokens: their counts agree, so no repeat is flagged
    assert summary["greedy_repeats_disagree"] == []


def test_summary_json_holds_vllms_acceptance_length_by_vllms_definition(rounds_run):
    rows, summary = rows_of(rounds_run), json.loads((rounds_run / "summary.json").read_text())
    accepted = sum(row["accepted"] for row in rows)
    drafting_calls = sum(sum(row["accepted_histogram"]) for row in rows)
    assert drafting_calls < sum(row["target_calls"] for row in rows) or accepted  # something was drafted
    assert summary["pooled"]["vllm_acceptance_length"]["value"] == pytest.approx(1 + accepted / drafting_calls)


def test_the_report_names_the_eos_convention_and_shows_the_spread_between_rounds(rounds_run, tmp_path):
    text = write_report([str(rounds_run)], str(tmp_path)).read_text()
    header = text.split("## Runs")[0]
    assert "EOS: prompts end at the tokenizer's EOS (`stop_at_eos=true`)" in header
    assert "speedup between replicates" in text and "(3) |" in text


def copy_run(run_dir: Path, to: Path, **changes) -> Path:
    """A copy of a run directory whose rows hold ``changes`` and a run_id of their own."""
    shutil.copytree(run_dir, to)
    rows = [row | {"run_id": f"{row['run_id']}-{to.name}"} | changes for row in rows_of(run_dir)]
    (to / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return to


def test_two_runs_at_two_commits_are_reported_apart_and_runs_differing_in_seed_pool(rounds_run, tmp_path):
    copy_run(rounds_run, tmp_path / "runs" / "b", git_commit="0" * 40)
    copy_run(rounds_run, tmp_path / "runs" / "c", target_weights="f" * 16)
    shutil.copytree(rounds_run, tmp_path / "runs" / "a")
    text = write_report([str(tmp_path / "runs")], str(tmp_path / "apart")).read_text()
    summary = pd.read_csv(tmp_path / "apart" / "summary.csv")
    assert len(summary) == 3 and "**Reported apart:** these runs differ in git_commit, target_weights" in text
    assert f"git_commit={'0' * 40}" in text  # the tables name the runs by what differs

    seeds = tmp_path / "seeds"
    shutil.copytree(rounds_run, seeds / "a")
    copy_run(rounds_run, seeds / "b", seed=1)
    text = write_report([str(seeds)], str(tmp_path / "pooled")).read_text()
    [pooled] = pd.read_csv(tmp_path / "pooled" / "summary.csv").to_dict("records")
    assert pooled["seed"] == "0, 1" and pooled["n_prompts"] == 18 and pooled["replicates"] == 6
    assert "2 runs pooled into 1 settings" in text and "Fastest lossless" in text
    assert "the next lossless" not in text  # a seed is never ranked against another


def test_greedy_repeats_whose_counts_disagree_are_flagged(rounds_run, tmp_path):
    shutil.copytree(rounds_run, tmp_path / "runs" / "a")
    rows = rows_of(rounds_run)
    changed = [row | {"run_id": row["run_id"] + "-b", "seed": 1} for row in rows]
    changed[0] = changed[0] | {"accepted": changed[0]["accepted"] + 1}
    (tmp_path / "runs" / "b").mkdir()
    shutil.copy(rounds_run / "config.yaml", tmp_path / "runs" / "b")
    shutil.copy(rounds_run / "summary.json", tmp_path / "runs" / "b")
    (tmp_path / "runs" / "b" / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in changed))
    text = write_report([str(tmp_path / "runs")], str(tmp_path / "out")).read_text()
    assert "**Warning: greedy repeats disagree** in" in text and rows[0]["prompt_id"] in text.split("## Runs")[0]


def test_a_killed_run_of_several_rounds_resumes_each_prompt_and_round_exactly_once(tiny, tmp_path):
    from test_experiments import Killed, kill_after

    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(tiny, num_prompts=2, max_new_tokens=4, warmup=0), "rounds=2"]
    with pytest.raises(Killed):
        runner.run(*compose_run(overrides, run_dir), after_row=kill_after(3))
    assert [(row["prompt_id"], row["round"]) for row in rows_of(run_dir)] == [("p0", 0), ("p1", 0), ("p0", 1)]
    summary = runner.run(*compose_run(overrides, run_dir))
    assert [(row["prompt_id"], row["round"]) for row in rows_of(run_dir)] == [
        ("p0", 0), ("p1", 0), ("p0", 1), ("p1", 1)]
    assert summary["rows"] == 4 and summary["prompts"] == 2 and summary["between_rounds"]["replicates"] == 2


def test_the_report_and_summary_json_give_one_predicted_speedup(rounds_run):
    """summary.json, the console and the report give one predicted speedup: Leviathan's at the pooled acceptance
    rate, the k the steps drafted and the mean cost ratio."""
    from analysis import load_runs, summarize_runs
    from specdec.results import leviathan_speedup

    rows, summary = rows_of(rounds_run), json.loads((rounds_run / "summary.json").read_text())
    drafted_k = sum(row["drafted"] for row in rows) / sum(sum(row["accepted_histogram"]) for row in rows)
    costs = [row["cost_ratio"] for row in rows if row["target_calls"] >= 2 and row["cost_ratio"] is not None]
    expected = leviathan_speedup(sum(row["accepted"] for row in rows) / sum(row["drafted"] for row in rows),
                                 drafted_k, sum(costs) / len(costs))
    assert summary["pooled"]["predicted_speedup"]["value"] == pytest.approx(expected)
    [run] = summarize_runs(load_runs(rounds_run)).to_dict("records")
    assert run["predicted_speedup"] == pytest.approx(expected)
