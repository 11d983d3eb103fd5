"""The host driver of the one cached decode loop (``HostRun``), shared by speculative decoding and the
autoregressive baseline.

Each ``generate`` call of a ``specdec.Decoder`` (``specdec.api``) is a run of the step written once in
``specdec.step`` (propose, verify, judge, log, emit, sync, roll back, notify), driven by one of two drivers:

- ``HostRun`` (here): reads each step once (``HostSync``: budgets, room, accepted counts, the step's flags), asks the
  policy for the next k, stops a draft early once every row drafted an EOS or the policy says so, and retires rows
  that finished (phase 9: rows leave the batch, from every owner at once);
- ``specdec.device_loop.DeviceRun``: each step as one device program, captured as a CUDA graph on CUDA and
  replayed, reading one flag per step.

Owners: a run (one ``generate`` call) owns the target's context (its KV cache and queue) and the per-row state; each
drafter owns its own; the ``Decoder``'s ``CachedModel`` keeps the target's forward and the buffers reused across
calls, freed by ``Decoder.release``. This module and ``specdec.step`` and ``specdec.device_loop`` depend on the
interfaces only (``tests/test_architecture.py``). Words the code coins are in docs/glossary.md.
"""

from __future__ import annotations

import torch

from specdec.cache import CachedModel, static_capacity
from specdec.checks import check_next_k
from specdec.emit import GenerationOutput, check_flags, unpack
from specdec.interfaces import AcceptanceStrategy, Drafter, StopHook
from specdec.layout import Proposal
from specdec.sampling import SamplingConfig
from specdec.step import DecodeRun
from specdec.types import HostSync
from specdec.verify import Judgement

# Rows that finished leave the batch once the forwards they would still feed as holes cost at least this many
# row-steps for each row that stays (an upper bound on the rows the caches move). On a 2-core CPU, embedded pair:
# moving a row's caches took about 0.4 ms and a row-step 0.3-0.5 ms at batch 16-64; at batch 64, T = 1, k = 1, rows
# retired at every finish spent 4% of the call moving caches, near its end, for a step or two each saved.
ROW_STEPS_PER_ROW_KEPT = 2


