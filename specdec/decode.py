"""The one cached decode loop, shared by speculative decoding and the autoregressive baseline.

Each step: the drafter proposes k tokens; the target scores the last emitted token and the k drafts in one
forward pass; the acceptance strategy keeps n of them and picks the next token; the target cache (owned here)
and the draft cache (owned by the drafter) roll back to the kept prefix. With ``NoDrafter`` k is always 0 and the
step is a plain decode step, so baseline and speculative runs share every cost but speculation.

One host sync per step: a handful of scalars that decide termination, rollback lengths and the next k. When rows
of a batch finish, they leave it (``retire_finished``): the forwards then run over the rows still generating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.cache import CACHE_LAYOUTS, KVCache, context_limit, static_capacity
from specdec.drafters import Drafter, NoDrafter
from specdec.policies import DraftLengthPolicy, FixedLength
from specdec.sampling import SamplingConfig, greedy_choice, logits_to_probs, one_hot_probs, sample, usable
from specdec.stats import DecodeStats, RowStats
from specdec.timing import Clock
from specdec.strategies import AcceptanceStrategy, Greedy, Speculative, point_mass_rule, probs_of
from specdec.types import Proposal, Verdict


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN or inf logits: any token chosen from them would be meaningless."""


@dataclass(frozen=True)
class StepOutcome:
    """What one step decided, for drafters and policies to learn from."""

    k: int  # drafts proposed this step
    num_accepted: torch.Tensor  # [B] drafts kept per row
    next_token: torch.Tensor  # [B] token emitted after the kept drafts
    new_tokens: torch.Tensor  # [B, k+1] kept drafts then next_token; only the first num_new are real
    num_new: torch.Tensor  # [B] tokens emitted this step (0 for rows already finished)
    active: torch.Tensor  # [B] bool, rows still generating during this step
    active_after: torch.Tensor  # [B] bool, rows still generating after it (the others leave the batch or feed holes)
    max_accepted: int  # host copies over active rows
    min_accepted: int
    draft_seconds: float
    target_seconds: float


@dataclass(frozen=True)
class GenerationOutput:
    tokens: list[list[int]]  # new tokens of each row, up to and including EOS
    stats: DecodeStats


class RowCounters:
    """Per-row statistics accumulated on the device, read once at the end. Rows are the call's original rows;
    ``add`` takes the step's rows as ``rows`` [B'] indices into them."""

    def __init__(self, batch_size: int, k_max: int, device: torch.device):
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=device)  # noqa: E731
        self.drafted, self.accepted, self.target_calls = zeros(batch_size), zeros(batch_size), zeros(batch_size)
        self.position_attempts, self.position_accepts = zeros(batch_size, k_max), zeros(batch_size, k_max)
        self.overlap_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.overlap_count = zeros(())

    def add(
        self, rows: torch.Tensor, k: int, num_accepted: torch.Tensor, live: torch.Tensor, overlap: torch.Tensor | None
    ) -> None:
        """Count one step of the ``live`` [B'] (1/0) rows; ``overlap`` [B', k] is sum_x min(q, p) per draft position."""
        self.target_calls.index_add_(0, rows, live)
        if k == 0:
            return
        self.drafted.index_add_(0, rows, k * live)
        self.accepted.index_add_(0, rows, num_accepted * live)
        position = torch.arange(k, device=live.device)  # [k]
        attempted = (num_accepted.unsqueeze(1) >= position) * live.unsqueeze(1)  # [B', k]
        self.position_attempts[:, :k].index_add_(0, rows, attempted)
        self.position_accepts[:, :k].index_add_(0, rows, (num_accepted.unsqueeze(1) > position) * live.unsqueeze(1))
        if overlap is not None:
            self.overlap_sum += (overlap * attempted).sum()
            self.overlap_count += attempted.sum()

    def rows(self, emitted: torch.Tensor) -> list[RowStats]:
        columns = zip(
            emitted.tolist(),
            self.drafted.tolist(),
            self.accepted.tolist(),
            self.target_calls.tolist(),
            self.position_attempts.tolist(),
            self.position_accepts.tolist(),
        )
        return [RowStats(*column) for column in columns]


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
        and a drafter with ``selects_rows``). Greedy outputs do not change; sampled ones do, since the random
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
        self.retires_rows = (
            retire_finished_rows and cache_layout == "dynamic" and getattr(self.drafter, "selects_rows", False)
        )
        self.speculates = not isinstance(self.drafter, NoDrafter)
        self.strategy = strategy if strategy is not None else Speculative()
        self.draft_length = draft_length if draft_length is not None else FixedLength()
        self.sampling = sampling if sampling is not None else SamplingConfig()
        check_parts(self.strategy, self.draft_length, self.sampling)
        if self.speculates and isinstance(self.strategy, Greedy) and not self.sampling.is_greedy:
            raise ValueError(
                f"strategy 'greedy' decodes the target's argmax and needs temperature 0, got temperature="
                f"{self.sampling.temperature}; use 'speculative' (lossless) or 'typical'/'topk' (lossy) to sample"
            )
        for model in (target, *draft_models(self.drafter)):
            check_eval_mode(model)
        # At temperature 0: the strategy's rule on token ids, or None to call it with one-hot distributions.
        self.verdict_from_ids = point_mass_rule(self.strategy) if self.sampling.is_greedy else None
        limits = [context_limit(target)] + [context_limit(m) for m in draft_models(self.drafter)]
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
        eos_ids = eos_tensor(eos_token_id, input_ids.device, vocab_size)
        # Padding is masked, but still goes through the embedding: an id outside the vocabulary there becomes 0.
        outside = (input_ids < 0) | (input_ids >= vocab_size)  # [B, T], only padding after check_prompt
        input_ids = input_ids.masked_fill(outside, 0)
        return DecodeRun(self, input_ids, attention_mask, max_new_tokens, eos_ids, seed).run()


