"""The decoder: one cached decode loop shared by speculative decoding and the autoregressive baseline, and its host
driver.

A ``Decoder`` holds the parts (target, drafter, strategy, draft-length policy, sampling settings) and what is decided
once from them: the verifier, the target's ``CachedModel``, whether rows retire, the largest k, the hidden states the
drafter reads, and which driver runs the steps. A drafter that ``proposes_nothing`` makes every step a plain decode
step, so baseline and speculative runs share every cost but speculation.

Each ``generate`` call is a run of the step written once in ``specdec.step`` (propose, verify, judge, log, emit,
sync, roll back, notify), driven by one of two drivers:

- ``HostRun`` (here): reads each step once (``HostSync``: budgets, room, accepted counts, the step's flags), asks the
  policy for the next k, stops a draft early once every row drafted an EOS or the policy says so, and retires rows
  that finished (phase 9: rows leave the batch, from every owner at once);
- ``specdec.device_loop.DeviceRun``: each step as one device program, captured as a CUDA graph on CUDA and
  replayed, reading one flag per step.

Owners: a run (one ``generate`` call) owns the target's context (its KV cache and queue) and the per-row state; each
drafter owns its own; the ``Decoder``'s ``CachedModel`` keeps the target's forward and the buffers reused across
calls, freed by ``Decoder.release``. Words the code coins are in docs/glossary.md.
"""

from __future__ import annotations

import threading

import torch

from specdec.cache import CachedModel, context_limit, static_capacity
from specdec.checks import (
    check_allocation, check_bool, check_device, check_eos_ids, check_eval_mode, check_max_k, check_max_new_tokens,
    check_model, check_next_k, check_parts, check_prompt, check_seed, check_strategy_object,
)
from specdec.drafters import NoDrafter
from specdec.emit import GenerationOutput, check_flags, unpack
from specdec.interfaces import AcceptanceStrategy, Drafter, DraftLengthPolicy, StopHook, as_strategy
from specdec.layout import Proposal
from specdec.policies import FixedLength
from specdec.sampling import SamplingConfig
from specdec.step import DecodeRun
from specdec.strategies import Speculative
from specdec.types import HostSync
from specdec.verify import Judgement, choose_verifier

STEPS = ("auto", "host", "device")


class Decoder:
    """Speculative (or, with a drafter that proposes nothing, autoregressive) decoding of a target causal LM.

    Defaults: ``drafter=None`` is the autoregressive baseline (``NoDrafter``), ``strategy=None`` speculative sampling,
    ``draft_length=None`` ``FixedLength(4)``, ``sampling=None`` greedy. Reuse one across calls: compiled forwards,
    static caches and captured steps are kept in it (``release``).
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None = None,
        strategy: AcceptanceStrategy | None = None,
        draft_length: DraftLengthPolicy | None = None,
        sampling: SamplingConfig | None = None,
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
        drafter = drafter if drafter is not None else NoDrafter()
        strategy = strategy if strategy is not None else Speculative()
        draft_length = draft_length if draft_length is not None else FixedLength()
        sampling = sampling if sampling is not None else SamplingConfig()
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
        limits = [context_limit(model) for model in models]
        self.context_limit = min((limit for limit in limits if limit is not None), default=None)
        self.target_context_limit = limits[0]
        # The most draft positions a step can have: the policy's, bounded by the context (a longer draft could never
        # be verified), so a huge k sizes nothing.
        self.policy_max_k = check_max_k(draft_length)
        self.k_max = 0 if not self.speculates else min(self.policy_max_k, self.context_limit or self.policy_max_k)
        # The target's hidden states the drafter reads, as indices into its layers: () where it reads none.
        request = drafter.target_states
        self.state_layers = () if request is None else request.resolved(self.runner.num_layers)
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
        attention_mask = check_prompt(input_ids, attention_mask, self.context_limit, vocab_size)
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
        return HostRun(self, input_ids, attention_mask, max_new_tokens, eos_ids, seed).run()

    def release(self) -> None:
        """Free the buffers and compiled forwards kept between calls, the target's and the drafter's."""
        self.runner.release()
        self.drafter.release()
        if self.device_program is not None:
            self.device_program.release()


class HostRun(DecodeRun):
    """The host driver of one ``generate`` call: the step's phases (``specdec.step``) with one host read per step,
    k from the policy, an early stop of drafts, and rows that finished leaving the batch."""

    def __init__(self, decoder: Decoder, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int):
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
        self.retire_finished(outcome.host.num_active)
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
