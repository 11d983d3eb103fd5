"""A model's KV cache and the mask that says which of its slots hold committed tokens.

Rows of a batch accept different numbers of drafts, but a Hugging Face cache has one length for all rows. So
rollback is masking: rejected slots stay in the cache as holes (attention mask 0) and positions are counted from
the mask, so the model sees exactly the committed tokens of each row. Slots rejected by *every* row are cropped
off the tail, so batch size 1 never keeps a hole. Left padding of ragged prompts is the same kind of hole. When
holes outnumber the committed slots of the fullest row, ``compact`` gathers every row's committed slots together.

A batch of one row without padding never holds a hole (every rejected slot is cropped, and trees are the only other
source), so such a cache is ``dense``: its forwards pass no attention mask and no positions, and the model takes
the plain causal path (transformers' padding-mask handling costs ~8% of a small model's decode step on CPU). Its
mask would be all ones, so it is not kept (rollback is a crop); a tree, or padding in the prompt, turns ``dense``
off for good (``leave_dense`` writes the ones then).

Two layouts, same behaviour: ``dynamic`` (a ``DynamicCache`` that grows by concatenation) and ``static`` (a
preallocated ``StaticCache`` written in place, whose tensors keep their addresses, for CUDA graphs / compile;
rollback moves its write pointer back). Static tensors are pooled per (model, role, batch size) and reused by
later calls (``STATIC_POOL``): compiled code guards on their identity and CUDA graphs replay on their addresses,
so new tensors would mean recompiling. A static cache that runs out of room even after compaction is reallocated
with twice the room it needs, replacing the pooled one.

``compile=True`` (static layout) runs the model's forward through ``torch.compile``: CUDA graphs
(``reduce-overhead``) on CUDA, inductor's default mode elsewhere. Shapes are fixed per k: the forward sees
[B, n] tokens over a [B, capacity] mask. Prefill, whose width varies with every prompt, stays eager.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache

CACHE_LAYOUTS = ("dynamic", "static")
STATIC_CACHE_SLACK = 64  # spare static slots, so compaction is rare
STATIC_CAPACITY_STEP = 256  # static capacities are multiples of this, so nearby needs share one compiled shape
COMPILED_FORWARDS: dict[int, tuple[torch.nn.Module, object]] = {}  # id(model) -> (model, its compiled forward)
# (id(model), label, batch size) -> (model, StaticCache, its [B, capacity] mask): one live KVCache uses each at a time
STATIC_POOL: dict[tuple[int, str, int], tuple[torch.nn.Module, StaticCache, torch.Tensor]] = {}


def release_static_caches() -> None:
    """Free every pooled static cache (the next static call allocates, and compiled forwards recompile)."""
    STATIC_POOL.clear()


def compiled_forward(model: torch.nn.Module):
    """The model's forward compiled once per process (CUDA graphs on CUDA), shared by every cache that runs it."""
    if id(model) not in COMPILED_FORWARDS:
        cuda = next(model.parameters()).device.type == "cuda"
        COMPILED_FORWARDS[id(model)] = (model, torch.compile(model, mode="reduce-overhead" if cuda else "default"))
    return COMPILED_FORWARDS[id(model)][1]


