"""What one forward pass costs: the measurements behind a cost ratio c and a predicted speedup.

``time_forwards`` times a model's forward of n tokens on top of a cached prompt, for each n asked, the way the
decode loop runs it (the same KV cache, eager or compiled), so benchmarks need no access to the cache itself;
``time_tree_forwards`` times the verification of a token tree of N nodes the same way. Each forward goes through a
``CachedContext`` as the loop's do, and is forgotten through its one rollback (``CachedContext.keep``).
"""

from __future__ import annotations

import statistics

import torch

from specdec.cache import CachedModel, KVCache, graph_capture, static_capacity
from specdec.context import CachedContext
from specdec.layout import TreeLayout, VerifyLayout
from specdec.timing import Clock
from specdec.tree import tree_shape


def time_forwards(model: torch.nn.Module, prompt: torch.Tensor, widths, repeats: int = 10, warmup: int = 3,
                  cache_layout: str = "dynamic", compile: bool = False, clock: Clock | None = None,
                  label: str = "model", forward: str = "auto", captured: bool = False) -> dict[int, float]:
    """Median seconds of one forward of n tokens (each n in ``widths``) over a cache holding ``prompt`` [B, T].

    The tokens are the prompt's first n, fed after the prompt; each forward is rolled back before the next, so
    every one sees the same cache. The widths are interleaved, one forward of each per round, so a machine whose
    speed drifts moves every width alike (their ratios are what predictions use); ``warmup`` untimed rounds precede
    the ``repeats`` timed ones.
    ``cache_layout``, ``compile`` and ``forward`` are as in ``specdec.generate``. ``captured=True`` (CUDA, a lean
    forward) times replays of a CUDA graph of each forward and its rollback, as the device step runs them (no
    launch cost per kernel). ``clock`` defaults to one that synchronises the prompt's device before every reading;
    ``label`` names the model in cache errors.
    """
    widths = list(widths)
    if not widths or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= prompt.shape[1]
                         for n in widths):
        raise ValueError(f"widths must be integers in [1, {prompt.shape[1]}] (the prompt's length), got {widths}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    clock = clock or Clock(prompt.device)
    runner = CachedModel(model, label, forward, cache_layout, compile)
    if captured and (prompt.device.type != "cuda" or not runner.is_lean):
        raise ValueError(f"captured=True times CUDA graphs of a lean forward; got device {prompt.device} and "
                         f"{'a lean' if runner.is_lean else 'no lean'} forward")
    cache = runner.new_cache(prompt.shape[0], static_capacity(prompt.shape[1], max(widths)), prompt.device,
                             fixed_span=captured)
    with torch.no_grad():
        context = filled(cache, prompt)
        # Each width's tokens made once, laid out as a decode step's (a slice's strides would compile another graph)
        run = {n: (lambda tokens=prompt[:, :n].clone(memory_format=torch.contiguous_format): forward_and_forget(
            context, tokens)) for n in widths}
        if captured:
            run = {n: captured_replay(step, prompt.device) for n, step in run.items()}
        samples = {n: [] for n in widths}
        for round_index in range(warmup + repeats):
            for n in widths:
                start = clock.now()
                run[n]()
                seconds = clock.now() - start
                if round_index >= warmup:
                    samples[n].append(seconds)
        return {n: statistics.median(times) for n, times in samples.items()}


def forward_and_forget(context: CachedContext, queue: torch.Tensor, nodes: torch.Tensor | None = None,
                       layout: VerifyLayout | None = None) -> None:
    """One forward of ``queue`` [B, m] (causal) and then ``nodes`` [B, N] laid out by ``layout``, with logits at
    every column as a verification has them, rolled back so the next sees the same cache and queue."""
    context.replace_queue(queue, None, None)
    fed = queue.shape[1] + (0 if nodes is None else nodes.shape[1])
    context.feed(nodes, layout, num_logits=fed)
    context.keep(torch.zeros(queue.shape[0], fed, dtype=torch.bool, device=queue.device),
                 prefix=layout is None or layout.causal, max_kept=0,
                 queue=queue, queue_valid=None)


def captured_replay(step, device: torch.device):
    """``step`` run once on a side stream (lazy set-up), captured as a CUDA graph; returns its replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph):
        step()
    return graph.replay


def filled(cache: KVCache, prompt: torch.Tensor) -> CachedContext:
    """A context over ``cache`` that has cached the whole [B, T] prompt (no logits) and committed it."""
    context = CachedContext(cache, prompt, None)
    context.feed(num_logits=0)
    context.keep(torch.ones_like(prompt, dtype=torch.bool), prefix=True, max_kept=prompt.shape[1],
                 queue=prompt[:, :0], queue_valid=None)
    return context


def time_tree_forwards(model: torch.nn.Module, prompt: torch.Tensor, node_counts, repeats: int = 10,
                       warmup: int = 3, clock: Clock | None = None, label: str = "model",
                       forward: str = "auto") -> dict[int, float]:
    """Median seconds of one tree verification of N nodes (each N in ``node_counts``) over a cache holding
    ``prompt`` [B, T]: the root and N nodes in one forward under a tree's ancestor mask, as the decode loop runs it
    (eager). The cost depends on N, not on the tree's shape, so the tree is the root's N children."""
    node_counts = list(node_counts)
    if not node_counts or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < prompt.shape[1]
                              for n in node_counts):
        raise ValueError(f"node_counts must be integers in [1, {prompt.shape[1] - 1}] (below the prompt's length), "
                         f"got {node_counts}")
    clock = clock or Clock(prompt.device)
    cache = CachedModel(model, label, forward).new_cache(prompt.shape[0], static_capacity(prompt.shape[1],
                                                                                          max(node_counts) + 1),
                                                         prompt.device)
    medians = {}
    with torch.no_grad():
        context = filled(cache, prompt)
        for n in node_counts:
            layout = TreeLayout(tree_shape((n,)).on(prompt.device))  # the root's n children
            root, nodes = prompt[:, :1], prompt[:, 1 : n + 1]  # [B, 1], [B, N]
            samples = []
            for _ in range(warmup + repeats):
                start = clock.now()
                forward_and_forget(context, root, nodes, layout)
                samples.append(clock.now() - start)
            medians[n] = statistics.median(samples[warmup:])
    return medians
