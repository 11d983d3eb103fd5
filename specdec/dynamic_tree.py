"""Dynamic token trees (EAGLE-2, Li et al. 2024): each row's tree grows where its draft is confident.

A static tree (``specdec.tree``) spends its nodes the same way at every step. ``DynamicTreeDrafter`` spends a budget
of N nodes per row where the draft's path probability is highest, so each row of a batch gets its own tree, verified
in one target forward under its own ancestor mask (``specdec.layout.RowTreeLayout``).

Growing. A node's score is the draft's log-probability of its path (the sum of log q along it). Depth 1 holds the
root's top-K children. At each later depth the K nodes of the previous depth with the best scores (the *frontier*)
each get K children, so a depth holds K·K candidates; the draft runs one forward per depth, over the previous
depth's nodes that may still enter the tree (the frontier among them), under their ancestor mask.

Keeping N nodes. At temperature 0 (EAGLE-2's reranking) the tree is the N best candidates of every depth by score:
a child never scores above its parent, so they form a tree. Children are the draft's top-K tokens; the target
keeps the longest path of its own argmaxes (greedy matching), so the output is the target's greedy output.

At temperature > 0 the children of a node are K draws from q *without replacement* (the Gumbel top-K trick gives
them in draw order), judged by the multi-draft speculative rule of SpecTr and Sequoia (``rules.speculative_tree``:
after a rejected sibling the residual is norm(max(0, r - q)) and q loses the rejected token). That rule is exact
only if a node's children are a prefix of its draws, however many: whether a sibling is kept may depend on
anything drawn before it, never on its own value. Reranking by score would keep the likelier siblings and bias the
output, so here the budget is spent level by level instead: depth t keeps its first m_t candidates in the order
they were made (parents by score, each parent's children in draw order), with m_t as large as the candidates allow
while one node stays for each deeper level. Every choice depends only on nodes drawn before the ones it keeps, so
the emitted tokens follow the target's distribution exactly (tests/test_dynamic_tree.py checks both the rule and a
reranking variant that is not exact).

The draft's own cache sees the nodes it fed, not the proposal: ``commit`` translates the accepted path into the
draft's *candidate tree* (the fed nodes in feed order, then the last depth's candidates, never fed), whose last
level is the only one unfed, as for a static tree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.cache import check_runner_options
from specdec.checks import check_children_fit_vocabulary, check_draft_length
from specdec.drafters import CachedDrafter
from specdec.interfaces import StopHook
from specdec.layout import Proposal, RowTreeLayout
from specdec.sampling import SamplingConfig, logits_to_probs, usable
from specdec.tree import MAX_TREE_NODES, RowTree, row_tree
from specdec.types import StepOutcome


@dataclass(frozen=True)
class LevelPlan:
    """How many candidates each depth makes and how many of them the draft feeds, for one step (host integers)."""

    candidates: tuple[int, ...]  # [d] candidates made at each depth: K, then K x the previous depth's frontier
    fed: tuple[int, ...]  # [d-1] candidates of each depth but the last that the draft feeds
    frontier: tuple[int, ...]  # [d-1] of those, the ones that get children
    last_kept: int  # temperature > 0: candidates of the last depth the tree keeps (all fed ones are kept)
    num_nodes: int  # N: nodes of the proposed tree


def level_plan(node_budget: int, depth: int, top_k: int, rerank: bool) -> LevelPlan:
    """The plan of a tree of ``depth`` levels with at most ``node_budget`` nodes (fewer where the levels cannot
    hold them). Reranking: depth t feeds its best min(candidates, N - t + 1) candidates (a depth holds at most that
    many of the N best: each of its nodes has t - 1 ancestors in the tree). Otherwise depth t keeps and feeds its
    first m_t candidates, as many as leave one node for each deeper level."""
    candidates, fed, frontier = [top_k], [], []
    remaining = node_budget
    for level in range(1, depth):
        if rerank:
            count = min(candidates[-1], node_budget - level + 1)
        else:
            count = max(min(candidates[-1], remaining - (depth - level)), 1)
            remaining -= count
        fed.append(count)
        frontier.append(min(top_k, count))
        candidates.append(top_k * frontier[-1])
    if rerank:
        num_nodes = min(node_budget, sum(fed) + candidates[-1])
        return LevelPlan(tuple(candidates), tuple(fed), tuple(frontier), 0, num_nodes)
    last_kept = max(min(candidates[-1], remaining), 0)
    return LevelPlan(tuple(candidates), tuple(fed), tuple(frontier), last_kept, sum(fed) + last_kept)


def draws_without_replacement(q: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """[..., V] distributions -> [..., count] tokens drawn from each without replacement, in draw order (Gumbel
    top-k: the order of log q + Gumbel noise). Past q's support the draws are tokens of probability 0."""
    uniform = torch.rand(q.shape, generator=generator, device=q.device).clamp_min(torch.finfo(q.dtype).tiny)
    keys = q.log() - (-uniform.log()).log()  # [..., V]; -inf where q is 0
    return keys.topk(count, dim=-1).indices


