"""Block verification (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh, ICLR 2025, arXiv 2403.10444).

Token-wise speculative sampling stops at the first rejected draft. Block verification judges the block jointly: a
draft that token-wise would reject can still be kept when the drafts before it were likelier under p than under q,
because the rule carries the prefix's surplus forward as a weight. It is lossless, and its expected number of kept
drafts is the most any verifier that sees only the on-path distributions can reach, so never below token-wise.

The rule, for drafts x_1..x_k with q_i = q(. | x_<i) and p_i = p(. | x_<i) (p_{k+1} the bonus position's):

    w_0 = 1,   w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))               (the prefix's weight)
    r_i = max(0, w_i p_{i+1} - q_{i+1}),  Z_i = sum_x r_i(x)            (q_{k+1} = 0, so r_k = w_k p_{k+1})
    h_i = Z_i / (Z_i + 1 - w_i)                                          (h_k = w_k)
    keep tau = the largest i in 1..k with u_i < h_i (u_i uniform), 0 if none;
    emit x_1..x_tau, then a sample of norm(r_tau)                        (r_0 = max(0, p_1 - q_1), the usual residual)

The weight scales the residual: norm(max(0, w_tau p - q)), not norm(max(0, p - q)). The second is the token-wise
residual, and using it here is the bug engines shipped (vllm-ascend #7807); ``BlockVerification(residual="tokenwise")``
keeps it as the test's wrong variant. On point masses (temperature 0) w_i is 1 while drafts match the argmax and
0 after, h_i is 1 only at the last match before a mismatch, and r_tau is the argmax: greedy matching exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.interfaces import AcceptanceStrategy
from specdec.rules import probs_of, row_at
from specdec.sampling import sample
from specdec.types import Verdict

RESIDUALS = ("block", "tokenwise")


def prefix_weights(p_of_draft: torch.Tensor, q_of_draft: torch.Tensor) -> torch.Tensor:
    """[B, k] p_i(x_i), q_i(x_i) -> [B, k+1] w_0..w_k with w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)).

    Unrolled, w_i = min over j <= i of (1, prod_{j..i} ratio), so in logs with S the cumulative log ratio,
    log w_i = S_i - max(0, S_1..S_i): one cumulative max instead of a loop over positions.
    """
    tiny = torch.finfo(q_of_draft.dtype).tiny
    log_ratio = p_of_draft.log() - q_of_draft.clamp_min(tiny).log()  # [B, k]; -inf where p = 0
    cumulative = log_ratio.cumsum(-1)  # [B, k]
    log_weight = cumulative - cumulative.cummax(-1).values.clamp_min(0)  # [B, k]
    return torch.nn.functional.pad(log_weight.exp(), (1, 0), value=1.0)  # [B, k+1]


@dataclass(frozen=True)
class BlockVerification(AcceptanceStrategy):
    """Block verification of a chain (see the module docstring for the rule). Lossless at every sampling setting;
    greedy matching at temperature 0. Costs one more pass over the [B, k+1, V] distributions than token-wise.

    ``residual="tokenwise"`` draws the correction from norm(max(0, p - q)) instead of norm(max(0, w p - q)): a
    deliberately wrong variant, not lossless, kept for the distribution tests that must catch it.
    """

    residual: str = "block"
    name: str = "block"
    trusted_verdicts: bool = True
    greedy_at_point_masses: bool = True

    def __post_init__(self) -> None:
        if self.residual not in RESIDUALS:
            raise ValueError(f"block verification residual must be one of {', '.join(RESIDUALS)}, got "
                             f"{self.residual!r}")

    @property
    def lossless(self) -> bool:
        return self.residual == "block"

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        k = draft_tokens.shape[1]
        weight = prefix_weights(probs_of(target_probs[:, :-1], draft_tokens), probs_of(draft_probs, draft_tokens))
        padded_q = torch.nn.functional.pad(draft_probs, (0, 0, 0, 1))  # [B, k+1, V], zero row at the bonus
        excess = (weight.unsqueeze(-1) * target_probs - padded_q).clamp_min(0)  # [B, k+1, V] r_0..r_k
        mass = excess.sum(-1)  # [B, k+1] Z_0..Z_k
        stop_here = mass / (mass + 1 - weight).clamp_min(torch.finfo(mass.dtype).tiny)  # [B, k+1] h_i; 0 where Z = 0
        uniform = torch.rand(draft_tokens.shape, generator=generator, device=draft_tokens.device)  # [B, k]
        stops = uniform < stop_here[:, 1:]  # [B, k]; strict so that h = 0 never stops
        stops = torch.nn.functional.pad(stops, (1, 0), value=True)  # [B, k+1]; tau = 0 when nothing stops
        num_accepted = (stops * torch.arange(k + 1, device=stops.device)).amax(-1)  # [B] the last stop
        if self.residual == "tokenwise":  # the wrong variant: norm(max(0, p - q)) whatever the weight
            excess = (target_probs - padded_q).clamp_min(0)
        residual = row_at(excess, num_accepted)  # [B, V]
        # Rounding can leave no residual mass where w p == q; p itself is the exact limit there.
        has_mass = residual.sum(-1, keepdim=True) > 0  # [B, 1]
        residual = torch.where(has_mass, residual, row_at(target_probs, num_accepted))
        return Verdict(num_accepted, sample(residual, generator))
