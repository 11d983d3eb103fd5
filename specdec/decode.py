"""The one cached decode loop, shared by speculative decoding and the autoregressive baseline.

Each step: the drafter proposes k tokens; the target scores the last emitted token and the k drafts in one
forward pass; the acceptance strategy keeps n of them and picks the next token; the target cache (owned here)
and the draft cache (owned by the drafter) roll back to the kept prefix. The first step's target forward is the
prefill: the whole prompt, then the drafts. With ``NoDrafter`` k is always 0 and the step is a plain decode step,
so baseline and speculative runs share every cost but speculation.

``DecodeRun.step`` runs one step in nine phases, one method each: propose, verify, judge, log, emit, sync the
host, roll back the target cache, notify the drafter and the policy, retire finished rows. The host sync is one
copy of a handful of scalars (``HostSync``) that decide termination, rollback lengths and the next k; the only
other host reads are the drafted tokens, where EOS ids may stop a draft.
Per-row state lives in one ``Rows`` object; rows that finish leave the batch (``retire_finished``), and the
forwards then run over the rows still generating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from specdec.cache import CACHE_LAYOUTS, KVCache, context_limit, static_capacity
from specdec.checks import (
    check_eos_ids, check_eval_mode, check_max_new_tokens, check_parts, check_prompt, check_seed,
)
from specdec.drafters import NoDrafter
from specdec.interfaces import (
    AcceptanceStrategy, Drafter, DraftLengthPolicy, StopHook, as_strategy, greedy_verdict,
)
from specdec.policies import FixedLength
from specdec.sampling import (
    SamplingConfig, finite_peaks, greedy_choice, logits_to_probs, one_hot_probs, sample, usable,
)
from specdec.stats import DecodeStats, RowStats
from specdec.strategies import Greedy, Speculative, probs_of
from specdec.timing import Clock
from specdec.tree import kept_positions, path_tokens
from specdec.types import Proposal, StepOutcome, TreeVerdict, Verdict


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN or inf logits: any token chosen from them would be meaningless."""


@dataclass(frozen=True)
class GenerationOutput:
    tokens: list[list[int]]  # new tokens of each row, up to and including EOS
    stats: DecodeStats


@dataclass(frozen=True)
class Judgement:
    """A step's verdict and what the loop needs around it."""

    verdict: Verdict
    target_usable: torch.Tensor  # [] bool: no NaN/inf in the target logits (checked at the step's sync)
    overlap: torch.Tensor | None = None  # [B, k] sum_x min(q, p) per draft position (q = onehot(draft) where the
    # drafter gives no distributions); None where not measured
    overlap_is_acceptance: bool = False  # greedy matching on point masses: the overlap is 1 exactly where kept
    new_tokens: torch.Tensor | None = None  # [B, k+1] the tokens to emit, where the judge has them at hand (greedy
    # matching: the target's choices); else built from the verdict


