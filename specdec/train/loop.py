"""The one training loop: drafters against their target (the three families) and the embedded pair's own models
(its target pretrained on text, its draft distilled), checkpoints that survive kill -9, and data parallelism over
ranks (torchrun).

- ``Family``: what is trained (an EAGLE head, Medusa heads, or the pair's draft model, always in fp32), its loss
  (a ``specdec.train.losses`` function) and the target's hidden states its batches carry; ``Family.save`` writes the
  checkpoint directory the library loads (``specdec.checkpoints``).
- ``train`` runs the loop, the only optimizer step: batches from a ``Batches`` source (``SequenceBatches``: an
  order fixed by the seed and the step alone; the pair's sources in ``specdec.train.data`` draw from a generator
  whose state the checkpoint keeps), so a resumed run draws the batches an uninterrupted one would; AdamW with the
  one schedule (``learning_rate``: warm-up, then cosine decay, over steps or over wall time); the simulated
  acceptance length on held-out data every ``eval_every`` steps (the best one kept in ``drafter/``), where there is
  held-out data; a checkpoint of everything the next step needs (weights, optimizer, RNG, batch order, the best
  weights) every ``checkpoint_every`` steps or ``checkpoint_minutes``, written beside and renamed.
- Data parallelism: each rank takes its slice of the global batch; every loss is a mean over the global batch's
  counted positions (``global_mean``), so gradients summed over ranks (one all-reduce of one flat buffer) are one
  process's gradients on that batch. The heads run through their lean forward rather than ``module.forward``, which
  is why the gradients are reduced explicitly rather than by ``DistributedDataParallel``'s forward hooks.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from specdec.checkpoints import save_draft_model, save_drafter
from specdec.heads import EagleHead, MedusaHeads
from specdec.results import json_ready
from specdec.train.data import Batches, Sequences, target_hidden
from specdec.train.files import replace_bytes, save_state
from specdec.train.losses import TrainingBatch, draft_matches, masked_mean, simulated_acceptance, walked_acceptance
from specdec.types import StateRequest

KINDS = ("eagle", "medusa", "model")
STATE = re.compile(r"state-(\d{9})\.pt")
CHECKPOINT_KEYS = frozenset({"step", "module", "optimizer", "rng", "best", "seconds"})


class TrainingStopped(RuntimeError):
    """Training cannot go on as it is (a non-finite loss or weights, a checkpoint or log that is not this run's):
    one line saying what and what to do; nothing non-finite was written."""


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


# Ranks -------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ranks:
    """This process's place in a data-parallel run (torchrun's environment), or a single process."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def start_ranks(device: torch.device) -> Ranks:
    """Join torchrun's process group (gloo on CPU, nccl on CUDA) when it started several processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
    if not dist.is_initialized():
        from datetime import timedelta

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(hours=4))
    return Ranks(dist.get_rank(), dist.get_world_size())


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        dist.barrier()


def global_mean(ranks: Ranks) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """This rank's share of the mean over every rank's counted positions: ``sum(values * mask) / N_global``, so
    that the shares (and their gradients) summed over ranks are the global batch's mean."""
    if ranks.world == 1:
        return masked_mean

    def mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        count = mask.sum().to(torch.float64)
        dist.all_reduce(count)
        return (values * mask).sum() / count.clamp_min(1).to(values.dtype)
    return mean


def reduce_gradients(parameters: list[nn.Parameter], ranks: Ranks) -> None:
    """Sum the gradients over ranks, as one flat buffer."""
    if ranks.world == 1:
        return
    grads = [parameter.grad for parameter in parameters]
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat)
    for grad, part in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(part.view_as(grad))


def broadcast_module(module: nn.Module, ranks: Ranks) -> None:
    if ranks.world > 1:
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, 0)


def check_ranks_agree(module: nn.Module, ranks: Ranks) -> None:
    """Every rank must end with rank 0's weights (one all-reduce of each rank's difference from them)."""
    if ranks.world == 1:
        return
    for name, tensor in module.state_dict().items():
        reference = tensor.clone()
        dist.broadcast(reference, 0)
        difference = (tensor - reference).abs().max().double() if tensor.is_floating_point() else \
            (tensor != reference).any().double()
        dist.all_reduce(difference, op=dist.ReduceOp.MAX)
        if difference > 0:
            raise RuntimeError(f"ranks disagree on {name} after training (max difference {float(difference)})")


