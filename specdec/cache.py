"""KV caches, and the object that owns a model's forward and the buffers its caches reuse (``CachedModel``).

Every cache has the same two operations. ``feed`` runs the model on a step's tokens and writes their keys and values
into the step's *region* (the slots fed since the last ``keep``); each fed token attends the committed slots and,
inside the region, the valid tokens its row of ``attend`` names (a causal run by default, ``TreeFeed`` for a token
tree). ``keep(kept)`` ends the step, the one rollback: of the region, the slots where ``kept`` holds join the
committed slots in order; the rest are forgotten. A token fed with ``valid`` 0 is a *hole*: nobody attends it and it
is never kept (left padding, rows that stopped generating, a drafter's optional queued token).

Two kinds of cache (words in docs/glossary.md):
- ``MaskedCache``: transformers' own forward over its cache, one length for every row, so a slot one row rejects
  stays as a hole (attention mask 0) and positions are counted from the mask; slots every row rejects are cropped
  off the tail; ``compact`` gathers each row's committed slots. Two layouts, one class each:
  ``DynamicMaskedCache`` (transformers' ``DynamicCache``, grows; a batch of one row without padding never holds a
  hole, so its cache is *dense*: no mask, no positions, rollback is a crop, until a tree or a hole ends that) and
  ``StaticMaskedCache`` (``StaticCache``, preallocated at fixed addresses for compile; compacts or grows when full).
- ``LeanCache``: ``specdec.lean``'s forward over preallocated buffers, with per-row lengths on the device. A row's
  committed slots are [0, length); a region's valid tokens are written right after them in order and its holes
  after those, so keeping a prefix (a chain) is arithmetic on lengths and the next write overwrites what was
  rejected; keeping a tree's path first gathers its slots into place. It reads nothing back to the host.

``CachedModel`` owns one model as the decode loop runs it: which forward (the lean one where ``specdec.lean``
supports the model, else transformers'), eager or compiled, and the static buffers its caches reuse across calls
(compiled code guards on them; CUDA graphs replay on their addresses). One ``Decoder`` or drafter owns each; its
``release`` frees the buffers and the compiled forward. Prefill (the first feed, whose width follows the prompt)
always runs eager.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache, StaticCache

from specdec.checks import check_allocation
from specdec.lean import LeanForward, lean_forward, lean_support
from specdec.types import ModelOutput

CACHE_LAYOUTS = ("dynamic", "static")
FORWARDS = ("auto", "lean", "transformers")
STATIC_CACHE_SLACK = 64  # spare static slots, so compaction is rare
STATIC_CAPACITY_STEP = 256  # static capacities are multiples of this, so nearby needs share one compiled shape
# Shapes one compiled lean forward may be specialised to. Every LeanForward call is one code object to dynamo, so
# each (model shape, batch size, capacity, one token or wider) a process runs is a variant: a drafter and a few
# capacities and batch sizes pass dynamo's default of 8, past which it would silently run eager. Raised around our
# calls only (``width_dynamic``).
COMPILED_VARIANTS = 64


@dataclass(frozen=True)
class TreeFeed:
    """How a token tree's tokens sit in the region (a causal run needs none of this)."""

    offsets: torch.Tensor  # [B, n] or [n]: each token's position after the region's start (the committed length)
    attend: torch.Tensor  # [n, R] or [B, n, R] bool: token j attends region slot r (R = the region's slots, these n
    # included); [B, n, R] where each row has its own tree


def check_runner_options(cache_layout: object, forward: object, compile: object) -> None:
    """The options of a ``CachedModel``, checked before any model is at hand."""
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    if cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"unknown cache layout {cache_layout!r}; known layouts: {', '.join(CACHE_LAYOUTS)}")
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")


