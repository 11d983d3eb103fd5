"""The GPT-2 XL recipe of docs/training.md, run offline on pair=gpt2-xl-shaped (random weights of GPT-2 XL's exact
shapes, real GPT-2 tokenizer), a few steps of each command, so that the recipe cannot rot: every key it sets must
still exist and compose, and each command must write a drafter that names its 1.56 B-parameter target."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, WORDS

from specdec.checkpoints import read_drafter_config

RECIPE = re.compile(r"<!-- recipe[^>]*-->\s*```bash\n(.*?)```", re.S)
# What a CPU test can afford; every other key is the recipe's own. fp32, not the recipe's bf16: bf16 matmuls run 24x
# slower on CPUs without AVX-512 BF16 (this machine's and CI's).
SHRUNK = {
    "pair": "gpt2-xl-shaped", "steps": "2", "eval_every": "1", "batch_size": "2", "data.num_prompts": "4",
    "data.new_tokens": "8", "data.shard_size": "4", "data.heldout_fraction": "0.2", "heldout.first": "0",
    "heldout.count": "2", "heldout.new_tokens": "8", "device": "cpu", "dtype": "float32", "threads": "2",
}


def recipe_commands() -> list[list[str]]:
    """The recipe's train_drafter commands, as override lists."""
    [block] = RECIPE.findall((REPO / "docs" / "training.md").read_text())
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = line.split("#")[0].split()
        if words[:3] == ["python", "-m", "experiments.train_drafter"]:
            commands.append(words[3:])
    return commands


def test_the_recipe_has_one_command_per_family():
    kinds = [dict(word.split("=", 1) for word in command).get("drafter", "eagle") for command in recipe_commands()]
    assert sorted(kinds) == ["eagle", "medusa", "model"]
    assert all(dict(word.split("=", 1) for word in command)["pair"] == "gpt2-xl" for command in recipe_commands())


@pytest.mark.slow
@pytest.mark.parametrize("command", recipe_commands(), ids=lambda command: " ".join(command)[:60])
def test_a_few_steps_of_the_gpt2_xl_recipe_run_offline_on_its_shapes(command, tmp_path):
    rng = random.Random(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(rng.choice(WORDS) for _ in range(80)) for _ in range(20)))
    settings = dict(word.split("=", 1) for word in command)
    settings.update(SHRUNK, **{"data.corpus": str(corpus), "data_dir": str(tmp_path / "data"),
                               "hydra.run.dir": str(tmp_path / "run")})
    environment = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    done = subprocess.run([sys.executable, "-m", "experiments.train_drafter",
                           *(f"{key}={value}" for key, value in settings.items())],
                          cwd=REPO, env=environment, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    kind = settings.get("drafter", "eagle")
    config = read_drafter_config(tmp_path / "run" / "drafter", kind)
    assert config["target"]["architecture"] == "GPT2LMHeadModel"
    assert config["target"]["num_parameters"] == 1_557_611_200
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["finished"]
