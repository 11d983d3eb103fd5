"""The one cached decode loop, shared by speculative decoding and the autoregressive baseline.

Each step the drafter proposes up to k tokens (a chain, or a token tree: the proposal's layout says which); the
target scores its queue (the last emitted token; at the first step the whole prompt, which makes that forward the
prefill) and the proposed tokens in one forward; the verifier turns the logits into a verdict through the strategy;
the target's context and the drafter each keep the accepted path. A drafter that ``proposes_nothing`` makes every
step a plain decode step, so baseline and speculative runs share every cost but speculation.

``DecodeRun.step`` runs one step in nine phases, one method or call each:

1. propose: the drafter's proposal (``Drafter.propose``), stopped early where every row drafted an EOS
2. verify: one target forward over the queue and the proposal (``CachedContext.feed``)
3. judge: the verifier chosen once per ``Decoder`` (``specdec.verify``)
4. log: what the step decided, per row (``specdec.stats.StepLog``)
5. emit: write each row's new tokens, cut at EOS and its budget
6. sync: one device-to-host copy of the scalars the host needs (``HostSync``)
7. roll back: the target's context keeps the emitted path (``CachedContext.commit``, its one rollback)
8. notify: the drafter rolls back its own cache (``Drafter.commit``) and the policy learns (``observe``)
9. retire: rows that finished leave the batch

Owners: a ``DecodeRun`` (one ``generate`` call) owns the target's context (its KV cache and queue); each drafter
owns its own; the ``Decoder``'s ``CachedModel`` keeps the target's forward and the buffers reused across calls,
freed by ``Decoder.release``. With ``step="device"`` the same phases run as one device program per k that the
host replays, reading one flag per step (``specdec.device_loop``). Words the code coins are in docs/glossary.md.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass, fields

import torch

from specdec.cache import CachedModel, context_limit, static_capacity
from specdec.checks import (
    check_allocation, check_bool, check_device, check_eos_ids, check_eval_mode, check_max_k, check_max_new_tokens,
    check_model, check_next_k, check_parts, check_prompt, check_proposal, check_seed, check_strategy_object,
    trusts_proposals,
)
from specdec.context import CachedContext
from specdec.emit import GenerationOutput, check_flags, count_new, finish_call, unpack
from specdec.interfaces import AcceptanceStrategy, Drafter, DraftLengthPolicy, StopHook, as_strategy
from specdec.layout import Proposal
from specdec.sampling import SamplingConfig
from specdec.stats import DecodeStats, StepLog
from specdec.timing import Clock
from specdec.types import HostSync, StepOutcome
from specdec.verify import Judgement, choose_verifier

STEPS = ("auto", "host", "device")


class Decoder:
    """Speculative (or, with a drafter that proposes nothing, autoregressive) decoding of a target causal LM.

    Every part is given explicitly here; ``specdec.Decoder`` (``specdec.api``) fills in the defaults.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter,
        strategy: AcceptanceStrategy,
        draft_length: DraftLengthPolicy,
        sampling: SamplingConfig,
        time_phases: bool = True,
        cache_layout: str = "dynamic",
        retire_finished_rows: bool = True,
        compile: bool = False,
        forward: str = "auto",
        step: str = "auto",
    ):
        """``time_phases=False`` skips the device syncs that split each step's time into draft / target / other
        (they cost a little on GPU); those timings and the cost ratio are then NaN. ``cache_layout`` is the
        target's transformers cache's: "dynamic" (grows) or "static" (preallocated, fixed addresses).
        ``retire_finished_rows``: rows that finish leave the batch, so later forwards skip them (where both the
        target's cache and the drafter can drop rows). Greedy outputs do not change; sampled ones do, since the
        random stream follows the batch's shape (each is still exact). ``compile=True`` runs the target's decode
        and verify forwards compiled (``specdec.cache.CachedModel``); the drafter compiles its own when built with
        ``compile=True``. ``forward``: "auto" (the lean forward where ``specdec.lean`` supports the model, else
        transformers'), "lean" or "transformers". ``step``: "host" runs the loop here, reading a few scalars per
        step; "device" runs each step as one device program (captured as a CUDA graph on CUDA) reading one flag;
        "auto" takes "device" where ``compile=True`` and the parts allow it (``specdec.device_loop``), else
        "host". Eager transformers is the reference, with identical greedy tokens on every path."""
        check_model("target", target)
        check_parts(drafter, draft_length, sampling)
        check_strategy_object(strategy)
        drafter.check_target(target)
        for name, value in (("time_phases", time_phases), ("retire_finished_rows", retire_finished_rows),
                            ("compile", compile)):
            check_bool(name, value)
        if step not in STEPS:
            raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
        self.target = target
        self.drafter, self.draft_length, self.sampling = drafter, draft_length, sampling
        self.strategy = as_strategy(strategy)
        self.time_phases = time_phases
        self.compile = compile
        self.runner = CachedModel(target, "target", forward, cache_layout, compile)
        self.cache_layout = self.runner.cache_layout
        self.speculates = not drafter.proposes_nothing
        self.retires_rows = retire_finished_rows and self.runner.selects_rows and drafter.selects_rows
        check_tree_support(drafter, self.strategy, sampling, self.runner)
        if self.speculates and self.strategy.requires_greedy and not sampling.is_greedy:
            raise ValueError(
                f"strategy {self.strategy.name!r} decodes the target's argmax and needs temperature 0, got "
                f"temperature={sampling.temperature}; use 'speculative' (lossless) or 'typical'/'topk' (lossy) to "
                f"sample"
            )
        models = [target, *drafter.models()]
        for model in models:
            check_eval_mode(model)
        limits = [context_limit(model) for model in (models if drafter.bounds_context else models[:1])]
        self.context_limit = min((limit for limit in limits if limit is not None), default=None)
        self.target_context_limit = limits[0]
        # The most draft positions a step can have: the policy's, bounded by the context (a longer draft could never
        # be verified), so a huge k sizes nothing.
        self.policy_max_k = check_max_k(draft_length)
        self.k_max = 0 if not self.speculates else min(self.policy_max_k, self.context_limit or self.policy_max_k)
        self.checks_proposals = not trusts_proposals(drafter)
        self.verifier = choose_verifier(drafter.proposes_nothing, self.strategy, sampling)
        self.device_program = self.choose_step(step)
        self.busy = threading.Lock()

    @property
    def steps_on_device(self) -> bool:
        """Whether each step runs as one device program: its phases are not timed apart (their seconds are NaN)."""
        return self.device_program is not None

    def choose_step(self, step: str):
        """The device program where the step runs on the device, else None (see ``specdec.device_loop``)."""
        from specdec.device_loop import DeviceProgram, device_step_blocker

        blocker = device_step_blocker(self)
        if step == "device" and blocker:
            raise ValueError(f"step='device' cannot run this decoder: {blocker}")
        if step == "device" or (step == "auto" and self.compile and blocker is None):
            return DeviceProgram(self)
        return None

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 32,
        eos_token_id: int | list[int] | None = None,
        seed: int = 0,
    ) -> GenerationOutput:
        if not self.busy.acquire(blocking=False):
            raise RuntimeError("this Decoder is generating in another thread; its drafter and caches hold one call's "
                               "state, so use one Decoder per thread")
        try:
            with torch.inference_mode():  # no autograd bookkeeping on any forward, whatever the caller's mode
                return self._generate(input_ids, attention_mask, max_new_tokens, eos_token_id, seed)
        finally:
            self.busy.release()

    def _generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, seed) -> GenerationOutput:
        vocab_size = self.target.config.vocab_size
        check_device("input_ids", input_ids, self.target)  # before any read of it: a meta tensor has no values
        attention_mask = check_prompt(input_ids, attention_mask, self.context_limit, vocab_size,
                                      self.context_limit != self.target_context_limit)
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        seed = check_seed(seed)
        batch_size = input_ids.shape[0]
        check_allocation("max_new_tokens", batch_size * (max_new_tokens + self.k_max + 1), torch.long,
                         input_ids.device)
        eos_ids = check_eos_ids(eos_token_id, input_ids.device, vocab_size)
        # Padding is masked, but still goes through the embedding: an id outside the vocabulary there becomes 0.
        outside = (input_ids < 0) | (input_ids >= vocab_size)  # [B, T], only padding after check_prompt
        input_ids = input_ids.masked_fill(outside, 0)
        if self.device_program is not None:
            return self.device_program.run(input_ids, attention_mask, max_new_tokens, eos_ids, seed)
        return DecodeRun(self, input_ids, attention_mask, max_new_tokens, eos_ids, seed).run()

    def release(self) -> None:
        """Free the buffers and compiled forwards kept between calls, the target's and the drafter's."""
        self.runner.release()
        self.drafter.release()
        if self.device_program is not None:
            self.device_program.release()


