"""What every bench shares: the pair and its prompts, the interleaved run, transformers at its best (assisted, and
its static-cache autoregressive path; ``System`` makes it the measured side of an ``experiments.run`` row), the cost
profile (``specdec.costs``), a counter of host reads, the argument checks, and the tables.

The measuring rules, kept here once: every method runs in one process, after an untimed warm-up; the methods are
interleaved per prompt, in the orders of a balanced design (``rotation``: each method in each place, and after
each other method, equally often), so a machine whose speed drifts moves them all alike; the device is
synchronised before every clock read (``specdec.Clock``). transformers runs at our algorithm and at its own best,
and ``transformers_configuration`` says how, for the table. Costs are in seconds everywhere; tables turn them into
milliseconds where they print them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

import specdec
from experiments.common.refusal import ArgumentParser, check_device, check_dtype, check_pair, check_writable
from specdec.lean import LeanForward
from specdec import Clock, DecodeStats, GenerationOutput
from specdec.costs import CostModel
from specdec.profile import time_forwards
from specdec.results import markdown_table


SETTLING_CALLS = 4  # warm-up calls beyond the first that a method still measuring the machine may take (``settle``)


# --- the pair and its prompts -----------------------------------------------------------------------------------


@dataclass
class Pair:
    name: str
    draft: torch.nn.Module
    target: torch.nn.Module
    prompts: list[list[int]]
    eos_token_id: int | None
    meaningful_acceptance: bool


def random_prompts(count: int, width: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``width`` uniformly random tokens, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (count, width), generator=generator).tolist()  # [count, width]


def load_bench_pair(name: str, num_prompts: int, device: str, dtype: str) -> Pair:
    """A load_pair preset with the held-out prompts; a random-weight ``*-shaped`` preset gets random 32-token
    prompts instead, and its acceptance means nothing."""
    from specdec.models import SHAPED_PRESETS

    pair = specdec.load_pair(name, device=device, dtype=dtype)
    if name in SHAPED_PRESETS:
        prompts = random_prompts(num_prompts, 32, pair.target.config.vocab_size)
        return Pair(f"{name} (random weights)", pair.draft, pair.target, prompts, None, False)
    texts = [p.text for p in specdec.load_prompts("embedded_heldout", limit=num_prompts)]
    prompts = [pair.tokenizer(text).input_ids for text in texts]
    return Pair(name, pair.draft, pair.target, prompts, pair.tokenizer.eos_token_id, True)


def load_pair_here(args: argparse.Namespace, num_prompts: int) -> tuple[Pair, Clock, str]:
    """A load bench's pair at the asked torch threads (``load_bench_pair``), the clock of its device, and where it
    runs, for the report's title."""
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_bench_pair(args.pair, num_prompts, args.device, args.dtype)
    where = (f"{pair.name}, {pair.target.device} {next(pair.target.parameters()).dtype}, torch threads "
             f"{torch.get_num_threads()}")
    return pair, Clock(pair.target.device), where


