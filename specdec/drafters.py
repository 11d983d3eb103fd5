"""Drafters propose tokens; the decode loop decides what to keep and tells them through ``commit``.

The interface, with what a drafter may declare, is ``specdec.interfaces.Drafter``. ``CachedDrafter`` is the base of
every drafter that runs a causal LM over its own KV cache: it owns the model's ``CachedModel`` and, per call, its
``CachedContext`` (the cache and its queue of emitted tokens the cache has not seen), started from the prompt,
rolled back in ``commit`` and narrowed in ``select_rows``. A new cached drafter writes ``draft`` only, feeding
its drafts through ``self.feed``. Here: ``ModelDrafter`` (a small LM drafting a chain), ``TreeDrafter``
(a small LM drafting a token tree, ``specdec.tree``) and ``NoDrafter`` (the baseline); in their own modules
``specdec.early_exit.EarlyExitDrafter`` (the target's first layers) and ``specdec.ngram.NGramDrafter`` (prompt
lookup, no model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.cache import CachedModel, adopted, check_runner_options, static_capacity
from specdec.checkpoints import load_draft_model, read_drafter_config
from specdec.checks import as_integer, check_children_fit_vocabulary, check_model, model_device
from specdec.context import CachedContext
from specdec.lean import LeanForward
from specdec.interfaces import Drafter, StopHook
from specdec.layout import Proposal, TreeLayout, tree_layout
from specdec.sampling import SamplingConfig, finite_peaks, greedy_choice, logits_to_probs, sample, usable
from specdec.tree import tree_shape
from specdec.types import ModelOutput, StepOutcome

DRAFT_ROOM_GUESS = 128  # new tokens a draft cache first makes room for; it grows if a call needs more


class CachedDrafter(Drafter):
    """A drafter running ``model`` over its own KV cache, which it owns and rolls back (see the module docstring).

    ``forward``, ``cache_layout`` and ``compile`` choose how the model runs (``specdec.cache.CachedModel``);
    ``lean``, the lean forward of a model ``specdec.lean`` does not know (a draft head's).
    """

    needs_pair = True

    def __init__(self, model: torch.nn.Module, label: str = "draft", forward: str = "auto",
                 cache_layout: str = "dynamic", compile: bool = False, lean: LeanForward | None = None):
        check_model(f"{type(self).__name__}'s model", model)
        self.model, self.label = model, label
        self.runner = CachedModel(model, label, forward, cache_layout, compile, lean)
        self.selects_rows = self.runner.selects_rows
        self.num_forwards = 0

    def models(self) -> list[torch.nn.Module]:
        return [self.model]

    def check_target(self, target: torch.nn.Module) -> None:
        """Its tokens are the target's: the two vocabularies must be the same size."""
        draft_vocab, target_vocab = self.model.config.vocab_size, target.config.vocab_size
        if draft_vocab != target_vocab:
            raise ValueError(f"the {self.label} model has vocab_size={draft_vocab} and the target {target_vocab}: a "
                             f"{type(self).__name__} proposes target token ids, so both must share a vocabulary; to "
                             f"draft across tokenizers use specdec.CrossTokenizerDrafter")
        draft_device, target_device = model_device(self.model), model_device(target)
        if draft_device != target_device:
            raise ValueError(f"the {self.label} model is on {draft_device} but the target on {target_device}; put "
                             f"both on one device")

    @property
    def drafts_on_device(self) -> bool:
        """A chain over a lean cache reads nothing back to the host (``specdec.device_loop``)."""
        return self.runner.is_lean and not self.drafts_trees

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Queue the prompt: the first ``propose`` feeds it with its first forward."""
        batch_size, width = input_ids.shape
        cache = self.runner.new_cache(batch_size, static_capacity(width, DRAFT_ROOM_GUESS), input_ids.device)
        padded = batch_size > 1 or not bool(attention_mask.all())  # one host read per call
        self.context = CachedContext(cache, input_ids, attention_mask if padded else None)
        self.live: torch.Tensor | None = None  # [B] bool rows still generating; None: all of them
        self.num_forwards = 0

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator,
                stop: StopHook | None = None) -> Proposal:
        if k == 0:
            return Proposal(self.context.queue[:, :0], None)
        return self.draft(k, sampling, generator, stop)

    def draft(self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None) -> Proposal:
        """Up to k draft positions (k >= 1), fed through ``self.context``; what a cached drafter writes."""
        raise NotImplementedError

    def feed(self, nodes=None, layout=None, num_logits: int = 1, features: torch.Tensor | None = None,
             hidden_layers: tuple[int, ...] = ()) -> ModelOutput:
        """One draft forward through the context (rows that stopped generating feed holes)."""
        self.num_forwards += 1
        return self.context.feed(nodes, layout, self.live, num_logits, features, hidden_layers)

    def commit(self, outcome: StepOutcome) -> None:
        """Keep the fed drafts on the accepted path that were emitted; queue the rest (see ``CachedContext``)."""
        self.context.commit(outcome)
        self.live = None if outcome.all_active_after else outcome.active_after

    def select_rows(self, index: torch.Tensor) -> None:
        self.context.select_rows(index)
        self.live = None if self.live is None else self.live[index]

    def release(self) -> None:
        self.runner.release()

    def fix_shapes(self, slots: int) -> None:
        self.context.fix_shapes(slots)

    def device_state(self) -> dict[str, torch.Tensor]:
        state = {f"context.{name}": tensor for name, tensor in self.context.device_state().items()}
        if self.live is not None:
            state["live"] = self.live
        return state

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        self.context.adopt_device_state({name.removeprefix("context."): tensor for name, tensor in state.items()
                                         if name.startswith("context.")})
        if self.live is not None:
            self.live = adopted(state["live"], self.live)


class ModelDrafter(CachedDrafter):
    """Drafts a chain autoregressively with a small causal LM that shares the target's vocabulary.

    ``num_drafts`` = n > 1 drafts n independent chains per row instead (multi-draft speculative decoding: SpecInfer,
    SpecTr): n i.i.d. draws of q at the root, each continued by its own chain of samples, proposed as one token tree
    of branching (n, 1, ..., 1) and verified by the strategy's tree rule in one target forward (speculative
    sampling's is recursive rejection sampling over the chains, exact at every temperature). At temperature 0 the
    chains start at the draft's n likeliest tokens and continue greedily. A step of k drafts n k nodes with k draft
    forwards, each over n tokens after the first.
    """

    name = "model"
    trusted_proposals = True

    def __init__(self, model: torch.nn.Module, label: str = "draft", forward: str = "auto",
                 cache_layout: str = "dynamic", compile: bool = False, lean: LeanForward | None = None,
                 num_drafts: int = 1):
        self.num_drafts = check_num_drafts(num_drafts, cache_layout, compile)
        self.drafts_trees = self.num_drafts > 1
        self.layouts: dict[tuple, TreeLayout] = {}  # (k, device) -> the n chains' tree; ``release`` clears it
        super().__init__(model, label, forward, cache_layout, compile, lean)
        check_children_fit_vocabulary(f"num_drafts={self.num_drafts}", self.num_drafts, model.config.vocab_size)

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", checkpoint: str | None = None,
                  **options) -> ModelDrafter:
        """The pair's draft, or with ``checkpoint`` the draft trained for the pair's target saved there
        (``python -m experiments.train_drafter drafter=model``)."""
        cls.check_options(compile=compile, forward=forward, checkpoint=checkpoint, **options)
        draft = pair.draft if checkpoint is None else load_draft_model(checkpoint, pair.target)
        return cls(draft, compile=compile, forward=forward, **options)

    @classmethod
    def reads_draft_model(cls, checkpoint: str | None = None, **options) -> bool:
        return checkpoint is None

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", checkpoint: str | None = None,
                      **options) -> None:
        unknown = set(options) - {"label", "cache_layout", "num_drafts"}
        if unknown:
            raise TypeError(f"ModelDrafter got unknown options {sorted(unknown)}; it takes checkpoint, label, "
                            f"cache_layout and num_drafts")
        check_runner_options(options.get("cache_layout", "dynamic"), forward, compile)
        check_num_drafts(options.get("num_drafts", 1), options.get("cache_layout", "dynamic"), compile)
        if checkpoint is not None:
            read_drafter_config(checkpoint, "model")

    def release(self) -> None:
        super().release()
        self.layouts.clear()

    def draft(self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None) -> Proposal:
        """k forwards: the queue, then each draft but the last (the cache never sees the last draft)."""
        if self.drafts_trees:
            return draft_tree(self.feed, self.chains_layout(k, self.context.queue.device), sampling, generator)
        return draft_chain(self.feed().logits[:, -1], lambda token: self.feed(token.unsqueeze(1)).logits[:, -1],
                           k, sampling, generator, stop)

    def chains_layout(self, k: int, device: torch.device) -> TreeLayout:
        """The tree of ``num_drafts`` chains of k tokens, built once per (k, device)."""
        if (k, device) not in self.layouts:
            self.layouts[k, device] = tree_layout((self.num_drafts,) + (1,) * (k - 1), device)
        return self.layouts[k, device]


class SyntheticDrafter(ModelDrafter):
    """The target drafting for itself through a fixed random bias on its logits: a draft of controlled acceptance.

    q = softmax(z + b) for the target's logits z, with b = ``bias`` * g and g a standard normal vector over the
    vocabulary drawn once from ``seed``: a draft whose errors are a fixed preference between tokens, the same at
    every position, as a real small model's can be. ``bias`` = 0 is the target itself (q = p, every draft kept by a
    lossless rule); larger biases lower the acceptance sum_x min(p, q) smoothly. It runs the target's forwards, so
    it is for counting (tau, acceptance) on pairs whose own draft means nothing, e.g. the random-weight shaped
    pairs (docs/verification.md), never for timing. ``num_drafts`` as for ``ModelDrafter``.
    """

    name = "synthetic"

    def __init__(self, target: torch.nn.Module, bias: float = 1.0, seed: int = 0, num_drafts: int = 1):
        super().__init__(target, label="synthetic draft", num_drafts=num_drafts)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not 0 <= bias < float("inf"):
            raise ValueError(f"SyntheticDrafter's bias must be a finite number >= 0 (the scale of its random logit "
                             f"bias; 0 drafts the target itself), got {bias!r}")
        if as_integer(seed) is None or as_integer(seed) < 0:
            raise ValueError(f"SyntheticDrafter's seed must be an integer >= 0 (it draws the bias), got {seed!r}")
        noise = torch.randn(target.config.vocab_size, generator=torch.Generator().manual_seed(as_integer(seed)))
        self.logit_bias = (bias * noise).to(model_device(target))  # [V]

    def feed(self, nodes=None, layout=None, num_logits: int = 1, features: torch.Tensor | None = None,
             hidden_layers: tuple[int, ...] = ()) -> ModelOutput:
        out = super().feed(nodes, layout, num_logits, features, hidden_layers)
        return out._replace(logits=out.logits + self.logit_bias)  # [B, m, V]


def check_num_drafts(num_drafts: object, cache_layout: str, compile: bool) -> int:
    """An integer >= 1; above 1 the chains form a token tree, which runs eager on the dynamic cache layout."""
    integer = as_integer(num_drafts)
    if integer is None or integer < 1:
        raise ValueError(f"num_drafts must be an integer >= 1 (independent draft chains per row), got {num_drafts!r}")
    if integer > 1 and (compile or cache_layout != "dynamic"):
        raise ValueError(f"num_drafts={integer} drafts a token tree, which runs eager on the dynamic cache layout; "
                         f"got compile={compile}, cache_layout={cache_layout!r}")
    return integer


def draft_chain(logits: torch.Tensor, feed_next, k: int, sampling: SamplingConfig, generator: torch.Generator,
                stop: StopHook | None) -> Proposal:
    """A chain of up to k drafts, each chosen from the [B, V] draft ``logits`` before it (the argmax at temperature
    0, else a sample of q); ``feed_next(token [B])`` feeds a draft and returns the next logits (never for the
    last). Stops early where ``stop`` says so."""
    tokens, peaks, probs = [], [], []  # [B] each per drafted token; peaks are checked once, after the loop
    for i in range(k):
        if sampling.is_greedy:  # q is a point mass at the argmax: the token says it all
            token, peak = greedy_choice(logits)  # [B], [B]
        else:
            peak = logits.amax(-1)  # [B]
            step_probs = logits_to_probs(logits, sampling)  # [B, V]
            token = sample(step_probs, generator)  # [B]
            probs.append(step_probs)
        tokens.append(token)
        peaks.append(peak)
        if i == k - 1 or (stop is not None and stop(token, logits)):
            break
        logits = feed_next(token)  # [B, V]
    finite = finite_peaks(torch.stack(peaks, 1))  # [] no NaN/inf in any draft step's logits
    return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None, finite)


class NoDrafter(Drafter):
    """Proposes nothing: the decode loop with it is plain autoregressive decoding (the baseline)."""

    name = "none"
    proposes_nothing = True
    selects_rows = True
    trusted_proposals = True

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.nothing = input_ids[:, :0]  # [B, 0]

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator,
                stop: StopHook | None = None) -> Proposal:
        return Proposal(self.nothing, None)

    def select_rows(self, index: torch.Tensor) -> None:
        self.nothing = self.nothing[index]

    def commit(self, outcome: StepOutcome) -> None:
        """No state."""


class TreeDrafter(CachedDrafter):
    """Drafts a token tree with a small causal LM: each node at depth i - 1 gets ``branching[i - 1]`` children.

    Level by level, one draft forward per level but the last: the children of the root come from the queue's
    forward; each later level feeds the previous one under its ancestor mask. Children are the top-b tokens at
    temperature 0, else b i.i.d. samples of q (``specdec.tree``).
    """

    name = "tree"
    drafts_trees = True
    trusted_proposals = True

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", **options) -> TreeDrafter:
        cls.check_options(compile=compile, forward=forward, **options)
        return cls(pair.draft, forward=forward, **options)

    @classmethod
    def reads_draft_model(cls, **options) -> bool:
        return True

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", branching=(2, 2, 1, 1), **options) -> None:
        unknown = set(options) - {"label"}
        if unknown:
            raise TypeError(f"TreeDrafter got unknown options {sorted(unknown)}; it takes branching and label")
        tree_shape(as_branching(branching))
        check_runner_options("dynamic", forward, compile)
        if compile:
            raise ValueError("token trees run eager on the dynamic cache layout: compile=true cannot draft trees")

    def __init__(self, model: torch.nn.Module, branching=(2, 2, 1, 1), label: str = "draft", forward: str = "auto"):
        self.branching = tree_shape(as_branching(branching)).branching
        self.layouts: dict[tuple, TreeLayout] = {}  # (depth, device) -> the tree's first levels there; ``release``
        super().__init__(model, label, forward)
        check_children_fit_vocabulary(f"branching {list(self.branching)}", max(self.branching),
                                      model.config.vocab_size)

    def layout(self, depth: int, device: torch.device) -> TreeLayout:
        """The layout of the tree's first ``depth`` levels on ``device``, built once per drafter."""
        key = (min(depth, len(self.branching)), device)
        if key not in self.layouts:
            self.layouts[key] = tree_layout(self.branching[: key[0]], device)
        return self.layouts[key]

    def release(self) -> None:
        super().release()
        self.layouts.clear()

    def draft(self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None) -> Proposal:
        return draft_tree(self.feed, self.layout(k, self.context.queue.device), sampling, generator)


