"""Shared test helpers. Tiny random-weight GPT-2 models built in-process (the tests never touch the hub), and for
the experiment tests a tiny saved pair with a word-level tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from contextlib import contextmanager

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from specdec.batching import left_pad  # noqa: F401 - the tests' padding helper is the library's

VOCAB = 97
# Lossless tests decode one prompt with a tiny-vocabulary pair and enumerate every continuation.
SMALL_VOCAB = 8
PROMPT = [3, 1, 4, 1, 5]


class TickingClock:
    """Each reading is one tick later than the last, so measured durations count clock readings exactly."""

    def __init__(self):
        self.ticks = 0

    def now(self) -> float:
        self.ticks += 1
        return float(self.ticks)


def tiny_gpt2(
    seed: int, layers: int = 2, width: int = 32, vocab: int = VOCAB, positions: int = 128, init: float = 0.02
) -> GPT2LMHeadModel:
    """float64 so that batched and incremental forwards agree to the last bit and argmax ties never flip.
    A larger ``init`` (weight std) gives peakier, less uniform distributions."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab, n_positions=positions, n_embd=width, n_layer=layers, n_head=2, initializer_range=init,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    return GPT2LMHeadModel(config).eval().double().requires_grad_(False)


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> list[int]:
    """transformers' own greedy decoding of one unpadded prompt: the reference."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id, pad_token_id=0,
    )
    return out[0, len(prompt):].tolist()


def random_prompts(lengths: list[int], seed: int = 0, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models run fastest on one thread, and CI's two cores are shared: oversubscribed threads wait on each
    other. Restored after the session."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def target():
    return tiny_gpt2(0, layers=3)


@pytest.fixture(scope="session")
def draft():
    return tiny_gpt2(1, layers=1)


REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
WORDS = ("the a of and to in is was it that he she they we you on for with as at by from this his her an be "
         "had not are but were have one all there their so out up said what which when who will would been "
         "if more no time then into only could some them my me about its over also two than first new").split()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict:
    """Saved draft/target dirs (shared vocabulary, tokenizer in each) and a prompts .jsonl file."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny")
    vocab = {token: i for i, token in enumerate(["<unk>", "<pad>", "<eos>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    dirs = {}
    for role, layers, seed in (("target", 2, 0), ("draft", 1, 1)):
        torch.manual_seed(seed)
        config = GPT2Config(vocab_size=len(vocab), n_positions=128, n_embd=32, n_layer=layers, n_head=2,
                            bos_token_id=2, eos_token_id=2)
        dirs[role] = root / role
        GPT2LMHeadModel(config).save_pretrained(dirs[role])
        tokenizer.save_pretrained(dirs[role])
    prompts = root / "prompts.jsonl"
    texts = ["the first time he said", "she was not there", "they will have one more",
             "what is it that you", "in the new time we", "it was the only one of them"]
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return {"draft": str(dirs["draft"]), "target": str(dirs["target"]), "prompts": str(prompts), "num_prompts": len(texts)}


@pytest.fixture
def loads(monkeypatch) -> dict:
    """Count pair and prompt loads (to prove validation happens before any model is loaded)."""
    import specdec.models
    import specdec.prompts

    counts = {"pair": 0, "prompts": 0}
    real_pair, real_prompts = specdec.models.load_pair, specdec.prompts.load_prompts

    def load_pair(*args, **kwargs):
        counts["pair"] += 1
        return real_pair(*args, **kwargs)

    def load_prompts(*args, **kwargs):
        counts["prompts"] += 1
        return real_prompts(*args, **kwargs)

    monkeypatch.setattr(specdec.models, "load_pair", load_pair)
    monkeypatch.setattr(specdec.prompts, "load_prompts", load_prompts)
    return counts


@pytest.fixture
def stand_in_processes(monkeypatch):
    """``experiments.common.processes.run_in_processes`` without fresh processes: ``install(result, written,
    change)`` makes each process write a copy of ``result`` (the second's passed through ``change`` first) to
    ``<its --out>/written``; the list it returns fills with each process's ``--first-call``."""
    from experiments.common import processes

    def install(result: dict, written: str, change) -> list[int]:
        first_calls = []

        def run(command, check):
            out = Path(command[command.index("--out") + 1])
            first_calls.append(int(command[command.index("--first-call") + 1]))
            copy = json.loads(json.dumps(result))
            if out.name == "process-1":
                change(copy)
            out.mkdir(parents=True)
            (out / written).write_text(json.dumps(copy))
        monkeypatch.setattr(processes.subprocess, "run", run)
        return first_calls
    return install


def tiny_overrides(tiny: dict, **extra) -> list[str]:
    """Overrides that point a run at the tiny pair and prompt file, sized for a test."""
    settings = {
        "pair.draft": tiny["draft"],
        "pair.target": tiny["target"],
        "data": "file",
        "data.source": tiny["prompts"],
        "device": "cpu",
        "dtype": "float32",
        "max_new_tokens": 8,
        "num_prompts": 4,
        "threads": 1,
    }
    settings.update(extra)
    return [f"{key}={'null' if value is None else value}" for key, value in settings.items()]


@pytest.fixture(autouse=True)
def quiet_wandb(monkeypatch, tmp_path):
    """W&B never reaches the network in tests and writes under the test's tmp dir."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@contextmanager
def watch_forwards(model: torch.nn.Module):
    """Record the [B, n] ``input_ids`` shape of every forward of ``model``: transformers' (a pre-hook) and the lean
    one (``specdec.lean``, a plain callable without hooks). Yields the list it appends to."""
    from specdec.lean import LeanForward

    seen = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)),
                                            with_kwargs=True)
    lean_call = LeanForward.__call__

    def watched(lean, input_ids, *args, **kwargs):
        if lean.model is model:
            seen.append(tuple(input_ids.shape))
        return lean_call(lean, input_ids, *args, **kwargs)
    LeanForward.__call__ = watched
    try:
        yield seen
    finally:
        hook.remove()
        LeanForward.__call__ = lean_call


# The fast tier (`python -m pytest -m fast`, docs/testing.md): the library's parts on plain tensors and tiny models,
# what a newcomer runs first. Marked by file; a file's slow tests stay out of it.
FAST_FILES = {
    "test_cache.py", "test_compiled_widths.py", "test_constructor_checks.py", "test_custom_parts.py",
    "test_device_step.py", "test_distribution.py", "test_drafters.py", "test_generate.py", "test_greedy_equality.py",
    "test_interfaces.py", "test_lean.py", "test_library_checks.py", "test_library_inputs.py", "test_metrics.py",
    "test_models.py", "test_policies.py", "test_prompts.py", "test_strategies.py", "test_target_states.py",
    "test_token_bridge.py",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "fast: the fast tier, the library's parts on plain tensors and tiny models")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in FAST_FILES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)