# --- the interleaved run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    """What one timed call decoded: the new tokens of each row, and the DecodeStats of each of our generate calls
    inside it (none for transformers)."""

    tokens: list[list[int]]
    stats: tuple[DecodeStats, ...] = ()

    @classmethod
    def of(cls, output: GenerationOutput) -> Decoded:
        return cls(output.tokens, (output.stats,))


@dataclass(frozen=True)
class Method:
    """One way to decode: ``decode(batch, index)`` decodes a batch of prompts (token lists) with ``index`` as its
    seed. A ``compiled`` method warms up on every distinct batch (each new width or draft shape may compile) and
    runs without forward hooks (compiled code would trace them). ``measuring()`` says whether it is still measuring
    the machine (``specdec.Decoder.measuring``): its warm-up goes on until it is not (``settle``)."""

    decode: Callable[[list[list[int]], int], Decoded]
    compiled: bool = False
    measuring: Callable[[], bool] = lambda: False


class ForwardTimer:
    """Total time spent inside the forward passes of the given models, synchronised: transformers' forwards through
    module hooks on each model and its body (which a prefill calls alone; a body's call inside its model's counts
    once), lean forwards (``specdec.lean``, plain callables without hooks) by wrapping ``LeanForward.__call__``
    for the timer's life."""

    def __init__(self, clock: Clock, *models: torch.nn.Module):
        self.clock, self.seconds, self.started, self.depth = clock, 0.0, 0.0, 0
        modules = {id(m): m for model in models for m in (model, getattr(model, "base_model", model))}.values()
        self.handles = [h for m in modules for h in (m.register_forward_pre_hook(self.pre), m.register_forward_hook(self.post))]
        self.lean_call = LeanForward.__call__
        timed_models = {id(model) for model in models}

        def timed_lean_call(lean, *args, **kwargs):
            if id(lean.model) not in timed_models:
                return self.lean_call(lean, *args, **kwargs)
            self.pre()
            try:
                return self.lean_call(lean, *args, **kwargs)
            finally:
                self.post()
        LeanForward.__call__ = timed_lean_call

    def pre(self, *_):
        if self.depth == 0:
            self.started = self.clock.now()
        self.depth += 1

    def post(self, *_):
        self.depth -= 1
        if self.depth == 0:
            self.seconds += self.clock.now() - self.started

    def remove(self):
        for handle in self.handles:
            handle.remove()
        LeanForward.__call__ = self.lean_call


@dataclass
class Tally:
    """One method's timed calls, summed."""

    tokens: int = 0
    seconds: float = 0.0
    forward_seconds: float = 0.0  # NaN where the forwards were not timed (compiled, or no models given)
    warmup_seconds: float = 0.0  # untimed warm-up calls (a compiled method's compilation happens there)
    compilations_while_timed: int = 0  # frames compiled during the run's timed calls, all methods together
    outputs: list[list[list[int]]] = field(default_factory=list)  # each timed call's token rows
    call_seconds: list[float] = field(default_factory=list)  # each timed call's seconds, in order
    stats: list[DecodeStats] = field(default_factory=list)  # each timed call's DecodeStats, in order

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def overhead(self) -> float:
        return 1 - self.forward_seconds / self.seconds


