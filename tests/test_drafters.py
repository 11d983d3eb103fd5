"""Drafters: n-gram (prompt lookup), early exit, and every drafter x draft-length policy against the target.

Greedy equality: at temperature 0 every drafter under every policy reproduces transformers' own greedy decoding,
batch 1 and a ragged left-padded batch (each row compared with the unpadded prompt decoded alone).
Distribution: speculative sampling with point-mass n-gram drafts emits the target's exact distribution; two
deliberately wrong rules fail the same test.
Models are tiny random GPT-2s in float64, built here; never the hub.
"""

from __future__ import annotations

import copy
import functools
import itertools
from dataclasses import dataclass

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import specdec
from specdec.api import Decoder
from specdec.drafters import ModelDrafter
from specdec.early_exit import EarlyExitDrafter, shallow_view
from specdec.rules import count_leading_true
from specdec.ngram import NGramDrafter
from specdec.costs import CostModel, CostTable
from specdec.policies import ConfidenceLength, CostOptimalLength, FixedLength, HeuristicLength
from specdec.sampling import SamplingConfig, sample
from specdec.rules import probs_of, row_at
from specdec.strategies import Speculative
from specdec.layout import ChainLayout
from specdec.types import HostSync, StepOutcome
from specdec.types import Verdict
from conftest import left_pad, tiny_gpt2

VOCAB = 97
NEW_TOKENS = 16


TARGET = tiny_gpt2(0, layers=3)
DRAFT = tiny_gpt2(1, layers=1)