class CandidateTree:
    """The candidates of one step, in the order they were made: slot 0 is the root, candidates are slots 1..C,
    depth by depth (one depth's candidates consecutive: parents in frontier order, each parent's children in draw
    order). Holds each candidate's token, parent slot, score and depth, and which slots the draft fed."""

    def __init__(self, batch: int, top_k: int, device: torch.device):
        self.top_k = top_k  # children of each parent
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)  # [B, C+1]; the root's is unused
        self.parent = torch.zeros(batch, 1, dtype=torch.long, device=device)  # [B, C+1]
        self.score = torch.zeros(batch, 1, device=device)  # [B, C+1] log q of the path; the root's 0
        self.level_start: list[int] = [1]  # the first slot of each depth (and one past the last)
        self.fed = torch.zeros(batch, 0, dtype=torch.long, device=device)  # [B, F] slots fed, in feed order

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def level(self, depth: int) -> torch.Tensor:
        """[c] the slots of ``depth`` (1..d)."""
        return torch.arange(self.level_start[depth - 1], self.level_start[depth], device=self.tokens.device)

    def add_children(self, parents: torch.Tensor, logits: torch.Tensor, sampling: SamplingConfig,
             generator: torch.Generator) -> torch.Tensor | None:
        """Give each of ``parents`` [B, f] (slots) K children from the draft ``logits`` [B, f, V] there: the
        top-K tokens at temperature 0, else K draws without replacement from q. Returns q [B, f, V] (None at
        temperature 0)."""
        batch, width = parents.shape
        top_k = self.top_k
        logits = logits.float()
        if sampling.is_greedy:
            top = logits.topk(top_k, dim=-1)  # [B, f, K]
            tokens, log_q = top.indices, top.values - logits.logsumexp(-1, keepdim=True)
            q = None
        else:
            q = logits_to_probs(logits, sampling)  # [B, f, V]
            tokens = draws_without_replacement(q, top_k, generator)  # [B, f, K]
            log_q = q.gather(-1, tokens).log()  # [B, f, K]; -inf past q's support
        score = self.score.gather(1, parents).unsqueeze(2) + log_q  # [B, f, K]
        self.tokens = torch.cat([self.tokens, tokens.reshape(batch, width * top_k)], 1)
        self.parent = torch.cat([self.parent, parents.repeat_interleave(top_k, dim=1)], 1)
        self.score = torch.cat([self.score, score.reshape(batch, width * top_k)], 1)
        self.level_start.append(self.size)
        return q

    def best(self, slots: torch.Tensor, count: int) -> torch.Tensor:
        """[B, count] of ``slots`` ([c] or [B, c]) those with the best scores, worst first (ties: the later slot
        counts as worse, so a parent always ranks above its children)."""
        slots = slots.expand(self.tokens.shape[0], -1)
        order = ranked(self.score.gather(1, slots))[:, :count]  # [B, count] best first
        return slots.gather(1, order).flip(1)

    def feed_slots(self, depth: int, count: int, rerank: bool) -> torch.Tensor:
        """[B, count] the slots of ``depth`` the draft feeds, worst first (so the frontier, the best, come last):
        reranking, the best ``count``; else the first ``count`` made (the ones the tree keeps)."""
        level = self.level(depth)
        chosen = self.best(level, count) if rerank else self.best(level[:count], count)
        self.fed = torch.cat([self.fed, chosen], 1)
        return chosen

    def fed_layout(self, num_levels: int, distinct_siblings: bool) -> RowTreeLayout:
        """The layout of the fed slots in feed order (positions 1..F), for the draft's tree feed."""
        return RowTreeLayout(self.tree_of(self.fed, num_levels, distinct_siblings))

    def tree_of(self, slots: torch.Tensor, num_levels: int, distinct_siblings: bool) -> RowTree:
        """The ``RowTree`` of ``slots`` [B, M] (each one's parent among them or the root) at positions 1..M."""
        position = self.position_of(slots)  # [B, C+1]
        parent = position.gather(1, self.parent.gather(1, slots))  # [B, M]
        return row_tree(parent, (self.top_k,) * num_levels, distinct_siblings)

    def position_of(self, slots: torch.Tensor) -> torch.Tensor:
        """[B, C+1] the position (1..M) each slot has among ``slots`` [B, M]; 0 for the root and the others."""
        batch, count = slots.shape
        positions = torch.arange(1, count + 1, device=slots.device).expand(batch, -1)  # [B, M]
        return torch.zeros_like(self.tokens).scatter_(1, slots, positions)