def rotation(names: list, index: int) -> list:
    """The order for the ``index``-th prompt: row ``index`` of a Williams design over ``names``. Over every n
    consecutive indices (2n where the count n is odd) each name runs in each place equally often and right after
    each other name equally often, so neither a place in the order nor the method run just before (what it left in
    the caches and the allocator) favours one. A plain rotation keeps the same predecessor for every method on every
    call: a bias that no number of calls averages out (at batch 64 on a CPU, a method's place moved it by about 2%)."""
    count = len(names)
    first = [0] + [(j + 1) // 2 if j % 2 else count - j // 2 for j in range(1, count)]  # 0, 1, n-1, 2, n-2, ...
    row = index % (count if count % 2 == 0 else 2 * count)
    order = [names[(place + row) % count] for place in first]
    return order if row < count else order[::-1]


def warmup_batches(method: Method, batches: list) -> list:
    """A compiled method's warm-up covers every distinct batch; an eager one's the first."""
    distinct = list({repr(batch): batch for batch in batches}.values())
    return distinct if method.compiled else distinct[:1]


def run_interleaved(methods: dict, batches: list, clock: Clock, timed_models: tuple = (),
                    first_call: int = 0) -> dict:
    """Run every method on every batch, the order changing per batch (``rotation``), after a warm-up
    (``warmup_batches``), so no compilation falls in the timed calls (``compilations_while_timed`` counts any that
    still do). The batches are calls ``first_call``, ``first_call`` + 1, ...: call i runs with seed i, in the order's
    row i. The forwards of ``timed_models`` are timed inside eager methods' calls, for their overhead; elsewhere it is
    NaN."""
    tallies = {name: warm_up_method(method, batches, clock) for name, method in methods.items()}
    return time_interleaved(methods, batches, clock, tallies, timed_models, first_call)


def warm_up_method(method: Method, batches: list, clock: Clock) -> Tally:
    """A method's untimed warm-up calls (``warmup_batches``, each repeated while the method is measuring:
    ``settle``), their seconds in a new tally."""
    tally = Tally()
    start = clock.now()
    for index, batch in enumerate(warmup_batches(method, batches)):
        method.decode(batch, index)
        settle(lambda: method.decode(batch, index), method.measuring)
    tally.warmup_seconds = clock.now() - start
    return tally


def settle(decode: Callable[[], object], measuring: Callable[[], bool]) -> int:
    """Repeat an untimed warm-up call (``decode``) while the method is still ``measuring`` the machine (a draft-length
    policy's calibration that the call's end interrupted), at most ``SETTLING_CALLS`` times, so that its timed calls
    time its choices as a fixed k's are timed: a start-up cost, like the cost table it measures in its first call.
    Returns the calls added. (Where the warm-up was one call, the calibration's last steps fell in the first timed
    call: traced in the run app at batch 16, greedy, its one warm-up call took 37 of the 64.)"""
    for added in range(SETTLING_CALLS):
        if not measuring():
            return added
        decode()
    if measuring():
        print(f"warning: a method still measures the machine after {SETTLING_CALLS} more warm-up calls (calls too "
              f"short for its calibration?): its first timed calls include the rest", file=sys.stderr)
    return SETTLING_CALLS


def time_interleaved(methods: dict, batches: list, clock: Clock, tallies: dict, timed_models: tuple = (),
                     first_call: int = 0) -> dict:
    """The timed part of ``run_interleaved``, for methods already warmed up (``tallies`` from ``warm_up_method``, one per
    method): every method on every batch, the order changing per batch."""
    compiled_before = compilations()
    for call, batch in enumerate(batches, start=first_call):
        for name in rotation(list(methods), call):
            time_call(methods[name], batch, call, clock, timed_models, tallies[name])
    for tally in tallies.values():
        tally.compilations_while_timed = compilations() - compiled_before
    return tallies


def time_call(method: Method, batch, index: int, clock: Clock, timed_models: tuple, tally: Tally) -> None:
    """One timed call of ``method``, added to its tally."""
    timer = ForwardTimer(clock, *timed_models) if timed_models and not method.compiled else None
    start = clock.now()
    decoded = method.decode(batch, index)
    seconds = clock.now() - start
    tally.seconds += seconds
    tally.call_seconds.append(seconds)
    tally.tokens += sum(map(len, decoded.tokens))
    tally.outputs.append(decoded.tokens)
    tally.stats.extend(decoded.stats)
    if timer is None:
        tally.forward_seconds = math.nan
    else:
        timer.remove()
        tally.forward_seconds += timer.seconds


def compilations() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own counter). Its per-frame counter
    (``frames/ok``) misses the lean forward's compilations in torch 2.13; ``unique_graphs`` counts every one."""
    from torch._dynamo.utils import counters  # imported on use: loading dynamo costs a second

    return counters["stats"]["unique_graphs"]


# --- transformers -----------------------------------------------------------------------------------------------

# transformers assisted generation, configured through the assistant's generation_config. "same_algorithm" is ours:
# a constant k and no confidence cut-off (threshold 0 turns it off). "default" is transformers' own defaults
# (20 tokens, constant schedule, confidence threshold 0.4, which stops drafting once the draft is unsure).
HF_ASSISTANT_SETTINGS = {
    "same_algorithm": lambda k: dict(num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                                     assistant_confidence_threshold=0.0),
    "default": lambda k: dict(num_assistant_tokens=None, num_assistant_tokens_schedule=None,
                              assistant_confidence_threshold=None),
}


def transformers_best_options(model: torch.nn.Module) -> dict:
    """Keyword arguments that put transformers' generate() at its best on the model's device and dtype. On CPU in
    bfloat16 its default logits_to_keep=1 slices a view whose batch stride sends the head's matmul down a path ~40x
    slower (torch 2.13), in every prefill; logits_to_keep=0 (the head on every prompt position) gives the same
    tokens 8% faster on the embedded pair's prompts. Elsewhere its defaults are its best."""
    weight = next(model.parameters())
    return {"logits_to_keep": 0} if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 else {}


