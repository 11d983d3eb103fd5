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


@pytest.mark.parametrize("arguments, expected", [
    (["loss=hellinger"], "loss=hellinger is not an option of loss"),
    (["unknown_key=1"], "unknown_key is not a key of the training config"),
    (["+unknown_key=1"], "unknown_key=1 is not a key the training app reads"),
    (["drafter.head.feature_layers=[99]"], "drafter.head:"),
    (["drafter.head.width=7"], "drafter.head:"),
    (["drafter.objective.pass_decay=high"], "drafter.objective.pass_decay='high' is not allowed"),
    (["drafter.objective.token_weight=nan"], "drafter.objective.token_weight=nan is not allowed"),
    (["drafter.objective.feature_weight=-1"], "drafter.objective.feature_weight=-1 is not allowed"),
    (["drafter.draft_vocab=100000"], "drafter.draft_vocab=100000 is not allowed"),
    (["heldout.k=16"], "heldout.k=16 is not allowed with heldout.new_tokens=16"),
    (["data.new_tokens=400"], "data: sequences of up to"),
    (["drafter=medusa", "drafter.head._target_=specdec.heads.EagleHead", "~drafter.head.num_heads"],
     "drafter.kind=medusa trains a specdec.heads.MedusaHeads"),
    (["drafter.kind=medusa"], "drafter.kind=medusa trains a specdec.heads.MedusaHeads"),
])
def test_bad_settings_are_refused_in_one_line_before_any_data(tiny_pair, tmp_path, monkeypatch, capsys, arguments,
                                                               expected):
    line = refusal(tiny_pair, tmp_path / "run", monkeypatch, capsys, arguments)
    assert line.startswith("config error: ") and expected in line, line


@pytest.mark.parametrize("name, text, expected", [
    ("empty.txt", "\n\n  \n", "holds no document"),
    ("no_text.jsonl", '{"body": "a b c"}\n', 'has no "text" string'),
    ("table.csv", "a,b\n1,2\n", "an existing .txt or .jsonl file"),
])
def test_bad_corpora_are_refused_before_any_data(tiny_pair, tmp_path, monkeypatch, capsys, name, text, expected):
    corpus = tmp_path / name
    corpus.write_text(text)
    line = refusal(tiny_pair, tmp_path / "run", monkeypatch, capsys, **{"data.corpus": str(corpus)})
    assert line.startswith("config error: ") and expected in line, line
