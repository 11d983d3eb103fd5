"""One ``generate`` call's state and its step, written once for both drivers.

Each step the drafter proposes up to k tokens (a chain, or a token tree: the proposal's layout says which); the
target scores its queue (the last emitted token; at the first step the whole prompt, which makes that forward the
prefill) and the proposed tokens in one forward; the verifier turns the logits into a verdict through the strategy;
the target's context and the drafter each keep the accepted path. ``DecodeRun.step`` runs the phases, one method or
call each:

1. propose: the drafter's proposal (``Drafter.propose``)
2. verify: one target forward over the queue and the proposal (``CachedContext.feed``), with the hidden states the
   drafter reads (``Drafter.target_states``)
3. judge: the verifier chosen once per ``Decoder`` (``specdec.verify``)
4. emit: write each row's new tokens, cut at EOS and its budget; the rows advance in place
5. log: what the step decided, per row, on the device (``specdec.stats.StepLog``): the drafts it kept up to its
   EOS (a draft past an EOS, which a drafter that drafts all k at once proposes, is never counted as accepted)
6. sync: the driver's: the host driver reads the step once (``HostSync``); the device driver prepares its flags
7. roll back: the target's context keeps the emitted path (``CachedContext.commit``, its one rollback)
8. notify: the drafter rolls back its own cache (``Drafter.commit``) and the policy learns (``observe``), both from
   the step's ``StepOutcome``

Two drivers run it. The host driver (``specdec.decode.HostRun``) adds what only the host does: the one read per step,
k from an adaptive policy, an early stop of a draft, and retiring rows that finished. The device driver
(``specdec.device_loop.DeviceRun``) adds only capture, replay, adoption of a kept capture and the lagged flag read.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields

import torch

from specdec.checks import check_proposal
from specdec.context import CachedContext
from specdec.emit import GenerationOutput, count_new, finish_call
from specdec.interfaces import StopHook
from specdec.layout import Proposal, VerifyLayout
from specdec.stats import DecodeStats, StepLog
from specdec.timing import Clock
from specdec.types import HostSync, ModelOutput, StateRequest, StepOutcome, TargetStates, Verdict
from specdec.verify import Judgement


@dataclass
class Rows:
    """Per-row state of the rows still in the batch, [B'] each (B' = B until rows retire), updated in place by each
    step (a captured step replays over these very tensors). ``select`` keeps some rows of every field at once, so
    retiring rows cannot forget one."""

    original: torch.Tensor  # [B'] the call's row each batch row is (results are indexed by it)
    emitted: torch.Tensor  # [B'] tokens emitted so far
    remaining: torch.Tensor  # [B'] tokens the row may still emit (max_new_tokens and its context bound it; 0 once
    # it finished)
    active: torch.Tensor  # [B'] bool, remaining > 0: still generating (finished rows that stay in the batch feed holes)
    room: torch.Tensor  # [B'] positions left in the row's context at the start

    def select(self, index: torch.Tensor) -> Rows:
        """The rows ``index`` [B''] of every field."""
        return Rows(**{field.name: getattr(self, field.name)[index] for field in fields(self)})


def warn_draft_context(decoder, least_room: int, max_new_tokens: int) -> None:
    """A drafter whose context is shorter than the target's stops rows the target alone would have continued: say
    so, since the output is then shorter than the baseline's."""
    target = "unbounded" if decoder.target_context_limit is None else f"{decoder.target_context_limit} positions"
    warnings.warn(f"the drafter's context ({decoder.context_limit} positions) is shorter than the target's ({target}): "
                  f"a row stops there, after as few as {least_room} of max_new_tokens={max_new_tokens} new tokens",
                  stacklevel=6)


