"""Drafting with Medusa heads (``specdec.heads.MedusaHeads``): chains, or Medusa's top-k trees.

The heads read one of the target's hidden states (``Drafter.target_states``, positions "last"): the last layer's at
the position whose distribution gave the step's next token. Head i turns it into the distribution q_i of the token i
+ 1 positions after that next token. There is no draft model and no draft cache: a proposal is one pass of the
heads.

- A chain of k <= K drafts takes each head's argmax at temperature 0, else a sample of q_i; q_i is the distribution
  it was drawn from, so the ``speculative`` rule stays exact at any temperature.
- A tree (``tree=(b_1, ..., b_d)``, d <= K) gives each node at depth i - 1 the b_i top tokens of head i - 1 at
  temperature 0 (the same under every parent: Medusa's trees), else b_i draws of q_{i-1} per parent, and is verified
  like any static tree (``specdec.layout.TreeLayout``).
- Heads with a reduced draft vocabulary (``specdec.heads.DraftHead``) give q_i over it (0 elsewhere): their drafts
  are target ids, and a tree level may not be wider than that vocabulary.
- The first step drafts nothing (no hidden state before the target's prefill). ``commit`` keeps the state of the
  step's last position, in place where the step's shapes are fixed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.cache import adopted
from specdec.checkpoints import check_target, load_weights, read_drafter_config, saved_draft_ids
from specdec.checks import check_children_fit_vocabulary, check_model, check_placement
from specdec.drafters import as_branching
from specdec.heads import MedusaHeads, medusa_logits, target_width
from specdec.interfaces import Drafter, StopHook
from specdec.layout import Proposal, TreeLayout, tree_layout
from specdec.models import EMBEDDED_DIR
from specdec.sampling import SamplingConfig, finite_peaks, greedy_choice, logits_to_probs, sample
from specdec.tree import tree_shape
from specdec.types import StateRequest, StepOutcome

SHIPPED = {"embedded": EMBEDDED_DIR / "heads" / "medusa"}  # checkpoint names that resolve to shipped heads


class MedusaDrafter(Drafter):
    """Drafts with ``heads``, trained for ``target`` (see the module docstring). The constructor refuses, in one
    line, heads in another dtype or on another device than the target (refused, not cast: move them with
    ``heads.to(...)``; ``from_pretrained`` builds them in the target's), heads of another width, and a tree deeper
    than the heads or wider than the draft vocabulary."""

    name = "medusa"
    selects_rows = True
    trusted_proposals = True
    needs_pair = True
    target_states = StateRequest(layers=(-1,), positions="last")

    def __init__(self, heads: MedusaHeads, target: torch.nn.Module, tree=None):
        check_heads_fit(heads, target)
        self.heads, self.target = heads.eval().requires_grad_(False), target
        self.branching = medusa_branching(tree, heads.num_heads)
        if self.branching is not None:
            check_children_fit_vocabulary(f"tree {list(self.branching)}", max(self.branching),
                                          heads.draft_vocab_size(target))
        self.drafts_trees = self.branching is not None
        self.drafts_on_device = not self.drafts_trees
        self.layouts: dict[tuple, TreeLayout] = {}  # (depth, device) -> the tree's first levels; ``release``

    @classmethod
    def from_pretrained(cls, directory: str | Path, target: torch.nn.Module, **options) -> MedusaDrafter:
        """The Medusa heads saved in ``directory`` for ``target`` (refused in one line for another)."""
        config = read_drafter_config(directory, "medusa")
        check_target(directory, config, target)
        saved = config["options"]
        heads = MedusaHeads(target, num_heads=saved["num_heads"], draft_ids=saved_draft_ids(directory, saved, target))
        return cls(load_weights(directory, heads), target, **options)

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", checkpoint: str = "embedded",
                  tree: list[int] | None = None) -> MedusaDrafter:
        cls.check_options(compile=compile, forward=forward, checkpoint=checkpoint, tree=tree)
        return cls.from_pretrained(SHIPPED.get(checkpoint, checkpoint), pair.target, tree=tree)

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", checkpoint: str = "embedded",
                      tree: list[int] | None = None) -> None:
        config = read_drafter_config(Path(SHIPPED.get(checkpoint, checkpoint)), "medusa")
        medusa_branching(tree, config["options"]["num_heads"])

    def check_target(self, target: torch.nn.Module) -> None:
        if target is not self.target:
            raise ValueError("these Medusa heads read the hidden states of the model they were built with; pass "
                             "that model as the Decoder's target")

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.state: torch.Tensor | None = None  # [B, D] the target's last hidden state that gave the last token
        self.nothing = input_ids[:, :0]  # [B, 0] the empty proposal
        self.fixed_shapes = False
        self.num_forwards = 0

    def fix_shapes(self, slots: int) -> None:
        self.fixed_shapes = True

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator,
                stop: StopHook | None = None) -> Proposal:
        if self.state is None or k == 0:
            return Proposal(self.nothing, None)
        self.num_forwards += 1
        depth = min(k, self.heads.num_heads if self.branching is None else len(self.branching))
        logits = medusa_logits(self.heads, self.target, self.state)[:, :depth]  # [B, d, V]
        if self.branching is not None:
            return self.tree(logits, sampling, generator)
        if sampling.is_greedy:
            tokens, peaks = greedy_choice(logits)  # [B, d], [B, d]
            return Proposal(tokens, None, finite_peaks(peaks))
        probs = logits_to_probs(logits, sampling)  # [B, d, V]
        return Proposal(sample(probs, generator), probs, finite_peaks(logits.amax(-1)))

    def tree(self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> Proposal:
        """Medusa's tree over the heads' [B, d, V] logits: level i's nodes from head i - 1 (module docstring)."""
        layout = self.layout(logits.shape[1], logits.device)
        parents, levels = 1, []
        probs = None if sampling.is_greedy else logits_to_probs(logits, sampling)  # [B, d, V]
        for level, b in enumerate(layout.shape.branching):
            if probs is None:
                children = logits[:, level].topk(b, dim=-1).indices.repeat(1, parents)  # [B, n*b]
            else:
                children = torch.multinomial(probs[:, level], parents * b, replacement=True, generator=generator)
            levels.append(children)
            parents *= b
        internal_depths = layout.shape.depth_offsets[: layout.shape.num_internal]  # [I] each internal position's
        at_internal = None if probs is None else probs[:, internal_depths]  # [B, I, V]: q of its children's head
        return Proposal(torch.cat(levels, 1), at_internal, finite_peaks(logits.amax(-1)), layout)

    def layout(self, depth: int, device: torch.device) -> TreeLayout:
        """The layout of the tree's first ``depth`` levels on ``device``, built once per drafter."""
        key = (depth, device)
        if key not in self.layouts:
            self.layouts[key] = tree_layout(self.branching[:depth], device)
        return self.layouts[key]

    def commit(self, outcome: StepOutcome) -> None:
        """Keep the target's state at the position that gave the step's next token."""
        state = outcome.target_states.hidden[:, 0, 0]  # [B, D]
        if self.fixed_shapes and self.state is not None and self.state.shape == state.shape:
            self.state.copy_(state)
        else:  # a fixed-shape run writes into it later: its own copy, not the step's tensor
            self.state = state.clone() if self.fixed_shapes else state

    def select_rows(self, index: torch.Tensor) -> None:
        self.nothing = self.nothing[index]
        if self.state is not None:
            self.state = self.state[index]

    def release(self) -> None:
        self.layouts.clear()

    def device_state(self) -> dict[str, torch.Tensor]:
        return {} if self.state is None else {"state": self.state}

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.state is not None:
            self.state = adopted(state["state"], self.state)


def medusa_branching(tree: object, num_heads: int) -> tuple[int, ...] | None:
    """``tree`` as a branching (None for chains): one level per head at most."""
    if tree is None:
        return None
    branching = tree_shape(as_branching(tree)).branching
    if len(branching) > num_heads:
        raise ValueError(f"tree {list(branching)} has {len(branching)} levels and needs as many heads; there are "
                         f"{num_heads}")
    return branching


def check_heads_fit(heads: object, target: torch.nn.Module) -> None:
    """Everything ``generate`` will need of ``heads`` beside ``target``, checked before any forward, in one line."""
    if not isinstance(heads, MedusaHeads):
        raise TypeError(f"heads must be specdec.heads.MedusaHeads, got {type(heads).__name__}")
    check_model("target", target)
    width = heads.blocks[0].in_features
    if width != target_width(target):
        raise ValueError(f"the Medusa heads read hidden states of width {width}; the target's are "
                         f"{target_width(target)} wide: build the heads for this target")
    check_placement("the Medusa heads", heads, target)
    heads.check_draft_vocabulary(target)
