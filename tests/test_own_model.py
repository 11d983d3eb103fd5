"""A model directory of one's own, end to end: `train_drafter pair.target=DIR drafter=eagle` trains a head from a
Llama-shaped directory (no draft model), and `experiments.run pair.target=DIR drafter=eagle drafter.checkpoint=HEAD`
decodes with it losslessly (every row's tokens equal the baseline's)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from conftest import REPO, WORDS
from llama_dirs import save_tiny_llama
from test_experiments import compose_run, rows_of

from experiments import runner
from experiments import train_drafter as app
from specdec.checkpoints import read_drafter_config


@pytest.fixture(scope="module")
def own(tmp_path_factory) -> dict:
    """A Llama-shaped target directory, a corpus of its words and a prompt file."""
    root = tmp_path_factory.mktemp("own_model")
    rng = random.Random(0)
    documents = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 60))) for _ in range(60)]
    (root / "corpus.txt").write_text("\n\n".join(documents))
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "text": " ".join(documents[i].split()[:12])})
                                                + "\n" for i in range(3)))
    return {"root": root, "target": str(save_tiny_llama(root / "TinyLlama-Instruct")),
            "corpus": str(root / "corpus.txt"), "prompts": str(root / "prompts.jsonl")}


def train(arguments: list[str], monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(REPO / "experiments" / "train_drafter.py"), *arguments])
    app.main()


def small_training(own: dict, run_dir: Path, *extra: str) -> list[str]:
    """The data and held-out sizes of a seconds-long run on the tiny directory."""
    return [f"data.corpus={own['corpus']}", "data.num_prompts=16", "data.new_tokens=8", "data.shard_size=8",
            "data.prompt_tokens=[4,8]", "data.heldout_fraction=0.1", "heldout.first=0", "heldout.count=4",
            "heldout.new_tokens=8", "batch_size=4", "device=cpu", "dtype=float32", "threads=1",
            f"data_dir={own['root'] / 'data'}", f"hydra.run.dir={run_dir}", *extra]


@pytest.fixture(scope="module")
def head(own, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("train") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        train([f"pair.target={own['target']}", "drafter=eagle", "steps=2", *small_training(own, run_dir)], monkeypatch)
    return run_dir / "drafter"


def test_a_head_trains_from_a_model_directory_alone(head):
    config = read_drafter_config(head, "eagle")
    assert config["target"]["architecture"] == "LlamaForCausalLM" and config["training"]["steps"] == 2
    assert (head / "weights.safetensors").is_file()


def test_the_run_app_decodes_losslessly_with_the_head_on_the_directory(own, head, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run([f"pair.target={own['target']}", "drafter=eagle", f"drafter.checkpoint={head}",
                             "data=file", f"data.source={own['prompts']}", "device=cpu", "dtype=float32",
                             "max_new_tokens=10", "stop_at_eos=false", "num_prompts=3", "warmup=0", "threads=1"],
                            run_dir))
    rows = rows_of(run_dir)
    assert len(rows) == 3 and {(row["pair"], row["drafter"]) for row in rows} == {("TinyLlama-Instruct", "eagle")}
    assert all(row["identical_output"] is True and row["emitted"] == 10 for row in rows)
    assert sum(row["drafted"] for row in rows) > 0
