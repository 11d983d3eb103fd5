"""The front door: ``specdec.Decoder``, which holds the parts and what is decided once from them, and
``specdec.generate``, which takes plain arguments (a draft model or none, a strategy's name, k, sampling settings),
checks them and runs a ``Decoder`` built from them.

A ``Decoder`` decides once, when built: its verifier (``specdec.verify``), the target's ``CachedModel`` (which
forward, eager or compiled), whether rows retire, the largest k a step may draft, the target's hidden states the
drafter reads, and which driver runs the steps: the host driver (``specdec.decode.HostRun``) or the device driver
(``specdec.device_loop``). Each ``generate`` call is one run of the step of ``specdec.step``."""

from __future__ import annotations

import threading

import torch

from specdec.cache import CachedModel, context_limit
from specdec.checks import (
    check_allocation, check_bool, check_device, check_eos_ids, check_eval_mode, check_max_k, check_max_new_tokens,
    check_model, check_parts, check_prompt, check_seed, check_strategy_object, described, model_device,
)
from specdec.decode import HostRun, check_tree_support
from specdec.device_loop import DeviceProgram, device_step_blocker
from specdec.drafters import ModelDrafter, NoDrafter
from specdec.emit import GenerationOutput
from specdec.interfaces import AcceptanceStrategy, Drafter, as_strategy
from specdec.policies import DraftLengthPolicy, FixedLength
from specdec.sampling import SamplingConfig
from specdec.strategies import Speculative, make_strategy
from specdec.verify import choose_verifier

STEPS = ("auto", "host", "device")


