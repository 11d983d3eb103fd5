"""The training app's guarantees (issue 43): bad settings refused in one line before any data or model, damaged
files named with what to do, data named by their content, the run directory locked, a non-finite loss stopping the
run without writing its weights, "done" only when a drafter was written, log.jsonl never losing a good line, and
half-precision training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_train_drafter import overrides, tiny_pair, train_in_process  # noqa: F401 - tiny_pair is a fixture

from specdec.checkpoints import read_drafter_config


def run_app(pair: dict, run_dir: Path, monkeypatch, **extra) -> None:
    train_in_process(overrides(pair, run_dir, steps=8, eval_every=4, **extra), monkeypatch)


def refusal(pair: dict, run_dir: Path, monkeypatch, capsys, arguments: list[str] | None = None, **extra) -> str:
    """The one line the app refuses with (exit 2), having written nothing under data_dir or the run directory."""
    data = Path(pair["data_dir"])
    before = sorted(data.rglob("*")) if data.exists() else []
    with pytest.raises(SystemExit) as exit_info:
        train_in_process(overrides(pair, run_dir, steps=8, eval_every=4, **extra) + (arguments or []), monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (sorted(data.rglob("*")) if data.exists() else []) == before
    return err[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_training_writes_a_finite_drafter(tiny_pair, tmp_path, monkeypatch, dtype):
    run_app(tiny_pair, tmp_path / dtype, monkeypatch, dtype=dtype)
    summary = json.loads((tmp_path / dtype / "summary.json").read_text())
    assert math.isfinite(summary["simulated_tau"]) and summary["simulated_tau"] >= 1
    config = read_drafter_config(tmp_path / dtype / "drafter", "eagle")
    assert config["training"]["best_step"] is not None
