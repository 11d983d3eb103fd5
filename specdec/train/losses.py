"""Training drafters against their target: the divergences, each family's loss, and simulated acceptance.

Every loss compares the drafter's distribution q with the target's p at the positions it drafts, on sequences the
target scored (``TrainingBatch``: tokens, the target's hidden states, which positions count):

- ``divergence``: "kl" KL(p || q) (forward; soft cross-entropy up to a constant), "rkl" KL(q || p), "jsd" the
  Jensen-Shannon divergence, "tv" the total variation 1/2 sum |p - q| (1 - tv is speculative sampling's acceptance),
  "ce" the cross-entropy of the target's token;
- ``eagle_loss``: EAGLE's feature regression (smooth L1 to the target's next feature, where the head predicts the
  target's last layer) plus the divergence of its logits, over ``passes`` unrolled draft steps: pass j feeds the
  features pass j - 1 predicted, attending the real prefix and the earlier passes' slots as drafting does (EAGLE-3's
  training-time test);
- ``medusa_loss``: head i against p at i + 1 positions ahead;
- ``draft_loss``: a draft model's divergence at every position;
- ``next_token_loss`` and ``distillation_loss``: how the embedded pair's models are trained (its target from text
  alone; its draft toward the target run as a teacher, w KL(p || q) + (1 - w) CE), with torch's own reductions over
  the batch, exactly as the shipped pair was trained, so they are for a single process.

A head with a reduced draft vocabulary (either kind) is scored over that vocabulary only and compared with p
restricted to it and renormalised, at the positions whose target choice lies inside it (``next_token_targets``,
EAGLE-3's rule: q is 0 outside, so every divergence but tv would be infinite there).

Each loss averages over the positions that count with ``mean(values, mask)`` (default ``masked_mean``, this batch's
mean); data-parallel training passes a mean over the whole global batch instead, so that gradients summed over
ranks equal one process's on that batch.

Simulated acceptance (``simulated_acceptance``): at temperature 0, draft step i from a prefix is accepted when it
equals the target's argmax, given steps 1..i-1 were; over every prefix of held-out greedy continuations this gives
the per-position acceptance a_i and tau = 1 + sum_k prod_{i <= k} a_i (SpecForge's and NeMo's simulated acceptance
length), which the loop's measured tau should approach.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.heads import DraftHead, EagleHead, MedusaHeads, medusa_logits, target_head_weight

DIVERGENCES = ("kl", "rkl", "jsd", "tv", "ce")
Mean = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (values [...], mask [...]) -> the mean that counts


@dataclass
class TrainingBatch:
    """Sequences the target scored, right-padded."""

    tokens: torch.Tensor  # [B, T] long
    last: torch.Tensor | None  # [B, T, D] the target's last hidden state (its LM head's input): p of token t + 1
    # at t; None in the embedded pair's batches, whose losses run their teacher (if any) themselves
    counts: torch.Tensor  # [B, T] bool: position t's next token is trained on (the continuation, not padding)
    hidden: torch.Tensor | None = None  # [B, T, H, D] the target's hidden states at the layers an EAGLE head reads


def check_divergence(name: object) -> str:
    if name not in DIVERGENCES:
        raise ValueError(f"loss must be one of {', '.join(DIVERGENCES)}, got {name!r}")
    return name


def divergence(name: str, draft_logits: torch.Tensor, target_logits: torch.Tensor,
               target_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] logits of q and p -> [...] the divergence ``name`` at each position (``target_tokens`` [...] for
    "ce": the target's tokens)."""
    log_q = draft_logits.float().log_softmax(-1)
    if name == "ce":
        return -log_q.gather(-1, target_tokens.unsqueeze(-1)).squeeze(-1)
    log_p = target_logits.float().log_softmax(-1)
    p, q = log_p.exp(), log_q.exp()
    if name == "kl":
        return (p * (log_p - log_q)).sum(-1)
    if name == "rkl":
        return (q * (log_q - log_p)).sum(-1)
    if name == "tv":
        return 0.5 * (p - q).abs().sum(-1)
    log_m = (0.5 * (p + q)).clamp_min(torch.finfo(p.dtype).tiny).log()
    return 0.5 * (p * (log_p - log_m)).sum(-1) + 0.5 * (q * (log_q - log_m)).sum(-1)  # jsd