class Decoder:
    """Speculative (or, with a drafter that proposes nothing, autoregressive) decoding of a target causal LM.

    Defaults: ``drafter=None`` is the autoregressive baseline (``NoDrafter``), ``strategy=None`` speculative sampling,
    ``draft_length=None`` ``FixedLength(4)``, ``sampling=None`` greedy. Reuse one across calls: compiled forwards,
    static caches and captured steps are kept in it (``release``).
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None = None,
        strategy: AcceptanceStrategy | None = None,
        draft_length: DraftLengthPolicy | None = None,
        sampling: SamplingConfig | None = None,
        time_phases: bool = True,
        cache_layout: str = "dynamic",
        retire_finished_rows: bool = True,
        compile: bool = False,
        forward: str = "auto",
        step: str = "auto",
    ):
        """``time_phases=False`` skips the device syncs that split each step's time into draft / target / other
        (they cost a little on GPU); those timings and the cost ratio are then NaN. ``cache_layout`` is the
        target's transformers cache's: "dynamic" (grows) or "static" (preallocated, fixed addresses).
        ``retire_finished_rows``: rows that finish leave the batch, so later forwards skip them, once feeding them
        as holes would cost more than moving the others' caches (``specdec.decode.HostRun.retire_finished``; where
        both the target's cache and the drafter can drop rows). Greedy outputs do not change; sampled ones do, since the
        random stream follows the batch's shape (each is still exact). ``compile=True`` runs the target's decode
        and verify forwards compiled (``specdec.cache.CachedModel``); the drafter compiles its own when built with
        ``compile=True``. ``forward``: "auto" (the lean forward where ``specdec.lean`` supports the model, else
        transformers'), "lean" or "transformers". ``step``: "host" runs the loop here, reading a few scalars per
        step; "device" runs each step as one device program (captured as a CUDA graph on CUDA) reading one flag;
        "auto" takes "device" where ``compile=True`` and the parts allow it (``specdec.device_loop``), else
        "host". Eager transformers is the reference, with identical greedy tokens on every path."""
        check_model("target", target)
        drafter = drafter if drafter is not None else NoDrafter()
        strategy = strategy if strategy is not None else Speculative()
        draft_length = draft_length if draft_length is not None else FixedLength()
        sampling = sampling if sampling is not None else SamplingConfig()
        check_parts(drafter, draft_length, sampling)
        check_strategy_object(strategy)
        drafter.check_target(target)
        for name, value in (("time_phases", time_phases), ("retire_finished_rows", retire_finished_rows),
                            ("compile", compile)):
            check_bool(name, value)
        if step not in STEPS:
            raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
        self.target = target
        self.drafter, self.draft_length, self.sampling = drafter, draft_length, sampling
        self.strategy = as_strategy(strategy)
        self.time_phases = time_phases
        self.compile = compile
        self.runner = CachedModel(target, "target", forward, cache_layout, compile)
        self.cache_layout = self.runner.cache_layout
        self.speculates = not drafter.proposes_nothing
        self.retires_rows = retire_finished_rows and self.runner.selects_rows and drafter.selects_rows
        check_tree_support(drafter, self.strategy, sampling, self.runner)
        if self.speculates and self.strategy.requires_greedy and not sampling.is_greedy:
            raise ValueError(
                f"strategy {self.strategy.name!r} decodes the target's argmax and needs temperature 0, got "
                f"temperature={sampling.temperature}; use 'speculative' (lossless) or 'typical'/'topk' (lossy) to "
                f"sample"
            )
        models = [target, *drafter.models()]
        for model in models:
            check_eval_mode(model)
        limits = [context_limit(model) for model in (models if drafter.bounds_context else models[:1])]
        self.context_limit = min((limit for limit in limits if limit is not None), default=None)
        self.target_context_limit = limits[0]
        # The most draft positions a step can have: the policy's, bounded by the context (a longer draft could never
        # be verified), so a huge k sizes nothing.
        self.policy_max_k = check_max_k(draft_length)
        self.k_max = 0 if not self.speculates else min(self.policy_max_k, self.context_limit or self.policy_max_k)
        # The target's hidden states the drafter reads, as indices into its layers: () where it reads none.
        request = drafter.target_states
        self.state_layers = () if request is None else request.resolved(self.runner.num_layers)
        if self.speculates:
            draft_length.bind(target, drafter, forward)
        self.verifier = choose_verifier(drafter.proposes_nothing, self.strategy, sampling)
        self.device_program = self.choose_step(step)
        self.busy = threading.Lock()

    @property
    def measuring(self) -> bool:
        """Whether the draft-length policy is still measuring the machine (``DraftLengthPolicy.measuring``)."""
        return self.speculates and self.draft_length.measuring

    @property
    def steps_on_device(self) -> bool:
        """Whether each step runs as one device program: its phases are not timed apart (their seconds are NaN)."""
        return self.device_program is not None

    def choose_step(self, step: str):
        """The device program where the step runs on the device, else None (see ``specdec.device_loop``)."""
        blocker = device_step_blocker(self)
        if step == "device" and blocker:
            raise ValueError(f"step='device' cannot run this decoder: {blocker}")
        if step == "device" or (step == "auto" and self.compile and blocker is None):
            return DeviceProgram(self)
        return None

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 32,
        eos_token_id: int | list[int] | None = None,
        seed: int = 0,
    ) -> GenerationOutput:
        if not self.busy.acquire(blocking=False):
            raise RuntimeError("this Decoder is generating in another thread; its drafter and caches hold one call's "
                               "state, so use one Decoder per thread")
        try:
            with torch.inference_mode():  # no autograd bookkeeping on any forward, whatever the caller's mode
                return self._generate(input_ids, attention_mask, max_new_tokens, eos_token_id, seed)
        finally:
            self.busy.release()

    def _generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, seed) -> GenerationOutput:
        vocab_size = self.target.config.vocab_size
        check_device("input_ids", input_ids, self.target)  # before any read of it: a meta tensor has no values
        attention_mask = check_prompt(input_ids, attention_mask, self.context_limit, vocab_size,
                                      self.context_limit != self.target_context_limit)
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        seed = check_seed(seed)
        batch_size = input_ids.shape[0]
        check_allocation("max_new_tokens", batch_size * (max_new_tokens + self.k_max + 1), torch.long,
                         input_ids.device)
        eos_ids = check_eos_ids(eos_token_id, input_ids.device, vocab_size)
        # Padding is masked, but still goes through the embedding: an id outside the vocabulary there becomes 0.
        outside = (input_ids < 0) | (input_ids >= vocab_size)  # [B, T], only padding after check_prompt
        input_ids = input_ids.masked_fill(outside, 0)
        if self.device_program is not None:
            return self.device_program.run(input_ids, attention_mask, max_new_tokens, eos_ids, seed)
        return HostRun(self, input_ids, attention_mask, max_new_tokens, eos_ids, seed).run()

    def release(self) -> None:
        """Free the buffers and compiled forwards kept between calls, the target's and the drafter's."""
        self.runner.release()
        self.drafter.release()
        if self.device_program is not None:
            self.device_program.release()




def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    draft: torch.nn.Module | Drafter | None = None,
    attention_mask: torch.Tensor | None = None,
    strategy: str | AcceptanceStrategy = "speculative",
    k: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    seed: int = 0,
    *,
    min_p: float | None = None,
    draft_length: DraftLengthPolicy | None = None,
    cache_layout: str = "dynamic",
    compile: bool = False,
    forward: str = "auto",
    step: str = "auto",
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` per row with ``target``, drafted by ``draft`` (None: autoregressive).

    ``draft`` is a causal LM sharing the target's vocabulary, or any object with the ``Drafter`` interface.
    ``input_ids`` [B, T] may be left-padded, with ``attention_mask`` zeros on the padding. Temperature 0 is
    greedy. ``draft_length`` overrides the fixed ``k`` with a policy. Randomness comes only from ``seed``.
    ``cache_layout="static"`` preallocates transformers' caches (fixed addresses). ``compile=True`` compiles
    both models' decode forwards (and, where the parts allow, runs each step as one captured device program); it
    pays only across many calls, so build a ``Decoder`` once and reuse it rather than calling this in a loop.
    ``forward``: "auto" (the lean forward where supported), "lean" or "transformers"; ``step``: "auto", "host"
    or "device" (``Decoder``).
    """
    sampling = SamplingConfig(temperature, top_k, top_p, min_p)
    acceptance = make_strategy(strategy)
    policy = draft_length if draft_length is not None else FixedLength(k)
    check_model("target", target)
    drafter = as_drafter(draft, target, cache_layout, compile, forward)
    check_device("input_ids", input_ids, target)
    if attention_mask is not None:
        check_device("attention_mask", attention_mask, target)
    decoder = Decoder(target, drafter, acceptance, policy, sampling, cache_layout=cache_layout, compile=compile,
                      forward=forward, step=step)
    return decoder.generate(input_ids, attention_mask, max_new_tokens, eos_token_id, seed)


def as_drafter(
    draft: torch.nn.Module | Drafter | None, target: torch.nn.Module, cache_layout: str = "dynamic",
    compile: bool = False, forward: str = "auto",
) -> Drafter | None:
    """A causal LM becomes a ``ModelDrafter`` after checking it can draft for ``target``."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if not isinstance(draft, torch.nn.Module):
        raise TypeError(f"draft must be a causal LM, a Drafter, or None; got {type(draft).__name__} "
                        f"({described(draft)})")
    check_model("draft", draft)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft and target must share a vocabulary: draft vocab_size={draft.config.vocab_size}, "
            f"target vocab_size={target.config.vocab_size}; to draft across tokenizers use "
            f"specdec.CrossTokenizerDrafter"
        )
    draft_device, target_device = model_device(draft), model_device(target)
    if draft_device != target_device:
        raise ValueError(f"draft is on {draft_device} but target on {target_device}; put both on one device")
    return ModelDrafter(draft, cache_layout=cache_layout, compile=compile, forward=forward)
