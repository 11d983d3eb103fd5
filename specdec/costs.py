"""What a step costs on this machine: the one cost model behind draft-length choices, the tree search and the
benches' predictions.

A step of the loop over B batch rows, drafting a chain of k tokens, costs

    step(B, k) = draft(B, 2) + (k - 1) draft(B, 1) + verify(B, k + 1) + overhead(k)     (k >= 1; k = 0: no draft)

where verify(B, n) is the target's forward of n tokens per row over a cached context (a chain's verification feeds
the root and its k drafts; a plain decode step, k = 0, feeds 1), draft(B, n) the draft's forward of n tokens per
row (a step's first catches up on two tokens, ``CostModel.draft_chain``), and overhead the loop's own time per
step beyond its forwards. A token tree of N nodes is verified in one forward of N + 1 tokens under a tree mask
(``target_tree``), drafted level by level (``draft_tree``). The cost grows
with the tokens a forward computes, B (k + 1): flat while the forward is bound by reading the weights, steeply once
it is bound by compute, which is why long drafts stop paying at large batches.

``CostTable`` holds one forward's measured seconds by (rows, tokens per row), interpolated between the points
measured; ``CostModel`` holds the tables of a pair and the step costs and predicted speedups they give;
``measure_costs`` times them on the device and dtype the models live on (``specdec.profile``), in a few seconds.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from specdec.profile import time_forwards
from specdec.timing import Clock

COST_CONTEXT = 64  # tokens cached before a timed forward: about a prompt and part of its continuation


def interpolate(points: dict[int, float], x: float) -> float:
    """The piecewise-linear curve through ``points`` (x -> y) at ``x``, extended beyond either end along its end
    segment (a single point: a constant), never below 0."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)  # the segment [xs[i-1], xs[i]] holding x, or the end one
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = points[x0], points[x1]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


@dataclass(frozen=True)
class CostTable:
    """Seconds of one forward of a model by batch rows and tokens per row, as measured at some (rows, width)
    points; ``at`` interpolates linearly in the width at each measured row count, then in the rows."""

    seconds: dict[int, dict[int, float]]  # rows -> tokens per row -> seconds

    def __post_init__(self) -> None:
        if not self.seconds or any(not widths for widths in self.seconds.values()):
            raise ValueError(f"a cost table needs at least one (rows, width) point, got {self.seconds!r}")

    @classmethod
    def of_widths(cls, seconds: dict[int, float], rows: int = 1) -> CostTable:
        """A table measured at one row count: ``seconds`` by tokens per row."""
        return cls({rows: dict(seconds)})

    def at(self, rows: float, width: float) -> float:
        return interpolate({b: interpolate(widths, width) for b, widths in self.seconds.items()}, rows)

    @property
    def rows(self) -> list[int]:
        return sorted(self.seconds)

    def to_json(self) -> dict:
        return {str(b): {str(n): s for n, s in sorted(widths.items())} for b, widths in sorted(self.seconds.items())}