def draft_tree(feed, layout: TreeLayout, sampling: SamplingConfig, generator: torch.Generator) -> Proposal:
    """The token tree of ``layout``, level by level through ``feed`` (a ``CachedDrafter``'s): one draft forward per
    level but the last, the root's from the queue, each later one over the previous level under its ancestor
    mask. Children are the top-b tokens at temperature 0, else b i.i.d. samples of q (``choose_children``)."""
    logits = feed().logits  # [B, 1, V] at the root
    levels, probs, finite = [], [], usable(logits)
    for depth, b in enumerate(layout.shape.branching, start=1):
        children, level_probs = choose_children(logits, b, sampling, generator)  # [B, n*b], [B, n, V]
        levels.append(children)
        if level_probs is not None:
            probs.append(level_probs)
        if depth == layout.depth:
            break
        logits = feed(children, layout, num_logits=children.shape[1]).logits  # [B, n*b, V]
        finite &= usable(logits)
    return Proposal(torch.cat(levels, 1), torch.cat(probs, 1) if probs else None, finite, layout)


def as_branching(value: object) -> object:
    """A branching as ``tree_shape`` takes it: any sequence of children counts (a list, a config's list, a 1-d
    array or tensor) as a tuple, numpy integers in it as ints; anything else as given, for ``tree_shape`` to
    refuse."""
    if hasattr(value, "ndim") and hasattr(value, "tolist") and value.ndim == 1:  # numpy array, tensor
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return value
    return tuple(b if as_integer(b) is None else as_integer(b) for b in value)


def choose_children(
    logits: torch.Tensor, b: int, sampling: SamplingConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, n, V] draft logits at n parents -> [B, n*b] children (each parent's b consecutively) and [B, n, V] q.

    Temperature 0: the top-b tokens (q is a point mass, judged on ids, so None). Otherwise b i.i.d. samples of q.
    """
    batch, n, vocab = logits.shape
    if sampling.is_greedy:
        return logits.topk(b, dim=-1).indices.reshape(batch, n * b), None
    q = logits_to_probs(logits, sampling)  # [B, n, V]
    draws = torch.multinomial(q.reshape(batch * n, vocab), b, replacement=True, generator=generator)  # [B*n, b]
    return draws.reshape(batch, n * b), q
