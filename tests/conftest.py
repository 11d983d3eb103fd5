"""Tiny random-weight GPT-2 models built in-process: the tests never touch the hub."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 97


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


def left_pad(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


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