def ranked(score: torch.Tensor) -> torch.Tensor:
    """[B, c] scores -> [B, c] indices, best first; equal scores in index order (a stable sort)."""
    return score.sort(dim=-1, descending=True, stable=True).indices


class DynamicTreeDrafter(CachedDrafter):
    """Drafts a tree per row with a small causal LM (EAGLE-2's dynamic tree): ``node_budget`` nodes over up to
    ``depth`` levels, each expanded node getting ``top_k`` children (see the module docstring)."""

    name = "dynamic_tree"
    drafts_trees = True
    trusted_proposals = True

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", **options) -> DynamicTreeDrafter:
        cls.check_options(compile=compile, forward=forward, **options)
        return cls(pair.draft, forward=forward, **options)

    @classmethod
    def reads_draft_model(cls, **options) -> bool:
        return True

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", node_budget: int = 16, depth: int = 5,
                      top_k: int = 4, **options) -> None:
        unknown = set(options) - {"label"}
        if unknown:
            raise TypeError(f"DynamicTreeDrafter got unknown options {sorted(unknown)}; it takes node_budget, depth, "
                            f"top_k and label")
        check_tree_size(node_budget, depth, top_k)
        check_runner_options("dynamic", forward, compile)
        if compile:
            raise ValueError("token trees run eager on the dynamic cache layout: compile=true cannot draft trees")

    def __init__(self, model: torch.nn.Module, node_budget: int = 16, depth: int = 5, top_k: int = 4,
                 label: str = "draft", forward: str = "auto"):
        check_tree_size(node_budget, depth, top_k)
        self.node_budget, self.depth, self.top_k = node_budget, depth, top_k
        self.candidates: CandidateTree | None = None  # this step's, where it drafted
        self.kept_slots: torch.Tensor | None = None  # [B, N] this step's candidates the proposal holds
        super().__init__(model, label, forward)
        check_children_fit_vocabulary(f"top_k={top_k}", top_k, model.config.vocab_size)

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator,
                stop: StopHook | None = None) -> Proposal:
        self.candidates = None
        return super().propose(k, sampling, generator, stop)

    def draft(self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None) -> Proposal:
        """One draft forward per depth but the last; then the proposal's tree of the kept candidates."""
        proposal, self.candidates, self.kept_slots = grow_tree(
            self.node_budget, self.top_k, min(k, self.depth), self.reranks(sampling), sampling, generator,
            self.feed_root, self.feed_level)
        return proposal

    @staticmethod
    def reranks(sampling: SamplingConfig) -> bool:
        """Whether the tree is the N best candidates by score (EAGLE-2's reranking): at temperature 0 only, where
        it is exact (see the module docstring)."""
        return sampling.is_greedy

    def feed_root(self) -> torch.Tensor:
        """The draft's first forward of a step, over its queue: [B, 1, V] logits at the root."""
        return self.feed().logits

    def feed_level(self, candidates: CandidateTree, fed: torch.Tensor, layout: RowTreeLayout,
                   frontier: int) -> torch.Tensor:
        """Feed the candidates ``fed`` [B, m] (slots, under ``layout``): [B, frontier, V] logits at the last ones."""
        return self.feed(candidates.tokens.gather(1, fed), layout, num_logits=frontier).logits

    def commit(self, outcome: StepOutcome) -> None:
        """The draft's cache saw the candidate tree, not the proposal: keep the accepted path in it."""
        candidates = self.candidates
        if candidates is None:  # nothing drafted this step
            super().commit(outcome)
            return
        depth = outcome.layout.depth
        in_draft = torch.cat([candidates.fed, candidates.level(depth).expand(candidates.fed.shape[0], -1)], 1)
        position = candidates.position_of(in_draft)  # [B, C+1]
        root = torch.zeros_like(self.kept_slots[:, :1])  # [B, 1]
        proposal_to_draft = torch.cat([root, position.gather(1, self.kept_slots)], 1)  # [B, N+1]
        layout = RowTreeLayout(candidates.tree_of(in_draft, depth, distinct_siblings=False))  # read for its path only
        super().commit(replace(outcome, layout=layout, path=proposal_to_draft.gather(1, outcome.path)))


