"""Draft heads trained against one target, as modules: EAGLE's feature-level head and Medusa's heads.

``EagleHead`` (Li et al. 2024). Its input at position t is ``fc([feature_t ; embed(token_{t+1})])``: the target's
hidden state at t (the input of its LM head, or with ``feature_layers`` several of its layers fused, as in EAGLE-3)
and the embedding of the token that follows. One decoder block of the target's family runs over that (a one-block
model of the target's own class, ``body``), then that family's final norm (and a projection back to the target's
width where the head is narrower): the *predicted feature* at t + 1. The target's own LM head, frozen and shared,
gives the logits of the token after next.

``MedusaHeads`` (Cai et al. 2024). K residual blocks ``x + SiLU(W x + b)`` over the target's last hidden state, each
followed by the target's LM head; head i, over the state that gave token t + 1, predicts token t + i + 2. W starts at
zero, so an untrained head predicts what the target's head does.

Both are ``DraftHead``s: ``draft_ids`` restricts the LM head to a reduced draft vocabulary (EAGLE-3's: the N tokens
most frequent in the training data, ``specdec.train.loop.frequent_tokens``). The head scores those rows of the LM
head only (training's cost at a large vocabulary is its logit tensors), and its drafts are target ids: ``widened``
puts the scores back at their ids with -inf (probability 0) elsewhere, so the ``speculative`` rule stays exact.

A head holds only its own parameters: the target's embedding and LM head are read from the target when the head
runs (``EagleForward``, ``medusa_logits``), never copied. ``specdec.eagle`` and ``specdec.medusa`` draft with them;
``specdec.train.losses`` holds their training losses; ``specdec.checkpoints`` saves them with the target they belong to.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from specdec.checks import check_draft_ids, check_draft_length
from specdec.lean import FAMILIES, LeanForward, lean_support
from specdec.types import StateRequest


def target_width(target: nn.Module) -> int:
    """The target's hidden size: the width of its features."""
    return target.get_input_embeddings().weight.shape[1]


def target_head_weight(target: nn.Module) -> torch.Tensor:
    """[V, D] the target's LM head weight."""
    return target.get_output_embeddings().weight


def check_family(target: nn.Module) -> None:
    """A head's block is the target family's lean block: refuse, in one line, a target without a lean forward."""
    if type(target) not in FAMILIES:
        raise ValueError(f"a draft head runs one block of the target's family through specdec.lean: "
                         f"{lean_support(target)}")