class DecodeRun:
    """The state of one ``generate`` call and its step's phases (see the module docstring). Owns the target's
    context and the per-row state; the drafter owns its own. A driver subclasses it, writes ``sync`` and runs the
    steps."""

    def __init__(self, decoder, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int, k_max: int,
                 max_steps: int):
        self.decoder, self.input_ids, self.attention_mask = decoder, input_ids, attention_mask
        self.max_new_tokens, self.eos_ids, self.k_max = max_new_tokens, eos_ids, k_max
        device = input_ids.device
        batch_size = input_ids.shape[0]
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.clock = Clock(device)
        self.phase_clock = self.clock.phase(False)  # the host driver times phases where asked
        room = (decoder.context_limit if decoder.context_limit is not None else 2**62) - attention_mask.sum(-1)  # [B]
        self.least_room = int(room.min())
        if self.least_room < max_new_tokens and decoder.context_limit != decoder.target_context_limit:
            warn_draft_context(decoder, self.least_room, max_new_tokens)
        self.rows = Rows(
            original=torch.arange(batch_size, device=device),
            emitted=torch.zeros(batch_size, dtype=torch.long, device=device),
            remaining=room.clamp(max=max_new_tokens),
            active=torch.ones(batch_size, dtype=torch.bool, device=device),
            room=room,
        )
        self.all_active = False  # known on the host: every batch row generates (the target then feeds no hole)
        # Results by original row.
        self.output = torch.zeros(batch_size, max_new_tokens + k_max + 1, dtype=torch.long, device=device)
        self.final_emitted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.slot_offsets = torch.arange(k_max + 1, device=device)  # [k_max+1]
        self.log = StepLog(batch_size, k_max, max_steps=max_steps, device=device)
        self.steps = 0  # steps run (or replayed)
        self.draft_seconds = self.target_seconds = 0.0
        self.draft_step_seconds = self.target_step_seconds = 0.0
        self.first_step_draft_forwards = 0

    def begin(self, capacity: int, fixed_shapes: bool) -> None:
        """Start the policy and the drafter on the prompt, and queue the prompt in the target's new context.
        ``fixed_shapes``: every later step has the same shapes (a captured step replays them)."""
        decoder, batch_size = self.decoder, self.input_ids.shape[0]
        decoder.draft_length.start()
        decoder.drafter.start(self.input_ids, self.attention_mask)
        if fixed_shapes:
            decoder.drafter.fix_shapes(capacity)
        cache = decoder.runner.new_cache(batch_size, capacity, self.input_ids.device)
        padded = batch_size > 1 or not bool(self.attention_mask.all())  # one host read per call
        self.target = CachedContext(cache, self.input_ids, self.attention_mask if padded else None)
        if fixed_shapes:
            self.target.fix_shapes(capacity)

    def step(self, k: int, first: bool = False) -> StepOutcome:
        """One step's phases (see the module docstring); the ``first`` step's target forward is the prefill, whose
        time counts apart from the verifications'."""
        decoder = self.decoder
        t0 = self.phase_clock()
        proposal = self.propose(k)  # 1
        t1 = self.phase_clock()
        layout = proposal.layout
        queue, queue_valid = self.target.queue, self.target.queue_valid  # [B', m] what the target sees first
        verified = self.verify(proposal)  # 2
        t2 = self.phase_clock()
        judgement = decoder.verifier(proposal, verified.logits, self.generator)  # 3
        verdict, active = judgement.verdict, self.rows.active.clone()  # [B'] rows generating during the step
        kept_or_idle = torch.where(active, verdict.num_accepted, -1)  # [B'] -1: the row fed holes
        self.last_layout, self.last_overlap_is_acceptance = layout, judgement.overlap_is_acceptance
        new_tokens, num_new, kept_to_eos = self.emit(proposal, judgement)  # 4
        kept_to_eos = torch.where(active, kept_to_eos, -1)  # [B'] -1: the row fed holes
        self.log.add(self.rows.original, kept_to_eos, proposal, judgement)  # 5
        host = self.sync(proposal, judgement, num_new, kept_or_idle)  # 6
        outcome = StepOutcome(
            k=layout.depth,
            layout=layout,
            num_accepted=verdict.num_accepted,
            next_token=verdict.next_token,
            path=verdict.path,
            new_tokens=new_tokens,
            num_new=num_new,
            active=active,
            active_after=self.rows.active,
            host=host,
            draft_seconds=t1 - t0,
            target_seconds=math.nan if first else t2 - t1,  # a prefill's time says nothing of a verification
            target_states=self.target_states(verified.hidden, queue, queue_valid, verdict, new_tokens, num_new),
        )
        self.target.commit(outcome)  # 7
        t3 = self.phase_clock()
        decoder.drafter.commit(outcome)  # 8: the drafter rolls back its own cache (timed as drafting)
        t4 = self.phase_clock()
        decoder.draft_length.observe(outcome)
        self.record_times(draft=(t1 - t0) + (t4 - t3), target=t2 - t1, first=first)
        return outcome

    def propose(self, k: int) -> Proposal:
        """Ask the drafter for up to k tokens (a custom drafter's proposal is checked)."""
        drafter = self.decoder.drafter
        proposal = drafter.propose(k, self.decoder.sampling, self.generator, stop=self.draft_stop(k))
        if not drafter.trusted_proposals:
            check_proposal(proposal, drafter, k, len(self.rows.original), self.input_ids.device,
                           self.decoder.target.config.vocab_size)
        return proposal

    def draft_stop(self, k: int) -> StopHook | None:
        """When to stop this step's draft early; never, unless the driver reads the host (``HostRun``)."""
        return None

    def verify(self, proposal: Proposal) -> ModelOutput:
        """One target forward over its queue and the proposal: the logits at the root and every node, and the
        hidden states the drafter reads."""
        layout = proposal.layout
        active = None if self.all_active else self.rows.active
        return self.target.feed(proposal.tokens, layout, active, num_logits=layout.num_nodes + 1,
                                hidden_layers=self.decoder.state_layers)

    def emit(self, proposal: Proposal, judgement: Judgement) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write each row's new tokens into the output and advance the rows in place: [B', d+1] new tokens (the
        accepted path's tokens, then the next token), [B'] how many of them each row emits (cut at EOS and the
        budget) and [B'] the drafts each row kept up to its EOS (a draft past an EOS is not kept; one past the
        budget, which the device step's fixed k can draft, was accepted and counts)."""
        rows, verdict, new_tokens = self.rows, judgement.verdict, judgement.new_tokens
        depth = proposal.layout.depth
        if new_tokens is None:
            path_tokens = proposal.layout.path_tokens(proposal.tokens, verdict.path)  # [B', d]
            new_tokens = torch.cat([path_tokens, verdict.next_token.unsqueeze(1)], 1)  # [B', d+1]
            new_tokens.scatter_(1, verdict.num_accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))
        slot = self.slot_offsets[: depth + 1]  # [d+1]
        num_new, no_eos = count_new(new_tokens, verdict.num_accepted, rows.remaining, self.eos_ids, slot)
        slots = (rows.emitted.unsqueeze(1) + slot).clamp(max=self.output.shape[1] - 1)  # [B', d+1]
        self.output.index_put_((rows.original.unsqueeze(1), slots), new_tokens)  # past num_new: rewritten or unread
        rows.emitted += num_new
        rows.remaining -= num_new
        kept = verdict.num_accepted  # [B']
        if no_eos is not None:
            rows.remaining *= no_eos
            kept = torch.where(no_eos, kept, torch.minimum(kept, num_new))  # cut where an EOS was emitted
        rows.active.copy_(rows.remaining > 0)
        return new_tokens, num_new, kept

    def sync(self, proposal: Proposal, judgement: Judgement, num_new: torch.Tensor,
             kept_or_idle: torch.Tensor) -> HostSync | None:
        """The driver's phase 6: what the host reads of the step (None where it reads nothing now)."""
        raise NotImplementedError

    def target_states(self, hidden: torch.Tensor | None, queue: torch.Tensor, queue_valid: torch.Tensor | None,
                      verdict: Verdict, new_tokens: torch.Tensor, num_new: torch.Tensor) -> TargetStates | None:
        """The hidden states the drafter asked for, at the positions it asked for; None where it asked for none."""
        request: StateRequest | None = self.decoder.drafter.target_states
        if request is None:
            return None
        if request.positions == "last":
            return last_states(hidden, queue.shape[1], verdict, num_new)
        return emitted_states(hidden, queue, queue_valid, verdict.path, new_tokens, num_new)

    def record_times(self, draft: float, target: float, first: bool) -> None:
        """Add a step's times to the call's; to the decode steps' (the cost ratio's) unless it is the first step,
        whose forwards are the prefills."""
        self.steps += 1
        self.draft_seconds += draft
        self.target_seconds += target
        if first:
            self.first_step_draft_forwards = self.decoder.drafter.num_forwards
            return
        self.draft_step_seconds += draft
        self.target_step_seconds += target

    def note_step(self, layout: VerifyLayout, overlap_is_acceptance: bool) -> None:
        """Record a step on the host (its shape, for the step log's counts), once per step run or replayed."""
        self.log.note(layout, overlap_is_acceptance)

    def finish(self, wall: float, ttft: float, first_step_emitted: torch.Tensor, timed: bool) -> GenerationOutput:
        """The call's tokens and stats. ``timed``: the phases were timed apart (else their seconds are NaN)."""
        self.final_emitted.index_copy_(0, self.rows.original, self.rows.emitted)
        if not timed:
            self.draft_seconds = self.target_seconds = math.nan
            self.draft_step_seconds = self.target_step_seconds = math.nan
        return finish_call(self.output, self.final_emitted, self.log, DecodeStats(
            rows=[],
            draft_forwards=self.decoder.drafter.num_forwards - self.first_step_draft_forwards,
            target_forwards=self.steps - 1,
            draft_seconds=self.draft_seconds,
            target_seconds=self.target_seconds,
            wall_seconds=wall,
            ttft_seconds=ttft,
            first_step_emitted=int(first_step_emitted),
            draft_step_seconds=self.draft_step_seconds,
            target_step_seconds=self.target_step_seconds,
        ))


