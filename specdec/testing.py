"""A lossless check anyone can run on a new strategy or drafter: ``check_lossless``.

A strategy is lossless when the tokens it emits are distributed exactly as the target's own (after the sampling
settings). The check decodes one prompt many times through the real loop (drafter, caches, rollback, several
steps) with a tiny-vocabulary target, counts each continuation of the first ``length`` tokens, and compares the
counts with the exact distribution, enumerated from the target prefix by prefix (V^length continuations). Every
token comes from a speculative step: the first step drafts from the prompt and the prefill verifies it.
A chi-square goodness-of-fit test gives the p-value: a lossless rule gives p-values spread over [0, 1]; a rule that
changes the distribution drives p towards 0 as ``samples`` grows. Seeds are fixed, so a verdict is reproducible.

    from specdec.testing import check_lossless
    report = check_lossless(my_strategy, make_drafter=lambda draft, target: specdec.TreeDrafter(draft, (2, 2)))
    report.lossless, report.p_value
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import torch
from scipy.stats import chisquare
from transformers import GPT2Config, GPT2LMHeadModel

from specdec.decode import Decoder
from specdec.drafters import ModelDrafter
from specdec.interfaces import AcceptanceStrategy, Drafter
from specdec.policies import FixedLength
from specdec.sampling import SamplingConfig, logits_to_probs

TEST_VOCAB = 8  # the tiny target's vocabulary: 8^3 = 512 continuations of 3 tokens to enumerate
TEST_PROMPT = (3, 1, 4, 1, 5)


@dataclass(frozen=True)
class LosslessReport:
    p_value: float  # chi-square goodness of fit of the emitted continuations to the exact joint distribution
    significance: float
    samples: int
    length: int  # tokens per continuation compared
    acceptance_rate: float  # of the decoding that was checked (near 0 or 1, the check exercises little)

    @property
    def lossless(self) -> bool:
        """No evidence against losslessness at this significance."""
        return self.p_value > self.significance


def tiny_model(seed: int, layers: int, vocab: int = TEST_VOCAB, init: float = 0.02) -> GPT2LMHeadModel:
    """A random GPT-2 in float64 (batched and incremental forwards agree to the last bit); a larger ``init``
    (weight std) gives peakier distributions."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=layers, n_head=2, initializer_range=init,
                        bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(config).eval().double().requires_grad_(False)


def exact_joint(target: torch.nn.Module, prompt: list[int], sampling: SamplingConfig, length: int) -> torch.Tensor:
    """[V ** length] the exact probability of each continuation, enumerating every prefix through the target."""
    vocab = target.config.vocab_size
    joint = torch.ones(1, dtype=torch.float64)
    for depth in range(length):
        prefixes = itertools.product(range(vocab), repeat=depth)
        ids = torch.tensor([prompt + list(prefix) for prefix in prefixes])
        with torch.no_grad():
            next_probs = logits_to_probs(target(ids).logits[:, -1], sampling).double()  # [V**depth, V]
        joint = (joint.unsqueeze(1) * next_probs).flatten()
    return joint


def continuation_codes(tokens: list[list[int]], length: int, vocab: int) -> torch.Tensor:
    """Each row's first ``length`` tokens as one integer in [0, vocab ** length)."""
    codes = torch.tensor([row[:length] for row in tokens])
    return (codes * vocab ** torch.arange(length - 1, -1, -1)).sum(-1)


def chi_square_p_value(samples: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Goodness of fit of integer ``samples`` to ``expected_probs``; cells expecting fewer than 5 are pooled."""
    observed = torch.bincount(samples, minlength=expected_probs.numel()).double()
    expected = expected_probs.double().flatten() * samples.numel()
    small = expected < 5
    observed = torch.cat([observed[~small], observed[small].sum().view(1)])
    expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    expected *= observed.sum() / expected.sum()
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


def check_lossless(
    strategy: AcceptanceStrategy,
    make_drafter: Callable[[torch.nn.Module, torch.nn.Module], Drafter] | None = None,
    sampling: SamplingConfig | None = None,
    k: int = 2,
    samples: int = 6000,
    length: int = 3,
    significance: float = 1e-3,
    target: torch.nn.Module | None = None,
    draft: torch.nn.Module | None = None,
    seed: int = 1,
) -> LosslessReport:
    """Whether ``strategy`` with the drafter ``make_drafter(draft, target)`` (default: ``ModelDrafter(draft)``)
    keeps the target's distribution, under ``sampling`` (default temperature 1) and draft length ``k``.

    ``target`` and ``draft`` default to tiny random GPT-2s with an 8-token vocabulary that disagree often enough
    (acceptance about 0.3) for a wrong rule to show; models of your own must be small-vocabulary causal LMs in
    eval mode (the check enumerates vocab ** length continuations).
    """
    sampling = sampling if sampling is not None else SamplingConfig(temperature=1.0)
    if sampling.is_greedy:
        raise ValueError("check_lossless compares distributions: use a sampling temperature > 0")
    target = target if target is not None else tiny_model(seed=10, layers=2)
    draft = draft if draft is not None else tiny_model(seed=12, layers=1, init=0.1)
    vocab = target.config.vocab_size
    if vocab ** length > 100_000:
        raise ValueError(f"vocab ** length = {vocab} ** {length} continuations is too many to enumerate; "
                         f"use a target with a smaller vocabulary or a shorter length")
    drafter = make_drafter(draft, target) if make_drafter is not None else ModelDrafter(draft)
    prompt = list(TEST_PROMPT)
    ids = torch.tensor([prompt]).expand(samples, -1)
    out = Decoder(target, drafter, strategy, FixedLength(k), sampling).generate(ids, max_new_tokens=length, seed=seed)
    p_value = chi_square_p_value(continuation_codes(out.tokens, length, vocab),
                                 exact_joint(target, prompt, sampling, length))
    return LosslessReport(p_value, significance, samples, length, out.stats.acceptance_rate)
