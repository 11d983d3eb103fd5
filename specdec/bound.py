"""The best any lossless verifier can do with the drafts a drafter samples (Hu et al., ICLR 2025, arXiv 2502.18779).

A lossless verifier is a coupling: given the drafts X (distributed as the drafter samples them) it emits tokens Y
distributed exactly as p. What it keeps is what the coupling makes X and Y share, so the best expected gain over
every lossless verifier is a transport problem, a linear program over couplings pi(x, y) >= 0 with
sum_y pi(x, y) = Q(x) and sum_x pi(x, y) = P(y), maximising sum pi(x, y) gain(x, y). On a small vocabulary the LP is
small enough to solve exactly (scipy's HiGHS). Two gains:

- ``optimal_multidraft_acceptance``: n i.i.d. drafts of q at one position, gain 1 where y is among them: the best
  chance to keep a draft (Hu et al.'s LP). By max-flow min-cut it is also min over token sets H of
  p(H) + 1 - q(H)^n (``multidraft_acceptance_by_cut``), which the tests check against the LP. For n = 1 both are
  sum_x min(p, q), what speculative sampling reaches.
- ``optimal_chain_length``: a chain of k drafts from prefix tables of q, y the target's first k tokens, gain the
  length of the common prefix: the best expected number of kept drafts for a verifier that knows p after every
  prefix, on the path or off it. No real verifier does (the target scores only the drafted path), so this bounds
  block verification from above without being reached: Sun et al.'s optimality is among verifiers that see the
  on-path distributions only, and the gap between the two is the price of seeing one path.

Tables: ``tables[d]`` is [V ** d, V], the distribution after each prefix of d tokens (a prefix as its base-V code).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import sparse
from scipy.optimize import linprog

MAX_LP_CELLS = 2_000_000  # pi's entries at most (the LP's variables)


def sequence_probs(tables: list[torch.Tensor], length: int) -> torch.Tensor:
    """[V ** length] the probability of each sequence of ``length`` tokens drawn from the prefix tables."""
    joint = torch.ones(1, dtype=torch.float64)
    for table in tables[:length]:
        joint = (joint.unsqueeze(1) * table.double()).flatten()
    return joint


def check_lp_size(rows: int, cols: int) -> None:
    """Refuse, before building it, an LP over more than ``MAX_LP_CELLS`` couplings' entries."""
    if rows * cols > MAX_LP_CELLS:
        raise ValueError(f"the LP has {rows} x {cols} = {rows * cols} variables, more than {MAX_LP_CELLS}: use a "
                         f"smaller vocabulary, fewer drafts or a shorter chain")


def best_coupling_value(source: np.ndarray, target: np.ndarray, gain: np.ndarray) -> float:
    """max over couplings pi of sum pi * gain, with row sums ``source`` [X] and column sums ``target`` [Y]."""
    rows, cols = gain.shape
    target = target * (source.sum() / target.sum())  # float rounding must not make equal totals infeasible
    row_sums = sparse.kron(sparse.eye(rows), np.ones((1, cols)))  # [X, X*Y]
    col_sums = sparse.kron(np.ones((1, rows)), sparse.eye(cols))  # [Y, X*Y]
    equality = sparse.vstack([row_sums, col_sums]).tocsr()
    bounds = np.concatenate([source, target])
    result = linprog(-gain.ravel(), A_eq=equality, b_eq=bounds, bounds=(0, None), method="highs")
    if not result.success:
        raise RuntimeError(f"the coupling LP failed: {result.message}")
    return float(-result.fun)


def optimal_multidraft_acceptance(p: torch.Tensor, q: torch.Tensor, num_drafts: int) -> float:
    """p, q [V] -> the highest P(the emitted token is one of ``num_drafts`` i.i.d. drafts of q), as an LP."""
    vocab = p.shape[-1]
    check_lp_size(vocab ** num_drafts, vocab)
    draws = np.array(list(itertools.product(range(vocab), repeat=num_drafts)))  # [V**n, n]
    draw_probs = q.double().numpy()[draws].prod(-1)  # [V**n]
    hit = (draws[:, :, None] == np.arange(vocab)).any(1).astype(float)  # [V**n, V] y among the draws
    return best_coupling_value(draw_probs, p.double().numpy(), hit)


def multidraft_acceptance_by_cut(p: torch.Tensor, q: torch.Tensor, num_drafts: int) -> float:
    """The same optimum by min-cut: min over token sets H of p(H) + 1 - q(H)^n (2^V sets; V up to ~16)."""
    vocab = p.shape[-1]
    sets = torch.tensor(list(itertools.product((0.0, 1.0), repeat=vocab)), dtype=torch.float64)  # [2^V, V]
    return float((sets @ p.double() + 1 - (sets @ q.double()) ** num_drafts).min())


def common_prefix_lengths(vocab: int, k: int) -> np.ndarray:
    """[V**k, V**k] the number of leading tokens two sequences of k tokens share."""
    sequences = np.array(list(itertools.product(range(vocab), repeat=k)))  # [V**k, k]
    same = sequences[:, None, :] == sequences[None, :, :]  # [V**k, V**k, k]
    return np.cumprod(same, -1).sum(-1).astype(float)


def optimal_chain_length(p_tables: list[torch.Tensor], q_tables: list[torch.Tensor], k: int) -> float:
    """The highest expected number of kept drafts, for a chain of k drafts from ``q_tables`` and a target whose
    first k tokens follow ``p_tables``, over every lossless coupling (an LP over V^k x V^k couplings; a verifier
    that knew p off the drafted path too)."""
    vocab = p_tables[0].shape[-1]
    check_lp_size(vocab ** k, vocab ** k)
    return best_coupling_value(sequence_probs(q_tables, k).numpy(), sequence_probs(p_tables, k).numpy(),
                               common_prefix_lengths(vocab, k))


def tokenwise_chain_length(p_tables: list[torch.Tensor], q_tables: list[torch.Tensor], k: int) -> float:
    """Token-wise speculative sampling's expected number of kept drafts, exactly: the sum over draft positions i of
    E_q[prod_{j <= i} min(1, p_j(x_j) / q_j(x_j))]."""
    reach = torch.ones(1, dtype=torch.float64)  # [V**d] q(prefix) * P(every draft of the prefix kept)
    expected = 0.0
    for d in range(k):
        p, q = p_tables[d].double(), q_tables[d].double()  # [V**d, V]
        kept = torch.minimum(q, p)  # q(x) min(1, p(x)/q(x))
        reach = (reach.unsqueeze(1) * kept).flatten()  # [V**(d+1)]
        expected += float(reach.sum())
    return expected


def mean_kept(rule, p_tables: list[torch.Tensor], q_tables: list[torch.Tensor], k: int, samples: int,
              generator: torch.Generator) -> float:
    """A chain rule's mean number of kept drafts over ``samples`` chains of k drafts drawn from ``q_tables``."""
    vocab = p_tables[0].shape[-1]
    code = torch.zeros(samples, dtype=torch.long)  # [S] each chain's prefix so far
    tokens, draft_probs, target_probs = [], [], []
    for d in range(k):
        q_here = q_tables[d][code]  # [S, V]
        token = torch.multinomial(q_here, 1, generator=generator).squeeze(1)  # [S]
        tokens.append(token)
        draft_probs.append(q_here)
        target_probs.append(p_tables[d][code])
        code = code * vocab + token
    target_probs.append(p_tables[k][code])
    verdict = rule(torch.stack(tokens, 1), torch.stack(draft_probs, 1), torch.stack(target_probs, 1), generator)
    return verdict.num_accepted.double().mean().item()