@dataclass
class CostModel:
    """The costs of a pair's forwards on one device and dtype, and the step costs and predicted speedups they give.

    ``draft`` None: a drafter without a model of its own to time (n-gram lookup; its cost is learned online by the
    policy that uses the model). ``overhead``: the loop's seconds per step beyond its forwards by kind of step
    ("baseline", "chain", "tree"), 0 where not measured. ``setting`` says where it was measured (device, dtype)."""

    target: CostTable  # causal forward of the target: rows x tokens per row
    draft: CostTable | None = None  # causal forward of the draft: rows x tokens per row
    target_tree: CostTable | None = None  # target verifying a tree: rows x nodes (the root and N nodes)
    draft_tree: CostTable | None = None  # draft feeding a tree level: rows x nodes after the root
    overhead: dict[str, float] = field(default_factory=dict)
    setting: str = ""

    @classmethod
    def at_batch_one(cls, draft_step: float, target: dict[int, float]) -> CostModel:
        """Costs measured at batch 1: the draft's one-token forward and the target's forward of n tokens per n."""
        return cls(CostTable.of_widths(target), CostTable.of_widths({1: draft_step}))

    def draft_step(self, rows: float = 1) -> float:
        """One draft forward of one token per row (0 for a drafter without a timed model)."""
        return 0.0 if self.draft is None else self.draft.at(rows, 1)

    def draft_chain(self, k: int, rows: float = 1) -> float:
        """A chain step's k draft forwards: the first catches up on the tokens the last step left the draft (two
        where every draft was kept: the last draft, which the draft never fed, and the target's token; one token's
        cost where the table has no width 2), the others feed one draft each. As k times one token's cost, learned
        from short drafts, this priced long ones up to a quarter too high at batch 16, and the policy alternated
        between k = 1 and k = 3 as its estimate followed the k it had drafted."""
        if not k or self.draft is None:
            return 0.0
        return self.draft.at(rows, 2) + (k - 1) * self.draft.at(rows, 1)

    def target_step(self, rows: float = 1) -> float:
        """One plain decode step's forward: one token per row."""
        return self.target.at(rows, 1)

    def cost_ratio(self, rows: float = 1) -> float:
        """c = draft step / target step."""
        return self.draft_step(rows) / self.target_step(rows)

    def verify(self, k: int, rows: float = 1) -> float:
        """One target forward verifying a chain of k drafts: k + 1 tokens per row."""
        return self.target.at(rows, k + 1)

    def forwards(self, branching: tuple[int, ...], rows: float = 1) -> float:
        """The forwards of one step drafting ``branching`` (a chain of k: k ones; () drafts nothing): a chain's k
        draft steps and its verification; a tree's root feed, one draft forward per level but the last, and its
        verification of N nodes."""
        if all(b == 1 for b in branching):
            k = len(branching)
            return self.draft_chain(k, rows) + self.verify(k, rows)
        widths = [math.prod(branching[:depth]) for depth in range(1, len(branching))]  # levels fed as drafts
        nodes = sum(math.prod(branching[:depth]) for depth in range(1, len(branching) + 1))
        level_costs = sum(self.draft_tree.at(rows, width - 1) if width > 1 else self.draft_step(rows)
                          for width in widths)
        return self.draft_step(rows) + level_costs + self.target_tree.at(rows, nodes)

    def step(self, branching: tuple[int, ...], rows: float = 1) -> float:
        """One step's seconds: its forwards and the loop's overhead for its kind."""
        kind = "baseline" if not branching else "chain" if all(b == 1 for b in branching) else "tree"
        return self.forwards(branching, rows) + self.overhead.get(kind, 0.0)

    def chain_step(self, k: int, rows: float = 1) -> float:
        return self.step((1,) * k, rows)

    def baseline_step(self, rows: float = 1) -> float:
        return self.step((), rows)

    def speedup(self, alpha: float, k: int, rows: float = 1) -> float:
        """Leviathan's expected tokens per step, E = sum_{i=0..k} alpha^i, over the measured step costs instead of
        his one target step per verification: E baseline_step / chain_step(k). Unitless, whatever the costs' unit."""
        return expected_tokens(alpha, k) * self.baseline_step(rows) / self.chain_step(k, rows)

    def milliseconds(self, rows: int = 1) -> dict[str, float]:
        """The chain costs at ``rows`` in milliseconds, for a table: ``draft`` and ``target_<n>`` per width n
        measured there."""
        widths = self.target.seconds.get(rows, {})
        return {"draft": 1000 * self.draft_step(rows),
                **{f"target_{n}": 1000 * self.target.at(rows, n) for n in sorted(widths)}}

    def to_json(self) -> dict:
        tables = {"target": self.target, "draft": self.draft, "target_tree": self.target_tree,
                  "draft_tree": self.draft_tree}
        return {**{name: table.to_json() for name, table in tables.items() if table is not None},
                "overhead": dict(self.overhead), "setting": self.setting}


