"""The seam for what the target computes: a drafter that declares ``target_states`` gets the target's hidden states
in ``commit``, at the positions it asked for, equal (fp32, 1e-5) to what transformers' forward returns for the same
emitted tokens; at batch 1 and on ragged batches with EOS, after rejections, through the lean forward and
transformers' forward, on the host driver and the device driver. A drafter that asks for nothing gets nothing."""

from __future__ import annotations

import pytest
import torch

import specdec
from conftest import left_pad, random_prompts, tiny_gpt2
from specdec.early_exit import shallow_view
from specdec.types import StateRequest


class RecordingDrafter(specdec.ModelDrafter):
    """A model drafter that reads the target's hidden states and keeps every step's, with the call's row each batch
    row is (rows that finish leave the batch)."""

    def __init__(self, model, request: StateRequest | None, forward: str):
        super().__init__(model, forward=forward)
        self.target_states = request
        self.steps = []

    def start(self, input_ids, attention_mask):
        super().start(input_ids, attention_mask)
        self.original = list(range(input_ids.shape[0]))

    def select_rows(self, index):
        super().select_rows(index)
        self.original = [self.original[i] for i in index.tolist()]

    def commit(self, outcome):
        self.steps.append((self.original, outcome.target_states, outcome.num_new, outcome.num_accepted))
        super().commit(outcome)

    def of_row(self, row: int) -> list:
        """Each step's states of the call's row ``row``, as (hidden [W, H, D], next tokens [W], valid [W], tokens
        emitted, drafts accepted)."""
        return [(states.hidden[i], states.next_tokens[i], states.valid[i], int(num_new[i]), int(accepted[i]))
                for original, states, num_new, accepted in self.steps if row in original
                for i in [original.index(row)]]


def reference_states(target, sequence: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """[T, H, D] transformers' hidden states of ``sequence`` at every position, for ``layers``."""
    hidden = target(torch.tensor([sequence]), output_hidden_states=True).hidden_states
    return torch.stack([hidden[i][0] for i in layers], 1)


def decode(step: str, forward: str, request: StateRequest | None, prompts: list[list[int]], eos: int | None):
    target = tiny_gpt2(0, layers=3, init=0.1).float()
    drafter = RecordingDrafter(shallow_view(target, 1), request, forward)  # the first layer: about half accepted
    decoder = specdec.Decoder(target, drafter, specdec.Greedy(), specdec.FixedLength(3), forward=forward, step=step)
    ids, mask = left_pad(prompts)
    out = decoder.generate(ids, mask, max_new_tokens=20, eos_token_id=eos)
    return target, drafter, out


CASES = [("host", "lean"), ("host", "transformers"), ("device", "lean")]
BATCHES = {"batch-1": ([9], None), "ragged-eos": ([3, 11, 6, 1], 5)}


@pytest.mark.parametrize("step,forward", CASES)
@pytest.mark.parametrize("batch", BATCHES)
def test_emitted_positions_carry_the_targets_hidden_states_and_next_tokens(step, forward, batch):
    """Each row's valid entries, step after step, are every position of its sequence in order (the prompt's, then
    each emitted token's but the last), each with the token after it and transformers' hidden states there."""
    lengths, eos = BATCHES[batch]
    prompts = random_prompts(lengths, seed=8)
    layers = (-1, 1)
    target, drafter, out = decode(step, forward, StateRequest(layers=layers), prompts, eos)
    assert 0 < out.stats.accepted < out.stats.drafted  # some drafts kept, some rejected
    resolved = StateRequest(layers=layers).resolved(3)
    for row, (prompt, tokens) in enumerate(zip(prompts, out.tokens)):
        sequence = prompt + tokens
        entries = drafter.of_row(row)
        hidden = torch.cat([h[valid] for h, _, valid, _, _ in entries])  # [P, H, D]
        next_tokens = torch.cat([n[valid] for _, n, valid, _, _ in entries]).tolist()
        assert next_tokens == sequence[1:]  # every position followed by an emitted token, once, in order
        torch.testing.assert_close(hidden, reference_states(target, sequence, resolved)[:-1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("step,forward", CASES)
def test_the_last_position_carries_the_state_that_gave_the_next_token(step, forward):
    """positions="last": one entry per step and row, the hidden state whose distribution gave the step's next
    token (the bonus or the correction), with that token."""
    prompts = random_prompts([4, 10, 7], seed=3)
    target, drafter, out = decode(step, forward, StateRequest(positions="last"), prompts, eos=None)
    for row, (prompt, tokens) in enumerate(zip(prompts, out.tokens)):
        sequence = prompt + tokens
        reference = reference_states(target, sequence, (3,))
        length, checked = len(prompt), 0  # the sequence's length so far
        for hidden, next_tokens, valid, num_new, accepted in drafter.of_row(row):
            length += num_new
            if num_new == accepted + 1:  # the next token was emitted (not cut by the budget): it ends the sequence
                assert bool(valid[0]) and int(next_tokens[0]) == sequence[length - 1]
                torch.testing.assert_close(hidden[0], reference[length - 2], rtol=0, atol=1e-5)
                checked += 1
        assert length == len(sequence) and checked >= len(tokens) // 4


def test_a_drafter_that_asks_for_nothing_gets_nothing_and_the_target_computes_nothing_extra(monkeypatch):
    """No request: ``outcome.target_states`` is None and the target's forward is asked for no hidden layer."""
    asked = []
    original = specdec.lean.LeanForward.__call__

    def watched(self, *args, **kwargs):
        asked.append(kwargs.get("hidden_layers", args[7] if len(args) > 7 else ()))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(specdec.lean.LeanForward, "__call__", watched)
    _, drafter, _ = decode("host", "lean", None, random_prompts([5, 8], seed=1), eos=None)
    assert drafter.steps and all(states is None for _, states, _, _ in drafter.steps)
    assert asked and all(not layers for layers in asked)


def test_a_request_outside_the_targets_layers_is_refused_when_the_decoder_is_built():
    target, draft = tiny_gpt2(0, layers=3), tiny_gpt2(1, layers=1)
    drafter = RecordingDrafter(draft, StateRequest(layers=(4,)), "lean")
    with pytest.raises(ValueError, match=r"layers \[4\] must be distinct hidden-state indices in \[-4, 3\]"):
        specdec.Decoder(target, drafter)
    with pytest.raises(ValueError, match="positions must be one of emitted, last"):
        StateRequest(positions="all")