def target_logits(target: nn.Module, last: torch.Tensor) -> torch.Tensor:
    """[..., D] the target's last hidden states -> [..., V] its logits (its own LM head, frozen)."""
    return F.linear(last, target_head_weight(target).detach())


def next_token_targets(head: DraftHead, target: nn.Module, batch: TrainingBatch, loss: str
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """By position t, what a head learns of token t + 1, over its draft vocabulary: [B, T, V_d] p's logits, [B, T]
    the token t + 1 as a position in the draft vocabulary (for "ce"), and [B, T] whether the target's choice (that
    token for "ce", else p's argmax) lies inside it. Over the whole vocabulary: p, the tokens, everywhere."""
    p = target_logits(target, batch.last)  # [B, T, V]
    following = batch.tokens.roll(-1, 1)  # [B, T] token t + 1
    if not head.reduced:
        return p, following, torch.ones_like(batch.counts)
    index = head.draft_index(p.shape[-1])  # [V] target id -> draft position, -1 outside
    choice = following if loss == "ce" else p.argmax(-1)  # [B, T]
    return p.index_select(-1, head.draft_ids), index[following].clamp_min(0), index[choice] >= 0


def eagle_passes(head: EagleHead, target: nn.Module, batch: TrainingBatch, passes: int, reduced: bool = False
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The head's first ``passes`` draft steps from every prefix at once: per pass j, [B, T, V] logits and
    [B, T, D] predicted features, position t predicting token t + 2. Pass 0 reads the target's features; pass j
    reads pass j - 1's prediction at t - 1 and attends the real prefix up to t - j and pass i's slot at t - j + i,
    as the head does while drafting. Differentiable. ``reduced``: logits over the head's draft vocabulary only,
    [B, T, V_d] in ``head.draft_ids`` order (its loss; drafting sees -inf elsewhere; all of V where not reduced)."""
    forward = head.lean(target)
    batch_size, length = batch.tokens.shape
    device = batch.tokens.device
    keys, values = forward.new_buffers(batch_size, passes * length, device)
    key_buffer, value_buffer = keys[0], values[0]
    positions = torch.arange(length, device=device).expand(batch_size, -1)  # [B, T]
    next_tokens = torch.cat([batch.tokens[:, 1:], batch.tokens[:, -1:]], 1)  # [B, T] the token after each position
    features = head.fused(batch.hidden)  # [B, T, D]
    rows = torch.arange(batch_size, device=device).unsqueeze(1)
    outputs = []
    for j in range(passes):
        hidden, rotary = forward.embed(next_tokens, positions, features)
        write = (rows, slice(None), positions + j * length)
        mask = pass_mask(j, length, device).expand(batch_size, 1, -1, -1)  # [B, 1, T, (j+1) T]
        # Each pass writes into its own copy: the passes before it read theirs, and autograd keeps those as read.
        key_buffer, value_buffer = key_buffer.clone(), value_buffer.clone()
        hidden = forward.block(0, hidden, rotary, write, mask, key_buffer, value_buffer)
        predicted = forward.final_norm(hidden)  # [B, T, D]
        logits = F.linear(predicted, forward.draft_weight) if reduced else forward.lm_head(predicted)
        outputs.append((logits, predicted))
        features = torch.cat([torch.zeros_like(predicted[:, :1]), predicted[:, :-1]], 1)  # pass j's at t - 1
    return outputs


def pass_mask(j: int, length: int, device: torch.device) -> torch.Tensor:
    """[T, (j+1) T] bool: what pass j at position t attends: pass 0's slots up to t - j, pass i's slot t - j + i
    (0 < i < j) and its own. Positions t < j (no real prefix) attend their own slot only."""
    t = torch.arange(length, device=device)
    columns = [t.unsqueeze(0) <= (t - j).unsqueeze(1)]  # [T, T] the real prefix
    for i in range(1, j + 1):
        columns.append(torch.eye(length, dtype=torch.bool, device=device).roll(-(j - i), 1)
                       & (t >= j).unsqueeze(1) if i < j else torch.eye(length, dtype=torch.bool, device=device))
    return torch.cat(columns, 1)


def eagle_loss(head: EagleHead, target: nn.Module, batch: TrainingBatch, loss: str = "kl", passes: int = 1,
               feature_weight: float = 1.0, token_weight: float = 0.1, pass_decay: float = 0.8,
               mean: Mean | None = None) -> torch.Tensor:
    """EAGLE's loss over ``passes`` unrolled steps (pass j weighted ``pass_decay``^j): smooth L1 from the
    predicted feature to the target's next last-layer feature (where the head reads the last layer alone) plus
    ``token_weight`` times the divergence from p at the position predicted (with a reduced draft vocabulary: from
    p over that vocabulary, renormalised, where the target's choice lies inside it)."""
    mean = mean or masked_mean
    total = 0.0
    regress = feature_weight and tuple(head.feature_layers) == (-1,)
    p, tokens, inside = next_token_targets(head, target, batch, loss)  # [B, T, V_d], [B, T], [B, T]
    for j, (logits, predicted) in enumerate(eagle_passes(head, target, batch, passes, reduced=True)):
        counts = shifted_counts(batch.counts, 1, j) & inside.roll(-1, 1)  # [B, T] position t predicts token t + 2
        term = token_weight * divergence(loss, logits, p.roll(-1, 1), tokens.roll(-1, 1))
        if regress:
            term = term + feature_weight * F.smooth_l1_loss(predicted, batch.last.roll(-1, 1), reduction="none").mean(-1)
        total = total + pass_decay**j * mean(term, counts)
    return total


def medusa_loss(heads: MedusaHeads, target: nn.Module, batch: TrainingBatch, loss: str = "kl",
                mean: Mean | None = None) -> torch.Tensor:
    """Head i at position t against p at t + i + 1 (it predicts token t + i + 2); heads weighted alike. With a
    reduced draft vocabulary, over that vocabulary where the target's choice lies inside it (``next_token_targets``)."""
    mean = mean or masked_mean
    logits = medusa_logits(heads, target, batch.last, reduced=True)  # [B, T, K, V_d]
    p, tokens, inside = next_token_targets(heads, target, batch, loss)  # [B, T, V_d], [B, T], [B, T]
    total = 0.0
    for i in range(heads.num_heads):
        ahead = i + 1  # head i's distribution is p's at t + i + 1
        counts = shifted_counts(batch.counts, ahead, 0) & inside.roll(-ahead, 1)  # [B, T]
        term = divergence(loss, logits[:, :, i], p.roll(-ahead, 1), tokens.roll(-ahead, 1))
        total = total + mean(term, counts)
    return total / heads.num_heads


def draft_loss(draft: nn.Module, target: nn.Module, batch: TrainingBatch, loss: str = "kl",
               mean: Mean | None = None) -> torch.Tensor:
    """A draft model's divergence from p at every counted position (it predicts token t + 1 from position t)."""
    mean = mean or masked_mean
    logits = draft(batch.tokens).logits  # [B, T, V]
    term = divergence(loss, logits, target_logits(target, batch.last), torch.roll(batch.tokens, -1, 1))
    return mean(term, batch.counts)


def counted_logits(model: nn.Module, batch: TrainingBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's fp32 logits at the counted positions: [n, V]; with the ``batch.tokens`` [B, T] it reads (all but
    the last, whose next token is unknown) and [B, T - 1] where it counts."""
    inputs, counted = batch.tokens[:, :-1], batch.counts[:, :-1]  # [B, T-1], [B, T-1]
    return model(inputs).logits.float()[counted], inputs, counted  # [n, V]


def single_process(mean: Mean | None, name: str) -> None:
    if mean not in (None, masked_mean):
        raise ValueError(f"{name} reduces over this process's batch (torch's own mean, as the embedded pair was "
                         f"trained): run it in a single process")


def next_token_loss(model: nn.Module, teacher: None, batch: TrainingBatch, loss: str = "ce",
                    mean: Mean | None = None) -> torch.Tensor:
    """Pretraining from text (the embedded pair's target): the mean cross-entropy of each counted next token."""
    if loss != "ce" or teacher is not None:
        raise ValueError(f"next_token_loss is the cross-entropy of the text (loss 'ce', no teacher), got loss "
                         f"{loss!r} and a {type(teacher).__name__} teacher")
    single_process(mean, "next_token_loss")
    logits, _, counted = counted_logits(model, batch)
    return F.cross_entropy(logits, batch.tokens[:, 1:][counted])


def distillation_loss(draft: nn.Module, teacher: nn.Module, batch: TrainingBatch, loss: str = "kl",
                      mean: Mean | None = None, kl_weight: float = 0.8) -> torch.Tensor:
    """The embedded pair's distillation: ``kl_weight`` KL(p || q) + (1 - ``kl_weight``) CE at the counted positions,
    p from the teacher run on the batch now (under the loop's autocast), q the draft's; KL averaged over positions
    (``batchmean``), CE the mean cross-entropy of the batch's next tokens."""
    if loss != "kl":
        raise ValueError(f"distillation_loss mixes KL(p || q) with the cross-entropy (loss 'kl'), got {loss!r}")
    if not 0 <= kl_weight <= 1:
        raise ValueError(f"kl_weight must be in [0, 1], got {kl_weight!r}")
    single_process(mean, "distillation_loss")
    logits, inputs, counted = counted_logits(draft, batch)  # [n, V]
    ce = F.cross_entropy(logits, batch.tokens[:, 1:][counted])
    with torch.no_grad():
        teacher_logp = F.log_softmax(teacher(inputs).logits.float()[counted], dim=-1)  # [n, V]
    kl = F.kl_div(F.log_softmax(logits, dim=-1), teacher_logp, log_target=True, reduction="batchmean")
    return kl_weight * kl + (1 - kl_weight) * ce


def shifted_counts(counts: torch.Tensor, ahead: int, prefix: int) -> torch.Tensor:
    """[B, T] the positions t where ``counts`` holds at t + ``ahead`` (the token trained on there is counted) and
    that have ``prefix`` positions before them (draft step j + 1 of an EAGLE head needs j)."""
    shifted = torch.zeros_like(counts)
    length = counts.shape[1]
    if ahead < length:
        shifted[:, : length - ahead] = counts[:, ahead:]
    shifted[:, :prefix] = False
    return shifted


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1)


@torch.no_grad()
def draft_matches(drafter: nn.Module, target: nn.Module, batch: TrainingBatch, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """At temperature 0, [B, T, k] whether draft step i + 1 from the prefix ending at token t + 1 (an EAGLE or
    Medusa head; a draft model: at token t) equals the target's argmax there, given the prefix; and [B, T] the
    prefixes whose k steps all lie in counted tokens."""
    choice = target_logits(target, batch.last).argmax(-1)  # [B, T] the target's choice of token t + 1
    if isinstance(drafter, EagleHead):  # pass i at position t + i predicts token t + i + 2
        steps = [drafter.target_ids(logits.argmax(-1)) for logits, _ in eagle_passes(drafter, target, batch, k, True)]
        guesses = torch.stack([steps[i].roll(-i, 1) for i in range(k)], -1)  # [B, T, k]
        ahead = 1
    elif isinstance(drafter, MedusaHeads):  # head i at position t predicts token t + i + 2
        logits = medusa_logits(drafter, target, batch.last, reduced=True)[..., :k, :]  # [B, T, k, V_d]
        guesses = drafter.target_ids(logits.argmax(-1))  # [B, T, k] target ids
        ahead = 1
    else:  # teacher forced: position t + i predicts token t + i + 1
        argmax = drafter(batch.tokens).logits.argmax(-1)  # [B, T]
        guesses = torch.stack([argmax.roll(-i, 1) for i in range(k)], -1)
        ahead = 0
    reference = torch.stack([choice.roll(-(ahead + i), 1) for i in range(k)], -1)  # [B, T, k]
    counted = torch.stack([shifted_counts(batch.counts, ahead + i, 0) for i in range(k)], -1).all(-1)  # [B, T]
    return guesses == reference, counted


def simulated_acceptance(matches: torch.Tensor, counted: torch.Tensor) -> tuple[list[float], float]:
    """[..., k] per-prefix matches of draft steps 1..k over the [...] ``counted`` prefixes -> (a_i for i = 1..k,
    tau = 1 + sum_k prod_{i<=k} a_i)."""
    matches = matches[counted]  # [P, k]
    runs = torch.cumprod(matches.long(), -1).sum(0).double()  # [k] prefixes whose first i steps all match
    reached = torch.cat([runs.new_tensor([matches.shape[0]]), runs[:-1]])  # [k] whose first i - 1 steps did
    rates = [float(hit / seen) if seen else float("nan") for hit, seen in zip(runs, reached)]
    tau = 1.0 + float(runs.sum() / matches.shape[0]) if matches.shape[0] else float("nan")
    return rates, tau


@dataclass(frozen=True)
class WalkedStep:
    """One step of the loop over a trace: it starts after ``start`` emitted tokens, drafts ``drafted`` and keeps the
    leading ``kept`` of them, emitting ``kept + 1``."""

    start: int
    drafted: int
    kept: int


def walk_trace(length: int, depth: int, accepts: Callable[[int, int], bool], budget: int | None = None,
               first_alone: bool = False) -> list[WalkedStep]:
    """The steps the loop takes over a fixed trace of ``length`` tokens at temperature 0: the one acceptance walker
    (simulated tau in training, the tree search's replay, the pair's greedy acceptance).

    A step after ``e`` emitted tokens drafts min(``depth``, ``budget`` - e - 1) tokens (``budget``: the call's
    token budget, default the trace's length) and keeps draft i while ``accepts(e, i)`` holds for it and every
    draft before it, and the trace has a token after it; it emits kept + 1. ``first_alone``: the prefill emits the
    first token alone (a head has no feature before it), a step that drafts nothing."""
    budget = length if budget is None else budget
    steps, done = [], 0
    while done < length:
        drafted = 0 if first_alone and done == 0 else max(min(depth, budget - done - 1), 0)
        kept = 0
        while kept < min(drafted, length - done - 1) and accepts(done, kept):
            kept += 1
        steps.append(WalkedStep(done, drafted, kept))
        done += kept + 1
    return steps


def walked_acceptance(matches: torch.Tensor, counts: torch.Tensor, drafts_first: bool) -> tuple[list[float], float]:
    """The loop's tau at temperature 0, walked step by step over the target's greedy continuations, where
    ``simulated_acceptance`` averages over every prefix alike.

    ``matches`` [B, T, k] from ``draft_matches``, ``counts`` [B, T] the continuation's positions. The loop emits the
    continuation (``walk_trace``): a step from the prefix at t keeps the leading n matching drafts and emits n + 1
    tokens (no more than are left), so the next step starts at t + n + 1, after a rejection (where drafting is
    harder than on average). The target's prefill is a call of its own: it verifies a first draft where
    ``drafts_first`` (a draft model), and otherwise emits the first token alone (a head has no feature before it).
    Returns the per-position acceptance the loop would count and tau = emitted / target calls."""
    k = matches.shape[-1]
    attempts, accepts = [0] * k, [0] * k
    emitted = calls = 0
    for row, row_counts in zip(matches.tolist(), counts.tolist()):
        total = sum(row_counts)
        start = row_counts.index(True) if total else 0
        if not drafts_first:  # a head's matches[t] drafts after token t + 1 (a model's after token t)
            start -= 1
        steps = walk_trace(total, k, lambda done, i: row[start + done][i], first_alone=not drafts_first)
        for step in steps:
            for i in range(min(step.kept + 1, step.drafted)):
                attempts[i] += 1
                accepts[i] += i < step.kept
        calls += len(steps)
        emitted += total
    rates = [hit / seen if seen else float("nan") for hit, seen in zip(accepts, attempts)]
    return rates, emitted / calls if calls else float("nan")
