"""The parts' declared capabilities (specdec.interfaces) and the loop's per-row state: the loop relies on what a
part declares, with the interface's defaults, and retiring rows keeps every field of every row."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

import specdec
from specdec.step import Rows
from specdec.early_exit import EarlyExitDrafter
from specdec.interfaces import AcceptanceStrategy, Drafter, DraftLengthPolicy, as_strategy
from specdec.layout import Proposal
from tests.conftest import left_pad, tiny_gpt2


@pytest.fixture(scope="module")
def target():
    return tiny_gpt2(seed=0)


@pytest.fixture(scope="module")
def draft():
    return tiny_gpt2(seed=1, layers=1)


def test_selecting_rows_keeps_every_field_of_the_same_rows():
    batch = 5
    values = {field.name: torch.arange(batch) * 10 + i for i, field in enumerate(fields(Rows))}  # [B] each
    rows = Rows(**values)
    keep = torch.tensor([4, 1])
    kept = rows.select(keep)
    for field in fields(Rows):
        assert torch.equal(getattr(kept, field.name), values[field.name][keep]), field.name


class RepeatPending(Drafter):
    """Proposes the last emitted token k times; declares nothing beyond the interface's defaults, so it keeps its
    batch rows and the loop must never ask it to select some (the base ``select_rows`` raises)."""

    name = "repeat"

    def start(self, input_ids, attention_mask):
        self.last = input_ids[:, -1]  # [B]

    def propose(self, k, sampling, generator, stop=None):
        return Proposal(self.last.unsqueeze(1).expand(-1, k).clone(), None)

    def commit(self, outcome):
        self.last = outcome.new_tokens.gather(1, (outcome.num_new - 1).clamp_min(0).unsqueeze(1)).squeeze(1)


def test_a_drafter_that_keeps_its_rows_is_never_asked_to_select_them(target):
    """Rows finish at different steps (EOS, ragged prompts); the drafter's default ``selects_rows = False`` keeps
    them in the batch, and the tokens are still the target's greedy ones."""
    ids, mask = left_pad([[5, 6, 7], [8, 9, 10, 11, 12], [13]])
    baseline = specdec.generate(target, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=73)
    assert len({len(tokens) for tokens in baseline.tokens}) > 1  # a row finishes early: retiring would apply
    out = specdec.generate(target, ids, draft=RepeatPending(), attention_mask=mask, k=3, max_new_tokens=20,
                           eos_token_id=73)
    assert out.tokens == baseline.tokens
    assert specdec.Decoder(target, RepeatPending()).retires_rows is False
    with pytest.raises(NotImplementedError, match="RepeatPending keeps every batch row"):
        RepeatPending().select_rows(torch.tensor([0]))


class CountingStop(DraftLengthPolicy):
    """Asks for 4 tokens and counts how often the loop asks whether to stop (it never says yes)."""

    def __init__(self, stops_drafts: bool):
        self.stops_drafts = stops_drafts
        self.asked = 0

    @property
    def max_k(self):
        return 4

    def next_k(self):
        return 4

    def should_stop(self, draft_probs, active):
        self.asked += 1
        return False


@pytest.mark.parametrize("stops_drafts", [False, True])
def test_only_a_policy_that_declares_it_is_asked_to_stop_a_draft(target, draft, stops_drafts):
    policy = CountingStop(stops_drafts)
    ids = torch.tensor([[4, 5, 6]])
    out = specdec.generate(target, ids, draft=draft, draft_length=policy, max_new_tokens=16)
    assert out.tokens == specdec.generate(target, ids, max_new_tokens=16).tokens
    assert (policy.asked > 0) == stops_drafts
    assert policy.asked <= 3 * out.stats.target_calls  # after each drafted token but the last


def reject_all(draft_tokens, draft_probs, target_probs, generator):
    return specdec.Verdict(torch.zeros_like(draft_tokens[:, 0]), target_probs[:, 0].argmax(-1))


def test_a_plain_function_is_a_strategy_that_declares_nothing(target, draft):
    strategy = as_strategy(reject_all)
    assert isinstance(strategy, AcceptanceStrategy)
    assert not strategy.judges_ids and not strategy.lossless
    ids = torch.tensor([[4, 5, 6]])
    out = specdec.generate(target, ids, draft=draft, strategy=reject_all, k=3, max_new_tokens=8)
    assert out.stats.accepted == 0 and out.tokens == specdec.generate(target, ids, max_new_tokens=8).tokens
    with pytest.raises(TypeError, match="strategy must be an acceptance strategy"):
        as_strategy("not callable")


@pytest.mark.parametrize("part, interface", [
    (specdec.Greedy(), AcceptanceStrategy), (specdec.Speculative(), AcceptanceStrategy),
    (specdec.Typical(), AcceptanceStrategy), (specdec.TopK(), AcceptanceStrategy),
    (specdec.SyntheticAcceptance(), AcceptanceStrategy),
    (specdec.NoDrafter(), Drafter), (specdec.NGramDrafter(), Drafter),
    (specdec.FixedLength(), DraftLengthPolicy), (specdec.HeuristicLength(), DraftLengthPolicy),
    (specdec.ConfidenceLength(), DraftLengthPolicy), (specdec.CostOptimalLength(), DraftLengthPolicy),
])
def test_every_shipped_part_declares_its_interface(part, interface):
    assert isinstance(part, interface)


def test_a_drafter_declares_the_models_it_runs(target, draft):
    assert specdec.ModelDrafter(draft).models() == [draft]
    assert EarlyExitDrafter(target, 1).models()[0].config.n_layer == 1
    assert specdec.NGramDrafter().models() == [] and specdec.NoDrafter().models() == []


def test_a_part_of_the_wrong_kind_is_named(target):
    with pytest.raises(TypeError, match="draft_length must be a draft-length policy"):
        specdec.Decoder(target, None, None, draft_length=4)
    with pytest.raises(TypeError, match="drafter must be a specdec.Drafter"):
        specdec.Decoder(target, drafter="ngram")
