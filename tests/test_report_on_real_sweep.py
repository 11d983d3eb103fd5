"""The report command on a small real sweep of the embedded pair: rows written by experiments.run, read back
by analysis/, rendered to Markdown and PNGs."""

import sys
from pathlib import Path

import pytest

from analysis import load_runs, summarize_runs
from analysis import report


@pytest.mark.slow
def test_report_on_a_real_embedded_sweep(tmp_path, monkeypatch):
    from experiments import run as run_app

    sweep = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", [
        str(Path(run_app.__file__)), "-m", "strategy=greedy,speculative", "draft_length.k=2,4", "num_prompts=2",
        "max_new_tokens=12", "warmup=0", "device=cpu", "threads=1", f"hydra.sweep.dir={sweep}",
    ])
    run_app.main()

    frame = load_runs(sweep)
    assert len(frame) == 8 and set(frame["pair"]) == {"embedded"}
    assert set(zip(frame["strategy"], frame["k"])) == {("greedy", 2), ("greedy", 4), ("speculative", 2), ("speculative", 4)}
    summary = summarize_runs(frame)
    assert len(summary) == 4 and not summary["partial"].any()
    # At temperature 0 both strategies decode identically, so their acceptance matches at each k.
    by_setting = summary.set_index(["strategy", "k"])["acceptance_rate_mean"]
    for k in (2, 4):
        assert by_setting[("greedy", k)] == by_setting[("speculative", k)]

    assert report.main([str(sweep)]) == 0
    text = (sweep / "report.md").read_text()
    assert "fastest" in text.lower() and "embedded" in text
    for png in ("speedup.png", "acceptance.png", "per_position.png", "throughput.png"):
        assert (sweep / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in text
