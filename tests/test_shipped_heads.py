"""The EAGLE head and Medusa heads shipped for the embedded target (specdec/embedded/heads/), judged by what they
must achieve on held-out prompts, measured in the loop: tau at k = 4, greedy, batch 1, the first prompts of
`embedded_heldout` (which no model of the pair, and no head, trained on); the EAGLE head's simulated tau (what
training reports) within 10% of the loop's. The floors sit below the model card's 64-prompt figures by the spread
of a 16-prompt sample. The run app builds both from `drafter=eagle` / `drafter=medusa`, offline, and compares the
families in one sweep."""

from __future__ import annotations

import json
from dataclasses import asdict
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from experiments import measure_drafter
from experiments import run as run_app
from specdec.checkpoints import read_drafter_config, target_identity
from specdec.models import EMBEDDED_DIR, load_pair
from specdec.results import leviathan_speedup

REPO = Path(__file__).resolve().parents[1]
HEADS = EMBEDDED_DIR / "heads"
PROMPTS = 16


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    data_dir = tmp_path_factory.mktemp("heldout")
    return {kind: measure_drafter.measure(measure_drafter.parse_args(
        ["--kind", kind, "--checkpoint", "embedded", "--prompts", str(PROMPTS), "--k", "4", "--threads", "2",
         "--data-dir", str(data_dir)])) for kind in ("eagle", "medusa")}


@pytest.mark.slow
def test_the_eagle_head_reaches_its_acceptance_in_the_loop(measured):
    eagle = measured["eagle"]
    assert eagle["tau"] >= 3.5, eagle
    assert abs(eagle["simulated_tau"] - eagle["tau"]) / eagle["tau"] <= 0.10, eagle


@pytest.mark.slow
def test_the_medusa_heads_reach_their_acceptance_in_the_loop(measured):
    """... and their predicted speedup takes the k the steps drafted (at most the 4 heads; fewer where a budget cut
    a step), not the configured k."""
    medusa = measured["medusa"]
    assert medusa["tau"] >= 2.6, medusa
    assert 3 < medusa["drafted_k"] <= 4, medusa
    assert medusa["predicted_speedup"] == pytest.approx(
        leviathan_speedup(medusa["acceptance_rate"], medusa["drafted_k"], medusa["cost_ratio"])), medusa


@pytest.mark.slow
def test_training_walks_the_held_out_data_as_the_loop_does(measured):
    """The walked tau is the loop's exactly. vLLM's acceptance length counts the steps that drafted: all but the
    prefill step, which emits one token of a prompt's 64. Each such step kept its accepted drafts and a bonus token,
    except that the last one may be cut short by up to k = 4 tokens, so per prompt
    63 <= drafting_tau x (target calls - 1) <= 63 + 4."""
    for kind, found in measured.items():
        assert found["walked_tau"] == pytest.approx(found["tau"], abs=1e-9), (kind, found)
        kept = found["drafting_tau"] * (64 / found["tau"] - 1)  # per prompt: tokens the drafting steps kept
        assert 63 - 1e-9 <= kept <= 63 + 4 + 1e-9, (kind, kept, found)


def test_each_shipped_head_names_the_embedded_target_and_is_half_precision():
    target = load_pair("embedded", device="cpu", dtype="float32").target
    for kind in ("eagle", "medusa"):
        config = read_drafter_config(HEADS / kind, kind)
        assert config["target"] == asdict(target_identity(target))
        weights = load_file(str(HEADS / kind / "weights.safetensors"))
        assert {tensor.dtype for tensor in weights.values() if tensor.is_floating_point()} == {torch.float16}
        assert (HEADS / kind / "weights.safetensors").stat().st_size < 8 * 2**20


@pytest.mark.slow
def test_the_run_app_compares_the_families_on_one_baseline_offline(tmp_path, monkeypatch):
    sweep_dir = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", [str(REPO / "experiments" / "run.py"), "-m", "drafter=model,eagle,medusa",
                                      "num_prompts=2", "max_new_tokens=12", "warmup=0", "device=cpu",
                                      f"hydra.sweep.dir={sweep_dir}"])
    run_app.main()
    rows = [json.loads(line) for job in sorted(sweep_dir.iterdir()) if job.is_dir() and not job.name.startswith(".")
            for line in (job / "rows.jsonl").read_text().splitlines()]
    assert sorted({row["drafter"] for row in rows}) == ["eagle", "medusa", "model"]
    assert all(row["emitted"] == 12 for row in rows)
    assert all(row["identical_output"] for row in rows)
