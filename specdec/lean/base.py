"""What every lean forward shares: the call (embed, blocks, head), the cache write and the attention over slots.

A lean forward runs a Hugging Face causal LM's own parameters through a few plain tensor ops over per-row KV
buffers that the caller owns. The caller says, per token, its position, the slot its key and value go to, and
which slots it attends; rollback, padding, holes and trees are the caller's arithmetic on those three tensors.
Per family, a subclass collects the model's Parameters once into plain lists and writes ``embed``, ``block`` and
``head``.

A call reads nothing from the device: no ``.item()``, no branch on a tensor's value, so it traces under
``torch.compile(fullgraph=True)`` and replays as one CUDA graph. Slots and positions out of range (rows of a batch
that finished feed junk) are clamped into range, so they cannot index outside a buffer; rows never mix, so a junk
row cannot disturb the others.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LeanForward:
    """``logits = forward(input_ids, positions, write_slots, attend, keys, values, logit_columns=None)``;
    ``logits, hidden = forward(..., hidden_layers=(L,))`` also returns hidden states (``__call__``).

    Hidden states are numbered as transformers' ``output_hidden_states`` numbers them: 0 is the embeddings' output,
    i (1 <= i < L) the output of block i, and L the final norm's output, the LM head's input.

    Set by subclasses: ``num_layers``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``vocab_size``,
    ``context_limit`` (int, or None when the model has no hard limit) and ``embedding`` (a Parameter that tells the
    model's current device and dtype, which follow ``model.to(...)``).
    """

    model: torch.nn.Module
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_limit: int | None
    embedding: torch.nn.Parameter

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the blocks compute keys and values in on ``device``: autocast's where it is on there (fp32
        weights trained in mixed precision write bf16 or fp16 keys), else the weights'."""
        return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else self.dtype

    def new_buffers(
        self, batch_size: int, capacity: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Zeroed key and value buffers, one [B, num_kv_heads, capacity, head_dim] tensor per layer each, in
        ``dtype`` (default ``compute_dtype``)."""
        if batch_size < 1 or capacity < 1:
            raise ValueError(f"buffers need batch_size >= 1 and capacity >= 1, got {batch_size} and {capacity}")
        shape = (batch_size, self.num_kv_heads, capacity, self.head_dim)
        device = torch.device(device or self.device)
        options = dict(device=device, dtype=dtype or self.compute_dtype(device))
        keys = [torch.zeros(shape, **options) for _ in range(self.num_layers)]
        values = [torch.zeros(shape, **options) for _ in range(self.num_layers)]
        return keys, values

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        write_slots: torch.Tensor,
        attend: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        logit_columns: torch.Tensor | None = None,
        hidden_layers: tuple[int, ...] = (),
        features: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """[B, m, V] logits of the ``logit_columns`` [m] of the [B, n] ``input_ids`` (all n when None); with
        ``hidden_layers`` (indices in [0, L], see the class docstring) also the [B, n, H, D] hidden states of those
        layers at every column. ``features`` [B, n, F]: what a family that takes more than tokens reads beside them
        (``embed``; an EAGLE head's target features).

        Token j of row b sits at ``positions[b, j]``, writes its key and value to slot ``write_slots[b, j]`` of
        every layer's buffers (in place) and attends the slots s < S where ``attend[b, j, s]`` [B, n, S] holds, its
        own slot included (the caller's duty: a token attending nothing has no defined output).
        """
        self.check_call(input_ids, positions, write_slots, attend, keys, values)
        capacity = keys[0].shape[2]
        rows = torch.arange(input_ids.shape[0], device=input_ids.device).unsqueeze(1)  # [B, 1]
        # buffer[write_index] is the [B, n, Hkv, hd] block of the new tokens; junk rows stay inside the buffers
        write_index = (rows, slice(None), write_slots.clamp(0, capacity - 1))
        hidden, rotary = self.embed(input_ids, positions, features)  # [B, n, D]; the family's position tensors or None
        mask = attend.unsqueeze(1)  # [B, 1, n, S] broadcast over heads
        states = {0: hidden} if 0 in hidden_layers else {}  # only the layers asked for: no memory held otherwise
        for layer in range(self.num_layers):
            hidden = self.block(layer, hidden, rotary, write_index, mask, keys[layer], values[layer])
            if layer + 1 in hidden_layers:
                states[layer + 1] = hidden
        hidden = self.final_norm(hidden)  # [B, n, D]: the LM head's input
        if self.num_layers in hidden_layers:
            states[self.num_layers] = hidden
        if logit_columns is not None:
            hidden = hidden.index_select(1, logit_columns)  # [B, m, D]
        logits = self.lm_head(hidden)  # [B, m, V]
        if not hidden_layers:
            return logits
        return logits, torch.stack([states[layer] for layer in hidden_layers], 2)  # [B, n, H, D]

    def check_call(self, input_ids, positions, write_slots, attend, keys, values) -> None:
        """Shapes only (host metadata, no device read): one clear error before any work."""
        batch, n = input_ids.shape
        if positions.shape != (batch, n) or write_slots.shape != (batch, n):
            raise ValueError(f"positions {tuple(positions.shape)} and write_slots {tuple(write_slots.shape)} must "
                             f"match input_ids {tuple(input_ids.shape)}")
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise ValueError(f"keys and values need one buffer per layer ({self.num_layers}), got {len(keys)} and "
                             f"{len(values)}")
        if attend.dtype != torch.bool or attend.shape[:2] != (batch, n) or attend.shape[2] > keys[0].shape[2]:
            raise ValueError(f"attend must be a bool [B={batch}, n={n}, S] mask with S <= the buffers' capacity "
                             f"{keys[0].shape[2]}, got {attend.dtype} {tuple(attend.shape)}")

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor,
              features: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """[B, n, D] input hidden states, and what the blocks need to place tokens (rotary cos/sin or None):
        ``place(embed_tokens(input_ids), positions)``. A family that reads ``features`` overrides this."""
        return self.place(self.embed_tokens(input_ids), positions)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, n] -> [B, n, D] token embeddings."""
        return F.embedding(input_ids, self.embedding)

    def place(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, object]:
        """Give [B, n, D] inputs their [B, n] positions: the hidden states the blocks take, and what the blocks need
        to place tokens (rotary cos/sin, or None where positions are added to the inputs)."""
        raise NotImplementedError

    def block(self, layer: int, hidden, rotary, write_index, mask, key_buffer, value_buffer) -> torch.Tensor:
        """One transformer block on [B, n, D] hidden states: the next [B, n, D]."""
        raise NotImplementedError

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last block's [B, n, D] output -> the LM head's [B, n, D] input."""
        raise NotImplementedError

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, m, D] -> [B, m, V] logits."""
        return F.linear(hidden, self.head_weight)

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        write_index: tuple,
        mask: torch.Tensor,
        key_buffer: torch.Tensor,
        value_buffer: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Write the new [B, Hkv, n, hd] keys and values to their slots, then attend the first S slots: the
        [B, H, n, hd] attention output of the [B, H, n, hd] queries (grouped-query when H > Hkv)."""
        # Indexed assignment (index_put_), not scatter_: inductor writes it in place, where a scatter into a graph
        # input becomes a copy of the whole buffer.
        key_buffer[write_index] = key.transpose(1, 2)  # [B, n, Hkv, hd]
        value_buffer[write_index] = value.transpose(1, 2)
        slots = mask.shape[-1]
        return F.scaled_dot_product_attention(
            query, key_buffer[:, :, :slots], value_buffer[:, :, :slots], attn_mask=mask, scale=scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, H, n, hd]