def emitted_states(hidden: torch.Tensor, queue: torch.Tensor, queue_valid: torch.Tensor | None, path: torch.Tensor,
                   new_tokens: torch.Tensor, num_new: torch.Tensor) -> TargetStates:
    """The target's hidden states at every position it fed this step whose token and next token were emitted: its
    real queued tokens, then the root and the accepted path's nodes while the row emitted their successors; each
    with that next token, right-aligned (valid entries end each row). hidden [B, m+N, H, D] at the fed columns
    (queue [B, m], then N nodes), path [B, d], new_tokens [B, d+1], num_new [B]."""
    batch, width = queue.shape
    depth = path.shape[1]
    queue_columns = torch.arange(width, device=queue.device).expand(batch, -1)  # [B, m]
    columns = torch.cat([queue_columns, width - 1 + path], 1)  # [B, m+d] the root is the queue's last column
    next_tokens = torch.cat([queue[:, 1:], new_tokens], 1)  # [B, m+d]
    queued = torch.ones_like(queue[:, 1:], dtype=torch.bool) if queue_valid is None else queue_valid[:, :-1].bool()
    followed = torch.arange(depth + 1, device=queue.device) < num_new.unsqueeze(1)  # [B, d+1] next token emitted
    valid = torch.cat([queued, followed], 1)  # [B, m+d]
    unused = (depth + 1 - num_new).unsqueeze(1)  # [B, 1] positions after the last emitted token
    entry = torch.arange(width + depth, device=queue.device)  # [m+d]
    source = (entry - unused).clamp_min(0)  # [B, m+d] shift each row right by its unused positions
    hidden_index = columns.gather(1, source)[:, :, None, None].expand(-1, -1, *hidden.shape[2:])
    return TargetStates(hidden=hidden.gather(1, hidden_index),  # [B, m+d, H, D]
                        next_tokens=next_tokens.gather(1, source),
                        valid=valid.gather(1, source) & (entry >= unused))


def last_states(hidden: torch.Tensor, width: int, verdict: Verdict, num_new: torch.Tensor) -> TargetStates:
    """The target's hidden states at the position whose distribution gave the next token (the root's, or the last
    accepted node's), with that token. hidden [B, m+N, H, D] at the fed columns, ``width`` = m."""
    path = torch.cat([verdict.path.new_zeros(verdict.path.shape[0], 1), verdict.path], 1)  # [B, d+1] root, path
    column = width - 1 + path.gather(1, verdict.num_accepted.unsqueeze(1))  # [B, 1]
    index = column[:, :, None, None].expand(-1, -1, *hidden.shape[2:])
    return TargetStates(hidden=hidden.gather(1, index),  # [B, 1, H, D]
                        next_tokens=verdict.next_token.unsqueeze(1), valid=(num_new > 0).unsqueeze(1))