def draft_models(drafter: Drafter) -> list[torch.nn.Module]:
    model = getattr(drafter, "model", None)
    return [model] if isinstance(model, torch.nn.Module) else []


class DecodeRun:
    """The state of one ``generate`` call. Owns the target cache; the drafter owns its own."""

    def __init__(self, decoder: Decoder, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int):
        self.decoder, self.input_ids, self.attention_mask = decoder, input_ids, attention_mask
        self.max_new_tokens, self.eos_ids = max_new_tokens, eos_ids
        device = input_ids.device
        batch_size = input_ids.shape[0]
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.clock = Clock(device)
        self.phase_clock = self.clock.phase(decoder.time_phases)
        self.k_max = decoder.draft_length.max_k if decoder.speculates else 0
        self.limit = decoder.context_limit if decoder.context_limit is not None else 2**62
        self.room = self.limit - attention_mask.sum(-1)  # [B] positions left in each row's context at the start
        self.allowance = self.room.clamp(max=max_new_tokens)  # [B] tokens each row may emit in all
        # Results by original row; the per-row state below covers only the rows still in the batch, ``rows``.
        self.output = torch.zeros(batch_size, max_new_tokens + self.k_max + 1, dtype=torch.long, device=device)
        self.final_emitted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.rows = torch.arange(batch_size, device=device)  # [B'] original row of each row in the batch
        self.emitted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.active = torch.ones(batch_size, dtype=torch.bool, device=device)  # [B]
        self.live = self.active.long()  # [B] the same as 1/0, the form masks and counters take
        self.slot_offsets = torch.arange(self.k_max + 1, device=device)  # [k_max+1]
        self.no_proposal = Proposal(torch.zeros(batch_size, 0, dtype=torch.long, device=device), None)
        self.no_drafts_accepted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.counters = RowCounters(batch_size, self.k_max, device)
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
        if self.input_ids.shape[1] > 1:
            self.target_cache.prefill(self.input_ids[:, :-1], self.attention_mask[:, :-1])
        after_target_prefill = self.phase_clock()
        self.draft_seconds = after_draft_prefill - (start if self.decoder.time_phases else 0.0)
        self.target_seconds = after_target_prefill - after_draft_prefill
        self.pending = self.input_ids[:, -1]  # [B] last token, not yet in the target cache
        remaining_max, room_min = self.budget_bounds()
        ttft = None
        while remaining_max > 0:
            k = min(decoder.draft_length.next_k(), remaining_max - 1, room_min) if decoder.speculates else 0
            remaining_max, room_min = self.step(max(k, 0))
            if ttft is None:
                ttft = self.clock.now() - start
        wall = self.clock.now() - start
        return self.finish(wall, ttft if ttft is not None else wall)

    def budgets(self) -> torch.Tensor:
        """[B] tokens each row may still emit: max_new_tokens and the context limit both bound it."""
        return (self.allowance - self.emitted) * self.active

    def bounds(self) -> list[torch.Tensor]:
        """[largest remaining budget, smallest context room] over active rows: the next k's limits, on device."""
        room = torch.where(self.active, self.room - self.emitted, self.limit)  # [B]
        return [self.budgets().max(), room.min()]

    def budget_bounds(self) -> tuple[int, int]:
        remaining_max, room_min = torch.stack(self.bounds()).tolist()
        return remaining_max, room_min

    def step(self, k: int) -> tuple[int, int]:
        decoder = self.decoder
        t0 = self.phase_clock()
        proposal = self.propose(k) if k else self.no_proposal
        k = proposal.tokens.shape[1]  # fewer than asked when the policy stopped the draft early
        t1 = self.phase_clock()
        verify_ids = self.pending.unsqueeze(1)  # [B, k+1]: the last emitted token, then the drafts
        if k:
            verify_ids = torch.cat([verify_ids, proposal.tokens], 1)
        verify_mask = self.live.unsqueeze(1).expand_as(verify_ids)  # finished rows feed holes
        target_logits = self.target_cache.forward(verify_ids, verify_mask)  # [B, k+1, V]
        t2 = self.phase_clock()
        verdict, overlap, target_usable = self.judge(proposal, target_logits)
        self.counters.add(self.rows, k, verdict.num_accepted, self.live, overlap)

        new_tokens = verdict.next_token.unsqueeze(1)  # [B, k+1]: the kept drafts, then the next token
        if k:
            new_tokens = torch.cat([proposal.tokens, new_tokens], 1)
            new_tokens.scatter_(1, verdict.num_accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))
        num_new, reached_eos = self.count_new(new_tokens, verdict.num_accepted)
        slots = self.emitted.unsqueeze(1) + self.slot_offsets[: k + 1]  # [B, k+1]
        self.output.index_put_((self.rows.unsqueeze(1), slots), new_tokens)  # slots past num_new: rewritten or unread
        active_during_step = self.active
        self.emitted = self.emitted + num_new
        self.active = self.active & (self.allowance > self.emitted)
        if reached_eos is not None:
            self.active &= ~reached_eos
        self.live = self.active.long()

        scalars = [*self.bounds(), target_usable.long(), self.active.sum()]
        if k:
            idle = ~active_during_step  # [B] rows that fed only holes: their verdicts mean nothing
            scalars += [
                verdict.num_accepted.masked_fill(idle, -1).max(),
                verdict.num_accepted.masked_fill(idle, k).min(),
                proposal.finite.long() if proposal.finite is not None else torch.ones_like(scalars[0]),
                num_new.max(),
                num_new.min(),
            ]
        host = torch.stack(scalars).tolist()  # the step's one host sync
        remaining_max, room_min, target_ok, num_live = host[:4]
        max_accepted, min_accepted, drafts_ok, max_new, min_new = host[4:] if k else (0, 0, True, 1, 1)
        if not drafts_ok:
            raise NonFiniteLogitsError("the draft model produced NaN/inf logits; refusing to emit tokens from them")
        if not target_ok:
            raise NonFiniteLogitsError("the target model produced NaN/inf logits; refusing to emit tokens from them")

        # With k = 0 every live row keeps its one token and idle rows fed a hole: there is nothing to roll back.
        self.target_cache.keep(num_new, k + 1, max_new, min_new)
        self.pending = verdict.next_token
        t3 = self.phase_clock()
        outcome = StepOutcome(
            k=k,
            num_accepted=verdict.num_accepted,
            next_token=verdict.next_token,
            new_tokens=new_tokens,
            num_new=num_new,
            active=active_during_step,
            active_after=self.active,
            max_accepted=max_accepted,
            min_accepted=min_accepted,
            draft_seconds=t1 - t0,
            target_seconds=t2 - t1,
        )
        decoder.drafter.commit(outcome)
        t4 = self.phase_clock()
        decoder.draft_length.observe(outcome)
        if decoder.retires_rows and 0 < num_live < len(self.rows):
            self.retire_finished()
        self.record_times(draft=(t1 - t0) + (t4 - t3), target=t2 - t1)
        return remaining_max, room_min

    def retire_finished(self) -> None:
        """Drop the rows that finished from the batch: from the per-row state here, the target cache and the
        drafter, each by its owner. Results stay in place, indexed by original row. (``nonzero`` syncs, but only
        after the step's sync, in the few steps where rows finish.)"""
        keep = self.active.nonzero().squeeze(1)  # [B'']
        self.final_emitted.index_copy_(0, self.rows, self.emitted)
        self.rows = self.rows[keep]
        for name in ("emitted", "active", "live", "allowance", "room", "pending", "no_drafts_accepted"):
            setattr(self, name, getattr(self, name)[keep])
        self.no_proposal = Proposal(self.no_proposal.tokens[keep], None)
        self.target_cache.select_rows(keep)
        self.decoder.drafter.select_rows(keep)

    def propose(self, k: int) -> Proposal:
        """Ask the drafter for up to k tokens, letting the policy stop the draft early if it has ``should_stop``."""
        drafter, sampling = self.decoder.drafter, self.decoder.sampling
        should_stop = getattr(self.decoder.draft_length, "should_stop", None)
        if should_stop is None:
            return drafter.propose(k, sampling, self.generator)
        active = self.active  # [B] rows generating this step; the policy ignores the others
        return drafter.propose(k, sampling, self.generator, stop=lambda draft_probs: should_stop(draft_probs, active))

    def judge(
        self, proposal: Proposal, target_logits: torch.Tensor
    ) -> tuple[Verdict, torch.Tensor | None, torch.Tensor]:
        """The strategy's verdict, [B, k] sum_x min(q, p) per draft position (q = onehot(draft) where the drafter
        gives no distributions), and [] whether the target logits were usable.

        With no drafts there is nothing to accept: every strategy reduces to picking the next token from p, done
        here directly (argmax at temperature 0), which keeps the baseline's per-token work to the bare minimum.
        At temperature 0, strategies with a rule on token ids (``strategies.point_mass_rule``) are judged on them.
        """
        sampling, k = self.decoder.sampling, proposal.tokens.shape[1]
        verdict_from_ids = self.decoder.verdict_from_ids
        if sampling.is_greedy and (k == 0 or verdict_from_ids is not None):
            # Point masses: token ids say everything a strategy would see, and one pass over V finds them.
            target_choice, target_usable = greedy_choice(target_logits)  # [B, k+1], []
            if k == 0:
                return Verdict(self.no_drafts_accepted, target_choice[:, 0]), None, target_usable
            overlap = (proposal.tokens == target_choice[:, :k]).float()  # [B, k] sum_x min(q, p) of point masses
            return verdict_from_ids(proposal.tokens, target_choice, self.generator), overlap, target_usable
        if k == 0:
            token = sample(logits_to_probs(target_logits[:, 0], sampling), self.generator)  # [B]
            return Verdict(self.no_drafts_accepted, token), None, usable(target_logits)
        target_probs = logits_to_probs(target_logits, sampling)  # [B, k+1, V]
        if proposal.probs is None:  # point masses q = onehot(draft), so sum_x min(q, p) = p(draft)
            overlap = probs_of(target_probs[:, :k], proposal.tokens)  # [B, k]
            draft_probs = one_hot_probs(proposal.tokens, target_probs.shape[-1])
        else:
            overlap = torch.minimum(proposal.probs, target_probs[:, :k]).sum(-1)  # [B, k]
            draft_probs = proposal.probs
        verdict = self.decoder.strategy(proposal.tokens, draft_probs, target_probs, self.generator)
        return verdict, overlap, usable(target_logits)

    def count_new(
        self, new_tokens: torch.Tensor, num_accepted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B] tokens each row emits this step (kept drafts + 1, cut at EOS and the budget) and [B] EOS reached
        (None without EOS ids)."""
        num_new = torch.minimum(num_accepted + 1, self.budgets())  # [B], 0 for finished rows
        if self.eos_ids is None:
            return num_new, None
        slot = self.slot_offsets[: new_tokens.shape[1]]  # [k+1]
        is_eos = torch.isin(new_tokens, self.eos_ids) & (slot < num_new.unsqueeze(1))  # [B, k+1]
        first_eos = torch.where(is_eos, slot, new_tokens.shape[1]).amin(-1)  # [B], k+1 if none
        return torch.minimum(num_new, first_eos + 1), is_eos.any(-1)

    def record_times(self, draft: float, target: float) -> None:
        self.draft_seconds += draft
        self.target_seconds += target
        self.draft_step_seconds += draft
        self.target_step_seconds += target
        self.target_forwards += 1

    def finish(self, wall: float, ttft: float) -> GenerationOutput:
        self.final_emitted.index_copy_(0, self.rows, self.emitted)
        rows = self.output.tolist()
        counts = self.final_emitted.tolist()
        tokens = [row[:count] for row, count in zip(rows, counts)]
        overlap_sum, overlap_count = self.counters.overlap_sum.item(), int(self.counters.overlap_count.item())
        if not self.decoder.time_phases:
            self.draft_seconds = self.target_seconds = math.nan
            self.draft_step_seconds = self.target_step_seconds = math.nan
        stats = DecodeStats(
            rows=self.counters.rows(self.final_emitted),
            draft_forwards=self.decoder.drafter.num_forwards,
            target_forwards=self.target_forwards,
            draft_seconds=self.draft_seconds,
            target_seconds=self.target_seconds,
            wall_seconds=wall,
            ttft_seconds=ttft,
            draft_step_seconds=self.draft_step_seconds,
            target_step_seconds=self.target_step_seconds,
            expected_overlap_sum=overlap_sum,
            expected_overlap_count=overlap_count,
        )
        return GenerationOutput(tokens, stats)


def check_parts(strategy: object, draft_length: object, sampling: object) -> None:
    """Wrong objects fail here, naming the argument, rather than deep inside a step."""
    if not callable(strategy):
        raise TypeError(f"strategy must be an acceptance strategy (specdec.Speculative(), ...), got {strategy!r}")
    if not all(hasattr(draft_length, name) for name in ("start", "next_k", "observe", "max_k")):
        raise TypeError(f"draft_length must be a draft-length policy (specdec.FixedLength(4), ...), got {draft_length!r}")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec.SamplingConfig, got {sampling!r}")


def check_eval_mode(model: torch.nn.Module) -> None:
    """A model in training mode runs dropout: every forward draws different tokens, silently."""
    if model.training:
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        raise ValueError(f"model {name!r} is in training mode (dropout active); call model.eval() before decoding")


def check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")


def check_prompt(input_ids, attention_mask, limit: int | None, vocab_size: int | None = None) -> torch.Tensor:
    """Validate a [B, T] left-padded prompt batch (ids in [0, vocab_size) where it is known, checked before any
    forward: on a GPU an out-of-range id is a device-side assert that kills the CUDA context) and return its
    attention mask."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.LongTensor of shape [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.long, torch.int):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [B, T], got shape {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}; need at least one token per row")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {shape}")
    if attention_mask.device != input_ids.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but input_ids on {input_ids.device}")
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)].flatten()[0].item()
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (token), got {bad!r}")
    attention_mask = attention_mask.long()
    if bool((attention_mask.diff(dim=-1) < 0).any()):
        raise ValueError("attention_mask must be left-padded (zeros before ones in every row); got right padding")
    lengths = attention_mask.sum(-1)
    if bool((lengths == 0).any()):
        rows = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"empty prompt in batch rows {rows}: every row needs at least one token")
    if vocab_size is not None:
        real = input_ids[attention_mask.bool()]  # padding may hold anything: it is never fed as a token
        if bool(((real < 0) | (real >= vocab_size)).any()):
            bad = real[(real < 0) | (real >= vocab_size)][0].item()
            raise ValueError(f"input_ids holds token id {bad}, outside the target's vocabulary [0, {vocab_size})")
    if limit is not None and int(lengths.max()) >= limit:
        raise ValueError(
            f"prompt of {int(lengths.max())} tokens is at or beyond the context limit of {limit} positions; "
            f"prompts must be shorter than {limit} tokens"
        )
    return attention_mask


def check_max_new_tokens(max_new_tokens: object) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def eos_tensor(eos_token_id, device: torch.device, vocab_size: int | None = None) -> torch.Tensor | None:
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"eos_token_id must be a token id, a list of token ids, or None; got {eos_token_id!r}")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ValueError(f"eos_token_id {max(ids)} is outside the target's vocabulary [0, {vocab_size}): it could "
                         f"never be emitted")
    return torch.tensor(ids, dtype=torch.long, device=device)