def kept_slots(candidates: CandidateTree, plan: LevelPlan, depth: int, rerank: bool) -> torch.Tensor:
    """[B, N] the slots the tree keeps, sorted (so by depth, siblings in draw order). Reranking: the N best of
    the fed candidates and the last depth's; else the fed ones and the last depth's first ``last_kept``."""
    last = candidates.level(depth)  # [c_d]
    if rerank:
        eligible = torch.cat([candidates.fed, last.expand(candidates.fed.shape[0], -1)], 1)  # [B, F + c_d]
        kept = candidates.best(eligible, plan.num_nodes)
    else:
        kept = torch.cat([candidates.fed, last[: plan.last_kept].expand(candidates.fed.shape[0], -1)], 1)
    return kept.sort(dim=1).values

def probs_by_position(candidates: CandidateTree, kept: torch.Tensor, q_at: list) -> torch.Tensor:
    """[B, N+1, V] q at each position of the proposed tree that has children (zero elsewhere)."""
    batch, num_nodes = kept.shape
    position = candidates.position_of(kept)  # [B, C+1]; 0 for the root
    vocab = q_at[0][1].shape[-1]
    probs = torch.zeros(batch, num_nodes + 2, vocab, device=kept.device)  # row N+1 takes parents not kept
    for parents, q in q_at:
        where = torch.where((position.gather(1, parents) > 0) | (parents == 0), position.gather(1, parents),
                            num_nodes + 1)  # [B, f]
        probs.scatter_(1, where.unsqueeze(2).expand(-1, -1, vocab), q)
    return probs[:, : num_nodes + 1]


def grow_tree(node_budget: int, top_k: int, depth: int, rerank: bool, sampling: SamplingConfig,
              generator: torch.Generator, feed_root, feed_level) -> tuple[Proposal, CandidateTree, torch.Tensor]:
    """Grow one step's trees (see the module docstring) of ``node_budget`` nodes over ``depth`` levels with
    ``top_k`` children per expanded node, kept by score where ``rerank``, running the draft through ``feed_root()`` ([B, 1, V] logits at the root)
    and ``feed_level(candidates, fed, layout, frontier)`` ([B, frontier, V] at the last of the fed slots). Returns
    the proposal, the candidates made and the [B, N] slots the proposal holds."""
    greedy = sampling.is_greedy
    plan = level_plan(node_budget, depth, top_k, rerank)
    logits = feed_root()  # [B, 1, V] at the root
    candidates = CandidateTree(logits.shape[0], top_k, logits.device)
    finite = usable(logits)
    parents = torch.zeros_like(candidates.tokens)  # [B, 1] the root's slot
    q_at = [(parents, candidates.add_children(parents, logits, sampling, generator))]
    for level, (count, frontier) in enumerate(zip(plan.fed, plan.frontier), start=1):
        fed = candidates.feed_slots(level, count, rerank)  # [B, m], the frontier last
        logits = feed_level(candidates, fed, candidates.fed_layout(level, not greedy), frontier)  # [B, f, V]
        finite &= usable(logits)
        parents = fed[:, -frontier:].flip(1)  # [B, f] the frontier, best first
        q_at.append((parents, candidates.add_children(parents, logits.flip(1), sampling, generator)))
    kept = kept_slots(candidates, plan, depth, rerank)  # [B, N] slots in the order they were made
    tree = candidates.tree_of(kept, depth, not greedy)
    probs = None if greedy else probs_by_position(candidates, kept, q_at)
    return Proposal(candidates.tokens.gather(1, kept), probs, finite, RowTreeLayout(tree)), candidates, kept


def check_tree_size(node_budget: object, depth: object, top_k: object) -> None:
    """The three sizes of a dynamic tree: integers >= 1 with depth <= node_budget <= what the levels can hold."""
    for name, value in (("node_budget", node_budget), ("depth", depth), ("top_k", top_k)):
        check_draft_length(name, value)
    if depth > node_budget:
        raise ValueError(f"depth={depth} needs node_budget >= depth (one node per level at least), got "
                         f"node_budget={node_budget}")
    most = top_k + (depth - 1) * top_k * top_k  # K at depth 1, then K children of each of K frontier nodes
    if node_budget > min(most, MAX_TREE_NODES):
        raise ValueError(f"node_budget={node_budget} is more than {min(most, MAX_TREE_NODES)}, the most nodes a tree "
                         f"of depth={depth} with top_k={top_k} can hold (K + (depth - 1) K^2, at most "
                         f"{MAX_TREE_NODES})")
