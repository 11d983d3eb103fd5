"""Drafting with an EAGLE head (``specdec.heads.EagleHead``): chains, or EAGLE-2's dynamic trees.

The head reads the target's features (``Drafter.target_states``: the hidden states it was trained on, at every
position the step kept) and runs over its own small KV cache, through a ``CachedContext`` whose queue carries
features beside tokens. Position t of the head holds the pair (feature_t, token_{t+1}).

- propose: the first forward feeds the queue, the pairs the last step committed (the target's real features, each
  with the token that followed), and gives the first draft's logits and the predicted feature after it; each later
  draft feeds (predicted feature, drafted token) and predicts the next. In a tree (``tree=(node_budget, depth,
  top_k)``, grown by ``specdec.dynamic_tree.grow_tree``: EAGLE-2), each fed node reads its parent's predicted
  feature. The first step drafts nothing: no feature exists before the target's prefill.
- commit: the cache keeps the queue's pairs and forgets every drafted node (their features were predicted); the
  queue becomes the pairs of this step's target states, the target's real features at every position it verified
  and kept, so the next step re-feeds them. One ``CachedContext.keep``, the context's one rollback.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.cache import static_capacity
from specdec.checkpoints import check_target, load_weights, read_drafter_config, saved_draft_ids
from specdec.checks import check_children_fit_vocabulary, check_model, check_placement
from specdec.context import CachedContext
from specdec.drafters import DRAFT_ROOM_GUESS, CachedDrafter, as_branching, draft_chain
from specdec.dynamic_tree import CandidateTree, DynamicTreeDrafter, check_tree_size, grow_tree
from specdec.heads import EagleHead, target_width
from specdec.interfaces import StopHook
from specdec.layout import Proposal, RowTreeLayout
from specdec.models import EMBEDDED_DIR
from specdec.sampling import SamplingConfig
from specdec.types import StateRequest, StepOutcome

PREDICTED = (1,)  # the head's hidden state 1: its final norm's output, the predicted feature (one block)
SHIPPED = {"embedded": EMBEDDED_DIR / "heads" / "eagle"}  # checkpoint names that resolve to shipped heads


class EagleDrafter(CachedDrafter):
    """Drafts with ``head``, trained for ``target`` (see the module docstring). ``tree``: (node_budget, depth,
    top_k) for EAGLE-2's dynamic trees; None drafts chains.

    The constructor refuses, in one line, what generate could not run (``check_head_fits``): a head in another
    dtype or on another device than its target (refused, not cast: move it with ``head.to(...)``;
    ``from_pretrained`` builds it in the target's), of another width, family or depth of features, a reduced
    vocabulary outside the target's, and a tree that is not three sizes or whose top_k exceeds the draft's
    vocabulary."""

    name = "eagle"
    trusted_proposals = True

    def __init__(self, head: EagleHead, target: torch.nn.Module, tree: tuple[int, int, int] | None = None,
                 compile: bool = False):
        check_head_fits(head, target)
        self.tree = dynamic_tree_sizes(tree, compile)
        if self.tree is not None:
            check_children_fit_vocabulary(f"tree top_k={self.tree[2]}", self.tree[2], head.draft_vocab_size(target))
        self.head, self.target = head.eval().requires_grad_(False), target
        self.drafts_trees = self.tree is not None
        self.target_states = StateRequest(layers=head.feature_layers, positions="emitted")
        super().__init__(head.body, "EAGLE head", "lean", "dynamic", compile, lean=head.lean(target))

    @classmethod
    def from_pretrained(cls, directory: str | Path, target: torch.nn.Module, **options) -> EagleDrafter:
        """The EAGLE head saved in ``directory`` (``python -m experiments.train_drafter``), for ``target``: refused
        in one line if it was trained for another."""
        config = read_drafter_config(directory, "eagle")
        check_target(directory, config, target)
        saved = config["options"]
        head = EagleHead(target, feature_layers=tuple(saved["feature_layers"]), width=saved["width"],
                         draft_ids=saved_draft_ids(directory, saved, target))
        return cls(load_weights(directory, head), target, **options)

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", checkpoint: str = "embedded",
                  tree: list[int] | None = None) -> EagleDrafter:
        cls.check_options(compile=compile, forward=forward, checkpoint=checkpoint, tree=tree)
        return cls.from_pretrained(SHIPPED.get(checkpoint, checkpoint), pair.target, compile=compile, tree=tree)

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", checkpoint: str = "embedded",
                      tree: list[int] | None = None) -> None:
        if forward == "transformers":
            raise ValueError("an EAGLE head runs its block through the lean forward: forward must be auto or lean")
        directory = Path(SHIPPED.get(checkpoint, checkpoint))
        read_drafter_config(directory, "eagle")
        dynamic_tree_sizes(tree, compile)

    def models(self) -> list[torch.nn.Module]:
        return [self.head.body]

    def check_target(self, target: torch.nn.Module) -> None:
        if target is not self.target:
            raise ValueError("this EAGLE drafter reads the features of the model it was built with; pass that model "
                             "as the Decoder's target")

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """An empty queue: the target's prefill gives the first features."""
        batch_size, width = input_ids.shape
        cache = self.runner.new_cache(batch_size, static_capacity(width, DRAFT_ROOM_GUESS), input_ids.device)
        features = self.head.fc.weight.new_zeros(batch_size, 0, target_width(self.target))  # [B, 0, D]
        self.context = CachedContext(cache, input_ids[:, :0], None, features)
        self.live: torch.Tensor | None = None
        self.num_forwards = 0

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator,
                stop: StopHook | None = None) -> Proposal:
        if not self.context.queue.shape[1]:  # before the target's prefill: nothing to draft from
            k = 0
        return super().propose(k, sampling, generator, stop)

    def draft(self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None) -> Proposal:
        if self.tree is not None:
            node_budget, depth, top_k = self.tree
            proposal, _, _ = grow_tree(node_budget, top_k, min(k, depth), DynamicTreeDrafter.reranks(sampling),
                                       sampling, generator, self.feed_root, self.feed_level)
            return proposal
        output = self.feed(hidden_layers=PREDICTED)
        self.predicted = output.hidden[:, -1:, 0]  # [B, 1, D] the feature after the queue's last token

        def feed_next(token: torch.Tensor) -> torch.Tensor:
            output = self.feed(token.unsqueeze(1), features=self.predicted, hidden_layers=PREDICTED)
            self.predicted = output.hidden[:, -1:, 0]  # [B, 1, D]
            return output.logits[:, -1]  # [B, V]

        return draft_chain(output.logits[:, -1], feed_next, k, sampling, generator, stop)

    def feed_root(self) -> torch.Tensor:
        """The queue's forward: [B, 1, V] logits at the root; its predicted feature is the root slot's."""
        output = self.feed(hidden_layers=PREDICTED)
        self.slot_features = output.hidden[:, -1:, 0]  # [B, 1, D] by candidate slot (the root is slot 0)
        return output.logits

    def feed_level(self, candidates: CandidateTree, fed: torch.Tensor, layout: RowTreeLayout,
                   frontier: int) -> torch.Tensor:
        """Feed the candidates ``fed`` [B, m], each with its parent's predicted feature; keep theirs by slot."""
        width = self.slot_features.shape[-1]
        parents = candidates.parent.gather(1, fed).unsqueeze(2).expand(-1, -1, width)  # [B, m, D]
        output = self.feed(candidates.tokens.gather(1, fed), layout, num_logits=frontier,
                           features=self.slot_features.gather(1, parents), hidden_layers=PREDICTED)
        grown = self.slot_features.new_zeros(fed.shape[0], candidates.size, width)  # [B, C+1, D]
        grown[:, : self.slot_features.shape[1]] = self.slot_features
        self.slot_features = grown.scatter(1, fed.unsqueeze(2).expand(-1, -1, width), output.hidden[:, :, 0])
        return output.logits

    def commit(self, outcome: StepOutcome) -> None:
        """Keep the queued pairs (real features), forget the drafted nodes; queue this step's target states."""
        context, states = self.context, outcome.target_states
        queue, valid = states.next_tokens, states.valid  # [B, W]
        features = self.head.fused(states.hidden)  # [B, W, D]
        if context.queue_fed:
            kept, max_kept = context.kept_prefix(context.queue_count), context.queue_fed
        else:  # nothing fed this step: the new pairs queue behind the old ones
            old_valid = context.queue_valid if context.queue_valid is not None else torch.ones_like(context.queue)
            queue, valid = torch.cat([context.queue, queue], 1), torch.cat([old_valid.bool(), valid], 1)
            features = torch.cat([context.queue_features, features], 1)
            kept, max_kept = queue[:, :0].bool(), None
        context.keep(kept, True, max_kept, queue, valid, features)
        self.live = None if outcome.all_active_after else outcome.active_after