def transformers_generate(target: torch.nn.Module, draft: torch.nn.Module, batch: list[list[int]],
                          max_new_tokens: int, k: int | None = None, temperature: float = 0.0, seed: int = 0,
                          eos_token_id: int | None = None, assistant_setting: str = "same_algorithm",
                          top_k: int | None = None, top_p: float | None = None, min_p: float | None = None) -> Decoded:
    """transformers' generate() on one prompt (assisted generation refuses batches), at its best: assisted by
    ``draft`` with ``HF_ASSISTANT_SETTINGS[assistant_setting](k)`` where k is given, plain where it is None.
    Without an EOS every call emits ``max_new_tokens``, as ours does. Sampling filters (``top_k``, ``top_p``,
    ``min_p``; None for none) apply where ``temperature`` > 0."""
    ids = torch.tensor(batch, device=target.device)  # [1, T]
    sampling = dict(do_sample=False)
    if temperature:
        sampling = dict(do_sample=True, temperature=temperature, top_k=top_k or 0,
                        top_p=1.0 if top_p is None else top_p)
        if min_p is not None:
            sampling["min_p"] = min_p
    length = dict(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
    if eos_token_id is None:
        length["min_new_tokens"] = max_new_tokens
    assistant = {}
    if k:
        for key, value in HF_ASSISTANT_SETTINGS[assistant_setting](k).items():
            setattr(draft.generation_config, key, value)
        assistant = dict(assistant_model=draft)
    torch.manual_seed(seed)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=eos_token_id or 0, **length,
                          **sampling, **assistant, **transformers_best_options(target))
    return Decoded([out[0, ids.shape[1]:].tolist()])


# --- transformers as the system of an experiments.run row ---------------------------------------------------------

SYSTEMS = ("specdec", "hf_generate", "hf_assisted")


@dataclass(frozen=True)
class System:
    """What decodes the measured side of an ``experiments.run`` row (configs/system/): ``specdec``, our loop with
    the run's drafter, strategy and policy; or transformers' ``generate()`` through ``transformers_generate``,
    plain (``hf_generate``) or assisted by the pair's draft model (``hf_assisted``) at
    ``HF_ASSISTANT_SETTINGS[assistant]`` with the run's k. Our autoregressive baseline decodes beside it either
    way, interleaved, so a sweep over systems compares them prompt by prompt on one scale."""

    name: str = "specdec"
    assistant: str = "same_algorithm"

    def __post_init__(self) -> None:
        if self.name not in SYSTEMS:
            raise ValueError(f"name must be one of {', '.join(SYSTEMS)}, got {self.name!r}")
        if self.assistant not in HF_ASSISTANT_SETTINGS:
            raise ValueError(f"assistant must be one of {', '.join(HF_ASSISTANT_SETTINGS)}, got {self.assistant!r}")

    @property
    def is_transformers(self) -> bool:
        return self.name != "specdec"

    def settings(self, target: torch.nn.Module, k: int) -> str | None:
        """The generation options transformers is called with, for the row (None for ours)."""
        if not self.is_transformers:
            return None
        options = {**transformers_best_options(target)}
        if self.name == "hf_assisted":
            options |= {"assistant": self.assistant, **HF_ASSISTANT_SETTINGS[self.assistant](k)}
        described = ", ".join(f"{key}={value}" for key, value in options.items())
        return f"transformers {transformers.__version__} generate()" + (f": {described}" if described else "")

    def decode(self, pair, prompt: list[int], max_new_tokens: int, k: int, sampling: specdec.SamplingConfig,
               seed: int, eos_token_id: int | None) -> tuple[list[int], int]:
        """One prompt decoded by this transformers system: its new tokens, and the target forwards it ran
        (counted by a hook on the target, for tau = emitted / target calls)."""
        calls = []
        hook = pair.target.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            decoded = transformers_generate(
                pair.target, pair.draft, [prompt], max_new_tokens, k if self.name == "hf_assisted" else None,
                sampling.temperature, seed, eos_token_id, self.assistant, sampling.top_k, sampling.top_p,
                sampling.min_p)
        finally:
            hook.remove()
        return decoded.tokens[0], len(calls)


