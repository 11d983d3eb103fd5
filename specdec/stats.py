"""Decoding statistics, per call and per row, by these definitions (which the rows of an experiment carry per
prompt, docs/results-schema.md):

    drafted D, accepted A, target calls N (the prefill, whose logits give the first token, and the
    verification passes), emitted E
    acceptance rate       A / D                         (NaN when nothing was drafted)
    mean accepted length  E / N                         (tau; plain decoding has tau = 1; vLLM's acceptance length)
    per-position a_i      P(draft i accepted | drafts 1..i-1 accepted)
    accepted histogram    h_j = steps that drafted and kept j drafts, j = 0..k_max
    k histogram           steps by the draft length k they drafted, k = 0..k_max (sums to the target calls)
    expected acceptance   mean over verified positions of sum_x min(q(x), p(x))
    cost ratio c          mean draft forward time / mean target forward time (decode steps, this call)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specdec.checks import as_integer, check_number
from specdec.rules import probs_of


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


@dataclass
class RowStats:
    """Counts of one batch row."""

    emitted: int
    drafted: int
    accepted: int
    target_calls: int
    position_attempts: list[int]  # [k_max] times draft position i was verified
    position_accepts: list[int]  # [k_max] times it was accepted
    steps_by_accepted: list[int] = field(default_factory=list)  # [k_max+1] steps that drafted and kept j drafts
    steps_by_k: list[int] = field(default_factory=list)  # [k_max+1] steps the row generated in that drafted k

    @property
    def acceptance_rate(self) -> float:
        return ratio(self.accepted, self.drafted)

    @property
    def mean_accepted_length(self) -> float:
        return ratio(self.emitted, self.target_calls)

    @property
    def per_position(self) -> list[float]:
        return [ratio(a, n) for a, n in zip(self.position_accepts, self.position_attempts)]


@dataclass
class DecodeStats:
    """Counts summed over rows, timings of the whole call, and the rows themselves."""

    rows: list[RowStats]
    draft_forwards: int  # draft forward passes in decode steps (prefill excluded)
    target_forwards: int  # batched verification passes (prefill excluded)
    draft_seconds: float  # drafting, draft prefill included
    target_seconds: float  # target forwards, prefill included
    wall_seconds: float
    ttft_seconds: float  # start of the call to the end of the first step, which emits the first tokens
    first_step_emitted: int  # tokens the first step emitted, over all rows
    draft_step_seconds: float  # draft_seconds less the draft prefill
    target_step_seconds: float  # target_seconds less the target prefill
    expected_overlap_sum: float = 0.0  # sum over verified positions of sum_x min(q, p)
    expected_overlap_count: int = 0

    @property
    def totals(self) -> RowStats:
        """The rows' counts summed: the whole call as one row."""
        return RowStats(
            emitted=sum(r.emitted for r in self.rows),
            drafted=sum(r.drafted for r in self.rows),
            accepted=sum(r.accepted for r in self.rows),
            target_calls=sum(r.target_calls for r in self.rows),
            position_attempts=[sum(col) for col in zip(*(r.position_attempts for r in self.rows))],
            position_accepts=[sum(col) for col in zip(*(r.position_accepts for r in self.rows))],
            steps_by_accepted=[sum(col) for col in zip(*(r.steps_by_accepted for r in self.rows))],
            steps_by_k=[sum(col) for col in zip(*(r.steps_by_k for r in self.rows))],
        )

    drafted = property(lambda self: self.totals.drafted)
    accepted = property(lambda self: self.totals.accepted)
    target_calls = property(lambda self: self.totals.target_calls)
    emitted = property(lambda self: self.totals.emitted)
    acceptance_rate = property(lambda self: self.totals.acceptance_rate)
    mean_accepted_length = property(lambda self: self.totals.mean_accepted_length)
    per_position = property(lambda self: self.totals.per_position)

    @property
    def expected_acceptance(self) -> float | None:
        """Mean over verified draft positions of sum_x min(q, p); None when nothing was verified.

        Where the drafter gives no distributions (n-gram) q is the point mass at the draft, so this is the mean
        p(draft): the probability speculative sampling accepts it.
        """
        if not self.expected_overlap_count:
            return None
        return self.expected_overlap_sum / self.expected_overlap_count

    @property
    def other_seconds(self) -> float:
        return self.wall_seconds - self.draft_seconds - self.target_seconds

    @property
    def tokens_per_second(self) -> float:
        return ratio(self.emitted, self.wall_seconds)

    @property
    def cost_ratio(self) -> float:
        return ratio(ratio(self.draft_step_seconds, self.draft_forwards), ratio(self.target_step_seconds, self.target_forwards))

    @property
    def decode_tokens(self) -> int:
        """Tokens emitted after the first step (the decode phase, after the prefill's), over all rows."""
        return self.emitted - self.first_step_emitted

    @property
    def itl_seconds(self) -> float:
        """Mean time a row waits per token after the first step (tokens of one step arrive together)."""
        tokens_after_first = self.decode_tokens / len(self.rows)
        return ratio(self.wall_seconds - self.ttft_seconds, tokens_after_first) if tokens_after_first > 0 else math.nan