class StepLog:
    """What each step decided for each of the call's original rows, written with a few ops per step and turned into
    per-row counts once, at the end (``row_stats``). ``add`` takes the step's rows as ``rows`` [B'] indices."""

    def __init__(self, batch_size: int, k_max: int, max_steps: int, device: torch.device):
        # [S, B] drafts each row kept in each step; -1 where the row was not generating (a later step's -1: unused)
        self.accepted = torch.full((max_steps, batch_size), -1, dtype=torch.long, device=device)
        # [S, B, k_max] sum_x min(q, p) at each draft position (read where the position was verified)
        self.overlap = torch.zeros(max_steps, batch_size, k_max, device=device)
        self.depths: list[int] = []  # per step: draft positions k (a tree's levels)
        self.drafted: list[int] = []  # per step: tokens each generating row drafted (a tree's nodes)
        self.overlap_logged: list[bool] = []  # per step: the overlap was measured (chains with drafts)
        self.overlap_is_acceptance: list[bool] = []  # per step: ... and is 1 exactly where a draft was kept

    def add(self, rows: torch.Tensor, k: int, kept_or_idle: torch.Tensor, drafted: int, judgement: Judgement) -> None:
        """Log one step: ``kept_or_idle`` [B'] drafts kept per row, -1 for rows not generating; ``drafted`` tokens
        over ``k`` positions (a chain drafts k; a tree of depth k more); the judgement's overlap."""
        step = len(self.depths)
        self.accepted[step].index_copy_(0, rows, kept_or_idle)
        if judgement.overlap is not None:
            self.overlap[step, :, :k].index_copy_(0, rows, judgement.overlap.float())
        self.depths.append(k)
        self.drafted.append(drafted)
        self.overlap_logged.append(judgement.overlap is not None or judgement.overlap_is_acceptance)
        self.overlap_is_acceptance.append(judgement.overlap_is_acceptance)

    def row_stats(self, emitted: torch.Tensor) -> tuple[list[RowStats], float, int]:
        """Each row's counts, and the sum and count of the overlap over the verified draft positions."""
        steps, device = len(self.depths), self.accepted.device
        accepted = self.accepted[:steps]  # [S, B]
        generating = accepted >= 0  # [S, B]
        depths = torch.tensor(self.depths, device=device)  # [S]
        position = torch.arange(self.overlap.shape[2], device=device)  # [k_max]
        drafted_position = generating.unsqueeze(2) & (position < depths[:, None, None])  # [S, B, k_max]
        attempted = drafted_position & (accepted.unsqueeze(2) >= position)  # [S, B, k_max] reached position i
        kept = drafted_position & (accepted.unsqueeze(2) > position)  # [S, B, k_max] accepted at position i
        drafted = (torch.tensor(self.drafted, device=device).unsqueeze(1) * generating).sum(0)  # [B]
        columns = zip(
            emitted.tolist(),
            drafted.tolist(),
            accepted.clamp_min(0).sum(0).tolist(),
            generating.sum(0).tolist(),
            attempted.sum(0).tolist(),
            kept.sum(0).tolist(),
        )
        measured = attempted & torch.tensor(self.overlap_logged, device=device)[:, None, None]  # [S, B, k_max]
        from_acceptance = torch.tensor(self.overlap_is_acceptance, device=device)[:, None, None]  # [S, 1, 1]
        overlap = torch.where(from_acceptance, kept.double(), self.overlap[:steps].double())  # [S, B, k_max]
        overlap_sum = (overlap * measured).sum().item()
        return [RowStats(*column) for column in columns], overlap_sum, int(measured.sum())


class Decoder:
    """Speculative (or, with no drafter, autoregressive) decoding of a target causal LM."""

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
    ):
        """``time_phases=False`` skips the device syncs that split each step's time into draft / target / other
        (they cost a little on GPU); those timings and the cost ratio are then NaN. ``cache_layout`` is the
        target cache's: "dynamic" (grows) or "static" (preallocated, fixed addresses for CUDA graphs).
        ``retire_finished_rows``: rows that finish leave the batch, so later forwards skip them (dynamic layout
        and a drafter that ``selects_rows``). Greedy outputs do not change; sampled ones do, since the random
        stream follows the batch's shape (each is still exact). ``compile=True`` runs the target's decode and
        verify forwards compiled (CUDA graphs on CUDA) over a static cache (pooled across calls); the drafter
        compiles its own when built with ``compile=True``. The first call of each shape compiles; eager
        (``compile=False``) is the reference, with identical greedy tokens."""
        if compile:
            cache_layout = "static"
        if cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"unknown cache layout {cache_layout!r}; known layouts: {', '.join(CACHE_LAYOUTS)}")
        self.target = target
        self.time_phases = time_phases
        self.cache_layout = cache_layout
        self.compile = compile
        self.drafter = drafter if drafter is not None else NoDrafter()
        self.strategy = as_strategy(strategy) if strategy is not None else Speculative()
        self.draft_length = draft_length if draft_length is not None else FixedLength()
        self.sampling = sampling if sampling is not None else SamplingConfig()
        check_parts(self.drafter, self.draft_length, self.sampling)
        self.speculates = not isinstance(self.drafter, NoDrafter)
        self.retires_rows = retire_finished_rows and cache_layout == "dynamic" and self.drafter.selects_rows
        check_tree_support(self.drafter, self.strategy, self.sampling, cache_layout)
        if self.speculates and isinstance(self.strategy, Greedy) and not self.sampling.is_greedy:
            raise ValueError(
                f"strategy 'greedy' decodes the target's argmax and needs temperature 0, got temperature="
                f"{self.sampling.temperature}; use 'speculative' (lossless) or 'typical'/'topk' (lossy) to sample"
            )
        models = [target, *self.drafter.models()]
        for model in models:
            check_eval_mode(model)
        # At temperature 0 a strategy that judges ids is called on them, never on one-hot distributions.
        self.judges_ids = self.sampling.is_greedy and self.strategy.judges_ids
        limits = [context_limit(model) for model in models]
        self.context_limit = min((limit for limit in limits if limit is not None), default=None)

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 32,
        eos_token_id: int | list[int] | None = None,
        seed: int = 0,
    ) -> GenerationOutput:
        with torch.inference_mode():  # no autograd bookkeeping on any forward, whatever the caller's mode
            return self._generate(input_ids, attention_mask, max_new_tokens, eos_token_id, seed)

    def _generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, seed) -> GenerationOutput:
        vocab_size = self.target.config.vocab_size
        attention_mask = check_prompt(input_ids, attention_mask, self.context_limit, vocab_size)
        check_max_new_tokens(max_new_tokens)
        check_seed(seed)
        eos_ids = check_eos_ids(eos_token_id, input_ids.device, vocab_size)
        # Padding is masked, but still goes through the embedding: an id outside the vocabulary there becomes 0.
        outside = (input_ids < 0) | (input_ids >= vocab_size)  # [B, T], only padding after check_prompt
        input_ids = input_ids.masked_fill(outside, 0)
        return DecodeRun(self, input_ids, attention_mask, max_new_tokens, eos_ids, seed).run()


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
    pending: torch.Tensor  # [B'] last emitted token, not yet in the target cache
    no_drafts: torch.Tensor  # [B', 0] the proposal of a step with k = 0
    none_accepted: torch.Tensor  # [B'] zeros: the verdict's num_accepted when nothing was drafted

    def select(self, index: torch.Tensor) -> Rows:
        """The rows ``index`` [B''] of every field."""
        return Rows(**{field.name: getattr(self, field.name)[index] for field in fields(self)})