def expected_tokens(alpha: float, k: int) -> float:
    """E = sum_{i=0..k} alpha^i: the tokens a chain of k emits per step when each draft is kept with probability
    alpha (Leviathan et al. 2023); 1 at k = 0."""
    return sum(alpha**i for i in range(k + 1))


def doubling_rows(batch_size: int) -> list[int]:
    """1, 2, 4, ... below ``batch_size``, and ``batch_size`` itself: the row counts a cost table is measured at, so
    every batch that rows leaving make of it lies between two of them."""
    rows = [1]
    while rows[-1] * 2 < batch_size:
        rows.append(rows[-1] * 2)
    return rows + ([batch_size] if batch_size > 1 else [])


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """Costs by size fitted non-decreasing (isotonic regression, pool adjacent violators), as the tree search fits
    its profiles: a spike is averaged with its neighbours rather than carried to every larger size. It also flattens
    real dips (``measure_table``), which is why the draft-length policy's tables are not fitted."""
    blocks: list[list[float]] = []  # [mean, count] of pooled runs of sizes
    for n in sorted(costs):
        blocks.append([costs[n], 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (upper, m), (lower, k) = blocks.pop(), blocks.pop()
            blocks.append([(upper * m + lower * k) / (m + k), m + k])
    fitted = [mean for mean, count in blocks for _ in range(int(count))]
    return dict(zip(sorted(costs), fitted))


def measure_table(model: torch.nn.Module, rows: Iterable[int], widths: Iterable[int], repeats: int = 3,
                  context: int = COST_CONTEXT, forward: str = "auto", clock: Clock | None = None,
                  label: str = "model", seed: int = 0) -> CostTable:
    """A model's ``CostTable``: the seconds of its forward of each of ``widths`` tokens per row over a cache of
    ``context`` random tokens per row, at each of ``rows`` (``specdec.profile.time_forwards``, eager, as the host
    step runs it): the fastest of ``repeats`` rounds, since load on a shared machine only ever adds time. Not
    fitted: a forward of more tokens can cost less (the embedded target on a 2-core CPU, one row: 5 tokens 8.2 ms,
    3 tokens 11.8 ms, the matrix kernels changing with the tokens multiplied), and a choice of k needs the dip."""
    widths = sorted(set(widths))
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    width = max(context, max(widths))
    seconds = {}
    for b in sorted(set(rows)):
        prompt = torch.randint(0, model.config.vocab_size, (b, width), generator=generator).to(device)  # [b, C]
        rounds = [time_forwards(model, prompt, widths, repeats=1, warmup=1 if not i else 0, clock=clock,
                                label=label, forward=forward) for i in range(repeats)]
        seconds[b] = {n: min(r[n] for r in rounds) for n in widths}
    return CostTable(seconds)


def measure_costs(target: torch.nn.Module, draft: torch.nn.Module | None, batch_size: int, k_max: int,
                  repeats: int = 3, forward: str = "auto", clock: Clock | None = None) -> CostModel:
    """The chain costs of ``target`` drafted by ``draft`` (None: no model to time) for batches of up to
    ``batch_size`` rows and drafts of up to ``k_max`` tokens: the target's forward of every width 1..k_max + 1
    tokens per row (interpolating between widths would hide the dips ``measure_table`` keeps) and the draft's of
    one and two (``CostModel.draft_chain``), at ``doubling_rows(batch_size)`` rows. A second or two for the
    embedded pair on a CPU at batch 1, more at larger batches."""
    rows = doubling_rows(batch_size)
    weight = next(target.parameters())
    setting = f"{weight.device.type}, {str(weight.dtype).removeprefix('torch.')}"
    target_table = measure_table(target, rows, range(1, k_max + 2), repeats, forward=forward, clock=clock,
                                 label="target")
    draft_table = None if draft is None else measure_table(draft, rows, [1, 2], repeats, forward=forward, clock=clock,
                                                           label="draft")
    return CostModel(target_table, draft_table, setting=setting)
