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
    train_in_process(overrides(pair, run_dir, **{"steps": 8, "eval_every": 4, **extra}), monkeypatch)


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


def stopped_line(capsys) -> str:
    """The line a stopped run ends with (after the progress bar's carriage returns)."""
    return capsys.readouterr().err.strip().splitlines()[-1].split("\r")[-1]


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
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


def test_a_diverging_run_stops_and_writes_no_non_finite_weights(tiny_pair, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_app(tiny_pair, tmp_path / "run", monkeypatch, lr=1e6, grad_clip=0)
    assert exit_info.value.code == 1
    line = stopped_line(capsys)
    assert line.startswith("training stopped: ") and ("loss" in line or "weights" in line), line
    assert not (tmp_path / "run" / "summary.json").exists()
    drafter = tmp_path / "run" / "drafter" / "weights.safetensors"
    if drafter.exists():
        from safetensors.torch import load_file
        assert all(torch.isfinite(tensor).all() for tensor in load_file(str(drafter)).values())
    for text in (tmp_path / "run" / "log.jsonl").read_text().splitlines():
        json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in log.jsonl"))


@pytest.mark.slow
def test_a_damaged_log_line_is_set_aside_and_no_good_line_is_lost(tiny_pair, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run_app(tiny_pair, run, monkeypatch, steps=8, checkpoint_every=8)
    lines = (run / "log.jsonl").read_text().splitlines()
    damaged = [*lines[:2], "{not json", *lines[2:]]
    (run / "log.jsonl").write_text("\n".join(damaged) + "\n")
    (run / "summary.json").unlink()
    run_app(tiny_pair, tmp_path / "again", monkeypatch, checkpoint_every=8, resume=str(run))
    assert (run / "log.jsonl").read_text().splitlines() == lines
    assert (run / "log.jsonl.damaged").read_text() == "{not json\n"


def test_a_stray_checkpoint_beyond_the_steps_is_named(tiny_pair, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    torch.save({"step": 99}, run / "checkpoint" / "state-000000099.pt")
    with pytest.raises(SystemExit) as exit_info:
        run_app(tiny_pair, run, monkeypatch)
    assert exit_info.value.code == 1
    line = stopped_line(capsys)
    assert "state-000000099.pt is beyond this run's 8 steps" in line
    assert not (run / "drafter").exists()


@pytest.mark.parametrize("content, expected", [(b"", "is damaged"), (b"garbage" * 10, "is damaged")])
def test_a_damaged_checkpoint_is_named(tiny_pair, tmp_path, monkeypatch, capsys, content, expected):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "state-000000004.pt").write_bytes(content)
    with pytest.raises(SystemExit):
        run_app(tiny_pair, run, monkeypatch)
    line = stopped_line(capsys)
    assert line.startswith("training stopped: ") and expected in line and "state-000000004.pt" in line


@pytest.mark.slow
@pytest.mark.parametrize("pattern, damage", [
    ("*/shard-00000.safetensors", "truncate"),
    ("*/hidden-*/shard-00000.safetensors", "truncate"),
    ("heldout/heldout-*.safetensors", "truncate"),
    ("*/shard-00000.safetensors", "out_of_vocabulary"),
])
def test_a_damaged_data_file_is_named(tiny_pair, tmp_path, monkeypatch, capsys, pattern, damage):
    data = tmp_path / "data"
    run_app(tiny_pair, tmp_path / "first", monkeypatch, data_dir=str(data), hidden="cache")
    path = sorted(data.glob(pattern))[0]
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    else:
        from safetensors.torch import load_file, save_file
        tensors = load_file(str(path))
        tensors["tokens"][0, 0] = 10**6
        save_file(tensors, str(path))
    with pytest.raises(SystemExit) as exit_info:
        run_app(tiny_pair, tmp_path / "second", monkeypatch, data_dir=str(data), hidden="cache")
    assert exit_info.value.code == 1
    line = stopped_line(capsys)
    assert line.startswith(f"training stopped: {path} is damaged") and "delete it" in line, line


def test_a_damaged_train_config_is_named(tiny_pair, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_config.yaml").write_text("")
    line = refusal(tiny_pair, tmp_path / "other", monkeypatch, capsys, resume=str(run))
    assert "train_config.yaml is damaged" in line


@pytest.mark.slow
def test_a_corpus_edited_in_place_is_read_again(tiny_pair, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(Path(tiny_pair["corpus"]).read_text())
    data = tmp_path / "data"
    run_app(tiny_pair, tmp_path / "first", monkeypatch, data_dir=str(data), **{"data.corpus": str(corpus)})
    documents = corpus.read_text().split("\n\n")
    corpus.write_text("\n\n".join(" ".join(reversed(document.split())) for document in documents))
    run_app(tiny_pair, tmp_path / "second", monkeypatch, data_dir=str(data), **{"data.corpus": str(corpus)})
    assert len([path for path in data.iterdir() if path.name.startswith("targetcontinuations-")]) == 2


def test_a_run_directory_another_process_writes_is_refused(tiny_pair, tmp_path, monkeypatch, capsys):
    from experiments.rundir import RunLock

    run = tmp_path / "run"
    with RunLock(run):
        line = refusal(tiny_pair, run, monkeypatch, capsys)
    assert line.startswith(f"config error: run directory {run} is being written by "), line
    assert not (run / "train_config.yaml").exists()