def summed(value: float, ranks: Ranks) -> float:
    if ranks.world == 1:
        return value
    total = torch.tensor(value, dtype=torch.float64)
    dist.all_reduce(total)
    return float(total)


def from_main(value: float, ranks: Ranks) -> float:
    """Rank 0's ``value``, on every rank: a time budget ends every rank at the same step, and a schedule that
    follows wall time gives every rank one learning rate."""
    if ranks.world == 1:
        return value
    shared = torch.tensor(float(value), dtype=torch.float64)
    dist.broadcast(shared, 0)
    return float(shared)


# Families ----------------------------------------------------------------------------------------------------------

@dataclass
class Family:
    """One drafter being trained: ``module`` (fp32), ``objective(module, target, batch, loss=, mean=)`` and the
    target's hidden states its batches carry: ``layers`` (transformers' numbering), the first ``features`` of them
    the head's input and the last one, always, the LM head's input."""

    kind: str
    module: nn.Module
    objective: Callable[..., torch.Tensor]
    layers: tuple[int, ...]
    features: int = 0

    def loss(self, target: nn.Module, batch: TrainingBatch, divergence: str, mean) -> torch.Tensor:
        return self.objective(self.module, target, batch, loss=divergence, mean=mean)

    def options(self) -> dict:
        return getattr(self.module, "options", {})

    def save(self, directory: Path, target: nn.Module, training: dict, dtype: torch.dtype) -> Path:
        """The checkpoint the library loads: ``EagleDrafter.from_pretrained``, ``MedusaDrafter.from_pretrained``,
        ``ModelDrafter.from_pair(pair, checkpoint=...)``."""
        if self.kind == "model":
            draft = copy.deepcopy(self.module).to(dtype).eval()
            return save_draft_model(directory, draft, target, training)
        return save_drafter(directory, self.kind, self.module, self.options(), target, training, dtype)


def hidden_layers(target: nn.Module, feature_layers: tuple[int, ...]) -> tuple[int, ...]:
    """The resolved feature layers in the head's order, then the last layer unless it is among them."""
    last = target.config.num_hidden_layers
    resolved = StateRequest(tuple(feature_layers)).resolved(last) if feature_layers else ()
    return resolved if last in resolved else (*resolved, last)


def build_family(kind: str, make_head: Callable | None, objective: Callable, pair,
                 draft_ids: list[int] | None = None) -> Family:
    """The family ``kind``: ``make_head(target, ...)`` completes the configured head (eagle, medusa); a model
    family trains a copy of the pair's draft."""
    target = pair.target
    if kind == "model":
        module, layers, features = copy.deepcopy(pair.draft), (target.config.num_hidden_layers,), 0
        return Family(kind, module.float().train().requires_grad_(True), objective, layers, features)
    module = make_head(target, draft_ids=draft_ids) if draft_ids is not None else make_head(target)
    family = {"eagle": EagleHead, "medusa": MedusaHeads}[kind]
    if not isinstance(module, family):
        raise TypeError(f"drafter={kind} builds a specdec.heads.{family.__name__}, got {type(module).__name__}")
    feature_layers = getattr(module, "feature_layers", ())
    layers, features = hidden_layers(target, feature_layers), len(feature_layers)
    return Family(kind, module.float().train().requires_grad_(True), objective, layers, features)


def frequent_tokens(sequences: Sequences, size: int) -> tuple[list[int], float]:
    """The ``size`` tokens that most often follow a counted position (EAGLE-3's draft vocabulary), and the
    fraction of those positions they cover."""
    following = sequences.tokens.roll(-1, 1)[sequences.counts]  # [P] the trained-on tokens
    frequency = torch.bincount(following)
    top = frequency.topk(min(size, frequency.numel())).indices
    return sorted(top.tolist()), float(frequency[top].sum() / following.numel())


