"""A model directory of one's own, end to end: `train_drafter pair.target=DIR drafter=eagle` trains a head from a
Llama-shaped directory (no draft model), and `experiments.run pair.target=DIR drafter=eagle drafter.checkpoint=HEAD`
decodes with it losslessly (every row's tokens equal the baseline's)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch
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


def chat_file(own: dict, count: int = 40) -> str:
    """Conversations in the tiny tokenizer's words: a system turn on some, an earlier assistant turn on others."""
    rng = random.Random(1)
    path = own["root"] / "conversations.jsonl"
    with path.open("w") as file:
        for i in range(count):
            turns = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))}]
            if i % 3 == 0:
                turns = [{"role": "system", "content": "you are the one"}, *turns]
            if i % 4 == 1:
                turns = [*turns, {"role": "assistant", "content": "the end"}]
            file.write(json.dumps({"messages": turns}) + "\n")
    return str(path)


def test_chat_data_is_the_targets_replies_in_its_own_template(own, tmp_path, monkeypatch):
    """data=chat: each training sequence is a conversation in the tokenizer's chat template, ending in its
    generation prompt, followed by the target's own greedy reply, which alone is trained on."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.train.chat import ChatConversations
    from specdec.train.data import read_sequences

    conversations = chat_file(own)
    run_dir = tmp_path / "run"
    train([f"pair.target={own['target']}", "drafter=eagle", "steps=2", "data=chat",
           *small_training(own, run_dir, f"data.corpus={conversations}", "data.prompt_tokens=[1,64]",
                           "data.num_prompts=16")], monkeypatch)
    assert read_drafter_config(run_dir / "drafter", "eagle")["training"]["data"]["kind"] == "ChatConversations"

    tokenizer = AutoTokenizer.from_pretrained(own["target"])
    target = AutoModelForCausalLM.from_pretrained(own["target"]).eval()
    spec = ChatConversations(corpus=conversations, num_prompts=16, new_tokens=8, prompt_tokens=(1, 64),
                             heldout_fraction=0.1, shard_size=8)
    first = json.loads(spec.read_corpus().train[0])
    last_user = max(i for i, turn in enumerate(first) if turn["role"] == "user")
    prompt = tokenizer.apply_chat_template(first[:last_user + 1], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<assistant> ") and "the end" not in prompt  # a trailing assistant turn is the target's
    [directory] = [d for d in (own["root"] / "data").iterdir() if d.name.startswith("chatconversations")]
    sequences = read_sequences(directory, 16, 8, spec.width, len(tokenizer))
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert sequences.tokens[0, :len(ids)].tolist() == ids
    reply = target.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                            pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
    assert sequences.tokens[0, len(ids):len(ids) + 8].tolist() == reply
    assert sequences.counts[0].nonzero().flatten().tolist() == list(range(len(ids) - 1, len(ids) + 7))


def test_continuations_of_ones_own_train_on_the_completions(own, tmp_path, monkeypatch):
    from specdec.train.chat import Continuations

    rng = random.Random(2)
    path = tmp_path / "continuations.jsonl"
    with path.open("w") as file:
        for i in range(30):
            words = [rng.choice(WORDS) for _ in range(12)]
            record = {"prompt": " ".join(words[:5]), "completion": " " + " ".join(words[5:])} if i % 2 else \
                {"prompt_ids": [10 + i % 7, 20, 30], "completion_ids": [40, 41, 42, 43]}
            file.write(json.dumps(record) + "\n")
    spec = Continuations(source=str(path), num_sequences=12, length=16, heldout_fraction=0.2, shard_size=4)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(own["target"])
    openings = spec.openings(spec.read_corpus(), tokenizer)
    shard = spec.write_shard({}, openings, 0, 1)
    for (prompt_length, *ids), tokens, counts in zip(openings, shard.tokens, shard.counts):
        assert tokens[:len(ids)].tolist() == ids
        assert counts.nonzero().flatten().tolist() == list(range(prompt_length - 1, len(ids) - 1))
    run_dir = tmp_path / "run"
    train([f"pair.target={own['target']}", "drafter=eagle", "steps=2", "data=continuations",
           f"data.source={path}", "data.num_sequences=12", "data.length=16", "data.heldout_fraction=0.2",
           "data.shard_size=4", "heldout.first=0", "heldout.count=4", "heldout.new_tokens=8", "batch_size=4",
           "device=cpu", "dtype=float32", "threads=1", f"data_dir={tmp_path / 'data'}", f"hydra.run.dir={run_dir}"],
          monkeypatch)
    assert read_drafter_config(run_dir / "drafter", "eagle")["training"]["data"]["kind"] == "Continuations"


def test_the_draft_vocabulary_coverage_of_the_held_out_tokens_is_logged_and_kept(own, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    train([f"pair.target={own['target']}", "drafter=eagle", "steps=2", "drafter.draft_vocab=12",
           *small_training(own, run_dir, f"data_dir={tmp_path / 'data'}")], monkeypatch)
    coverage = read_drafter_config(run_dir / "drafter", "eagle")["training"]["draft_vocab_coverage"]
    draft_ids = set(load_file(str(run_dir / "drafter" / "weights.safetensors"))["draft_ids"].tolist())
    [held] = (tmp_path / "data" / "heldout").iterdir()
    saved = load_file(str(held))
    following = saved["tokens"].long().roll(-1, 1)[saved["counts"].bool()].tolist()  # the target's greedy tokens
    assert len(draft_ids) == 12 and coverage["heldout"] == pytest.approx(
        sum(token in draft_ids for token in following) / len(following), abs=1e-12)
    assert 0 < coverage["heldout"] < 1 and 0 < coverage["trained_on"] < 1  # 12 of 78 tokens cover neither wholly
    assert f"{coverage['heldout']:.1%} of the held-out tokens" in capsys.readouterr().err


def test_a_shard_written_chunk_by_chunk_is_one_calls_bits_and_the_bar_moves_inside_it(own, tmp_path, monkeypatch):
    """Sampled continuations, shards of 10 written in chunks of 4: the bits of one continuations call per shard,
    and the progress reports every chunk in sequences against the total known from the start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.train import data as data_lib

    monkeypatch.setattr(data_lib, "GENERATION_BATCH", 4)
    tokenizer = AutoTokenizer.from_pretrained(own["target"])
    target = AutoModelForCausalLM.from_pretrained(own["target"]).eval()
    spec = data_lib.TargetContinuations(corpus=own["corpus"], num_prompts=13, new_tokens=5, temperature=1.0,
                                        prompt_tokens=(3, 6), shard_size=10, seed=7)
    openings = spec.openings(spec.read_corpus(), tokenizer)
    reports = []
    data_lib.write_sequences(tmp_path, spec, openings, tokenizer, {"target": target},
                             progress=lambda done, total: reports.append((done, total)))
    assert reports == [(0, 13), (4, 13), (8, 13), (10, 13), (13, 13)]
    written = data_lib.read_sequences(tmp_path, 13, 10, spec.width, len(tokenizer))
    for index, first in enumerate((0, 10)):
        whole = data_lib.continuations(target, openings[first:first + 10], 5, 1.0, spec.width,
                                       7 * 1_000_003 + index, tokenizer.pad_token_id, batch_size=4)
        assert torch.equal(written.tokens[first:first + 10], whole.tokens)
        assert torch.equal(written.counts[first:first + 10], whole.counts)


def test_max_wall_minutes_counts_the_whole_command_and_stops_training_checkpointed(own, tmp_path, monkeypatch):
    """A wall limit already spent by loading and data (a millisecond): one step, checkpointed, not finished."""
    run_dir = tmp_path / "run"
    train([f"pair.target={own['target']}", "drafter=eagle", "steps=50", "max_wall_minutes=0.00001",
           *small_training(own, run_dir)], monkeypatch)
    steps = [json.loads(line)["step"] for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert max(steps) == 1 and not (run_dir / "summary.json").exists()
    assert (run_dir / "checkpoint").is_dir()