def compile_forward(model: torch.nn.Module) -> Callable:
    """The model's forward through torch.compile as transformers' docs prescribe for its fastest decoding (LLM
    inference optimization: static cache and torch.compile): ``mode="reduce-overhead", fullgraph=True``."""
    return torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)


def transformers_static_generate(target: torch.nn.Module, batch: list[list[int]], max_new_tokens: int,
                                 compiled_forward: Callable | None = None) -> Decoded:
    """transformers' own fastest autoregressive decoding of a batch of equal-length prompts, greedy, EOS ignored:
    ``generate(cache_implementation="static")``, which transformers 5 compiles by itself on CUDA. With
    ``compiled_forward`` (``compile_forward(target)``) the docs' recipe instead: the model's forward replaced by the
    compiled one and generate's own compilation off. The replacement lasts this call only, so every other method
    that runs the same model object runs its plain forward."""
    ids = torch.tensor(batch, device=target.device)  # [B, T]
    options = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                   min_new_tokens=max_new_tokens, pad_token_id=0, cache_implementation="static")
    if compiled_forward is None:
        out = target.generate(ids, **options)
    else:
        target.forward = compiled_forward
        try:
            out = target.generate(ids, disable_compile=True, **options)
        finally:
            del target.forward  # the class's forward again
    return Decoded(out[:, ids.shape[1]:].tolist())


def transformers_configuration(target: torch.nn.Module, names: Iterable[str]) -> str:
    """How each transformers method named (of hf_generate, hf_assisted, hf_assisted_default) was run, for the
    line under a table."""
    options = ", ".join(f"{key}={value}" for key, value in transformers_best_options(target).items())
    described = {
        "hf_generate": f"generate() with {options or 'its defaults'}",
        "hf_assisted": "assisted generation at our algorithm (num_assistant_tokens=k, constant schedule, "
                       "assistant_confidence_threshold=0)",
        "hf_assisted_default": "assisted generation at transformers' defaults (20 tokens, constant schedule, "
                               "confidence threshold 0.4)",
    }
    return (f"transformers {transformers.__version__}, eager: "
            + "; ".join(f"`{name}` is {described[name]}" for name in names) + ".")


# --- costs and predictions --------------------------------------------------------------------------------------


def cost_profile(pair, prompt: torch.Tensor, widths: Iterable[int], repeats: int, clock: Clock,
                 compile: bool = False, captured: bool = False) -> CostModel:
    """The pair's costs at batch 1 (``specdec.costs.CostModel``) over ``prompt`` [1, T], on the cache layout its
    mode decodes with (eager: dynamic, compiled: static): the draft's forward of one token and the target's of each
    of ``widths`` tokens. ``captured``: each forward timed as a CUDA graph replay, as the device step runs it (CUDA,
    lean forwards)."""
    layout = "static" if compile else "dynamic"

    def seconds(model, model_widths, label):
        return time_forwards(model, prompt, model_widths, repeats, cache_layout=layout, compile=compile, clock=clock,
                             label=label, forward="lean" if captured else "auto", captured=captured)

    return CostModel.at_batch_one(seconds(pair.draft, [1], "draft")[1], seconds(pair.target, widths, "target"))


# --- host reads -------------------------------------------------------------------------------------------------


class HostReads:
    """While active (``with HostReads() as reads``), counts the ways the host reads a tensor's values: item,
    tolist, bool, int, float and index, as tests/test_device_step.py counts them."""

    METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self):
        self.count = 0
        self.originals = {name: getattr(torch.Tensor, name) for name in self.METHODS}

    def __enter__(self) -> HostReads:
        for name, original in self.originals.items():
            setattr(torch.Tensor, name, self.counting(original))
        return self

    def __exit__(self, *_) -> None:
        for name, original in self.originals.items():
            setattr(torch.Tensor, name, original)

    def counting(self, original: Callable) -> Callable:
        def counted(tensor, *args):
            self.count += 1
            return original(tensor, *args)
        return counted