def adopted(kept: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """``kept`` holding ``current``'s values (unless they are one tensor): what an owner continues with when a kept
    captured step is to read ``kept``."""
    if kept is not current:
        kept.copy_(current)
    return kept


def round_up_capacity(slots: int) -> int:
    return -(-slots // STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP


def static_capacity(prompt_width: int, new_tokens: int) -> int:
    """Slots to preallocate: the prompt (with its padding), the tokens to come, and slack for one step's rejected
    drafts and holes. A cache that still runs out compacts (masked) or grows; the device step fixes its caches'
    room and shapes before its first step (``KVCache.fix_shapes``)."""
    return prompt_width + new_tokens + STATIC_CACHE_SLACK


def context_limit(model: torch.nn.Module) -> int | None:
    """Largest number of positions the model can attend over, if its config says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def device_is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


@contextmanager
def graph_capture(graph: torch.cuda.CUDAGraph) -> Iterator[None]:
    """Capture the work run inside into ``graph``, its matrix products given a workspace of the graph's own.

    cuBLAS keeps one workspace per stream and reuses it; a capture bakes the workspace's address into the graph.
    One made before the capture (an eager product on the capture stream, or another graph's capture: every
    ``torch.cuda.graph`` captures on the same stream) is freed by whoever clears the workspaces next, and
    torch.compile's own CUDA graphs clear them at every recording: a replay then writes where nothing is allocated,
    the likely cause of the illegal memory access in the H200 suite's first replay after transformers' compiled
    methods had run. Cleared before and after, as ``torch._inductor.cudagraph_trees`` does, the capture allocates
    its workspace in the graph's private pool, which lives as long as the graph."""
    torch._C._cuda_clearCublasWorkspaces()
    try:
        with torch.cuda.graph(graph):
            yield
    finally:
        torch._C._cuda_clearCublasWorkspaces()


class KVCache:
    """A model's cache for one ``generate`` call; its owner feeds each step's tokens and keeps some of them."""

    def feed(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, tree: TreeFeed | None = None,
             logit_columns: torch.Tensor | None = None, prefill: bool = False, hidden_layers: tuple[int, ...] = (),
             features: torch.Tensor | None = None) -> ModelOutput:
        """Feed [B, n] tokens (``valid`` [B, n] 0 for holes, None when every token is real) and return the [B, m, V]
        logits of ``logit_columns`` [m] (None: all n), with the [B, n, H, D] hidden states of ``hidden_layers``
        (``specdec.lean.LeanForward``'s numbering) where asked. ``features`` [B, n, F]: what a model that reads
        more than tokens takes beside them. ``prefill``: a width that varies per call, run eager."""
        raise NotImplementedError

    def keep(self, kept: torch.Tensor, prefix: bool, max_kept: int | None = None) -> None:
        """End the step: keep the region's slots where ``kept`` [B, R] holds (only valid ones). ``prefix``: each
        row's kept slots are the first of its valid ones. ``max_kept``, a host bound where the owner has one: no
        row keeps a region slot at or past this index."""
        raise NotImplementedError

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B'] (rows that finished leave the batch)."""
        raise NotImplementedError

    def fix_shapes(self, slots: int) -> None:
        """Make room for ``slots`` slots now and keep every later step's shapes fixed: a captured step replays one
        set of shapes and cannot grow a cache."""
        raise NotImplementedError(f"the {type(self).__name__} cannot run a captured step")


class MaskedCache(KVCache):
    """transformers' forward over its own cache, one length for every row: a slot one row rejects stays as a hole
    (attention mask 0) and positions are counted from the mask; slots every row rejects are cropped off the tail.
    Two layouts: ``DynamicMaskedCache`` (grows) and ``StaticMaskedCache`` (preallocated)."""

    def __init__(self, owner: CachedModel):
        self.owner, self.model, self.label = owner, owner.model, owner.label
        self.mask: torch.Tensor  # [B, S] 1 = committed slot (a static layout's is zero past num_slots)
        self.num_slots = 0  # slots written so far
        self.region_start = 0  # the first slot of the current step's region
        self.body = getattr(self.model, "base_model", self.model)  # transformers' models: the layers without the head

    def feed(self, tokens, valid=None, tree=None, logit_columns=None, prefill=False, hidden_layers=(),
             features=None) -> ModelOutput:
        if features is not None:
            raise ValueError(f"the {self.label} model runs transformers' forward, which reads token ids only")
        n = tokens.shape[1]
        valid = torch.ones_like(tokens) if valid is None else valid.long()  # [B, n]
        if tree is None:  # a causal run: positions count the valid slots so far
            positions = self.mask.sum(-1, keepdim=True) + valid.cumsum(-1) - 1  # [B, n]
        else:
            positions = self.mask[:, : self.region_start].sum(-1, keepdim=True) + tree.offsets  # [B, n]
        where = self.write_mask(valid)
        attention_mask = self.mask if tree is None else self.tree_mask(tree, n)
        return self.run(tokens, prefill, logit_columns, hidden_layers, attention_mask=attention_mask,
                        position_ids=positions.clamp_min(0), **where)

    def run(self, tokens: torch.Tensor, prefill: bool, logit_columns: torch.Tensor | None,
            hidden_layers: tuple[int, ...], **inputs) -> ModelOutput:
        """One forward of the model over the cache. Asked for no logit column, the body alone runs."""
        if logit_columns is not None and logit_columns.numel() == 0:
            self.body(input_ids=tokens, past_key_values=self.past, use_cache=True, **inputs)
            empty = torch.empty(tokens.shape[0], 0, self.model.config.vocab_size, device=tokens.device)
            return ModelOutput(empty)
        options = {} if logit_columns is None else {"logits_to_keep": logit_columns}
        if hidden_layers:
            options["output_hidden_states"] = True
        out = self.module(prefill)(input_ids=tokens, past_key_values=self.past, use_cache=True, **inputs, **options)
        if not hidden_layers:
            return ModelOutput(out.logits)
        return ModelOutput(out.logits, torch.stack([out.hidden_states[i] for i in hidden_layers], 2))  # [B, n, H, D]

    def module(self, prefill: bool):
        """The callable that runs a forward with logits: the model itself."""
        return self.model

    def write_mask(self, valid: torch.Tensor) -> dict:
        """Mark the n new slots in the mask (1 where valid); what the model must be told of where they go."""
        raise NotImplementedError

    def tree_mask(self, tree: TreeFeed, n: int) -> torch.Tensor:
        """[B, 1, n, S] for a tree: every committed slot before the region, and the region's valid slots its row of
        ``attend`` names (the dynamic layout's mask covers exactly the slots written)."""
        committed = self.mask[:, : self.region_start].bool()  # [B, S0]
        region = self.mask[:, self.region_start : self.num_slots].bool()  # [B, R]
        region_attend = tree.attend & region.unsqueeze(1)  # [B, n, R]
        own = torch.eye(n, dtype=torch.bool, device=region.device)  # each token sees itself: no empty row
        region_attend[:, :, -n:] |= own
        mask = torch.cat([committed.unsqueeze(1).expand(-1, n, -1), region_attend], -1)  # [B, n, S0 + R]
        return mask.unsqueeze(1)

    def keep(self, kept, prefix, max_kept=None) -> None:
        num_region = self.num_slots - self.region_start
        self.mask[:, self.region_start : self.num_slots] *= kept.long()
        if max_kept is not None:
            self.crop_tail(num_region - max_kept)
        self.region_start = self.num_slots

    def crop_tail(self, num_slots: int) -> None:
        """Forget the last ``num_slots`` slots (already holes in every row)."""
        if num_slots <= 0:
            return
        self.num_slots -= num_slots
        self.region_start = min(self.region_start, self.num_slots)
        self.drop_tail(num_slots)

    def drop_tail(self, num_slots: int) -> None:
        """The layout's part of ``crop_tail``: its cache and mask forget their last ``num_slots`` slots."""
        raise NotImplementedError

    def compact(self) -> None:
        """Gather each row's committed slots, in order, to the end of the first ``max committed`` slots."""
        committed = self.mask[:, : self.num_slots].bool()  # [B, S]
        length = int(committed.sum(-1).max())
        # A stable sort puts holes first and keeps committed slots in order: rows end up left-padded.
        order = committed.long().sort(dim=-1, stable=True).indices[:, self.num_slots - length :]  # [B, L]
        for layer in self.past.layers:
            for name in ("keys", "values"):
                states = getattr(layer, name)  # [B, H, S, D]
                index = order[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
                self.store_compacted(layer, name, states.gather(2, index), length)  # [B, H, L, D]
        self.store_compacted_mask(committed.gather(1, order).long(), length)  # [B, L]
        self.num_slots = self.region_start = length

    def store_compacted(self, layer, name: str, gathered: torch.Tensor, length: int) -> None:
        """Hold a layer's gathered [B, H, L, D] keys or values as its first ``length`` slots."""
        raise NotImplementedError

    def store_compacted_mask(self, mask: torch.Tensor, length: int) -> None:
        """Hold the gathered [B, L] mask as the first ``length`` slots' mask."""
        raise NotImplementedError


class DynamicMaskedCache(MaskedCache):
    """transformers' ``DynamicCache``, which grows. A batch of one row without padding never holds a hole, so its
    cache is *dense*: no mask, no positions, rollback is a crop (transformers' padding-mask handling costs ~8% of a
    small model's step on CPU); a tree or a hole ends that. Holes piling up are compacted away."""

    def __init__(self, owner: CachedModel, batch_size: int, device: torch.device):
        super().__init__(owner)
        self.past = DynamicCache(config=self.model.config)
        self.mask = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, S]
        self.dense = batch_size == 1  # no hole in any slot: no mask kept
        self.next_hole_check = 64  # slot count at which to look for piled-up holes again

    def feed(self, tokens, valid=None, tree=None, logit_columns=None, prefill=False, hidden_layers=(),
             features=None) -> ModelOutput:
        if self.dense and (tree is not None or (valid is not None and not bool(valid.all()))):
            self.leave_dense()  # a tree's other nodes, or a hole (one read, where a dense row sees one)
        if not self.dense:
            return super().feed(tokens, valid, tree, logit_columns, prefill, hidden_layers, features)
        if features is not None:
            raise ValueError(f"the {self.label} model runs transformers' forward, which reads token ids only")
        self.num_slots += tokens.shape[1]  # no holes: the model counts positions from the cache's length
        return self.run(tokens, prefill, logit_columns, hidden_layers)

    def write_mask(self, valid: torch.Tensor) -> dict:
        self.mask = torch.cat([self.mask, valid], dim=1)
        self.num_slots += valid.shape[1]
        return {}

    def keep(self, kept, prefix, max_kept=None) -> None:
        if self.dense and max_kept is None:
            self.leave_dense()
        if self.dense:  # one row, a prefix: its count is max_kept
            self.crop_tail(self.num_slots - self.region_start - max_kept)
            self.region_start = self.num_slots
            return
        super().keep(kept, prefix, max_kept)
        if self.num_slots >= self.next_hole_check:
            self.compact_if_mostly_holes()

    def leave_dense(self) -> None:
        """From now on the cache may hold holes: write the mask a dense cache does not keep (all ones)."""
        if self.dense:
            self.mask = torch.ones(self.mask.shape[0], self.num_slots, dtype=torch.long, device=self.mask.device)
            self.dense = False

    def drop_tail(self, num_slots: int) -> None:
        self.past.crop(-num_slots)  # transformers 5.x: a negative count of slots to remove
        if not self.dense:
            self.mask = self.mask[:, : self.num_slots]

    def compact_if_mostly_holes(self) -> None:
        """Compact when holes outnumber the fullest row's committed slots (a host sync every ~S/2 slots)."""
        if self.num_slots > 2 * int(self.mask.sum(-1).max()):
            self.compact()
        self.next_hole_check = self.num_slots + max(64, self.num_slots // 2)

    def store_compacted(self, layer, name, gathered, length) -> None:
        setattr(layer, name, gathered)

    def store_compacted_mask(self, mask, length) -> None:
        self.mask = mask

    def select_rows(self, index: torch.Tensor) -> None:
        self.past.batch_select_indices(index)
        self.mask = self.mask[index]


class StaticMaskedCache(MaskedCache):
    """transformers' ``StaticCache``, preallocated at fixed addresses (for compiled forwards): a write says where it
    goes (``cache_position``); about to overflow, it compacts (between steps) or grows. It keeps its batch rows."""

    def __init__(self, owner: CachedModel, batch_size: int, device: torch.device, capacity: int):
        super().__init__(owner)
        self.past, self.mask = owner.static_cache(batch_size, capacity, device)
        self.capacity = self.mask.shape[1]
        self.run_compiled = owner.compiled_forward() if owner.compile else None
        self.marks_cuda_graph_steps = owner.compile and device_is_cuda(device)

    def feed(self, tokens, valid=None, tree=None, logit_columns=None, prefill=False, hidden_layers=(),
             features=None) -> ModelOutput:
        self.make_room(tokens.shape[1])
        return super().feed(tokens, valid, tree, logit_columns, prefill, hidden_layers, features)

    def module(self, prefill: bool):
        """The compiled forward for decode steps where compiled; the prefill's width varies per call: eager."""
        if prefill or self.run_compiled is None:
            return self.model
        if self.marks_cuda_graph_steps:
            torch.compiler.cudagraph_mark_step_begin()  # earlier outputs of this graph may now be overwritten
        return self.run_compiled

    def write_mask(self, valid: torch.Tensor) -> dict:
        n = valid.shape[1]
        slots = torch.arange(self.num_slots, self.num_slots + n, device=valid.device)  # [n]
        self.mask[:, slots] = valid
        self.num_slots += n
        return {"cache_position": slots}

    def make_room(self, n: int) -> None:
        """About to overflow: compact (between steps), then grow if that is not enough."""
        if self.num_slots + n <= self.capacity:
            return
        if self.num_slots and self.region_start == self.num_slots:
            self.compact()
        if self.num_slots + n > self.capacity:
            self.grow(2 * (self.num_slots + n))

    def grow(self, capacity: int) -> None:
        """Reallocate the static cache with ``capacity`` slots (rounded up), keeping the slots written so far."""
        past, grown = self.owner.grow_static_cache(self.past, self.mask, self.num_slots, capacity)
        self.past, self.mask, self.capacity = past, grown, grown.shape[1]

    def drop_tail(self, num_slots: int) -> None:
        for layer in self.past.layers:
            layer.cumulative_length.sub_(num_slots)  # the next write overwrites the stale slots

    def store_compacted(self, layer, name, gathered, length) -> None:
        getattr(layer, name)[:, :, :length] = gathered  # in place: static tensors keep their addresses
        layer.cumulative_length.fill_(length)

    def store_compacted_mask(self, mask, length) -> None:
        self.mask.zero_()
        self.mask[:, :length] = mask

    def select_rows(self, index: torch.Tensor) -> None:
        raise ValueError(f"the {self.label} static cache keeps its batch rows; use the dynamic layout")


class LeanCache(KVCache):
    """``specdec.lean``'s forward over preallocated buffers with per-row lengths (see the module docstring)."""

    def __init__(self, owner: CachedModel, batch_size: int, device: torch.device, capacity: int,
                 fixed_span: bool):
        """``fixed_span``: attention always spans the whole capacity (shapes fixed per step width, for compiled
        forwards and captured steps); otherwise it spans a host bound on the longest row."""
        self.owner, self.label = owner, owner.label
        self.run = owner.compiled_forward() if owner.compile else owner.lean
        self.eager = owner.lean
        self.keys, self.values = owner.lean_buffers(batch_size, capacity, device)
        self.capacity = self.keys[0].shape[2]
        self.position_limit = (owner.lean.context_limit or 2**62) - 1
        self.fixed_span = fixed_span
        # Per-row state a step reads from the step before: written in place only, so a captured step reads on every
        # replay the tensors its capture saw (a tensor rebound during capture would be freed, its memory reused).
        self.length = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] committed slots per row
        self.region_count = torch.zeros_like(self.length)  # [B] valid entries in the region so far
        self.slot_index = torch.arange(self.capacity, device=device)  # [C]
        self.start_region()
        self.bound = 0  # host: no row's length plus region reaches past this

    def start_region(self) -> None:
        """An empty region: no slot fed since the last keep."""
        empty = self.length.new_zeros(self.length.shape[0], 0)  # [B, 0]: no memory a later step could read
        self.region_slots, self.region_valid = empty, empty.bool()  # [B, R] each entry's slot, whether it is valid
        self.region_count.zero_()

    def feed(self, tokens, valid=None, tree=None, logit_columns=None, prefill=False, hidden_layers=(),
             features=None) -> ModelOutput:
        batch, n = tokens.shape
        if self.bound + n > self.capacity:
            self.grow(2 * (self.bound + n))
        valid = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid.bool()  # [B, n]
        rank = valid.long().cumsum(-1) - 1  # [B, n] rank among the valid ones
        num_valid = rank[:, -1:] + 1  # [B, 1]
        rank_of_hole = (~valid).long().cumsum(-1) - 1  # [B, n]
        first_free = (self.length + self.region_count).unsqueeze(1)  # [B, 1]
        slots = first_free + torch.where(valid, rank, num_valid + rank_of_hole)  # [B, n] holes after the valid ones
        if tree is None:
            positions = first_free + rank  # [B, n]
        else:
            positions = self.length.unsqueeze(1) + tree.offsets  # [B, n]
        span = self.capacity if self.fixed_span else self.bound + n
        attend = self.attention(slots, valid, tree, span)  # [B, n, S]
        self.region_slots = torch.cat([self.region_slots, slots], 1)
        self.region_valid = torch.cat([self.region_valid, valid], 1)
        self.region_count += num_valid.squeeze(1)
        self.bound += n
        run = self.eager if prefill else self.run
        output = run(tokens, positions.clamp(0, self.position_limit), slots, attend, self.keys, self.values,
                     logit_columns, hidden_layers, features)
        return ModelOutput(*output) if hidden_layers else ModelOutput(output)

    def attention(self, slots: torch.Tensor, valid: torch.Tensor, tree: TreeFeed | None, span: int) -> torch.Tensor:
        """[B, n, S] bool: the committed slots, the region's valid slots each token attends, and its own slot."""
        slot = self.slot_index[:span]  # [S]
        committed = slot < self.length.unsqueeze(1)  # [B, S]
        own = slot == slots.unsqueeze(2)  # [B, n, S]
        if tree is None:  # the region's valid tokens lie in order from the length on: a causal run
            region = (slot >= self.length[:, None, None]) & (slot <= slots.unsqueeze(2))  # [B, n, S]
            region &= valid.unsqueeze(2)
        else:
            entries = torch.cat([self.region_valid, valid], 1)  # [B, R]
            entry_slots = torch.cat([self.region_slots, slots], 1)  # [B, R]
            seen = (tree.attend & entries.unsqueeze(1) & valid.unsqueeze(2)).long()  # [B, n, R]
            # A hole's slot may since hold a valid token: add, so a hole's 0 never hides it.
            region = torch.zeros(*seen.shape[:2], span, dtype=torch.long, device=seen.device)
            region = region.scatter_add_(2, entry_slots.unsqueeze(1).expand_as(seen), seen) > 0  # [B, n, S]
        return committed.unsqueeze(1) & valid.unsqueeze(2) | region | own

    def keep(self, kept, prefix, max_kept=None) -> None:
        kept = kept & self.region_valid  # [B, R]
        if not prefix:
            self.gather_kept(kept)
        num_region = kept.shape[1]
        self.length += kept.sum(-1)  # in place: a captured step updates the same tensor on every replay
        self.bound -= num_region - (max_kept if max_kept is not None else num_region)
        self.start_region()

    def gather_kept(self, kept: torch.Tensor) -> None:
        """Move each row's kept region slots, in order, to the slots right after its length."""
        order = (~kept).long().sort(dim=-1, stable=True).indices  # [B, R] kept entries first, in order
        source = self.region_slots.gather(1, order)  # [B, R]
        target = self.length.unsqueeze(1) + torch.arange(kept.shape[1], device=kept.device)  # [B, R]
        for states in (*self.keys, *self.values):  # [B, H, C, D] each
            heads, dim = states.shape[1], states.shape[3]
            moved = states.gather(2, source[:, None, :, None].expand(-1, heads, -1, dim))  # [B, H, R, D], a copy
            states.scatter_(2, target[:, None, :, None].expand(-1, heads, -1, dim), moved)

    def fix_shapes(self, slots: int) -> None:
        if slots > self.capacity:
            self.grow(slots)
        self.fixed_span = True  # attention over the whole capacity: the same shapes at every step

    def device_state(self) -> dict[str, torch.Tensor]:
        """The tensors a captured step reads from the step before it (``specdec.device_loop``), by name."""
        return {"length": self.length, "region_count": self.region_count, "slot_index": self.slot_index,
                **{f"keys.{i}": states for i, states in enumerate(self.keys)},
                **{f"values.{i}": states for i, states in enumerate(self.values)}}

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue in ``state``'s tensors (a kept capture's), holding this cache's values."""
        self.length = adopted(state["length"], self.length)
        self.region_count = adopted(state["region_count"], self.region_count)
        self.slot_index = adopted(state["slot_index"], self.slot_index)
        self.keys = [adopted(state[f"keys.{i}"], states) for i, states in enumerate(self.keys)]
        self.values = [adopted(state[f"values.{i}"], states) for i, states in enumerate(self.values)]

    def grow(self, capacity: int) -> None:
        """Move to larger buffers (rounded up) holding the slots written so far; they replace the pooled ones."""
        keys, values = self.owner.lean_buffers(self.length.shape[0], capacity, self.length.device, replace=True)
        for old, new in zip((*self.keys, *self.values), (*keys, *values)):
            new[:, :, : self.capacity] = old
        self.keys, self.values, self.capacity = keys, values, keys[0].shape[2]
        self.slot_index = torch.arange(self.capacity, device=self.length.device)

    def select_rows(self, index: torch.Tensor) -> None:
        """Move the rows ``index`` [B''] (distinct) to the front of the buffers in place: only the rows that change
        place, only the slots written so far (``bound``), layer by layer through one scratch. The buffers become
        their first B'' rows. (Gathered into new buffers of the whole capacity, a row leaving batch 16 cost 36 ms on
        a 2-core CPU, most of it faulting in fresh memory: more than two decode steps.)"""
        kept, span = index.shape[0], self.bound
        places = torch.arange(kept, device=index.device)  # [B'']
        first = int(torch.where(index != places, places, kept).min())  # rows before it stay where they are
        moving = index[first:]  # [M]
        scratch = self.keys[0].new_empty(moving.shape[0], self.keys[0].shape[1], span, self.keys[0].shape[3])
        for states in (*self.keys, *self.values):  # [B', H, C, D] each; scratch [M, H, S, D]
            torch.index_select(states[:, :, :span], 0, moving, out=scratch)
            states[first:kept, :, :span] = scratch
        self.keys = [states[:kept] for states in self.keys]
        self.values = [states[:kept] for states in self.values]
        self.length = self.length[index]
        self.region_slots, self.region_valid = self.region_slots[index], self.region_valid[index]
        self.region_count = self.region_count[index]


class CachedModel:
    """One model as the decode loop runs it: its forward and the static buffers its caches reuse across calls.

    ``forward``: "auto" runs the lean forward where ``specdec.lean`` supports the model, else transformers';
    "lean" insists (an unsupported model is an error); "transformers" always runs transformers' forward (the
    reference). ``cache_layout`` ("dynamic" or "static") is the masked cache's; a lean cache is always
    preallocated. ``compile=True`` runs decode forwards through ``torch.compile``: the lean forward with inductor
    alone (a decode loop that captures its step takes CUDA graphs around it), transformers' forward over a static
    cache with CUDA graphs (``reduce-overhead``) on CUDA. "Compile means static" is decided here, once.
    """

    def __init__(self, model: torch.nn.Module, label: str, forward: str = "auto", cache_layout: str = "dynamic",
                 compile: bool = False, lean: LeanForward | None = None):
        """``lean``: the lean forward to run, where the model is not a causal LM ``specdec.lean`` knows (a draft
        head's, ``specdec.heads.EagleForward``)."""
        check_runner_options(cache_layout, forward, compile)
        self.model, self.label, self.compile = model, label, compile
        if lean is None and forward != "transformers":
            lean = lean_forward(model)
        self.lean: LeanForward | None = lean
        if forward == "lean" and self.lean is None:
            raise ValueError(f"forward='lean' cannot run the {label} model: {lean_support(model)}")
        self.static = compile or cache_layout == "static"
        self.cache_layout = "static" if self.static else "dynamic"
        self.compiled = None
        self.pool: dict[int, tuple] = {}  # batch size -> the buffers its caches reuse

    @property
    def is_lean(self) -> bool:
        return self.lean is not None

    @property
    def num_layers(self) -> int:
        """The model's blocks (hidden states are numbered 0..num_layers, ``specdec.lean.LeanForward``)."""
        return self.lean.num_layers if self.is_lean else self.model.config.num_hidden_layers

    @property
    def selects_rows(self) -> bool:
        """Whether its caches can drop batch rows (compiled forwards and transformers' static caches keep theirs)."""
        return not self.compile if self.is_lean else not self.static

    def new_cache(self, batch_size: int, capacity: int, device: torch.device, fixed_span: bool = False) -> KVCache:
        """A cache for one call, with room for ``capacity`` slots."""
        if self.is_lean:
            return LeanCache(self, batch_size, device, capacity, fixed_span=fixed_span or self.compile)
        if self.static:
            return StaticMaskedCache(self, batch_size, device, capacity)
        return DynamicMaskedCache(self, batch_size, device)

    def compiled_forward(self):
        """The forward compiled once for this owner (lean: inductor alone, one graph for every step width
        (``width_dynamic``); transformers': CUDA graphs on CUDA)."""
        if self.compiled is None:
            if self.is_lean:
                self.compiled = width_dynamic(torch.compile(self.lean, fullgraph=True, dynamic=False))
            else:
                cuda = next(self.model.parameters()).device.type == "cuda"
                self.compiled = torch.compile(self.model, mode="reduce-overhead" if cuda else "default")
        return self.compiled

    def lean_buffers(self, batch_size: int, capacity: int, device: torch.device,
                     replace: bool = False) -> tuple[list, list]:
        """Key and value buffers of at least ``capacity`` slots (rounded up), reused from the pool when they fit
        (``replace``: new ones regardless). Zeroed when allocated: a slot nobody attends is still multiplied by 0,
        and must not hold NaN."""
        pooled = self.pool.get(batch_size)
        if (not replace and pooled is not None and pooled[0][0].shape[2] >= capacity
                and pooled[0][0].device == torch.device(device)):
            return pooled
        capacity = round_up_capacity(capacity)
        numel = 2 * self.lean.num_layers * batch_size * self.lean.num_kv_heads * capacity * self.lean.head_dim
        check_allocation("max_new_tokens", numel, self.lean.dtype, device)  # the capacity follows the budget
        buffers = self.lean.new_buffers(batch_size, capacity, device)
        self.pool[batch_size] = buffers
        return buffers

    def static_cache(self, batch_size: int, capacity: int, device: torch.device) -> tuple[StaticCache, torch.Tensor]:
        """The pooled transformers ``StaticCache`` (emptied) and its [B, capacity] mask for this batch size if it
        has room, else new ones (rounded up), pooled."""
        pooled = self.pool.get(batch_size)
        if pooled is not None and pooled[1].shape[1] >= capacity and pooled[1].device == torch.device(device):
            past, mask = pooled
            mask.zero_()
            for layer in past.layers:
                if layer.is_initialized:
                    layer.cumulative_length.zero_()
            return past, mask
        capacity = round_up_capacity(capacity)
        past = StaticCache(config=self.model.config, max_cache_len=capacity)
        mask = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)  # [B, S] 1 = committed
        self.pool[batch_size] = (past, mask)
        return past, mask

    def grow_static_cache(self, old: StaticCache, mask: torch.Tensor, num_slots: int, capacity: int):
        """A larger static cache (rounded up) holding ``old``'s first ``num_slots`` slots; it replaces the pooled one."""
        capacity = round_up_capacity(capacity)
        past = StaticCache(config=self.model.config, max_cache_len=capacity)
        for old_layer, layer in zip(old.layers, past.layers):
            if old_layer.is_initialized:
                layer.lazy_initialization(old_layer.keys, old_layer.values)
                layer.keys[:, :, :num_slots] = old_layer.keys[:, :, :num_slots]
                layer.values[:, :, :num_slots] = old_layer.values[:, :, :num_slots]
                layer.cumulative_length.fill_(num_slots)
        grown = torch.zeros(mask.shape[0], capacity, dtype=mask.dtype, device=mask.device)
        grown[:, : mask.shape[1]] = mask
        self.pool[mask.shape[0]] = (past, grown)
        return past, grown

    def release(self) -> None:
        """Free the pooled buffers and the compiled forward (the next call allocates and compiles again)."""
        self.pool.clear()
        self.compiled = None


