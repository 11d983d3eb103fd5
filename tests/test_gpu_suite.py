"""experiments.gpu_suite: the smoke run on CPU (JSON keys, tables), the budget logic on a fake clock, failures
recorded rather than fatal."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace

import pytest

from experiments import gpu_suite
from experiments.gpu_suite import HEADLINE_KEYS, SMOKE, Budget, Estimates, Suite, device_kind, section_budget

ALL_BUT_STUDY = ",".join(name for name in gpu_suite.SECTIONS if name != "study")


class FakeClock:
    """A clock the sections advance by hand."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of every section but the study job (tests/test_gpu_suite.py's slow test runs that one)."""
    out = tmp_path_factory.mktemp("smoke")
    payload = gpu_suite.main(["--smoke", "--out", str(out), "--sections", ALL_BUT_STUDY])
    return payload, out


def test_the_smoke_run_writes_every_headline_key_measured_on_cpu(smoke):
    payload, out = smoke
    written = json.loads((out / "gpu-cpu.json").read_text())
    assert list(written)[: len(HEADLINE_KEYS)] == list(HEADLINE_KEYS)
    assert written["device"] == "cpu" and written["copy_bandwidth_tbps"] is None  # a device copy is CUDA's
    assert written["ar_batch1_share_of_bound"] is None  # no bandwidth, no bound
    for key in ("ar_batch1_tok_s", "hf_best_ar_batch1_tok_s", "draft_target_cost_ratio", "spec_speedup_a07_best",
                "spec_measured_over_predicted_a07", "embedded_ours_over_hf_assisted"):
        assert isinstance(written[key], float) and written[key] > 0, key
    assert written["spec_speedup_a07_best_k"] in SMOKE.ks
    assert written["identical_greedy_tokens"] is True
    assert written["host_reads_per_step"] <= 1  # the device step reads one small tensor per step
    assert {name: record["status"] for name, record in written["sections"].items()} == {
        name: "done" for name in ALL_BUT_STUDY.split(",")}


def test_the_smoke_tables_hold_what_the_headline_is_read_from(smoke):
    payload, out = smoke
    tables = payload["tables"]
    spec = tables["speculative"]
    assert sorted((row["acceptance"], row["k"]) for row in spec) == sorted(
        (alpha, k) for alpha in SMOKE.acceptances for k in SMOKE.ks)
    best = max((row for row in spec if row["acceptance"] == 0.7), key=lambda row: row["speedup"])
    assert (payload["spec_speedup_a07_best"], payload["spec_speedup_a07_best_k"]) == (best["speedup"], best["k"])
    for row in spec:
        assert row["measured_over_predicted"] == pytest.approx(row["decode_speedup"] / row["predicted"], abs=2e-3)
    batch1 = {row["method"]: row for row in tables["ar_batch1"]}
    assert set(batch1) == {*SMOKE.modes, *SMOKE.peers}
    assert payload["ar_batch1_tok_s"] == max(batch1[mode]["tok_s"] for mode in SMOKE.modes)
    assert payload["hf_best_ar_batch1_tok_s"] == max(batch1[peer]["tok_s"] for peer in SMOKE.peers)
    assert all(row["tokens_equal_eager"] for row in batch1.values())  # fp32: every path emits the same tokens
    assert [row["batch"] for row in tables["ar_batch2"]] == [2] * len(SMOKE.modes)  # no peers past batch 1
    markdown = (out / "gpu-cpu.md").read_text()
    for heading in ("## Autoregressive, batch 1", "## Speculative at synthetic acceptance", "## The embedded pair",
                    "## Host reads per step", "## Headline figures", "## Sections (time lines)"):
        assert heading in markdown, heading
    assert "| spec_speedup_a07_best | " in markdown


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    def broken(suite, budget):
        raise RuntimeError("no device copy here\nsecond line")

    monkeypatch.setitem(gpu_suite.SECTIONS, "bandwidth", broken)
    payload = gpu_suite.main(["--smoke", "--out", str(tmp_path), "--sections", "bandwidth,host_reads"])
    assert payload["sections"]["bandwidth"]["status"] == "failed"
    assert payload["sections"]["bandwidth"]["error"] == "RuntimeError: no device copy here"
    assert payload["sections"]["host_reads"]["status"] == "done" and payload["host_reads_per_step"] is not None
    assert "**Section `bandwidth` failed**: RuntimeError: no device copy here" in (tmp_path / "gpu-cpu.md").read_text()
    assert set(payload["sections"]) == {"bandwidth", "host_reads"}  # --sections left the others out