@dataclass
class Rows:
    """Per-row state of the rows still in the batch, [B'] each (B' = B until rows retire). ``select`` keeps some
    rows of every field at once, so retiring rows cannot forget one."""

    original: torch.Tensor  # [B'] the call's row each batch row is (results are indexed by it)
    emitted: torch.Tensor  # [B'] tokens emitted so far
    remaining: torch.Tensor  # [B'] tokens the row may still emit (max_new_tokens and its context bound it; 0 once
    # it finished)
    active: torch.Tensor  # [B'] bool, remaining > 0: still generating (finished rows that stay in the batch feed holes)
    room: torch.Tensor  # [B'] positions left in the row's context at the start

    def select(self, index: torch.Tensor) -> Rows:
        """The rows ``index`` [B''] of every field."""
        return Rows(**{field.name: getattr(self, field.name)[index] for field in fields(self)})


def warn_draft_context(decoder: Decoder, least_room: int, max_new_tokens: int) -> None:
    """A drafter whose context is shorter than the target's stops rows the target alone would have continued: say
    so, since the output is then shorter than the baseline's."""
    target = "unbounded" if decoder.target_context_limit is None else f"{decoder.target_context_limit} positions"
    warnings.warn(f"the drafter's context ({decoder.context_limit} positions) is shorter than the target's ({target}): "
                  f"a row stops there, after as few as {least_room} of max_new_tokens={max_new_tokens} new tokens",
                  stacklevel=5)


