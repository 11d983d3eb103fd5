"""A lossless check anyone can run on a new strategy or drafter: ``check_lossless``.

A strategy is lossless when the tokens it emits are distributed exactly as the target's own (after the sampling
settings). The check decodes one prompt many times through the real loop (drafter, caches, rollback, several
steps) with a tiny-vocabulary target, counts each continuation of the first ``length`` tokens, and compares the
counts with the exact distribution, enumerated from the target prefix by prefix (V^length continuations). Every
token comes from a speculative step: the first step drafts from the prompt and the prefill verifies it.
A chi-square goodness-of-fit test gives the p-value: a lossless rule gives p-values spread over [0, 1]; a rule that
changes the distribution drives p towards 0 as ``samples`` grows. Seeds are fixed, so a verdict is reproducible.
The test needs a minimum of samples, known before decoding (``minimum_samples``): the likeliest continuation and
all the others together must each expect 5 samples; fewer are refused with that minimum. An emitted continuation
of probability 0 gives p = 0 whatever the counts.

    from specdec.testing import check_lossless
    report = check_lossless(my_strategy, make_drafter=lambda draft, target: specdec.TreeDrafter(draft, (2, 2)))
    report.lossless, report.p_value
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import torch
from scipy.stats import chisquare
from transformers import GPT2Config, GPT2LMHeadModel

from specdec.checks import (
    check_allocation, check_draft_length, check_model, check_probability, check_seed, check_strategy_object,
    model_device,
)
from specdec.api import Decoder
from specdec.drafters import ModelDrafter
from specdec.interfaces import AcceptanceStrategy, Drafter
from specdec.policies import FixedLength
from specdec.sampling import SamplingConfig, logits_to_probs

TEST_VOCAB = 8  # the tiny target's vocabulary: 8^3 = 512 continuations of 3 tokens to enumerate
TEST_PROMPT = (3, 1, 4, 1, 5)
MIN_EXPECTED = 5  # chi-square's rule: every compared cell expects at least this many samples
ROUNDING = 1e-9  # slack on that rule, so that exactly ``minimum_samples`` passes despite float rounding
MAX_CONTINUATIONS = 100_000  # vocab ** length continuations enumerated through the target at most


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
    """Goodness of fit of integer ``samples`` (outcome indices) to ``expected_probs`` [C].

    An outcome of probability 0 that occurs gives p = 0, and a distribution with one possible outcome p = 1 (both
    exact). Otherwise cells expecting fewer than 5 are pooled (``pooled``); fewer samples than
    ``minimum_samples(expected_probs)`` leave one cell, which is refused with that minimum.
    """
    probs = expected_probs.double().flatten()
    samples = samples.flatten()
    if samples.numel() == 0 or bool(((samples < 0) | (samples >= probs.numel())).any()):
        raise ValueError(f"samples must be a non-empty set of outcome indices in [0, {probs.numel()})")
    observed = torch.bincount(samples, minlength=probs.numel()).double()  # [C]
    if bool((observed[probs == 0] > 0).any()):
        return 0.0
    if int((probs > 0).sum()) == 1:
        return 1.0
    minimum = minimum_samples(probs)
    if samples.numel() < minimum:
        raise ValueError(f"{samples.numel()} samples are too few for a chi-square test of this distribution: it "
                         f"needs at least {minimum} (the likeliest outcome and the rest must each expect "
                         f"{MIN_EXPECTED})")
    observed, expected = pooled(observed, probs * samples.numel())
    expected *= observed.sum() / expected.sum()  # the probabilities' float rounding, so scipy sees equal totals
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


def minimum_samples(probs: torch.Tensor) -> int:
    """The fewest samples for which ``chi_square_p_value`` compares two cells or more: the likeliest outcome, and
    all others pooled, must each expect ``MIN_EXPECTED``. 1 for a distribution with one possible outcome."""
    positive = probs.double().flatten()[probs.flatten() > 0]
    if positive.numel() == 1:
        return 1
    top = float(positive.max())
    rest = float(positive.sum()) - top
    return math.ceil(MIN_EXPECTED / min(top, rest) - ROUNDING)


def pooled(observed: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[C] observed and expected counts -> [C'] cells each expecting ``MIN_EXPECTED`` or more: the smaller cells are
    summed into one pool, which joins the smallest large cell where it still expects fewer."""
    small = expected < MIN_EXPECTED - ROUNDING  # [C]
    observed_large, expected_large = observed[~small], expected[~small]  # [L]
    pool_observed, pool_expected = observed[small].sum().view(1), expected[small].sum().view(1)  # [1]
    if bool(pool_expected >= MIN_EXPECTED - ROUNDING) or expected_large.numel() == 0:
        return torch.cat([observed_large, pool_observed]), torch.cat([expected_large, pool_expected])
    smallest = int(expected_large.argmin())
    observed_large[smallest] += pool_observed[0]
    expected_large[smallest] += pool_expected[0]
    return observed_large, expected_large


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
    step: str = "host",
) -> LosslessReport:
    """Whether ``strategy`` with the drafter ``make_drafter(draft, target)`` (default: ``ModelDrafter(draft)``)
    keeps the target's distribution, under ``sampling`` (default temperature 1) and draft length ``k``.

    ``target`` and ``draft`` default to tiny random GPT-2s with an 8-token vocabulary that disagree often enough
    (acceptance about 0.3) for a wrong rule to show; models of your own must be small-vocabulary causal LMs in
    eval mode (the check enumerates vocab ** length continuations). ``samples`` must reach the test's minimum for
    this target and sampling (``minimum_samples``, about 1000 for the defaults); more gives the test more power.
    ``step`` is the decode loop checked: "host" or "device" (``specdec.Decoder``).
    """
    check_lossless_arguments(strategy, make_drafter, sampling, k, samples, length, significance, target, draft, seed)
    sampling = sampling if sampling is not None else SamplingConfig(temperature=1.0)
    target = target if target is not None else tiny_model(seed=10, layers=2)
    draft = draft if draft is not None else tiny_model(seed=12, layers=1, init=0.1)
    vocab = target.config.vocab_size
    if vocab ** length > MAX_CONTINUATIONS:
        raise ValueError(f"vocab ** length = {vocab} ** {length} continuations is too many to enumerate; "
                         f"use a target with a smaller vocabulary or a shorter length")
    prompt = list(TEST_PROMPT)
    joint = exact_joint(target, prompt, sampling, length)  # [V ** length]
    minimum = minimum_samples(joint)
    if samples < minimum:
        raise ValueError(f"samples={samples} is too few for the chi-square test of this target under {sampling}: it "
                         f"needs samples >= {minimum} (the likeliest continuation and the rest must each expect "
                         f"{MIN_EXPECTED}); the default 6000 suits the default models")
    drafter = make_drafter(draft, target) if make_drafter is not None else ModelDrafter(draft)
    ids = torch.tensor([prompt]).expand(samples, -1)
    decoder = Decoder(target, drafter, strategy, FixedLength(k), sampling, step=step)
    out = decoder.generate(ids, max_new_tokens=length, seed=seed)
    p_value = chi_square_p_value(continuation_codes(out.tokens, length, vocab), joint)
    return LosslessReport(p_value, significance, samples, length, out.stats.acceptance_rate)


def check_lossless_arguments(strategy, make_drafter, sampling, k, samples, length, significance, target, draft,
                             seed) -> None:
    """Each of ``check_lossless``'s arguments, before any model is built or run."""
    check_strategy_object(strategy)
    if make_drafter is not None and not callable(make_drafter):
        raise TypeError(f"make_drafter must be a function (draft, target) -> Drafter, or None; got {make_drafter!r}")
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec.SamplingConfig or None, got {sampling!r}")
    if sampling is not None and sampling.is_greedy:
        raise ValueError("check_lossless compares distributions: use a sampling temperature > 0")
    check_draft_length("k", k)
    check_draft_length("samples", samples)  # an integer >= 1, as a draft length is
    check_draft_length("length", length)
    check_probability("significance", significance, low_open=True, high_open=True)
    for role, model in (("target", target), ("draft", draft)):
        if model is not None:
            check_model(role, model)
    device = model_device(target) if target is not None else torch.device("cpu")
    # The call decodes ``samples`` rows at once: its [samples, prompt + length + k + 1] buffers must fit.
    check_allocation("samples", samples * (len(TEST_PROMPT) + length + k + 1), torch.long, device)
    check_seed(seed)