def round_up_capacity(slots: int) -> int:
    return -(-slots // STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP


class KVCache:
    """One model's cache; its owner feeds tokens through ``forward`` and rolls back through ``keep``."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        device: torch.device,
        label: str,
        layout: str = "dynamic",
        capacity: int | None = None,
        compile: bool = False,
    ):
        """``capacity`` (static layout only) is the number of slots to preallocate, rounded up; ``compile`` (static
        layout only) runs forwards through ``compiled_forward``."""
        if layout not in CACHE_LAYOUTS:
            raise ValueError(f"unknown cache layout {layout!r}; known layouts: {', '.join(CACHE_LAYOUTS)}")
        if compile and layout != "static":
            raise ValueError(f"a compiled forward needs the static cache layout, got layout {layout!r}")
        self.model = model
        self.label = label  # names the model in errors
        self.static = layout == "static"
        self.run_model = compiled_forward(model) if compile else model  # what ``forward`` calls
        self.marks_cuda_graph_steps = compile and input_device_is_cuda(device)
        if self.static:
            self.take_pooled(batch_size, capacity, device)
        else:
            self.past = DynamicCache(config=model.config)
            self.mask = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, S] 1 = committed slot
        self.num_slots = 0  # slots written so far; the static mask is zero past them
        self.dense = batch_size == 1 and not self.static  # no hole in any slot (see the module docstring)
        self.next_hole_check = 64  # dynamic layout: slot count at which to look for piled-up holes again
        self.body = getattr(model, "base_model", model)  # transformers' models: the layers without the LM head

    def prefill(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> None:
        """Feed [B, n] tokens whose logits nobody needs: the model's body (``base_model``) fills the cache and the
        [B, n, V] head projection is skipped."""
        self.note_padding(input_mask)
        self.feed(self.body, input_ids, input_mask)

    def prefill_and_predict(self, input_ids: torch.Tensor, input_mask: torch.Tensor, num_logits: int = 1) -> torch.Tensor:
        """Feed [B, n] tokens and return the [B, m, V] logits of the last m = ``num_logits`` columns only (the head
        runs on those): the prompt's last token and any drafts appended to it, so the prefill verifies them. Left
        padding keeps the last columns real tokens in every row. Eager, whatever ``compile`` says: the width varies
        per prompt.

        The columns are named by position: transformers' integer form slices a view whose batch stride sends a
        bfloat16 matmul on CPU down a path ~40x slower (torch 2.13; the head of GPT-2 XL: 0.3 s a call).
        """
        self.note_padding(input_mask)
        n = input_ids.shape[1]
        last_columns = torch.arange(n - num_logits, n, device=input_ids.device)  # [m]
        return self.feed(self.model, input_ids, input_mask, logits_to_keep=last_columns).logits

    def note_padding(self, input_mask: torch.Tensor) -> None:
        """A prompt with padding makes holes: the cache is no longer ``dense`` (one host read, once per prompt)."""
        if self.dense and not bool(input_mask.all()):
            self.leave_dense()

    def leave_dense(self) -> None:
        """From now on the cache may hold holes: write the mask a dense cache does not keep (all ones)."""
        if self.dense:
            self.mask = torch.ones(self.mask.shape[0], self.num_slots, dtype=torch.long, device=self.mask.device)
            self.dense = False

    def forward(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> torch.Tensor:
        """Feed [B, n] tokens (input_mask 0 marks holes) and return their [B, n, V] logits.

        The new slots count as committed until ``keep`` says otherwise. Under CUDA graphs the logits live in the
        graph's output buffer: use them before this cache's next forward.
        """
        if self.marks_cuda_graph_steps:
            torch.compiler.cudagraph_mark_step_begin()  # earlier outputs of this graph may now be overwritten
        return self.feed(self.run_model, input_ids, input_mask).logits

    def take_pooled(self, batch_size: int, capacity: int, device: torch.device) -> None:
        """Use the pooled static cache of this model, role and batch size, emptied, if it has ``capacity`` slots;
        else allocate one (rounded up) and pool it."""
        key = (id(self.model), self.label, batch_size)
        pooled = STATIC_POOL.get(key)
        if pooled is not None and pooled[2].shape[1] >= capacity and pooled[2].device == torch.device(device):
            _, self.past, self.mask = pooled
            self.mask.zero_()
            for layer in self.past.layers:
                if layer.is_initialized:
                    layer.cumulative_length.zero_()
        else:
            capacity = round_up_capacity(capacity)
            self.past = StaticCache(config=self.model.config, max_cache_len=capacity)
            self.mask = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)  # [B, S] 1 = committed
            STATIC_POOL[key] = (self.model, self.past, self.mask)
        self.capacity = self.mask.shape[1]

    def feed(self, module: torch.nn.Module, input_ids: torch.Tensor, input_mask: torch.Tensor, **options):
        """Run ``module`` (the model or its body) on [B, n] tokens over the cache, with the model's ``options``;
        returns its output."""
        n = input_ids.shape[1]
        if self.static and self.num_slots + n > self.capacity:
            if self.num_slots:
                self.compact()
            if self.num_slots + n > self.capacity:
                self.grow(2 * (self.num_slots + n))
        if self.dense:  # no holes: the model counts positions from the cache's length, as without a mask
            self.num_slots += n
            return module(input_ids=input_ids, past_key_values=self.past, use_cache=True, **options)
        positions = self.mask.sum(-1, keepdim=True) + input_mask.cumsum(-1) - 1  # [B, n]
        if self.static:  # told where to write; a dynamic cache appends
            slots = torch.arange(self.num_slots, self.num_slots + n, device=input_ids.device)  # [n]
            self.mask[:, slots] = input_mask.long()
            where = {"cache_position": slots}
        else:
            self.mask = torch.cat([self.mask, input_mask.long()], dim=1)
            where = {}
        self.num_slots += n
        return module(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=positions.clamp_min(0),
            past_key_values=self.past,
            use_cache=True,
            **where,
            **options,
        )

    def forward_tree(
        self, input_ids: torch.Tensor, attend: torch.Tensor, offsets: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        """Feed [B, n] tree nodes and return their [B, n, V] logits. ``attend`` [n, T] says which of the last T slots
        each node sees: these n and the T - n slots this tree fed before (its ancestors and itself); every node
        also sees the committed slots before the tree. A node's position is the committed length plus its
        ``offsets`` [n] (its depth below the last committed token). ``active`` [B] bool: other rows feed holes.
        Dynamic layout: a 4D mask [B, 1, n, S + n] goes straight to attention."""
        if self.static:
            raise ValueError(f"the {self.label} cache verifies trees on the dynamic layout only")
        self.leave_dense()  # the tree's other nodes become holes
        n, tree_slots = input_ids.shape[1], attend.shape[1]
        committed = self.mask[:, : self.num_slots - (tree_slots - n)].bool()  # [B, S0]
        positions = committed.sum(-1, keepdim=True) + offsets  # [B, n]
        mask = torch.cat([committed.unsqueeze(1).expand(-1, n, -1), attend.expand(committed.shape[0], -1, -1)],
                         -1)  # [B, n, S0 + T]
        new_slots = active.long().unsqueeze(1).expand(-1, n)  # [B, n]
        self.mask = torch.cat([self.mask, new_slots], dim=1)
        self.num_slots += n
        out = self.model(input_ids=input_ids, attention_mask=mask.unsqueeze(1), position_ids=positions,
                         past_key_values=self.past, use_cache=True)
        return out.logits

    def keep_slots(self, kept: torch.Tensor) -> None:
        """Of the last ``kept.shape[1]`` slots keep those where ``kept`` [B, n] (bool) holds; the rest become holes.
        A tree's rollback: its accepted path stays, every other node becomes a hole, in place."""
        start = self.num_slots - kept.shape[1]
        self.mask[:, start : self.num_slots] *= kept.long()
        if self.num_slots >= self.next_hole_check:
            self.compact_if_mostly_holes()

    def keep(self, num_kept: torch.Tensor, num_last: int, max_kept: int, min_kept: int = 0) -> None:
        """Of the last ``num_last`` slots keep the first ``num_kept`` [B] of each row; the rest become holes.

        ``max_kept`` and ``min_kept`` bound ``num_kept`` over the rows that fed tokens (host ints; rows that fed
        holes may hold anything). Slots past ``max_kept`` are cropped from the cache; with ``min_kept ==
        num_last`` no row rejected anything and the mask stays as it is.
        """
        if min_kept >= num_last:
            return
        if self.dense:  # one row: max_kept is its count
            self.crop_tail(num_last - max_kept)
            return
        start = self.num_slots - num_last
        slot = torch.arange(num_last, device=self.mask.device)  # [num_last]
        kept = (slot < num_kept.unsqueeze(1)).long()  # [B, num_last]
        self.mask[:, start : self.num_slots] *= kept
        self.crop_tail(num_last - max_kept)
        if not self.static and self.num_slots >= self.next_hole_check:
            self.compact_if_mostly_holes()

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B'] (rows that finished leave the batch). Dynamic layout only: the
        static one keeps its tensors, addresses and batch size."""
        if self.static:
            raise ValueError(f"the {self.label} static cache keeps its batch rows; use the dynamic layout")
        self.past.batch_select_indices(index)
        self.mask = self.mask[index]

    def compact_if_mostly_holes(self) -> None:
        """Compact when holes outnumber the fullest row's committed slots (a host sync every ~S/2 slots)."""
        if self.num_slots > 2 * int(self.mask.sum(-1).max()):
            self.compact()
        self.next_hole_check = self.num_slots + max(64, self.num_slots // 2)

    def crop_tail(self, num_slots: int) -> None:
        """Forget the last ``num_slots`` slots (already holes in every row)."""
        if num_slots <= 0:
            return
        self.num_slots -= num_slots
        if self.static:
            for layer in self.past.layers:
                layer.cumulative_length.sub_(num_slots)  # the next write overwrites the stale slots
        else:
            self.past.crop(-num_slots)  # transformers 5.x: a negative count of slots to remove
            if not self.dense:
                self.mask = self.mask[:, : self.num_slots]

    def grow(self, capacity: int) -> None:
        """Reallocate the static cache with ``capacity`` slots (rounded up), keeping the slots written so far."""
        capacity = round_up_capacity(capacity)
        past = StaticCache(config=self.model.config, max_cache_len=capacity)
        for old, new in zip(self.past.layers, past.layers):
            if old.is_initialized:
                new.lazy_initialization(old.keys, old.values)
                new.keys[:, :, : self.num_slots] = old.keys[:, :, : self.num_slots]
                new.values[:, :, : self.num_slots] = old.values[:, :, : self.num_slots]
                new.cumulative_length.fill_(self.num_slots)
        grown = torch.zeros(self.mask.shape[0], capacity, dtype=self.mask.dtype, device=self.mask.device)
        grown[:, : self.capacity] = self.mask
        self.past, self.mask, self.capacity = past, grown, capacity
        STATIC_POOL[(id(self.model), self.label, self.mask.shape[0])] = (self.model, past, grown)

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
                gathered = states.gather(2, index)  # [B, H, L, D]
                if self.static:
                    states[:, :, :length] = gathered  # in place: static tensors keep their addresses
                else:
                    setattr(layer, name, gathered)
            if self.static:
                layer.cumulative_length.fill_(length)
        new_mask = committed.gather(1, order).long()  # [B, L]
        if self.static:
            self.mask.zero_()
            self.mask[:, :length] = new_mask
        else:
            self.mask = new_mask
        self.num_slots = length


def context_limit(model: torch.nn.Module) -> int | None:
    """Largest number of positions the model can attend over, if its config says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def static_capacity(prompt_width: int, new_tokens: int) -> int:
    """Slots to preallocate: the prompt (with its padding), the tokens to come, and slack for rejected drafts
    before ``KVCache.compact`` has to run. A cache that still runs out grows (``KVCache.grow``)."""
    return prompt_width + new_tokens + STATIC_CACHE_SLACK


def input_device_is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"