@dataclass(frozen=True)
class HostSync:
    """The scalars the host needs after a step, reduced on the host from the step's one device-to-host copy."""

    remaining_max: int  # largest budget left over active rows; 0 ends the call
    room_min: int  # smallest context room left over active rows (bounds the next k; k_max when it cannot bind)
    num_active: int  # rows still generating
    max_accepted: int  # over the rows generating during the step (0 when nothing was drafted)
    min_accepted: int
    max_new: int  # tokens emitted this step, over all rows (bounds the rollback)
    min_new: int


class DecodeRun:
    """The state of one ``generate`` call. Owns the target cache; the drafter owns its own."""

    def __init__(self, decoder: Decoder, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int):
        self.decoder, self.input_ids, self.attention_mask = decoder, input_ids, attention_mask
        self.max_new_tokens, self.eos_ids = max_new_tokens, eos_ids
        self.eos_id_set = set(eos_ids.tolist()) if eos_ids is not None else set()
        device = input_ids.device
        batch_size = input_ids.shape[0]
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.clock = Clock(device)
        self.phase_clock = self.clock.phase(decoder.time_phases)
        self.k_max = decoder.draft_length.max_k if decoder.speculates else 0
        self.limit = decoder.context_limit if decoder.context_limit is not None else 2**62
        room = self.limit - attention_mask.sum(-1)  # [B]
        # Rows with room for every token they may emit and k_max more never bind k: no room check per step then.
        self.room_binds = int(room.min()) < max_new_tokens + self.k_max
        zeros = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B], read only
        self.rows = Rows(
            original=torch.arange(batch_size, device=device),
            emitted=torch.zeros_like(zeros),
            remaining=room.clamp(max=max_new_tokens),
            active=torch.ones(batch_size, dtype=torch.bool, device=device),
            room=room,
            pending=input_ids[:, -1],  # the first step feeds it with the rest of the prompt
            no_drafts=zeros.unsqueeze(1)[:, :0],
            none_accepted=zeros,
        )
        # Results by original row.
        self.output = torch.zeros(batch_size, max_new_tokens + self.k_max + 1, dtype=torch.long, device=device)
        self.final_emitted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.slot_offsets = torch.arange(self.k_max + 1, device=device)  # [k_max+1]
        # Each step emits at least one token to every generating row, the prefill's step included.
        self.log = StepLog(batch_size, self.k_max, max_steps=max_new_tokens, device=device)
        self.draft_seconds = self.target_seconds = 0.0
        self.draft_step_seconds = self.target_step_seconds = 0.0
        self.target_forwards = 0

    def run(self) -> GenerationOutput:
        decoder = self.decoder
        start = self.clock.now()
        decoder.draft_length.start()
        decoder.drafter.start(self.input_ids, self.attention_mask)
        after_draft_prefill = self.phase_clock()
        capacity = static_capacity(self.input_ids.shape[1], self.max_new_tokens + self.k_max + 1)
        batch_size, device = self.input_ids.shape[0], self.input_ids.device
        self.target_cache = KVCache(
            decoder.target, batch_size, device, "target", decoder.cache_layout, capacity, decoder.compile
        )
        self.draft_seconds = after_draft_prefill - (start if self.decoder.time_phases else 0.0)
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
        return max(min(self.decoder.draft_length.next_k(), remaining_max - 1, room_min), 0)

    def step(self, k: int, first: bool = False) -> HostSync:
        """One step in nine phases; each but the bookkeeping of times is one method. The ``first`` step's target
        forward is the prefill: it feeds the whole prompt before the drafts (``verify``)."""
        t0 = self.phase_clock()
        proposal = self.propose(k)  # 1. the drafter proposes up to k tokens (a tree: up to k levels)
        k = depth_of(proposal)  # fewer than asked when the policy stopped the draft early
        t1 = self.phase_clock()
        target_logits = self.verify(proposal, first)  # 2. one target forward over the pending token and the drafts
        t2 = self.phase_clock()
        judgement = self.judge(proposal, target_logits)  # 3. the strategy decides
        verdict, active_during_step = judgement.verdict, self.rows.active
        kept_or_idle = torch.where(active_during_step, verdict.num_accepted, -1)  # [B'] -1: the row fed holes
        self.log.add(self.rows.original, k, kept_or_idle, proposal.tokens.shape[1], judgement)  # 4. log
        new_tokens, num_new = self.emit(proposal, judgement)  # 5. write the output, advance rows
        sync = self.sync_host(k, proposal, num_new, kept_or_idle, judgement.target_usable)  # 6. the one sync
        self.roll_back(proposal, verdict, num_new, sync)  # 7. the target cache keeps what was emitted
        t3 = self.phase_clock()
        outcome = StepOutcome(
            k=k,
            num_accepted=verdict.num_accepted,
            next_token=verdict.next_token,
            new_tokens=new_tokens,
            num_new=num_new,
            active=active_during_step,
            active_after=self.rows.active,
            max_accepted=sync.max_accepted,
            min_accepted=sync.min_accepted,
            draft_seconds=t1 - t0,
            target_seconds=math.nan if first else t2 - t1,  # a prefill's time says nothing of a verification
            path=verdict.path if isinstance(verdict, TreeVerdict) else None,
        )
        self.decoder.drafter.commit(outcome)  # 8. notify: the drafter rolls back its own cache (timed as drafting)
        t4 = self.phase_clock()
        self.decoder.draft_length.observe(outcome)  # ... and the policy learns
        self.retire_finished(sync.num_active)  # 9. finished rows leave the batch
        self.record_times(draft=(t1 - t0) + (t4 - t3), target=t2 - t1, prefill=first)
        return sync

    def propose(self, k: int) -> Proposal:
        """Ask the drafter for up to k tokens, letting a policy that ``stops_drafts`` stop the draft early."""
        if k == 0:
            return Proposal(self.rows.no_drafts, None)
        return self.decoder.drafter.propose(k, self.decoder.sampling, self.generator, stop=self.draft_stop())

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

    def verify(self, proposal: Proposal, first: bool) -> torch.Tensor:
        """[B', k+1, V] target logits for the pending token and the k drafts (a tree: [B', N+1, V] for the pending
        token and the N nodes, under the tree's ancestor mask); finished rows feed holes.

        The ``first`` step feeds the whole prompt, whose last token is pending: a chain's drafts go in the same
        forward, the head on the last k+1 columns; a tree's ancestor mask covers cached slots only, so the prompt
        but its last token is cached first (a forward of the body alone, as a prefill without drafts would cost).
        """
        if first and proposal.tree is None:
            drafts = proposal.tokens  # [B, k]
            ids = torch.cat([self.input_ids, drafts], 1)  # [B, T+k]
            mask = torch.cat([self.attention_mask, torch.ones_like(drafts)], 1)  # [B, T+k]
            return self.target_cache.prefill_and_predict(ids, mask, num_logits=drafts.shape[1] + 1)
        if first and self.input_ids.shape[1] > 1:
            self.target_cache.prefill(self.input_ids[:, :-1], self.attention_mask[:, :-1])
        verify_ids = self.rows.pending.unsqueeze(1)  # [B', 1]
        if proposal.tree is not None:
            verify_ids = torch.cat([verify_ids, proposal.tokens], 1)  # [B', N+1]
            shape = proposal.tree
            return self.target_cache.forward_tree(verify_ids, shape.ancestors, shape.depth_offsets, self.rows.active)
        if proposal.tokens.shape[1]:
            verify_ids = torch.cat([verify_ids, proposal.tokens], 1)  # [B', k+1]
        verify_mask = self.rows.active.unsqueeze(1).expand_as(verify_ids)  # [B', k+1]
        return self.target_cache.forward(verify_ids, verify_mask)

    def judge(self, proposal: Proposal, target_logits: torch.Tensor) -> Judgement:
        """The strategy's verdict, with what the loop needs around it (``Judgement``).

        With no drafts there is nothing to accept: every strategy reduces to picking the next token from p, done
        here directly (argmax at temperature 0), which keeps the baseline's per-token work to the bare minimum.
        At temperature 0, a strategy that ``judges_ids`` is judged on token ids; one whose rule there is greedy
        matching (``greedy_at_point_masses``) is judged here, and its kept drafts are the target's choices.
        """
        sampling, strategy, k = self.decoder.sampling, self.decoder.strategy, proposal.tokens.shape[1]
        if proposal.tree is not None:
            return self.judge_tree(proposal, target_logits)
        if sampling.is_greedy and (k == 0 or self.decoder.judges_ids):
            # Point masses: token ids say everything a strategy would see, and one pass over V finds them.
            target_choice, target_peaks = greedy_choice(target_logits)  # [B, k+1], [B, k+1]
            target_usable = finite_peaks(target_peaks)  # []
            if k == 0:
                return Judgement(Verdict(self.rows.none_accepted, target_choice[:, 0]), target_usable,
                                 new_tokens=target_choice)
            if strategy.greedy_at_point_masses:
                verdict = greedy_verdict(proposal.tokens, target_choice)
                return Judgement(verdict, target_usable, new_tokens=target_choice, overlap_is_acceptance=True)
            overlap = (proposal.tokens == target_choice[:, :k]).float()  # [B, k] sum_x min(q, p) of point masses
            verdict = strategy.verdict_from_ids(proposal.tokens, target_choice, self.generator)
            return Judgement(verdict, target_usable, overlap=overlap)
        if k == 0:
            token = sample(logits_to_probs(target_logits[:, 0], sampling), self.generator)  # [B]
            return Judgement(Verdict(self.rows.none_accepted, token), usable(target_logits))
        target_probs = logits_to_probs(target_logits, sampling)  # [B, k+1, V]
        if proposal.probs is None:  # point masses q = onehot(draft), so sum_x min(q, p) = p(draft)
            overlap = probs_of(target_probs[:, :k], proposal.tokens)  # [B, k]
            draft_probs = one_hot_probs(proposal.tokens, target_probs.shape[-1])
        else:
            overlap = torch.minimum(proposal.probs, target_probs[:, :k]).sum(-1)  # [B, k]
            draft_probs = proposal.probs
        verdict = strategy(proposal.tokens, draft_probs, target_probs, self.generator)
        return Judgement(verdict, usable(target_logits), overlap=overlap)

    def judge_tree(self, proposal: Proposal, target_logits: torch.Tensor) -> Judgement:
        """The strategy's tree rule: on token ids at temperature 0, else on distributions."""
        strategy, shape = self.decoder.strategy, proposal.tree
        if self.decoder.sampling.is_greedy:
            target_choice, target_peaks = greedy_choice(target_logits)  # [B, N+1], [B, N+1]
            verdict = strategy.tree_verdict_from_ids(shape, proposal.tokens, target_choice, self.generator)
            return Judgement(verdict, finite_peaks(target_peaks))
        target_probs = logits_to_probs(target_logits, self.decoder.sampling)  # [B, N+1, V]
        verdict = strategy.judge_tree(shape, proposal.tokens, proposal.probs, target_probs, self.generator)
        return Judgement(verdict, usable(target_logits))

    def emit(self, proposal: Proposal, judgement: Judgement) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's new tokens into the output and advance the rows: [B', k+1] new tokens (the kept drafts,
        then the next token; a tree's kept drafts are its accepted path) and [B'] how many of them each row emits
        (cut at EOS and the budget)."""
        rows, k, verdict, new_tokens = self.rows, depth_of(proposal), judgement.verdict, judgement.new_tokens
        if new_tokens is None:
            drafts = path_tokens(proposal.tokens, verdict.path) if proposal.tree is not None else proposal.tokens
            new_tokens = torch.cat([drafts, verdict.next_token.unsqueeze(1)], 1)  # [B', k+1]
            new_tokens.scatter_(1, verdict.num_accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))
        num_new, no_eos = self.count_new(new_tokens, verdict.num_accepted)
        slots = rows.emitted.unsqueeze(1) + self.slot_offsets[: k + 1]  # [B', k+1]
        self.output.index_put_((rows.original.unsqueeze(1), slots), new_tokens)  # slots past num_new: rewritten or unread
        rows.emitted = rows.emitted + num_new
        rows.remaining = rows.remaining - num_new if no_eos is None else (rows.remaining - num_new) * no_eos
        rows.active = rows.remaining > 0
        return new_tokens, num_new

    def count_new(
        self, new_tokens: torch.Tensor, num_accepted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B] tokens each row emits this step (kept drafts + 1, cut at EOS and the budget) and [B] whether none of
        them is EOS (None without EOS ids)."""
        num_new = torch.minimum(num_accepted + 1, self.rows.remaining)  # [B], 0 for finished rows
        if self.eos_ids is None:
            return num_new, None
        slot = self.slot_offsets[: new_tokens.shape[1]]  # [k+1]
        first_eos = torch.where(torch.isin(new_tokens, self.eos_ids), slot, new_tokens.shape[1]).amin(-1)  # [B]
        return torch.minimum(num_new, first_eos + 1), first_eos >= num_new

    def sync_host(
        self, k: int, proposal: Proposal, num_new: torch.Tensor, kept_or_idle: torch.Tensor,
        target_usable: torch.Tensor,
    ) -> HostSync:
        """Copy the step's two flags and its per-row values to the host in one copy, reduce them there, and refuse
        to go on from unusable logits. ``kept_or_idle`` [B'] is num_accepted, -1 for rows that fed holes (their
        verdicts mean nothing). Reducing on the host launches no kernel per scalar; Python reduces a few hundred
        rows in microseconds.
        """
        rows = self.rows
        flags = [target_usable.view(1)]  # [1] bool each
        if proposal.finite is not None:
            flags.append(proposal.finite.view(1))
        per_row = [rows.remaining]  # [B'] each; a row is active exactly while it has budget left
        if self.room_binds:
            per_row.append(rows.room - rows.emitted)
        if k:
            per_row += [kept_or_idle, num_new]
        values = torch.cat(flags + per_row).tolist()
        target_ok, drafts_ok = values[0], values[1] if len(flags) == 2 else True
        values = values[len(flags):]
        if not drafts_ok:
            raise NonFiniteLogitsError("the draft model produced NaN/inf logits; refusing to emit tokens from them")
        if not target_ok:
            raise NonFiniteLogitsError("the target model produced NaN/inf logits; refusing to emit tokens from them")
        batch = len(values) // len(per_row)
        columns = iter(values[i : i + batch] for i in range(0, len(values), batch))
        remaining = next(columns)
        active = [left > 0 for left in remaining]
        room_min = self.k_max
        if self.room_binds:
            room_min = min((room for room, on in zip(next(columns), active) if on), default=self.k_max)
        accepted, new = ([0], [1]) if not k else (next(columns), next(columns))
        return HostSync(
            remaining_max=max(remaining),
            room_min=room_min,
            num_active=sum(active),
            max_accepted=max(accepted),
            min_accepted=min(kept if kept >= 0 else k for kept in accepted),
            max_new=max(new),
            min_new=min(new),
        )

    def roll_back(self, proposal: Proposal, verdict: Verdict, num_new: torch.Tensor, sync: HostSync) -> None:
        """The target cache keeps each row's emitted tokens of the k + 1 it was fed (a tree: the root and the
        emitted part of the accepted path; the other nodes become holes); the next token is pending. (With k = 0
        every live row keeps its one token and idle rows fed a hole: nothing to roll back.)"""
        if proposal.tree is not None:
            self.target_cache.keep_slots(kept_positions(verdict.path, num_new, proposal.tokens.shape[1] + 1))
        else:
            self.target_cache.keep(num_new, proposal.tokens.shape[1] + 1, sync.max_new, sync.min_new)
        self.rows.pending = verdict.next_token

    def retire_finished(self, num_active: int) -> None:
        """Drop the rows that finished from the batch: from the rows here, the target cache and the drafter, each
        by its owner. Results stay in place, indexed by original row. (``nonzero`` syncs, but only after the
        step's sync, in the few steps where rows finish.)"""
        if not (self.decoder.retires_rows and 0 < num_active < len(self.rows.original)):
            return
        keep = self.rows.active.nonzero().squeeze(1)  # [B'']
        self.final_emitted.index_copy_(0, self.rows.original, self.rows.emitted)
        self.rows = self.rows.select(keep)
        self.target_cache.select_rows(keep)
        self.decoder.drafter.select_rows(keep)

    def record_times(self, draft: float, target: float, prefill: bool) -> None:
        """Add a step's times to the call's; to the decode steps' (the cost ratio's) all its drafting and, unless
        its target forward was the prefill, that forward."""
        self.draft_seconds += draft
        self.target_seconds += target
        self.draft_step_seconds += draft
        if not prefill:
            self.target_step_seconds += target
            self.target_forwards += 1

    def finish(self, wall: float, ttft: float) -> GenerationOutput:
        self.final_emitted.index_copy_(0, self.rows.original, self.rows.emitted)
        rows = self.output.tolist()
        counts = self.final_emitted.tolist()
        tokens = [row[:count] for row, count in zip(rows, counts)]
        row_stats, overlap_sum, overlap_count = self.log.row_stats(self.final_emitted)
        if not self.decoder.time_phases:
            self.draft_seconds = self.target_seconds = math.nan
            self.draft_step_seconds = self.target_step_seconds = math.nan
        stats = DecodeStats(
            rows=row_stats,
            draft_forwards=self.decoder.drafter.num_forwards,
            target_forwards=self.target_forwards,
            draft_seconds=self.draft_seconds,
            target_seconds=self.target_seconds,
            wall_seconds=wall,
            ttft_seconds=ttft,
            first_step_emitted=int(self.first_step_emitted),
            draft_step_seconds=self.draft_step_seconds,
            target_step_seconds=self.target_step_seconds,
            expected_overlap_sum=overlap_sum,
            expected_overlap_count=overlap_count,
        )
        return GenerationOutput(tokens, stats)


def depth_of(proposal: Proposal) -> int:
    """Draft positions a proposal covers: k tokens of a chain, or the levels of a tree."""
    return len(proposal.tree.branching) if proposal.tree is not None else proposal.tokens.shape[1]


def check_tree_support(drafter: Drafter, strategy: AcceptanceStrategy, sampling: SamplingConfig, layout: str) -> None:
    """A tree drafter needs a strategy with a tree rule (on ids at temperature 0) and the dynamic cache layout."""
    if not drafter.drafts_trees:
        return
    if not strategy.judges_trees:
        raise ValueError(f"strategy {strategy.name!r} has no rule for token trees; tree rules: greedy, speculative, "
                         f"typical, topk, synthetic")
    if sampling.is_greedy and not strategy.judges_ids:
        raise ValueError(f"strategy {strategy.name!r} cannot judge a tree drafted at temperature 0 (its children are "
                         f"the draft's top tokens, not one point mass)")
    if layout != "dynamic":
        raise ValueError(f"token trees run on the dynamic cache layout (eager), got cache_layout={layout!r} "
                         f"(compile=True uses the static one)")