def width_dynamic(compiled):
    """A compiled lean forward called with the step's width dynamic and dynamo's recompile limit raised to
    ``COMPILED_VARIANTS`` for the call only (the process's setting is left as it was). The width (n tokens fed, m
    logit columns) is what k changes: n = k + 2 and m = k + 1 when verifying k drafts, so one graph serves every k,
    and a captured step replays it at its own k. Widths 0 and 1 are specialised by torch whatever the marking, so
    a one-token step (a drafter's, the autoregressive baseline's) keeps a static graph of its own. A call naming no
    logit columns (a cost profile's) names them all, so it runs the graph its decode steps run."""

    def run(input_ids, positions, write_slots, attend, keys, values, logit_columns=None, hidden_layers=(),
            features=None):
        if logit_columns is None:  # every column, named: the graph of the decode steps, which always name theirs
            logit_columns = torch.arange(input_ids.shape[1], device=input_ids.device)  # [n]
        widths = [input_ids, positions, write_slots, attend] + ([] if features is None else [features])
        for tensor in widths:  # [B, n] each; attend [B, n, S]; features [B, n, F]
            torch._dynamo.maybe_mark_dynamic(tensor, 1)
        torch._dynamo.maybe_mark_dynamic(logit_columns, 0)  # [m]
        limit = max(torch._dynamo.config.recompile_limit, COMPILED_VARIANTS)
        with torch._dynamo.config.patch(recompile_limit=limit):
            return compiled(input_ids, positions, write_slots, attend, keys, values, logit_columns, hidden_layers,
                            features)

    return run