# --- argument checks: one line naming the value and what is allowed, before any model loads ----------------------


def bench_clock(args: argparse.Namespace) -> Clock:
    """What a bench sets up before loading anything: transformers' progress bars off, the asked torch threads, and
    the clock for the asked device."""
    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    return Clock(torch.device(args.device))


def argument_parser(module: str, doc: str) -> ArgumentParser:
    """A bench's parser: its usage names ``python -m module``, its help is the module's docstring as written, and
    its refusals are one line, exit 2 (``experiments.common.refusal``)."""
    return ArgumentParser(prog=f"python -m {module}", description=doc,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_pair_options(parser: ArgumentParser, written: str) -> None:
    """The options of a bench over a ``load_pair`` preset (``--pair``, added by the bench with its own help): where
    it runs, and the directory it writes ``written`` to."""
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", default=None, help=f"directory for {written}")


def parse_pair_options(parser: ArgumentParser, argv, bench: str) -> argparse.Namespace:
    """The parsed arguments, ``--out`` defaulting to outputs/<bench>/<time>, with the pair, device, dtype and
    output directory checked before any model loads."""
    args = parser.parse_args(argv)
    args.out = args.out or str(default_out_dir(bench))
    parser.check(lambda: check_device("--device", args.device),
                 lambda: check_dtype("--dtype", args.dtype, args.device),
                 lambda: check_pair("--pair", args.pair, args.device, args.dtype),
                 lambda: check_writable("--out", args.out))
    return args


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def positive_ints(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",")]


def floats_within(text: str, low: float, high: float) -> list[float] | None:
    """The comma-separated numbers in ``text`` if all lie in [low, high]; else None."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        return None
    return values if all(low <= value <= high for value in values) else None


def temperatures(text: str) -> list[float]:
    values = floats_within(text, 0.0, math.inf)
    if values is None:
        raise argparse.ArgumentTypeError(f"expected comma-separated temperatures >= 0 (0 is greedy), got {text!r}")
    return values


def single_temperature(text: str) -> float:
    values = floats_within(text, 0.0, math.inf)
    if values is None or len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected a temperature >= 0 (0 is greedy), got {text!r}")
    return values[0]


def fractions(text: str) -> list[float]:
    values = floats_within(text, 0.0, 1.0)
    if values is None:
        raise argparse.ArgumentTypeError(f"expected comma-separated acceptances in [0, 1], got {text!r}")
    return values


def names_from(allowed: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A check that takes comma-separated names from ``allowed``."""
    allowed = list(allowed)

    def check(text: str) -> list[str]:
        names = text.split(",")
        if not all(name in allowed for name in names):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what} from {', '.join(allowed)}, got {text!r}")
        return names

    return check


# --- tables and files -------------------------------------------------------------------------------------------


def markdown(rows: list[dict]) -> str:
    """Rows of the same keys as a Markdown table, values as they are (the benches round them first)."""
    header = list(rows[0])
    return markdown_table(header, [[row[key] for key in header] for row in rows])


class Report:
    """A bench's Markdown sections: each printed as it is added (unless told not to), all written at the end."""

    def __init__(self):
        self.sections: list[str] = []

    def add(self, text: str, echo: bool = True) -> None:
        self.sections.append(text)
        if echo:
            print(text, flush=True)

    def table(self, heading: str, rows: list[dict], note: str = "", echo: bool = True) -> None:
        self.add(f"{heading}\n\n{markdown(rows)}" + (f"\n\n{note}" if note else ""), echo)

    def text(self) -> str:
        return "\n\n".join(self.sections) + "\n"

    def write(self, markdown_path: Path, payload: dict | None = None) -> None:
        """The sections to ``markdown_path``; ``payload``, if given, as JSON beside it (the same name, .json)."""
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(self.text())
        if payload is not None:
            markdown_path.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")


def default_out_dir(bench: str) -> Path:
    """outputs/<bench>/<date_time>, for a run given no --out."""
    return Path(f"outputs/{bench}/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