def dynamic_tree_sizes(tree: object, compile: bool = False) -> tuple[int, int, int] | None:
    """``tree`` as (node_budget, depth, top_k), or None for chains: a sequence of three sizes (a list, tuple or a
    config's list; not a string, whose characters would unpack), each checked by ``check_tree_size``. Trees run
    eager, so not with ``compile``."""
    if tree is None:
        return None
    sizes = as_branching(tree)
    if not isinstance(sizes, tuple) or len(sizes) != 3:
        raise ValueError(f"tree must be [node_budget, depth, top_k] (three integers) or None, got {tree!r}")
    check_tree_size(*sizes)
    if compile:
        raise ValueError("dynamic trees run eager: compile=True cannot draft EAGLE trees")
    return sizes


def check_head_fits(head: object, target: torch.nn.Module) -> None:
    """Everything ``generate`` will need of ``head`` beside ``target``, checked before any forward, in one line."""
    if not isinstance(head, EagleHead):
        raise TypeError(f"head must be a specdec.heads.EagleHead, got {type(head).__name__}")
    check_model("target", target)
    if type(head.body) is not type(target):
        raise ValueError(f"the EAGLE head runs a {type(head.body).__name__} block; the target is a "
                         f"{type(target).__name__}: build the head for this target")
    if head.fc.in_features != 2 * target_width(target):
        raise ValueError(f"the EAGLE head reads features of width {head.fc.in_features // 2}; the target's are "
                         f"{target_width(target)} wide")
    check_placement("the EAGLE head", head, target)
    StateRequest(layers=head.feature_layers).resolved(target.config.num_hidden_layers)
    head.check_draft_vocabulary(target)