def vllm_acceptance_length(histogram: object) -> float:
    """vLLM's mean acceptance length of one row, 1 + sum_j j h_j / sum_j h_j (over the steps that drafted); NaN
    without a histogram or a step that drafted."""
    if not isinstance(histogram, list) or not sum(histogram):
        return math.nan
    return 1 + sum(j * count for j, count in enumerate(histogram)) / sum(histogram)


def predicted_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al. (2023) eq. 1, expected walltime improvement, in the form that also holds at alpha = 1:

        (1 - a^(k+1)) / ((1 - a)(k c + 1))  =  (sum_{i=0..k} a^i) / (k c + 1)

    NaN in alpha or c (an acceptance or a cost not measured) gives NaN; a value outside its range is refused.
    """
    check_prediction_inputs(alpha, k, cost_ratio)
    return sum(alpha**i for i in range(k + 1)) / (k * cost_ratio + 1)


def check_prediction_inputs(alpha: object, k: object, cost_ratio: object) -> None:
    """alpha in [0, 1], k an integer >= 0, c a finite number >= 0; NaN alpha or c passes (not measured)."""
    check_number("alpha", alpha)
    check_number("cost_ratio", cost_ratio)
    if not (0 <= alpha <= 1 or math.isnan(alpha)):
        raise ValueError(f"alpha must be an acceptance rate in [0, 1] (or NaN, not measured), got {alpha!r}")
    if as_integer(k) is None or k < 0:
        raise ValueError(f"k must be an integer >= 0 (draft tokens per step), got {k!r}")
    if not (0 <= cost_ratio < math.inf or math.isnan(cost_ratio)):
        raise ValueError(f"cost_ratio must be a finite number >= 0 (or NaN, not measured), got {cost_ratio!r}")


class StepLog:
    """What each step decided for each of the call's original rows, written with a few ops per step and turned into
    per-row counts once, at the end (``row_stats``). Also where the per-position overlap sum_x min(q, p) (the
    expected acceptance) is measured, from what the verifier judged."""

    def __init__(self, batch_size: int, k_max: int, max_steps: int, device: torch.device):
        # [S, B] drafts each row kept in each step; -1 where the row was not generating (a later step's -1: unused)
        self.accepted = torch.full((max_steps, batch_size), -1, dtype=torch.long, device=device)
        # [S, B, k_max] sum_x min(q, p) at each draft position (read where the position was verified)
        self.overlap = torch.zeros(max_steps, batch_size, k_max, device=device)
        self.step_index = torch.zeros(1, dtype=torch.long, device=device)  # [1] the next step's row of the log
        self.depths: list[int] = []  # per step: draft positions k (a tree's levels)
        self.drafted: list[int] = []  # per step: tokens each generating row drafted (a tree's nodes)
        self.overlap_logged: list[bool] = []  # per step: the overlap was measured (chains with drafts)
        self.overlap_is_acceptance: list[bool] = []  # per step: ... and is 1 exactly where a draft was kept

    def add(self, rows: torch.Tensor, kept_or_idle: torch.Tensor, proposal, judgement) -> None:
        """Log one step on the device: ``rows`` [B'] the original rows of the batch, ``kept_or_idle`` [B'] drafts
        kept per row (-1 for rows not generating), the ``proposal`` and the verifier's ``judgement``. The step's
        index is a device counter, so a captured step logs at the right place on every replay; ``note`` records
        the step on the host."""
        layout = proposal.layout
        step = self.step_index.expand_as(rows)  # [B']
        self.accepted.index_put_((step, rows), kept_or_idle)
        if self.measures(layout) and not judgement.overlap_is_acceptance:
            self.overlap[:, :, : layout.depth].index_put_((step, rows), self.measure_overlap(proposal, judgement))
        self.step_index += 1

    def note(self, layout, overlap_is_acceptance: bool) -> None:
        """Record a logged step's shape on the host (once per step, also for replays of a captured step)."""
        measured = self.measures(layout)
        self.depths.append(layout.depth)
        self.drafted.append(layout.num_nodes)
        self.overlap_logged.append(measured)
        self.overlap_is_acceptance.append(measured and overlap_is_acceptance)

    def device_state(self) -> dict[str, torch.Tensor]:
        return {"accepted": self.accepted, "overlap": self.overlap, "step_index": self.step_index}

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        """Log into ``state``'s tensors (a kept captured step's) from now on, holding what was logged so far."""
        for name, tensor in state.items():
            current = getattr(self, name)
            if tensor is not current:
                tensor.copy_(current)
            setattr(self, name, tensor)

    @staticmethod
    def measures(layout) -> bool:
        return layout.measures_overlap and layout.depth > 0

    @staticmethod
    def measure_overlap(proposal, judgement) -> torch.Tensor:
        """[B, k] sum_x min(q, p) at each draft position of a chain (q = onehot(draft) where the drafter gives no
        distributions, p = onehot(argmax) where judged on ids)."""
        k = proposal.layout.depth
        if judgement.target_probs is None:
            return (proposal.tokens == judgement.target_choice[:, :k]).float()
        target_probs = judgement.target_probs[:, :k]  # [B, k, V]
        if proposal.probs is None:
            return probs_of(target_probs, proposal.tokens)
        return torch.minimum(proposal.probs, target_probs).sum(-1)

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
        drafting = generating & (depths > 0).unsqueeze(1)  # [S, B] steps that proposed something
        by_accepted = torch.nn.functional.one_hot(accepted.clamp_min(0), position.shape[0] + 1)  # [S, B, k_max+1]
        columns = zip(
            emitted.tolist(),
            drafted.tolist(),
            accepted.clamp_min(0).sum(0).tolist(),
            generating.sum(0).tolist(),
            attempted.sum(0).tolist(),
            kept.sum(0).tolist(),
            (by_accepted * drafting.unsqueeze(2)).sum(0).tolist(),
            (torch.nn.functional.one_hot(depths, position.shape[0] + 1).unsqueeze(1)  # [S, 1, k_max+1]
             * generating.unsqueeze(2)).sum(0).tolist(),  # [B, k_max+1] steps by the k drafted
        )
        measured = attempted & torch.tensor(self.overlap_logged, device=device)[:, None, None]  # [S, B, k_max]
        from_acceptance = torch.tensor(self.overlap_is_acceptance, device=device)[:, None, None]  # [S, 1, 1]
        overlap = torch.where(from_acceptance, kept.double(), self.overlap[:steps].double())  # [S, B, k_max]
        overlap_sum = (overlap * measured).sum().item()
        return [RowStats(*column) for column in columns], overlap_sum, int(measured.sum())