@functools.lru_cache(maxsize=None)
def hf_greedy(prompt: tuple[int, ...], max_new_tokens: int = NEW_TOKENS) -> list[int]:
    """transformers' own greedy decoding of one unpadded prompt: the reference."""
    ids = torch.tensor([prompt])
    out = TARGET.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts_with_repeats(lengths: list[int], seed: int) -> list[list[int]]:
    """Random prompts whose second half repeats part of the first, so prompt lookup has something to find."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for n in lengths:
        head = torch.randint(1, VOCAB, ((n + 1) // 2,), generator=g).tolist()
        prompts.append((head + head[: n // 2])[:n])
    return prompts


# --- every drafter under every policy equals transformers greedy --------------------------------------------

DRAFTERS = {
    "model": lambda: ModelDrafter(DRAFT),
    "ngram": lambda: NGramDrafter(max_ngram=3, min_ngram=1),
    "early_exit": lambda: EarlyExitDrafter(TARGET, 1),
}
# Drafts cheap beside a verification that does not grow with its tokens: cost_optimal drafts at the prior and drops
# to plain decode steps (k = 0) once it has seen the tiny random models' low acceptance.
CHEAP_DRAFTS = CostModel(CostTable.of_widths({n: 1.0 for n in range(1, 8)}), CostTable.of_widths({1: 0.05}))
# Confidence: tiny random models are unsure (top probability ~0.015 of 97 tokens); this threshold cuts drafts at
# varying lengths, which the test checks.
POLICIES = {
    "fixed": lambda: FixedLength(3),
    "heuristic": lambda: HeuristicLength(k0=2, k_min=1, k_max=6),
    "confidence": lambda: ConfidenceLength(threshold=0.016, k_max=5),
    "cost_optimal": lambda: CostOptimalLength(k_max=6, prior_acceptance=0.7, costs=CHEAP_DRAFTS),
}
GRID = list(itertools.product(DRAFTERS, POLICIES))


def decode(drafter, policy, ids, mask=None, max_new_tokens=NEW_TOKENS, strategy="speculative"):
    return specdec.generate(TARGET, ids, draft=drafter, attention_mask=mask, strategy=strategy,
                            draft_length=policy, max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("drafter_name,policy_name", GRID)
def test_batch_of_one_equals_transformers_greedy(drafter_name, policy_name):
    prompt = prompts_with_repeats([10], seed=1)[0]
    policy = POLICIES[policy_name]()
    out = decode(DRAFTERS[drafter_name](), policy, torch.tensor([prompt]))
    assert out.tokens == [hf_greedy(tuple(prompt))]
    assert out.stats.drafted > 0
    if policy_name == "confidence" and drafter_name != "ngram":
        assert len(set(policy.history)) > 1, policy.history  # drafts really were cut at different lengths


@pytest.mark.parametrize("drafter_name,policy_name", GRID)
def test_ragged_batch_rows_equal_transformers_greedy(drafter_name, policy_name):
    prompts = prompts_with_repeats([5, 12, 2], seed=2)
    ids, mask = left_pad(prompts)
    out = decode(DRAFTERS[drafter_name](), POLICIES[policy_name](), ids, mask)
    assert out.tokens == [hf_greedy(tuple(p)) for p in prompts]


def test_ngram_drafts_are_accepted_on_repetitive_text():
    """Tiny random models fall into loops under greedy decoding; prompt lookup should then be accepted."""
    prompts = prompts_with_repeats([8, 6, 11], seed=3)
    ids, mask = left_pad(prompts)
    out = decode(NGramDrafter(), FixedLength(4), ids, mask, max_new_tokens=40)
    assert out.tokens == [hf_greedy(tuple(p), 40) for p in prompts]
    assert out.stats.accepted > 0 and out.stats.draft_forwards == 0


def test_ngram_under_the_greedy_strategy_with_longer_ngrams():
    prompt = prompts_with_repeats([3], seed=4)[0]
    drafter = NGramDrafter(max_ngram=4, min_ngram=2)
    out = decode(drafter, FixedLength(7), torch.tensor([prompt]), max_new_tokens=40, strategy="greedy")
    assert out.tokens == [hf_greedy(tuple(prompt), 40)]
    assert int(drafter.lengths[0]) == 3 + 40


def test_early_exit_with_every_layer_is_the_target_and_accepts_everything():
    prompt = prompts_with_repeats([7], seed=5)[0]
    out = decode(EarlyExitDrafter(TARGET, 3), FixedLength(4), torch.tensor([prompt]))
    assert out.tokens == [hf_greedy(tuple(prompt))]
    assert out.stats.acceptance_rate == 1.0


# --- n-gram drafter --------------------------------------------------------------------------------------------


def ngram_proposal(history: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    drafter = NGramDrafter(max_ngram, min_ngram)
    ids = torch.tensor([history])
    drafter.start(ids, torch.ones_like(ids))
    return drafter.propose(k, SamplingConfig(), torch.Generator()).tokens[0].tolist()


def test_ngram_continues_the_match_and_runs_into_its_own_draft():
    # suffix (5, 6) was seen at 0, followed by 7; the continuation then repeats with period 3.
    assert ngram_proposal([5, 6, 7, 5, 6], 4) == [7, 5, 6, 7]


def test_ngram_prefers_the_longest_ngram_then_the_most_recent_match():
    assert ngram_proposal([1, 2, 9, 4, 2, 8, 1, 2], 1) == [9]  # (1, 2) beats the more recent (2,) -> 8
    assert ngram_proposal([1, 7, 1, 8, 1], 4) == [8, 1, 8, 1]  # most recent (1,) at 2, not 0
    assert ngram_proposal([3, 4, 5, 3, 4, 6, 3, 4], 2) == [6, 3]  # most recent (3, 4)


def test_ngram_without_a_match_repeats_the_last_token():
    assert ngram_proposal([1, 2, 3], 3) == [3, 3, 3]
    assert ngram_proposal([1, 7, 1], 2, max_ngram=3, min_ngram=2) == [1, 1]  # (1,) matches but n >= 2 needed
    assert ngram_proposal([4], 2) == [4, 4]


def reference_proposal(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The rule in plain Python, one row at a time."""
    length = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[length - n :]:
                extended = list(tokens)
                for j in range(k):
                    extended.append(extended[start + n + j])
                return extended[length:]
    return [tokens[-1]] * k


