"""What one forward pass costs: the measurements behind a cost ratio c and a predicted speedup.

``time_forwards`` times a model's forward of n tokens on top of a cached prompt, for each n asked, the way the
decode loop runs it (the same KV cache, eager or compiled), so benchmarks need no access to the cache itself;
``time_tree_forwards`` times the verification of a token tree of N nodes the same way.
"""

from __future__ import annotations

import statistics

import torch

from specdec.cache import KVCache, static_capacity
from specdec.timing import Clock
from specdec.tree import tree_shape_on


def time_forwards(model: torch.nn.Module, prompt: torch.Tensor, widths, repeats: int = 10, warmup: int = 3,
                  cache_layout: str = "dynamic", compile: bool = False, clock: Clock | None = None,
                  label: str = "model") -> dict[int, float]:
    """Median seconds of one forward of n tokens (each n in ``widths``) over a cache holding ``prompt`` [B, T].

    The tokens are the prompt's first n, fed after the prompt; each forward is rolled back before the next, so
    every one sees the same cache. The widths are interleaved, one forward of each per round, so a machine whose
    speed drifts moves every width alike (their ratios are what predictions use); ``warmup`` untimed rounds precede
    the ``repeats`` timed ones.
    ``cache_layout`` and ``compile`` are as in ``specdec.generate`` (compile needs the static layout). ``clock``
    defaults to one that synchronises the prompt's device before every reading; ``label`` names the model in
    cache errors.
    """
    widths = list(widths)
    if not widths or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= prompt.shape[1]
                         for n in widths):
        raise ValueError(f"widths must be integers in [1, {prompt.shape[1]}] (the prompt's length), got {widths}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    clock = clock or Clock(prompt.device)
    capacity = static_capacity(prompt.shape[1], max(widths)) if cache_layout == "static" else None
    cache = KVCache(model, prompt.shape[0], prompt.device, label, cache_layout, capacity, compile)
    with torch.no_grad():
        cache.prefill(prompt, torch.ones_like(prompt))
        samples = {n: [] for n in widths}
        for round_index in range(warmup + repeats):
            for n in widths:
                seconds = forward_seconds(cache, prompt[:, :n], clock)
                if round_index >= warmup:
                    samples[n].append(seconds)
        return {n: statistics.median(times) for n, times in samples.items()}


def forward_seconds(cache: KVCache, tokens: torch.Tensor, clock: Clock) -> float:
    """Seconds of one forward of ``tokens`` [B, n], rolled back afterwards so the next sees the same cache."""
    nothing_kept = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
    start = clock.now()
    cache.forward(tokens, torch.ones_like(tokens))
    seconds = clock.now() - start
    cache.keep(nothing_kept, tokens.shape[1], 0)
    return seconds


def time_tree_forwards(model: torch.nn.Module, prompt: torch.Tensor, node_counts, repeats: int = 10,
                       warmup: int = 3, clock: Clock | None = None, label: str = "model") -> dict[int, float]:
    """Median seconds of one tree verification of N nodes (each N in ``node_counts``) over a cache holding
    ``prompt`` [B, T]: the root and N nodes in one forward under a tree's ancestor mask, as the decode loop runs it
    (dynamic layout). The cost depends on N, not on the tree's shape, so the tree is the root's N children."""
    node_counts = list(node_counts)
    if not node_counts or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < prompt.shape[1]
                              for n in node_counts):
        raise ValueError(f"node_counts must be integers in [1, {prompt.shape[1] - 1}] (below the prompt's length), "
                         f"got {node_counts}")
    clock = clock or Clock(prompt.device)
    cache = KVCache(model, prompt.shape[0], prompt.device, label)
    active = torch.ones(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    medians = {}
    with torch.no_grad():
        cache.prefill(prompt, torch.ones_like(prompt))
        for n in node_counts:
            shape = tree_shape_on((n,), prompt.device)
            tokens = prompt[:, : n + 1]  # [B, N+1]: the root, then the nodes
            nothing_kept = torch.zeros_like(tokens, dtype=torch.bool)
            samples = []
            for _ in range(warmup + repeats):
                start = clock.now()
                cache.forward_tree(tokens, shape.ancestors, shape.depth_offsets, active)
                samples.append(clock.now() - start)
                cache.keep_slots(nothing_kept)
                cache.crop_tail(n + 1)  # every slot is a hole: the next forward sees the same cache
            medians[n] = statistics.median(samples[warmup:])
    return medians