def test_unknown_sections_and_budgets_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        gpu_suite.parse_args(["--sections", "bandwidth,warp_speed"])
    assert "expected comma-separated sections from bandwidth, ar_batch1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--budget must be a positive number of seconds, got -5.0"):
        gpu_suite.main(["--smoke", "--budget", "-5"])


# --- the budget logic ---------------------------------------------------------------------------------------------


def test_a_budget_allows_what_fits_and_names_what_it_skips():
    clock = FakeClock()
    budget = Budget(30, clock.now)
    assert budget.allows("k = 3", 30)
    clock.t = 20
    assert not budget.allows("k = 4", 12.4)
    assert budget.skipped == ["skipped k = 4: needs ~12 s, 10 s left in the section"]
    clock.t = 45
    assert not budget.allows("k = 5", 1) and budget.skipped[-1].endswith("0 s left in the section")


def test_estimates_are_the_longest_measured_else_the_guess():
    estimates = Estimates()
    assert estimates.of("first:eager", 5.0) == 5.0
    estimates.add("first:eager", 2.0)
    estimates.add("first:eager", 3.0)
    estimates.add("first:eager", 1.0)
    assert estimates.of("first:eager", 5.0) == 3.0 and estimates.of("first:lean", 7.0) == 7.0


def test_a_section_gets_what_is_left_less_the_later_sections_shares():
    assert section_budget(left=100, later_shares=30) == 70
    assert section_budget(left=20, later_shares=30) == 0


def test_unused_time_goes_to_the_next_section_and_later_shares_stay_reserved():
    clock = FakeClock()
    plan = replace(SMOKE, budget_seconds=100, shares={"a": 40, "b": 30, "c": 30})
    suite = Suite(plan, now=clock.now)
    budgets = {}

    def section(name, spend):
        def run(suite, budget):
            budgets[name] = budget.left()
            clock.t += spend
        return run

    suite.run({"a": section("a", 10), "b": section("b", 60), "c": section("c", 5)})
    assert budgets["a"] == 40  # 100 left, 60 reserved for b and c
    assert budgets["b"] == 60  # a's unused 30 came to b; c's 30 still reserved
    assert budgets["c"] == 30  # b overran its budget by 0: c keeps its share
    assert [suite.records[name].seconds for name in "abc"] == [10, 60, 5]
    assert all(record.status == "done" for record in suite.records.values())


def test_attempt_skips_items_that_cannot_fit_and_learns_from_those_that_ran():
    clock = FakeClock()
    suite = Suite(replace(SMOKE, budget_seconds=100, shares={}), now=clock.now)
    ran = []

    def item(k, seconds):
        def work():
            ran.append(k)
            clock.t += seconds
            return k
        return work

    budget = Budget(50, clock.now)
    assert suite.attempt(budget, "k = 3", "spec_k", 10, item(3, 30)) == 3  # guessed 10, took 30
    assert suite.attempt(budget, "k = 4", "spec_k", 10, item(4, 1)) is None  # now estimated at 30, 20 left
    assert ran == [3] and budget.skipped == ["skipped k = 4: needs ~30 s, 20 s left in the section"]


def test_attempt_records_an_item_that_raises_and_the_section_goes_on():
    clock = FakeClock()
    suite = Suite(replace(SMOKE, shares={}), now=clock.now)
    budget = Budget(50, clock.now)

    def broken():
        raise ValueError("fullgraph capture failed")

    assert suite.attempt(budget, "hf_static_compiled at batch 1", "first:x", 1, broken) is None
    assert budget.failed == ["hf_static_compiled at batch 1: ValueError: fullgraph capture failed"]
    assert suite.attempt(budget, "eager at batch 1", "first:eager", 1, lambda: "ran") == "ran"


@pytest.mark.parametrize("name, kind", [("NVIDIA H100 80GB HBM3", "nvidia-h100"), ("NVIDIA H200", "nvidia-h200"),
                                        ("cpu", "cpu"), ("AMD Instinct MI300X", "amd-instinct-mi300x")])
def test_the_files_are_named_by_the_device_tools_kind(name, kind):
    assert device_kind(name) == kind


@pytest.mark.slow
def test_the_study_job_runs_with_wandb_offline(tmp_path, monkeypatch):
    """One short experiment=gpt2_xl_study job (embedded pair on CPU, eager) as the suite runs it: a subprocess."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its scratch run directory
    payload = gpu_suite.main(["--smoke", "--out", str(tmp_path), "--sections", "study"])
    [row] = payload["tables"]["study"]
    assert row["exit_code"] == 0 and row["status"] == "complete" and row["wandb_offline_runs"] == 1
    assert row["logger"] == "wandb" and row["run_dir"].startswith(str(tmp_path))
    assert row["compile"] is False and row["compile_seconds"] is None and row["speedup_mean"] > 0
    assert payload["study_ok"] is True