def test_batched_matching_equals_the_row_by_row_rule_through_ragged_commits():
    g = torch.Generator().manual_seed(0)
    lengths = [1, 4, 9, 2, 6]
    rows = [torch.randint(1, 7, (n,), generator=g).tolist() for n in lengths]  # 6 symbols: matches of every n
    ids, mask = left_pad(rows)
    drafter = NGramDrafter(max_ngram=3, min_ngram=1)
    drafter.start(ids, mask)
    capacity = drafter.history.shape[1]
    ngram_lengths_seen = set()
    for step in range(40):
        k = 1 + step % 5
        ngram_lengths_seen.update(drafter.match()[1].tolist())
        proposal = drafter.propose(k, SamplingConfig(), g).tokens
        assert proposal.tolist() == [reference_proposal(r, k, 3, 1) for r in rows], step
        active = torch.tensor([True, True, step % 3 != 0, True, step < 20])
        num_accepted = torch.randint(0, k + 1, (len(rows),), generator=g)
        new_tokens = torch.randint(1, 7, (len(rows), k + 1), generator=g)  # any text: this tests the drafter
        num_new = (num_accepted + 1) * active
        for i, count in enumerate(num_new.tolist()):
            rows[i].extend(new_tokens[i, :count].tolist())
        live = num_accepted[active]
        host = HostSync(remaining_max=1, room_min=k, num_active=int(active.sum()), max_accepted=int(live.max()),
                        min_accepted=int(live.min()), max_new=int(num_new.max()), min_new=int(num_new.min()),
                        remaining=(1,) * len(rows), kept=tuple(torch.where(active, num_accepted, -1).tolist()))
        drafter.commit(StepOutcome(k, ChainLayout(k), num_accepted, new_tokens[:, -1], chain_path(len(rows), k),
                                   new_tokens, num_new, active, active, host, 0.0, 0.0))
    assert drafter.lengths.tolist() == [len(r) for r in rows]
    assert max(map(len, rows)) > capacity  # the history buffer had to grow on the way
    assert ngram_lengths_seen == {0, 1, 2, 3}  # no match, and matches of each length, all came up


def chain_path(batch: int, k: int) -> torch.Tensor:
    return torch.arange(1, k + 1).expand(batch, k)


# --- early exit ------------------------------------------------------------------------------------------------


def test_early_exit_view_shares_every_tensor_and_equals_a_truncated_copy():
    target_params = {id(p) for p in TARGET.parameters()}
    view = shallow_view(TARGET, 2)
    assert all(id(p) in target_params for p in view.parameters())  # no copies
    assert len(view.transformer.h) == 2 and view.transformer.h[1] is TARGET.transformer.h[1]
    assert view.lm_head is TARGET.lm_head and view.transformer.ln_f is TARGET.transformer.ln_f
    assert TARGET.config.n_layer == 3 and len(TARGET.transformer.h) == 3  # the target is untouched

    truncated = copy.deepcopy(TARGET)
    truncated.transformer.h = truncated.transformer.h[:2]
    truncated.config.n_layer = 2
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(view(ids).logits, truncated(ids).logits, rtol=0, atol=0)


def test_early_exit_rejects_bad_layer_counts_and_unsupported_models():
    for bad in (0, 4, 1.5, True):
        with pytest.raises(ValueError, match="num_layers"):
            EarlyExitDrafter(TARGET, bad)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        EarlyExitDrafter(torch.nn.Linear(2, 2), 1)


# --- the stop hook ---------------------------------------------------------------------------------------------


def test_model_drafter_stops_when_the_hook_says_so_and_the_loop_uses_the_shorter_draft():
    drafter = ModelDrafter(DRAFT)
    ids = torch.tensor([[3, 4, 5]])
    drafter.start(ids, torch.ones_like(ids))
    asked = []
    stop_after_two = lambda token, logits: asked.append((token, logits)) or len(asked) == 2  # noqa: E731
    proposal = drafter.propose(5, SamplingConfig(temperature=1.0), torch.Generator(), stop=stop_after_two)
    assert proposal.tokens.shape == (1, 2) and proposal.probs.shape == (1, 2, VOCAB) and drafter.num_forwards == 2
    assert [token.tolist() for token, _ in asked] == [[t] for t in proposal.tokens[0].tolist()]  # each token drafted
    assert asked[0][1].shape == (1, VOCAB)  # with the draft logits it came from


def test_confidence_stopping_at_temperature_one_is_the_fixed_length_run_it_reduces_to():
    """Threshold 0 never stops (FixedLength(k_max)); threshold 1 always stops after one token (FixedLength(1)).
    Same seed, same random draws: the outputs must agree token for token, through the sampling code path."""
    prompts = prompts_with_repeats([4, 9], seed=6)
    ids, mask = left_pad(prompts)

    def run(policy):
        return specdec.generate(TARGET, ids, draft=EarlyExitDrafter(TARGET, 2), attention_mask=mask, temperature=1.0,
                                draft_length=policy, max_new_tokens=16, seed=3)

    assert run(ConfidenceLength(threshold=0.0, k_max=4)).tokens == run(FixedLength(4)).tokens
    never_sure = ConfidenceLength(threshold=1.0, k_max=4)
    assert run(never_sure).tokens == run(FixedLength(1)).tokens
    assert set(never_sure.history) == {1}