class DecodeRun:
    """The state of one ``generate`` call. Owns the target's context; the drafter owns its own."""

    def __init__(self, decoder: Decoder, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int):
        self.decoder, self.input_ids, self.attention_mask = decoder, input_ids, attention_mask
        self.max_new_tokens, self.eos_ids = max_new_tokens, eos_ids
        self.eos_id_set = set(eos_ids.tolist()) if eos_ids is not None else set()
        device = input_ids.device
        batch_size = input_ids.shape[0]
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.clock = Clock(device)
        self.phase_clock = self.clock.phase(decoder.time_phases)
        self.k_max = decoder.k_max
        self.limit = decoder.context_limit if decoder.context_limit is not None else 2**62
        room = self.limit - attention_mask.sum(-1)  # [B]
        least_room = int(room.min())
        if least_room < max_new_tokens and decoder.context_limit != decoder.target_context_limit:
            warn_draft_context(decoder, least_room, max_new_tokens)
        # Rows with room for every token they may emit and k_max more never bind k: no room check per step then.
        self.room_binds = least_room < max_new_tokens + self.k_max
        self.rows = Rows(
            original=torch.arange(batch_size, device=device),
            emitted=torch.zeros(batch_size, dtype=torch.long, device=device),
            remaining=room.clamp(max=max_new_tokens),
            active=torch.ones(batch_size, dtype=torch.bool, device=device),
            room=room,
        )
        self.all_active = True  # host: every batch row generates (the last sync said so)
        # Results by original row.
        self.output = torch.zeros(batch_size, max_new_tokens + self.k_max + 1, dtype=torch.long, device=device)
        self.final_emitted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.slot_offsets = torch.arange(self.k_max + 1, device=device)  # [k_max+1]
        # Each step emits at least one token to every generating row, the prefill's step included.
        self.log = StepLog(batch_size, self.k_max, max_steps=max_new_tokens, device=device)
        self.draft_seconds = self.target_seconds = 0.0
        self.draft_step_seconds = self.target_step_seconds = 0.0
        self.target_forwards = 0
        self.first_step_draft_forwards = 0

    def run(self) -> GenerationOutput:
        decoder = self.decoder
        start = self.clock.now()
        decoder.draft_length.start()
        decoder.drafter.start(self.input_ids, self.attention_mask)
        self.draft_seconds = self.phase_clock() - (start if self.decoder.time_phases else 0.0)
        batch_size, width = self.input_ids.shape
        cache = decoder.runner.new_cache(batch_size, static_capacity(width, self.max_new_tokens + self.k_max + 1),
                                         self.input_ids.device)
        padded = batch_size > 1 or not bool(self.attention_mask.all())  # one host read per call
        self.target = CachedContext(cache, self.input_ids, self.attention_mask if padded else None)
        # The first step drafts from the prompt and the target's prefill verifies its drafts, as in transformers'
        # assisted generation.
        sync = self.step(self.next_k(*self.first_bounds()), first=True)
        ttft = self.clock.now() - start
        self.first_step_emitted = self.rows.emitted.sum()  # [] read at the end
        while sync.remaining_max > 0:
            sync = self.step(self.next_k(sync.remaining_max, sync.room_min))
        return self.finish(self.clock.now() - start, ttft)

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

    def step(self, k: int, first: bool = False) -> HostSync:
        """One step in nine phases (see the module docstring); the ``first`` step's target forward is the prefill,
        whose time counts apart from the verifications'."""
        t0 = self.phase_clock()
        proposal = self.propose(k)  # 1
        t1 = self.phase_clock()
        layout = proposal.layout
        active = None if self.all_active else self.rows.active
        target_logits = self.target.feed(proposal.tokens, layout, active, num_logits=layout.num_nodes + 1)  # 2
        t2 = self.phase_clock()
        judgement = self.decoder.verifier(proposal, target_logits, self.generator)  # 3
        verdict, active_during_step = judgement.verdict, self.rows.active
        kept_or_idle = torch.where(active_during_step, verdict.num_accepted, -1)  # [B'] -1: the row fed holes
        self.log.add(self.rows.original, kept_or_idle, proposal, judgement)  # 4
        self.log.note(layout, judgement.overlap_is_acceptance)
        new_tokens, num_new = self.emit(proposal, judgement)  # 5
        sync = self.sync_host(proposal, judgement, num_new, kept_or_idle)  # 6
        self.target.commit(layout, verdict.path, num_new, verdict.next_token, proposal.tokens, self.rows.active,
                           sync)  # 7
        self.all_active = sync.num_active == len(self.rows.original)
        t3 = self.phase_clock()
        outcome = StepOutcome(
            k=layout.depth,
            layout=layout,
            num_accepted=verdict.num_accepted,
            next_token=verdict.next_token,
            path=verdict.path,
            new_tokens=new_tokens,
            num_new=num_new,
            active=active_during_step,
            active_after=self.rows.active,
            host=sync,
            draft_seconds=t1 - t0,
            target_seconds=math.nan if first else t2 - t1,  # a prefill's time says nothing of a verification
        )
        self.decoder.drafter.commit(outcome)  # 8: the drafter rolls back its own cache (timed as drafting)
        t4 = self.phase_clock()
        self.decoder.draft_length.observe(outcome)
        self.retire_finished(sync.num_active)  # 9
        self.record_times(draft=(t1 - t0) + (t4 - t3), target=t2 - t1, first=first)
        return sync

    def propose(self, k: int) -> Proposal:
        """Ask the drafter for up to k tokens, letting the EOS rule and a policy that ``stops_drafts`` stop the
        draft early."""
        stop = self.draft_stop() if k else None
        drafter = self.decoder.drafter
        proposal = drafter.propose(k, self.decoder.sampling, self.generator, stop=stop)
        if self.decoder.checks_proposals:
            check_proposal(proposal, drafter, k, len(self.rows.original), self.input_ids.device,
                           self.decoder.target.config.vocab_size)
        return proposal

    def draft_stop(self) -> StopHook | None:
        """When to stop this step's draft early: once every generating row has drafted an EOS (no draft after it
        could be emitted, as in transformers' assisted generation), or when a policy that ``stops_drafts`` says so.
        Either costs a host read per drafted token: a single row (which generates, or the call would have ended)
        reads its token and looks it up on the host."""
        policy, active = self.decoder.draft_length, self.rows.active  # [B'] the policy ignores rows not generating
        if self.eos_ids is None and not policy.stops_drafts:
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

    def emit(self, proposal: Proposal, judgement: Judgement) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's new tokens into the output and advance the rows: [B', d+1] new tokens (the accepted
        path's tokens, then the next token) and [B'] how many of them each row emits (cut at EOS and the budget)."""
        rows, verdict, new_tokens = self.rows, judgement.verdict, judgement.new_tokens
        depth = proposal.layout.depth
        if new_tokens is None:
            path_tokens = proposal.layout.path_tokens(proposal.tokens, verdict.path)  # [B', d]
            new_tokens = torch.cat([path_tokens, verdict.next_token.unsqueeze(1)], 1)  # [B', d+1]
            new_tokens.scatter_(1, verdict.num_accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))
        num_new, no_eos = count_new(new_tokens, verdict.num_accepted, rows.remaining, self.eos_ids,
                                    self.slot_offsets[: depth + 1])
        slots = rows.emitted.unsqueeze(1) + self.slot_offsets[: depth + 1]  # [B', d+1]
        self.output.index_put_((rows.original.unsqueeze(1), slots), new_tokens)  # slots past num_new: rewritten or unread
        rows.emitted = rows.emitted + num_new
        rows.remaining = rows.remaining - num_new if no_eos is None else (rows.remaining - num_new) * no_eos
        rows.active = rows.remaining > 0
        return new_tokens, num_new

    def sync_host(self, proposal: Proposal, judgement: Judgement, num_new: torch.Tensor,
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
        )

    def retire_finished(self, num_active: int) -> None:
        """Drop the rows that finished from the batch: from the rows here, the target's context and the drafter,
        each by its owner. Results stay in place, indexed by original row. (``nonzero`` syncs, but only after the
        step's sync, in the few steps where rows finish.)"""
        if not (self.decoder.retires_rows and 0 < num_active < len(self.rows.original)):
            return
        keep = self.rows.active.nonzero().squeeze(1)  # [B'']
        self.final_emitted.index_copy_(0, self.rows.original, self.rows.emitted)
        self.rows = self.rows.select(keep)
        self.target.select_rows(keep)
        self.decoder.drafter.select_rows(keep)
        self.all_active = True

    def record_times(self, draft: float, target: float, first: bool) -> None:
        """Add a step's times to the call's; to the decode steps' (the cost ratio's) unless it is the first step,
        whose forwards are the prefills."""
        self.draft_seconds += draft
        self.target_seconds += target
        if first:
            self.first_step_draft_forwards = self.decoder.drafter.num_forwards
            return
        self.draft_step_seconds += draft
        self.target_step_seconds += target
        self.target_forwards += 1

    def finish(self, wall: float, ttft: float) -> GenerationOutput:
        self.final_emitted.index_copy_(0, self.rows.original, self.rows.emitted)
        if not self.decoder.time_phases:
            self.draft_seconds = self.target_seconds = math.nan
            self.draft_step_seconds = self.target_step_seconds = math.nan
        return finish_call(self.output, self.final_emitted, self.log, DecodeStats(
            rows=[],
            draft_forwards=self.decoder.drafter.num_forwards - self.first_step_draft_forwards,
            target_forwards=self.target_forwards,
            draft_seconds=self.draft_seconds,
            target_seconds=self.target_seconds,
            wall_seconds=wall,
            ttft_seconds=ttft,
            first_step_emitted=int(self.first_step_emitted),
            draft_step_seconds=self.draft_step_seconds,
            target_step_seconds=self.target_step_seconds,
        ))


def check_tree_support(drafter: Drafter, strategy: AcceptanceStrategy, sampling: SamplingConfig,
                       runner: CachedModel) -> None:
    """A tree drafter needs a strategy with a tree rule (on ids at temperature 0) and an eager target forward."""
    if not drafter.drafts_trees:
        return
    if not strategy.judges_trees:
        raise ValueError(f"strategy {strategy.name!r} has no rule for token trees; tree rules: greedy, speculative, "
                         f"typical, topk, synthetic")
    if sampling.is_greedy and not strategy.judges_ids:
        raise ValueError(f"strategy {strategy.name!r} cannot judge a tree drafted at temperature 0 (its children are "
                         f"the draft's top tokens, not one point mass)")
    if runner.compile or (runner.static and not runner.is_lean):
        raise ValueError(f"token trees run on the dynamic cache layout or a lean cache, eager (compile=False); got "
                         f"compile={runner.compile}, cache_layout={runner.cache_layout!r}")