class HostRun(DecodeRun):
    """The host driver of one ``generate`` call: the step's phases (``specdec.step``) with one host read per step,
    k from the policy, an early stop of drafts, and rows that finished leaving the batch."""

    def __init__(self, decoder, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int):
        # Each step emits at least one token to every generating row, the prefill's step included.
        super().__init__(decoder, input_ids, attention_mask, max_new_tokens, eos_ids, seed, decoder.k_max,
                         max_steps=max_new_tokens)
        self.eos_id_set = set(eos_ids.tolist()) if eos_ids is not None else set()
        self.phase_clock = self.clock.phase(decoder.time_phases)
        # Rows with room for every token they may emit and k_max more never bind k: no room check per step then.
        self.room_binds = self.least_room < max_new_tokens + self.k_max
        self.all_active = True  # every batch row generates (the last sync said so)

    def run(self) -> GenerationOutput:
        start = self.clock.now()
        width = self.input_ids.shape[1]
        self.begin(static_capacity(width, self.max_new_tokens + self.k_max + 1), fixed_shapes=False)
        self.draft_seconds = self.phase_clock() - (start if self.decoder.time_phases else 0.0)
        # The first step drafts from the prompt and the target's prefill verifies its drafts, as in transformers'
        # assisted generation.
        sync = self.advance(self.next_k(*self.first_bounds()), first=True)
        ttft = self.clock.now() - start
        first_step_emitted = self.rows.emitted.sum()  # [] read at the end
        while sync.remaining_max > 0:
            sync = self.advance(self.next_k(sync.remaining_max, sync.room_min))
        return self.finish(self.clock.now() - start, ttft, first_step_emitted, timed=self.decoder.time_phases)

    def advance(self, k: int, first: bool = False) -> HostSync:
        """One step, then its host-side record and the retiring of rows that finished (phase 9)."""
        outcome = self.step(k, first)
        self.note_step(self.last_layout, self.last_overlap_is_acceptance)
        self.all_active = outcome.host.num_active == len(self.rows.original)
        self.retire_finished(outcome.host.num_active, outcome.host.remaining_max)
        return outcome.host

    def first_bounds(self) -> tuple[int, int]:
        """The next k's limits before the first step (``HostSync``'s): one host read."""
        rows = self.rows
        if not self.room_binds:
            return int(rows.remaining.max()), self.k_max
        remaining_max, room_min = torch.stack([rows.remaining.max(), rows.room.min()]).tolist()
        return remaining_max, room_min

    def next_k(self, remaining_max: int, room_min: int) -> int:
        """The policy's k, bounded by the largest budget left (drafts past it could not be emitted) and the
        smallest context room."""
        if not self.decoder.speculates:
            return 0
        policy = self.decoder.draft_length
        k = check_next_k(policy, policy.next_k(), self.decoder.policy_max_k)
        return max(min(k, remaining_max - 1, room_min), 0)

    def draft_stop(self, k: int) -> StopHook | None:
        """When to stop this step's draft early: once every generating row has drafted an EOS (no draft after it
        could be emitted, as in transformers' assisted generation), or when a policy that ``stops_drafts`` says so.
        Either costs a host read per drafted token: a single row (which generates, or the call would have ended)
        reads its token and looks it up on the host."""
        policy, active = self.decoder.draft_length, self.rows.active  # [B'] the policy ignores rows not generating
        if not k or (self.eos_ids is None and not policy.stops_drafts):
            return None
        done = ~active  # [B'] rows whose draft has reached an EOS, or that do not generate
        one_row = active.shape[0] == 1

        def drafted_eos_everywhere(token: torch.Tensor) -> bool:
            nonlocal done
            if one_row:
                return token.item() in self.eos_id_set
            done = done | torch.isin(token, self.eos_ids)  # [B']
            return bool(done.all())

        def stop(token: torch.Tensor, logits: torch.Tensor) -> bool:
            if self.eos_ids is not None and drafted_eos_everywhere(token):
                return True
            return policy.stops_drafts and policy.should_stop(logits.float().softmax(-1), active)
        return stop

    def sync(self, proposal: Proposal, judgement: Judgement, num_new: torch.Tensor,
             kept_or_idle: torch.Tensor) -> HostSync:
        """Copy the step's flags and per-row values to the host in one copy, reduce them there, and refuse to go on
        from unusable logits or an out-of-range verdict. ``kept_or_idle`` [B'] is num_accepted, -1 for rows that
        fed holes (their verdicts mean nothing). Reducing on the host launches no kernel per scalar; Python
        reduces a few hundred rows in microseconds."""
        rows, depth = self.rows, proposal.layout.depth
        flags = {"target_usable": judgement.target_usable, "drafts_finite": proposal.finite,
                 "verdict_in_range": judgement.verdict_in_range}
        flags = {name: flag.view(1) for name, flag in flags.items() if flag is not None}  # [1] bool each
        per_row = {"remaining": rows.remaining}  # [B'] each; a row is active exactly while it has budget left
        if self.room_binds:
            per_row["room"] = rows.room - rows.emitted
        if depth:
            per_row.update(kept_or_idle=kept_or_idle, num_new=num_new)
        read = unpack(torch.cat([*flags.values(), *per_row.values()]).tolist(), {**flags, **per_row})
        check_flags({name: read[name][0] for name in flags}, self.decoder.strategy.name)
        active = [left > 0 for left in read["remaining"]]
        room = [left for left, on in zip(read.get("room", []), active) if on]
        accepted = read.get("kept_or_idle", [0])
        new = read.get("num_new", [1])
        return HostSync(
            remaining_max=max(read["remaining"]),
            room_min=min(room, default=self.k_max),
            num_active=sum(active),
            max_accepted=max(accepted),
            min_accepted=min(kept if kept >= 0 else depth for kept in accepted),
            max_new=max(new),
            min_new=min(new),
            remaining=tuple(read["remaining"]),
            kept=tuple(read.get("kept_or_idle", ())),
        )

    def retire_finished(self, num_active: int, steps_left: int) -> None:
        """Drop the rows that finished from the batch: from the rows here, the target's context, the drafter and
        the policy, each by its owner, once that pays: once the finished rows, fed as holes for up to ``steps_left``
        more steps, would cost ``ROW_STEPS_PER_ROW_KEPT`` row-steps for each row that stays. Results stay in place,
        indexed by original row. (``nonzero`` syncs, but only after the step's sync, in the few steps where rows
        leave.)"""
        rows = len(self.rows.original)
        if not (self.decoder.retires_rows and 0 < num_active < rows):
            return
        if (rows - num_active) * steps_left < ROW_STEPS_PER_ROW_KEPT * num_active:
            return
        keep = self.rows.active.nonzero().squeeze(1)  # [B'']
        self.final_emitted.index_copy_(0, self.rows.original, self.rows.emitted)
        self.rows = self.rows.select(keep)
        self.target.select_rows(keep)
        self.decoder.drafter.select_rows(keep)
        self.decoder.draft_length.select_rows(keep)
        self.all_active = True


def check_tree_support(drafter: Drafter, strategy: AcceptanceStrategy, sampling: SamplingConfig,
                       runner: CachedModel) -> None:
    """A tree drafter needs a strategy with a tree rule (on ids at temperature 0) and an eager target forward."""
    if not drafter.drafts_trees:
        return
    if not strategy.judges_trees:
        raise ValueError(f"strategy {strategy.name!r} has no rule for token trees; tree rules: greedy, speculative, "
                         f"traversal, typical, topk, synthetic")
    if sampling.is_greedy and not strategy.judges_ids:
        raise ValueError(f"strategy {strategy.name!r} cannot judge a tree drafted at temperature 0 (its children are "
                         f"the draft's top tokens, not one point mass)")
    if runner.compile or (runner.static and not runner.is_lean):
        raise ValueError(f"token trees run on the dynamic cache layout or a lean cache, eager (compile=False); got "
                         f"compile={runner.compile}, cache_layout={runner.cache_layout!r}")