# --- distribution: speculative sampling with n-gram drafts is lossless --------------------------------------------

SMALL_VOCAB = 8
PROMPT = [1, 2, 3, 1, 2]  # prompt lookup proposes 3, 1, 2, ...
SAMPLES = 4000
ALPHA = 1e-3  # significance of the chi-square goodness-of-fit test


@dataclass(frozen=True)
class AlwaysAccept:
    """Wrong: keeps every draft and samples the bonus token."""

    name: str = "always_accept"
    lossless: bool = True

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        num_accepted = torch.full_like(draft_tokens[:, 0], draft_tokens.shape[1])
        return Verdict(num_accepted, sample(target_probs[:, -1], generator))


@dataclass(frozen=True)
class ResampleTarget:
    """Wrong in the classic way: the right acceptance test, but a rejection is replaced by a sample of p, not of
    the residual max(0, p - q)."""

    name: str = "resample_target"
    lossless: bool = True

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        p, q = probs_of(target_probs[:, :-1], draft_tokens), probs_of(draft_probs, draft_tokens)  # [B, k]
        uniform = torch.rand(p.shape, generator=generator, dtype=p.dtype)
        num_accepted = count_leading_true(uniform * q < p)
        return Verdict(num_accepted, sample(row_at(target_probs, num_accepted), generator))


@functools.lru_cache(maxsize=None)
def small_target(layers: int = 1):
    return tiny_gpt2(7, layers=layers, vocab=SMALL_VOCAB, width=16, positions=16, init=0.3)


def exact_joint(model, prompt: list[int], length: int) -> torch.Tensor:
    """[V^length] probability of each continuation (in lexicographic order), by enumeration."""
    continuations = torch.tensor(list(itertools.product(range(SMALL_VOCAB), repeat=length)))  # [V^n, n]
    ids = torch.cat([torch.tensor(prompt).expand(len(continuations), -1), continuations], 1)
    with torch.no_grad():
        probs = model(ids).logits[:, len(prompt) - 1 : -1].float().softmax(-1)  # same float32 softmax as the loop
    return probs_of(probs, continuations).double().prod(-1)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test; cells expected fewer than 5 times are pooled into one."""
    expected = probs * counts.sum()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum().unsqueeze(0)])
    expected = torch.cat([expected[~small], expected[small].sum().unsqueeze(0)])
    keep = expected > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


def emitted_joint_counts(model, drafter, policy, strategy, length: int = 3) -> tuple[torch.Tensor, specdec.DecodeStats]:
    """Counts of the ``length`` tokens each row emits (the first draft runs from the prompt)."""
    ids = torch.tensor([PROMPT]).expand(SAMPLES, -1).contiguous()
    decoder = Decoder(model, drafter, strategy, policy, SamplingConfig(temperature=1.0))
    out = decoder.generate(ids, max_new_tokens=length, seed=0)
    tokens = torch.tensor(out.tokens)  # [N, length]
    cell = (tokens * SMALL_VOCAB ** torch.arange(length - 1, -1, -1)).sum(-1)  # lexicographic index
    return torch.bincount(cell, minlength=SMALL_VOCAB**length).double(), out.stats


def test_speculative_sampling_with_ngram_drafts_emits_the_target_distribution():
    model = small_target(1)
    exact = exact_joint(model, PROMPT, 3)  # 512 cells
    counts, stats = emitted_joint_counts(model, NGramDrafter(), FixedLength(2), Speculative())
    # The drafts are neither always accepted nor always rejected, at both positions, or the test would be weak.
    assert all(0.05 < a < 0.95 for a in stats.per_position), stats.per_position
    assert chi_square_p_value(counts, exact) > ALPHA


@pytest.mark.parametrize("wrong_rule", [AlwaysAccept(), ResampleTarget()], ids=lambda rule: rule.name)
def test_a_wrong_acceptance_rule_fails_the_same_test(wrong_rule):
    model = small_target(1)
    exact = exact_joint(model, PROMPT, 3)
    counts, _ = emitted_joint_counts(model, NGramDrafter(), FixedLength(2), wrong_rule)
    assert chi_square_p_value(counts, exact) < ALPHA