def vocabulary_coverage(draft_ids: list[int], sequences: Sequences) -> float:
    """The fraction of ``sequences``' counted next tokens (held-out ones: the target's greedy continuations) inside
    the draft vocabulary ``draft_ids``: a ceiling on a_1, since a token outside it is never drafted."""
    following = sequences.tokens.roll(-1, 1)[sequences.counts]  # [P]
    inside = torch.isin(following, torch.tensor(draft_ids, device=following.device))  # [P]
    return float(inside.float().mean()) if following.numel() else float("nan")


# Batches -----------------------------------------------------------------------------------------------------------

@dataclass
class TrainingData:
    """The sequences, and the target's hidden states at ``Family.layers`` cached in memory ([N, W, H, D]), or None
    where each batch recomputes them."""

    sequences: Sequences
    hidden: torch.Tensor | None


def batch_rows(step: int, batch_size: int, count: int, seed: int) -> torch.Tensor:
    """[batch_size] the rows of global batch ``step``: slices of an endless stream of permutations (one per epoch,
    drawn from ``seed`` and the epoch), so any step's rows are known without replaying the ones before."""
    positions = torch.arange(step * batch_size, (step + 1) * batch_size)
    rows = torch.empty(batch_size, dtype=torch.long)
    for epoch in positions.div(count, rounding_mode="floor").unique().tolist():
        order = torch.randperm(count, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        inside = positions.div(count, rounding_mode="floor") == epoch
        rows[inside] = order[positions[inside] % count]
    return rows


def make_batch(data: TrainingData, rows: torch.Tensor, family: Family, target: nn.Module,
               device: torch.device) -> TrainingBatch:
    """A ``TrainingBatch`` of ``rows``, cut to its longest row, with the target's hidden states cached or
    computed now."""
    length = int(data.sequences.lengths[rows].max())
    tokens = data.sequences.tokens[rows, :length].to(device)  # [b, T]
    counts = data.sequences.counts[rows, :length].to(device)  # [b, T]
    if data.hidden is not None:
        hidden = data.hidden[rows, :length].to(device)  # [b, T, H, D]
    else:
        hidden = target_hidden(target, tokens, family.layers)
    hidden = hidden.to(next(target.parameters()).dtype)
    last = hidden[:, :, family.layers.index(target.config.num_hidden_layers)]  # [b, T, D]
    return TrainingBatch(tokens, last, counts, hidden[:, :, : family.features] if family.features else None)


def rank_slice(rows: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    share = rows.numel() // ranks.world
    return rows[ranks.rank * share:(ranks.rank + 1) * share]


@dataclass
class SequenceBatches(Batches):
    """Batches of fixed sequences (``TrainingData``) in ``batch_rows``' order, which the step alone decides (no
    state to keep), with the target's hidden states the family reads."""

    data: TrainingData
    family: Family
    target: nn.Module
    settings: Settings  # its batch_size (the global batch) and seed
    ranks: Ranks = Ranks()

    def draw(self, step: int) -> TrainingBatch:
        rows = batch_rows(step, self.settings.batch_size, len(self.data.sequences), self.settings.seed)
        rows = rank_slice(rows, self.ranks)
        return make_batch(self.data, rows, self.family, self.target, next(self.target.parameters()).device)

    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        pass


# Settings and state ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """The loop's settings (the training config's top-level keys; the embedded pair's script sets its own)."""

    steps: int
    batch_size: int
    lr: float
    divergence: str
    warmup: float = 0.05
    min_lr: float = 0.1  # the cosine decay's floor, as a fraction of lr
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 100
    checkpoint_every: int | None = 100  # steps between checkpoints; None: by checkpoint_minutes alone
    checkpoint_minutes: float | None = None  # also a checkpoint once this much wall time passed since the last
    k: int = 4
    eval_batch_size: int = 16
    schedule_minutes: float | None = None  # train for this wall time, the schedule following it; None: ``steps``
    max_minutes: float | None = None
    wall_deadline: float | None = None  # time.time() past which training stops (max_wall_minutes); None: never
    autocast: torch.dtype | None = None  # the forward's autocast dtype; None: the target's, where it is half precision
    seed: int = 0
    save_dtype: torch.dtype = torch.float32


WARMUP_START = 0.01  # the warm-up's first steps count as this much progress: a step at lr 0 would do nothing


def progress(step: int, seconds: float, settings: Settings) -> float:
    """How far training is, from 0 to 1: the wall time over ``schedule_minutes`` where it is set (a busy machine
    takes fewer steps rather than leaving the schedule unfinished), else the steps done over ``steps``."""
    if settings.schedule_minutes is not None:
        return seconds / (60 * settings.schedule_minutes)
    return step / settings.steps


def learning_rate(done: float, settings: Settings) -> float:
    """The one schedule, at progress ``done`` in [0, 1]: a linear warm-up over the first ``warmup`` of training
    (from ``WARMUP_START``), then cosine decay to ``min_lr`` times the peak ``lr``."""
    if done < settings.warmup:
        return settings.lr * max(done, min(WARMUP_START, settings.warmup)) / settings.warmup
    decay = (done - settings.warmup) / (1 - settings.warmup)
    return settings.lr * (settings.min_lr + (1 - settings.min_lr) * 0.5 * (1 + math.cos(math.pi * min(decay, 1.0))))


def make_optimizer(module: nn.Module, settings: Settings) -> torch.optim.Optimizer:
    """AdamW, weight decay on matrices only."""
    parameters = [parameter for parameter in module.parameters() if parameter.requires_grad]
    groups = [{"params": [p for p in parameters if p.ndim >= 2], "weight_decay": settings.weight_decay},
              {"params": [p for p in parameters if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95))


def forward_precision(settings: Settings, target: nn.Module | None, device: torch.device):
    """The autocast the loss is computed under: ``settings.autocast`` where set, else the target's half precision
    (``autocast_for``); the trained module stays fp32."""
    if settings.autocast is not None:
        return torch.autocast(device.type, dtype=settings.autocast)
    return autocast_for(target) if target is not None else nullcontext()


@dataclass
class Best:
    tau: float = -math.inf
    step: int | None = None
    per_position: list[float] = field(default_factory=list)
    weights: dict | None = None
    walked_tau: float | None = None  # absent from checkpoints written before it was measured


class Checkpoints:
    """``state-<step>.pt`` files in one directory: each written beside and renamed (a kill leaves the last whole
    one), older ones removed once a newer one is down."""

    def __init__(self, directory: Path):
        self.directory = directory

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(match[1]) for path in self.directory.iterdir() if (match := STATE.fullmatch(path.name)))

    def latest(self, last_step: int | None) -> dict | None:
        """The newest checkpoint, read whole; a file that cannot be this run's (beyond its ``last_step``, where
        the run has a number of steps) is a ``TrainingStopped`` line naming it and what to do."""
        steps = self.steps()
        if not steps:
            return None
        path = self.directory / f"state-{steps[-1]:09d}.pt"
        if last_step is not None and steps[-1] > last_step:
            raise TrainingStopped(f"{path} is beyond this run's {last_step} steps, so not this run's checkpoint: "
                                  f"delete it, or resume the run it belongs to")
        try:
            state = torch.load(path, weights_only=False)
        except Exception as err:  # noqa: BLE001 - torch.load raises many kinds over a damaged file
            raise TrainingStopped(f"{path} is damaged ({one_line(err)}): delete it to start the run over, or "
                                  f"resume from a copy of the run directory") from None
        if not isinstance(state, dict) or not CHECKPOINT_KEYS <= set(state) or state["step"] != steps[-1]:
            raise TrainingStopped(f"{path} is not a training checkpoint of this loop (it needs "
                                  f"{', '.join(sorted(CHECKPOINT_KEYS))}): delete it to start the run over")
        return state

    def save(self, state: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        save_state(state, self.directory / f"state-{state['step']:09d}.pt")
        for step in self.steps():
            if step < state["step"]:
                (self.directory / f"state-{step:09d}.pt").unlink()


class TrainingLog:
    """``log.jsonl``: one strict-JSON line per step (loss, lr) and per evaluation (tau, a_i; a non-finite figure is
    null). A resumed run first drops the lines after its checkpoint, which it is about to compute again, so no line
    is lost or written twice; a damaged line (cut by a kill, or edited) is moved to ``log.jsonl.damaged``, never
    dropped with the good lines after it."""

    def __init__(self, path: Path, through_step: int):
        self.path = path
        kept, damaged = self.read()
        if damaged:
            with open(path.with_name(path.name + ".damaged"), "a", encoding="utf-8") as aside:
                aside.write("".join(text + "\n" for text in damaged))
        replace_bytes(path, "".join(json.dumps(line, allow_nan=False) + "\n" for line in kept
                                    if line["step"] <= through_step).encode())
        self.handle = open(path, "a", encoding="utf-8")

    def read(self) -> tuple[list[dict], list[str]]:
        """The log's lines, and the texts of those that are not a line of this log."""
        if not self.path.is_file():
            return [], []
        lines, damaged = [], []
        for text in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                line = json.loads(text, parse_constant=reject_constant)
            except ValueError:
                line = None
            if isinstance(line, dict) and isinstance(line.get("step"), int) and not isinstance(line["step"], bool):
                lines.append(line)
            elif text.strip():
                damaged.append(text)
        return lines, damaged

    def lines(self) -> list[dict]:
        return self.read()[0]

    def write(self, line: dict) -> None:
        self.handle.write(json.dumps(json_ready(line), allow_nan=False) + "\n")
        self.handle.flush()

    def sync(self) -> None:
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


def reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# Evaluation --------------------------------------------------------------------------------------------------------

def heldout_batches(sequences: Sequences, family: Family, target: nn.Module, device: torch.device,
                    batch_size: int) -> list[TrainingBatch]:
    """The held-out sequences as batches with the target's hidden states (computed once, in its dtype)."""
    data = TrainingData(sequences, None)
    return [make_batch(data, torch.arange(first, min(first + batch_size, len(sequences))), family, target, device)
            for first in range(0, len(sequences), batch_size)]


@dataclass
class Evaluation:
    """What the held-out data says of a drafter at temperature 0: the per-position acceptance a_1..a_k and tau
    over every prefix (``simulated_acceptance``, SpecForge's and NeMo's figure), and the tau the loop would measure
    (``walked_acceptance``: steps start after rejections, and a head's prefill emits one token alone)."""
    per_position: list[float]
    tau: float
    walked_per_position: list[float]
    walked_tau: float


@torch.no_grad()
def evaluate(family: Family, target: nn.Module, batches: list[TrainingBatch], k: int) -> Evaluation:
    """The drafter's acceptance on held-out greedy data (see ``Evaluation``)."""
    module, training = family.module, family.module.training
    module.eval()
    found = []
    with autocast_for(target):
        for batch in batches:
            matches, counted = draft_matches(module, target, batch, k)  # [b, T, k], [b, T]
            found.append((matches, counted, batch.counts))
    module.train(training)
    every = torch.cat([matches[counted] for matches, counted, _ in found])  # [P, k] prefixes with k steps counted
    rates, tau = simulated_acceptance(every, torch.ones(every.shape[0], dtype=torch.bool))
    width = max(counts.shape[1] for _, _, counts in found)
    matches = torch.cat([F.pad(m, (0, 0, 0, width - m.shape[1])) for m, _, _ in found])  # [B, T, k]
    counts = torch.cat([F.pad(c, (0, width - c.shape[1])) for _, _, c in found])  # [B, T]
    walked_rates, walked_tau = walked_acceptance(matches, counts, drafts_first=family.kind == "model")
    return Evaluation(rates, tau, walked_rates, walked_tau)


def autocast_for(target: nn.Module):
    """Mixed precision where the target is in half precision: the trained module stays fp32."""
    dtype = next(target.parameters()).dtype
    device = next(target.parameters()).device
    return torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()


# Plot --------------------------------------------------------------------------------------------------------------

def plot_tau(lines: list[dict], path: Path) -> None:
    """tau against step, from the log's evaluation lines: over every prefix, and walked as the loop walks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluations = [line for line in lines if "tau" in line]
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot([line["step"] for line in evaluations], [line["tau"] for line in evaluations], marker="o",
              label="every prefix (SpecForge's figure)")
    walked = [line for line in evaluations if line.get("walked_tau") is not None]
    axis.plot([line["step"] for line in walked], [line["walked_tau"] for line in walked], marker="s",
              label="walked (the loop's τ)")
    axis.legend()
    axis.set_xlabel("step")
    axis.set_ylabel("simulated τ (held-out, greedy)")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    partial = path.with_name(path.name + ".partial.png")
    figure.savefig(partial, dpi=100)
    plt.close(figure)
    partial.replace(path)


# The loop ----------------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    steps: int  # steps done
    finished: bool  # the schedule's end (else stopped by max_minutes or wall_deadline)
    seconds: float  # training wall time, over every resumed part
    best: Best


def train(settings: Settings, family: Family, target: nn.Module | None, batches: Batches, out: Path, *,
          heldout: list[TrainingBatch] | None = None, ranks: Ranks = Ranks(), logger=None,
          training_info: dict | None = None, progress_of=None) -> Outcome:
    """Train ``family`` against ``target`` (its teacher; None where the module learns from the text alone) from the
    last checkpoint in ``out/checkpoint`` (or from the start), on ``batches``.

    With ``heldout`` (rank 0's; the other ranks pass []), the drafter's simulated tau is measured every
    ``eval_every`` steps and the best weights are kept in ``out/drafter``; without it (None) the module's final
    weights are the result. The module is left in eval mode."""
    device = next((target if target is not None else family.module).parameters()).device
    module = family.module.to(device).train()
    optimizer = make_optimizer(module, settings)
    checkpoints = Checkpoints(out / "checkpoint")
    state = checkpoints.latest(settings.steps if settings.schedule_minutes is None else None)
    best, start, seconds = Best(), 0, 0.0
    if state is not None:
        resume_from(state, module, optimizer, batches, checkpoints.directory)
        best, start, seconds = Best(**state["best"]), state["step"], state["seconds"]
    broadcast_module(module, ranks)
    if ranks.main:
        out.mkdir(parents=True, exist_ok=True)
    log = TrainingLog(out / "log.jsonl", start) if ranks.main else None
    if ranks.main and heldout is not None and best.weights is not None:  # the best drafter, as the checkpoint knew it
        save_best(family, best, target, out, training_info or {}, settings)
    mean = global_mean(ranks)
    recent: deque[float] = deque(maxlen=20)
    began = time.perf_counter() - seconds
    saved_at = time.perf_counter()
    step = start
    finished = from_main(progress(step, seconds, settings), ranks) >= 1
    stopped = False
    while not (finished or stopped):
        done = from_main(progress(step, time.perf_counter() - began, settings), ranks)
        value = training_step(step, done, family, target, batches.draw(step), optimizer, settings, ranks, mean)
        step += 1
        recent.append(value)
        seconds = time.perf_counter() - began
        rate = optimizer.param_groups[0]["lr"]
        if log is not None:
            log.write({"step": step, "loss": value, "lr": rate, "seconds": round(seconds, 3)})
        if logger is not None:
            logger.log_step({"loss": value, "lr": rate}, step)
        finished = from_main(progress(step, seconds, settings), ranks) >= 1
        stopped = bool(from_main((settings.max_minutes is not None and seconds >= 60 * settings.max_minutes)
                                 or (settings.wall_deadline is not None and time.time() >= settings.wall_deadline),
                                 ranks))
        last = finished or stopped
        evaluating = heldout is not None and (step % settings.eval_every == 0 or last)
        saving = last or (settings.checkpoint_every is not None and step % settings.checkpoint_every == 0) or bool(
            from_main(settings.checkpoint_minutes is not None
                      and time.perf_counter() - saved_at >= 60 * settings.checkpoint_minutes, ranks))
        if (evaluating or saving) and not finite_weights(module):
            raise TrainingStopped(f"the weights hold non-finite values after step {step} (lower lr, keep grad_clip "
                                  f"> 0); they were not written: the last checkpoint and drafter/ are as they were")
        if ranks.main and evaluating:
            best = measure_best(family, target, heldout, settings, step, best, log, logger, out, training_info or {})
        if saving:
            if ranks.main:
                log.sync()
                checkpoints.save({"step": step, "module": module.state_dict(), "optimizer": optimizer.state_dict(),
                                  "rng": torch.get_rng_state(), "best": best.__dict__, "seconds": seconds,
                                  "batches": batches.state()})
            saved_at = time.perf_counter()
            barrier(ranks)
        if progress_of is not None:
            progress_of(step, sum(recent) / len(recent), best)
    check_ranks_agree(module, ranks)
    module.eval()
    if log is not None:
        log.close()
    if ranks.main and heldout is not None and best.step is None:  # rank 0 evaluates
        raise TrainingStopped(f"no evaluation measured a finite tau in {step} steps (heldout.k={settings.k} needs "
                              f"held-out continuations longer than k), so no drafter was written")
    return Outcome(step, finished, seconds, best)


def measure_best(family: Family, target: nn.Module, heldout: list[TrainingBatch], settings: Settings, step: int,
                 best: Best, log: TrainingLog, logger, out: Path, training_info: dict) -> Best:
    """Evaluate the drafter on the held-out batches, log it, and keep (in ``out/drafter``) the best so far."""
    found = evaluate(family, target, heldout, settings.k)
    log.write({"step": step, "tau": found.tau, "per_position": found.per_position, "walked_tau": found.walked_tau})
    if logger is not None:
        logger.log_step({"tau": found.tau, "walked_tau": found.walked_tau,
                         **{f"a_{i}": a for i, a in enumerate(found.per_position, 1)}}, step)
    if math.isfinite(found.tau) and found.tau > best.tau:
        best = Best(found.tau, step, found.per_position, {name: tensor.detach().clone().cpu()
                                                           for name, tensor in family.module.state_dict().items()},
                    found.walked_tau)
        save_best(family, best, target, out, training_info, settings)
    plot_tau(log.lines(), out / "tau.png")
    return best


def training_step(step: int, done: float, family: Family, target: nn.Module | None, batch: TrainingBatch,
                  optimizer: torch.optim.Optimizer, settings: Settings, ranks: Ranks, mean) -> float:
    """Optimizer step ``step`` (from 0) on ``batch``, at progress ``done`` of the schedule: the family's loss (under
    ``forward_precision``), its gradients summed over ranks and clipped, AdamW at the schedule's learning rate.
    Returns the loss, summed over ranks; a non-finite one stops training before anything is changed."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(done, settings)
    with forward_precision(settings, target, next(family.module.parameters()).device):
        loss = family.loss(target, batch, settings.divergence, mean)
    value = summed(float(loss.detach()), ranks)
    if not math.isfinite(value):
        raise TrainingStopped(f"the loss at step {step + 1} is {value}: training diverged (lower lr, keep "
                              f"grad_clip > 0, check the loss weights); nothing non-finite was written, the "
                              f"last checkpoint and drafter/ are as they were")
    parameters = [parameter for parameter in family.module.parameters() if parameter.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    reduce_gradients([parameter for parameter in parameters if parameter.grad is not None], ranks)
    if settings.grad_clip:
        torch.nn.utils.clip_grad_norm_(parameters, settings.grad_clip)
    optimizer.step()
    return value


def resume_from(state: dict, module: nn.Module, optimizer: torch.optim.Optimizer, batches: Batches,
                directory: Path) -> None:
    """Load a checkpoint's module, optimizer, RNG and batch order; one that belongs to another drafter is named."""
    path = directory / f"state-{state['step']:09d}.pt"
    try:
        module.load_state_dict(state["module"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        batches.restore(state.get("batches", {}))  # checkpoints of sequence batches written before it was kept
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        raise TrainingStopped(f"{path} is another drafter's checkpoint ({one_line(err)[:200]}): delete {directory} to "
                              f"start over, or resume the run it belongs to") from None


def finite_weights(module: nn.Module) -> bool:
    return all(bool(torch.isfinite(tensor).all()) for tensor in module.state_dict().values()
               if tensor.is_floating_point())


def save_best(family: Family, best: Best, target: nn.Module, out: Path, training_info: dict,
              settings: Settings) -> None:
    """``out/drafter``: the best weights with the config naming the target and what training measured."""
    weights = {name: tensor.clone() for name, tensor in family.module.state_dict().items()}
    family.module.load_state_dict(best.weights)
    info = {**training_info, "best_step": best.step, "simulated_tau": best.tau, "per_position": best.per_position,
            "walked_tau": best.walked_tau, "k": settings.k}
    family.save(out / "drafter", target, info, settings.save_dtype)
    family.module.load_state_dict(weights)


def print_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