def one_block_model(target: nn.Module, width: int) -> nn.Module:
    """A causal LM of the target's own class with one block of ``width`` (heads of the target's head size), a
    one-token vocabulary (the head reads the target's embedding and LM head, not its own) and no dropout; on the
    target's device and dtype, in eval mode."""
    config = copy.deepcopy(target.config)
    dim, heads = target_width(target), config.num_attention_heads
    head_size = getattr(config, "head_dim", None) or dim // heads
    if width % head_size:
        raise ValueError(f"width={width} must be a multiple of the target's attention head size {head_size}")
    config.num_hidden_layers = 1
    config.vocab_size = 1
    config.pad_token_id = None  # a pad id (Llama's often) would index outside the one-token embedding
    config.hidden_size = width
    config.num_attention_heads = width // head_size
    if hasattr(config, "num_key_value_heads"):  # grouped-query attention keeps its group size where it can
        group = max(heads // config.num_key_value_heads, 1)
        config.num_key_value_heads = max(config.num_attention_heads // group, 1)
        config.head_dim = head_size
    for name in ("intermediate_size", "n_inner"):
        if getattr(config, name, None):
            setattr(config, name, getattr(config, name) * width // dim)
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:1]
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    parameter = next(target.parameters())
    body = type(target)(config).to(device=parameter.device, dtype=parameter.dtype)
    return body.eval()


class DraftHead(nn.Module):
    """What EAGLE's and Medusa's heads share: the target's frozen LM head, over a reduced draft vocabulary where
    ``draft_ids`` is given (a non-empty list of distinct token ids of the target's vocabulary, checked here in one
    line), else over the whole vocabulary. The ids are a buffer (``draft_ids``, [V_d] sorted; empty: the whole
    vocabulary), saved with the head's weights."""

    def __init__(self, target: nn.Module, draft_ids: list[int] | None = None):
        super().__init__()
        vocab_size = target_head_weight(target).shape[0]
        ids = [] if draft_ids is None else check_draft_ids(draft_ids, vocab_size)
        self.register_buffer("draft_ids", torch.tensor(ids, dtype=torch.long, device=next(target.parameters()).device))

    @property
    def reduced(self) -> bool:
        return self.draft_ids.numel() > 0

    def draft_vocab_size(self, target: nn.Module) -> int:
        """How many tokens the head can draft: its reduced vocabulary's, else the target's."""
        return self.draft_ids.numel() if self.reduced else target_head_weight(target).shape[0]

    def check_draft_vocabulary(self, target: nn.Module) -> None:
        """The ids (perhaps loaded from a file, or changed after construction) still lie in the target's vocabulary."""
        if self.reduced:
            check_draft_ids(self.draft_ids, target_head_weight(target).shape[0])

    def draft_weight(self, target: nn.Module) -> torch.Tensor:
        """[V_d, D] the rows of the target's LM head the head scores (frozen: detached); [V, D] all of them."""
        weight = target_head_weight(target).detach()
        return weight.index_select(0, self.draft_ids) if self.reduced else weight

    def widened(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[..., V_d] scores over the draft vocabulary -> [..., V] at their target ids, -inf elsewhere."""
        if not self.reduced:
            return logits
        full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
        return full.index_copy(-1, self.draft_ids, logits)  # [..., V]

    def target_ids(self, index: torch.Tensor) -> torch.Tensor:
        """[...] positions in the draft vocabulary -> [...] the target's token ids."""
        return self.draft_ids[index] if self.reduced else index

    def draft_index(self, vocab_size: int) -> torch.Tensor:
        """[V] each target id's position in a reduced draft vocabulary, -1 outside it."""
        index = torch.full((vocab_size,), -1, dtype=torch.long, device=self.draft_ids.device)
        return index.index_copy(0, self.draft_ids, torch.arange(self.draft_ids.numel(), device=index.device))


class EagleHead(DraftHead):
    """EAGLE's draft head for one target (see the module docstring).

    ``feature_layers``: the target's hidden states it reads (``StateRequest`` numbering; (-1,) the last, EAGLE-1;
    three, a low, a middle and a high layer, fused by a linear map as EAGLE-3 does). ``width``: the block's width
    (default the target's). ``init_from_last_layer``: start the block (and, at the target's width, its norm and
    positions) from the target's last block. ``draft_ids``: a reduced draft vocabulary (``DraftHead``), or None for
    the whole vocabulary. Each is checked here, in one line.
    """

    kind = "eagle"

    def __init__(self, target: nn.Module, feature_layers: tuple[int, ...] = (-1,), width: int | None = None,
                 init_from_last_layer: bool = False, draft_ids: list[int] | None = None):
        check_family(target)
        super().__init__(target, draft_ids)
        dim = target_width(target)
        width = dim if width is None else check_draft_length("width", width)
        self.feature_layers = tuple(feature_layers)
        StateRequest(layers=self.feature_layers).resolved(target.config.num_hidden_layers)
        self.options = {"feature_layers": list(self.feature_layers), "width": width,
                        "draft_vocab": self.draft_ids.numel() or None}
        parameter = next(target.parameters())
        options = dict(device=parameter.device, dtype=parameter.dtype)
        self.fuse = nn.Linear(len(feature_layers) * dim, dim, bias=False, **options) \
            if len(feature_layers) > 1 else None
        self.fc = nn.Linear(2 * dim, width, **options)
        self.body = one_block_model(target, width)
        self.project = nn.Linear(width, dim, bias=False, **options) if width != dim else None
        if init_from_last_layer:
            self.start_from_last_layer(target)

    def start_from_last_layer(self, target: nn.Module) -> None:
        """The block from the target's last block, and at the target's width its final norm and position table."""
        own, theirs = self.body.base_model, target.base_model
        blocks_own = [module for module in own.children() if isinstance(module, nn.ModuleList)][0]
        blocks_theirs = [module for module in theirs.children() if isinstance(module, nn.ModuleList)][0]
        if self.project is not None:
            raise ValueError("init_from_last_layer needs the head at the target's width (width=None)")
        blocks_own[0].load_state_dict(blocks_theirs[-1].state_dict())
        for name, module in own.named_children():
            if name in ("ln_f", "norm", "wpe"):
                module.load_state_dict(getattr(theirs, name).state_dict())

    def fused(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H, D] the target's hidden states at ``feature_layers`` -> [..., D] the feature the head reads."""
        return hidden[..., 0, :] if self.fuse is None else self.fuse(hidden.flatten(-2))

    def lean(self, target: nn.Module) -> EagleForward:
        """The head's lean forward, reading ``target``'s embedding and LM head."""
        return EagleForward(self, target)


class EagleForward(LeanForward):
    """The EAGLE head as a lean forward (``specdec.lean.LeanForward``): one block of its family over the fused
    input, run over caller-owned KV buffers like any lean forward. Its hidden state 1 is the predicted feature."""

    def __init__(self, head: EagleHead, target: nn.Module):
        self.head, self.model = head, head.body
        self.family = FAMILIES[type(head.body)][0](head.body)  # built once, in eval mode; holds the head's Parameters
        self.num_layers = 1
        self.num_heads, self.num_kv_heads = self.family.num_heads, self.family.num_kv_heads
        self.head_dim = self.family.head_dim
        self.vocab_size = target_head_weight(target).shape[0]
        self.context_limit = self.family.context_limit
        self.embedding = target.get_input_embeddings().weight  # [V, D], the target's own
        self.head_weight = target_head_weight(target)  # [V, D], the target's own
        # The draft vocabulary's rows of the frozen LM head, gathered once where reduced (else the target's own).
        self.draft_weight = head.draft_weight(target)  # [V_d, D]

    def embed(self, input_ids, positions, features=None):
        tokens = F.embedding(input_ids, self.embedding)  # [B, n, D]
        return self.family.place(self.head.fc(torch.cat([features, tokens], -1)), positions)  # [B, n, w]

    def block(self, layer, hidden, rotary, write_index, mask, key_buffer, value_buffer):
        return self.family.block(layer, hidden, rotary, write_index, mask, key_buffer, value_buffer)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The predicted feature: the block's norm, projected to the target's width where the head is narrower."""
        hidden = self.family.final_norm(hidden)
        return hidden if self.head.project is None else self.head.project(hidden)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, m, D] -> [B, m, V] the target's LM head; with a reduced vocabulary, -inf outside it."""
        if not self.head.reduced:
            return F.linear(hidden, self.head_weight)
        return self.head.widened(F.linear(hidden, self.draft_weight), self.vocab_size)  # [B, m, V]


class MedusaHeads(DraftHead):
    """Medusa's K heads for one target (see the module docstring); ``draft_ids``: a reduced draft vocabulary
    (``DraftHead``), or None for the whole vocabulary."""

    kind = "medusa"

    def __init__(self, target: nn.Module, num_heads: int = 4, draft_ids: list[int] | None = None):
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")
        super().__init__(target, draft_ids)
        dim = target_width(target)
        parameter = next(target.parameters())
        self.blocks = nn.ModuleList(nn.Linear(dim, dim, device=parameter.device, dtype=parameter.dtype)
                                    for _ in range(num_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.options = {"num_heads": num_heads, "draft_vocab": self.draft_ids.numel() or None}

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., D] the target's last hidden states -> [..., K, D] each head's input to the LM head."""
        return torch.stack([features + F.silu(block(features)) for block in self.blocks], -2)


def medusa_logits(heads: MedusaHeads, target: nn.Module, features: torch.Tensor, reduced: bool = False
                  ) -> torch.Tensor:
    """[..., D] the target's last hidden states -> [..., K, V] each head's logits (the target's LM head; with a
    reduced draft vocabulary, -inf outside it). ``reduced``: [..., K, V_d] over the draft vocabulary only, in
    ``heads.draft_ids`` order (training's loss; the whole vocabulary where the heads are not reduced)."""
    logits = F.linear(heads(features), heads.draft_weight(target))  # [..., K, V_d]
    return logits if reduced else heads.widened(logits, target_head_weight(target).shape[0])
