"""Benchmark specdec against transformers, profile the pair's costs, and measure batch scaling.

    python -m experiments.bench                       # embedded pair (the README table)
    python -m experiments.bench --pair gpt2-xl-shaped # GPT-2 small -> XL shapes, random weights: costs only
    python -m experiments.bench --pair gpt2-xl        # the real pair, where the hub is reachable

Everything is measured in one process, after warm-up, with methods interleaved per prompt (the order rotates), and
the device synchronised before every clock read. Prints Markdown tables and writes them with a JSON copy to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import specdec
from specdec import Clock
from specdec.batching import left_pad
from specdec.profile import time_forwards
from specdec.results import markdown_table


@dataclass
class Pair:
    name: str
    draft: torch.nn.Module
    target: torch.nn.Module
    prompts: list[list[int]]
    eos_token_id: int | None
    meaningful_acceptance: bool


def load_bench_pair(name: str, num_prompts: int, device: str, dtype: str) -> Pair:
    """A load_pair preset with the held-out prompts; a random-weight ``*-shaped`` preset gets random 32-token
    prompts instead, and its acceptance means nothing."""
    from specdec.models import SHAPED_PRESETS, load_pair
    from specdec.prompts import load_prompts

    pair = load_pair(name, device=device, dtype=dtype)
    if name in SHAPED_PRESETS:
        generator = torch.Generator().manual_seed(0)
        vocab_size = pair.target.config.vocab_size
        prompts = [torch.randint(0, vocab_size, (32,), generator=generator).tolist() for _ in range(num_prompts)]
        return Pair(f"{name} (random weights)", pair.draft, pair.target, prompts, None, False)
    texts = [p.text for p in load_prompts("embedded_heldout", limit=num_prompts)]
    prompts = [pair.tokenizer(text).input_ids for text in texts]
    return Pair(name, pair.draft, pair.target, prompts, pair.tokenizer.eos_token_id, True)


class ForwardTimer:
    """Total time spent inside the forward passes of the given models and their bodies (which a prefill calls
    alone), synchronised, via hooks; a body's call inside its model's counts once."""

    def __init__(self, clock: Clock, *models: torch.nn.Module):
        self.clock, self.seconds, self.started, self.depth = clock, 0.0, 0.0, 0
        modules = {id(m): m for model in models for m in (model, getattr(model, "base_model", model))}.values()
        self.handles = [h for m in modules for h in (m.register_forward_pre_hook(self.pre), m.register_forward_hook(self.post))]

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


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    forward_seconds: float = 0.0
    warmup_seconds: float = 0.0  # untimed warm-up calls (a compiled method's compilation happens there)
    compilations_while_timed: int = 0  # frames compiled during the run's timed calls, all methods together
    outputs: list = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def overhead(self) -> float:
        return 1 - self.forward_seconds / self.seconds


def ours(pair: Pair, k: int | None, temperature: float, max_new_tokens: int, batch: list[list[int]], seed: int,
         stop_at_eos: bool = True, stats: list | None = None, compile: bool = False):
    """Our decoding of one batch; its DecodeStats are appended to ``stats`` if given."""
    ids, mask = left_pad(batch, device=pair.target.device)
    out = specdec.generate(pair.target, ids, draft=pair.draft if k else None, attention_mask=mask, k=k or 1,
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           eos_token_id=pair.eos_token_id if stop_at_eos else None, seed=seed, compile=compile)
    if stats is not None:
        stats.append(out.stats)
    return out.tokens


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


def transformers_generate(pair: Pair, k: int | None, temperature: float, max_new_tokens: int, batch, seed: int,
                          assistant_setting: str = "same_algorithm"):
    ids = torch.tensor(batch, device=pair.target.device)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
    assistant = {}
    if k:
        for key, value in HF_ASSISTANT_SETTINGS[assistant_setting](k).items():
            setattr(pair.draft.generation_config, key, value)
        assistant = dict(assistant_model=pair.draft)
    torch.manual_seed(seed)
    out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               eos_token_id=pair.eos_token_id, pad_token_id=pair.eos_token_id or 0, **sampling, **assistant,
                               **transformers_best_options(pair.target))
    return [out[0, ids.shape[1]:].tolist()]


def run_interleaved(pair: Pair, methods: dict, prompts, max_new_tokens: int, clock: Clock) -> dict:
    """Run every method on every prompt, rotating the order per prompt, after a warm-up: one call per method, and
    for methods named ``*_compiled`` one call per distinct prompt (each new width or draft shape may compile), so
    no compilation falls in the timed calls (``compilations_while_timed`` counts any that still do). Compiled
    methods run without the forward hooks (compiled code would trace them), so their overhead is NaN."""
    tallies = {name: Tally() for name in methods}
    names = list(methods)
    distinct = list({repr(prompt): prompt for prompt in prompts}.values())
    for name in names:
        start = clock.now()
        for i, prompt in enumerate(distinct if str(name).endswith("_compiled") else distinct[:1]):
            methods[name](prompt, i)
        tallies[name].warmup_seconds = clock.now() - start
    compiled_before = compilations()
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[: i % len(names)]:
            hooked = not str(name).endswith("_compiled")
            timer = ForwardTimer(clock, pair.draft, pair.target) if hooked else None
            start = clock.now()
            tokens = methods[name](prompt, i)
            elapsed = clock.now() - start
            tally = tallies[name]
            tally.tokens += sum(map(len, tokens))
            tally.seconds += elapsed
            if timer is not None:
                timer.remove()
                tally.forward_seconds += timer.seconds
            else:
                tally.forward_seconds = math.nan
            tally.outputs.append(tokens)
    for tally in tallies.values():
        tally.compilations_while_timed = compilations() - compiled_before
    return tallies


def compilations() -> int:
    """Frames torch.compile has compiled in this process so far (dynamo's own counter)."""
    from torch._dynamo.utils import counters  # imported on use: loading dynamo costs a second

    return counters["frames"]["ok"]


def comparison_table(pair: Pair, ks: list[int], temperatures: list[float], max_new_tokens: int, clock: Clock,
                     compiled: bool = False, rounds: int = 1) -> list[dict]:
    """Ours (eager; with ``compiled`` also compiled) against transformers' generate() and assisted generation, at
    the same algorithm and at transformers' defaults, every method interleaved per prompt; each prompt is decoded
    ``rounds`` times per method (prompt by prompt, round after round)."""
    rows = []
    prompts = [[p] for p in pair.prompts] * rounds
    for temperature in temperatures:
        for k in ks:
            methods = {
                "ours_baseline": lambda b, i, t=temperature: ours(pair, None, t, max_new_tokens, b, i),
                "ours_speculative": lambda b, i, t=temperature, k=k: ours(pair, k, t, max_new_tokens, b, i),
                "hf_generate": lambda b, i, t=temperature: transformers_generate(pair, None, t, max_new_tokens, b, i),
                "hf_assisted": lambda b, i, t=temperature, k=k: transformers_generate(pair, k, t, max_new_tokens, b, i),
                "hf_assisted_default": lambda b, i, t=temperature: transformers_generate(
                    pair, 1, t, max_new_tokens, b, i, assistant_setting="default"),
            }
            if compiled:
                methods["ours_baseline_compiled"] = lambda b, i, t=temperature: ours(
                    pair, None, t, max_new_tokens, b, i, compile=True)
                methods["ours_speculative_compiled"] = lambda b, i, t=temperature, k=k: ours(
                    pair, k, t, max_new_tokens, b, i, compile=True)
            tallies = run_interleaved(pair, methods, prompts, max_new_tokens, clock)
            outputs = [t.outputs for t in tallies.values()]
            rows.append({
                "temperature": temperature,
                "k": k,
                **{f"{name}_tok_s": round(t.tokens_per_s, 1) for name, t in tallies.items()},
                "spec_vs_hf_assisted": round(tallies["ours_speculative"].tokens_per_s / tallies["hf_assisted"].tokens_per_s, 2),
                "baseline_vs_hf_generate": round(tallies["ours_baseline"].tokens_per_s / tallies["hf_generate"].tokens_per_s, 2),
                "spec_speedup": round(tallies["ours_speculative"].tokens_per_s / tallies["ours_baseline"].tokens_per_s, 2),
                "ours_spec_overhead": round(tallies["ours_speculative"].overhead, 3),
                "hf_assisted_overhead": round(tallies["hf_assisted"].overhead, 3),
                **({"compiled_spec_vs_hf_assisted": round(tallies["ours_speculative_compiled"].tokens_per_s
                                                          / tallies["hf_assisted"].tokens_per_s, 2),
                    "compiled_spec_speedup": round(tallies["ours_speculative_compiled"].tokens_per_s
                                                   / tallies["ours_baseline_compiled"].tokens_per_s, 2)}
                   if compiled else {}),
                **({"compiled_warmup_s": round(tallies["ours_baseline_compiled"].warmup_seconds
                                               + tallies["ours_speculative_compiled"].warmup_seconds, 1),
                    "compilations_while_timed": tallies["ours_speculative_compiled"].compilations_while_timed}
                   if compiled else {}),
                "identical_tokens": all(o == outputs[0] for o in outputs) if temperature == 0 else "n/a (sampled)",
            })
            print(markdown([rows[-1]]), flush=True)
    return rows


def baseline_summary(rows: list[dict]) -> str:
    """The baselines do not depend on k, so each row of a temperature measures the same ratio again: their mean
    is the steadier figure on a noisy machine."""
    lines = []
    for temperature in dict.fromkeys(row["temperature"] for row in rows):
        ratios = [row["ours_baseline_tok_s"] / row["hf_generate_tok_s"] for row in rows if row["temperature"] == temperature]
        lines.append(f"Baseline vs `generate()` at temperature {temperature}: mean {statistics.mean(ratios):.3f} over "
                     f"{len(ratios)} interleaved measurements (min {min(ratios):.2f}, max {max(ratios):.2f}).")
    return "\n".join(lines)


def cost_profile(pair: Pair, clock: Clock, repeats: int) -> dict:
    """Milliseconds per forward over the first prompt (batch 1, eager): the draft's of one token, the target's of
    1..9 tokens (verifying k drafts feeds k + 1), and the cost ratio c."""
    prompt = torch.tensor([pair.prompts[0]], device=pair.target.device)
    draft = time_forwards(pair.draft, prompt, [1], repeats, clock=clock, label="draft")
    target = time_forwards(pair.target, prompt, range(1, 10), repeats, clock=clock, label="target")
    profile = {"draft_forward_1_ms": 1000 * draft[1], **{f"target_forward_{n}_ms": 1000 * seconds
                                                         for n, seconds in target.items()}}
    profile["cost_ratio"] = profile["draft_forward_1_ms"] / profile["target_forward_1_ms"]
    return {key: round(value, 3) for key, value in profile.items()}


def predicted_table(profile: dict, ks: list[int]) -> list[dict]:
    """Predicted speedup per alpha and k, twice: Leviathan's formula (verifying k+1 tokens costs one target step)
    and the same expected tokens per step, E = sum_{i<=k} alpha^i, over the measured costs: E * T(1) / (k T_draft
    + T_verify(k+1))."""
    step, draft = profile["target_forward_1_ms"], profile["draft_forward_1_ms"]
    rows = []
    for alpha in (0.6, 0.7, 0.8):
        formula = {f"k={k}": round(specdec.predicted_speedup(alpha, k, profile["cost_ratio"]), 2) for k in ks}
        measured = {
            f"k={k}": round(specdec.predicted_speedup(alpha, k, 0.0) * step / (k * draft + profile[f"target_forward_{k + 1}_ms"]), 2)
            for k in ks
        }
        rows += [{"alpha": alpha, "verify cost": "1 step (formula)", **formula},
                 {"alpha": alpha, "verify cost": "measured", **measured}]
    return rows


def batch_scaling(pair: Pair, k: int, batch_sizes: list[int], max_new_tokens: int, clock: Clock,
                  rounds: int = 1) -> list[dict]:
    """Speculative and baseline tokens/s per batch size (greedy), every size and method interleaved per round
    (a shared machine's speed drifts, and sizes measured one after another would drift apart), after a warm-up.

    Every batch size decodes the same work: the first max(batch_sizes) prompts (cycled), split into batches of
    that size, once per round. EOS is ignored so that every row emits max_new_tokens: rows that stop after a token
    or two would shrink the batch at once, and the table would measure the prompts instead of the batch size. Rows
    still finish at different steps (those that accept more drafts sooner) and leave the batch; ``spec_live_rows``
    is the share of the full batch's row-steps in which a row was still generating.
    """
    work = [pair.prompts[i % len(pair.prompts)] for i in range(max(batch_sizes))]
    spec_stats = {size: [] for size in batch_sizes}  # greedy, so the warm-up's stats equal the timed ones

    def decode_work(size: int, draft_length: int | None, stats: list | None):
        def run(_, seed: int) -> list[list[int]]:
            tokens = []
            for start in range(0, len(work), size):
                tokens += ours(pair, draft_length, 0.0, max_new_tokens, work[start : start + size], seed,
                               stop_at_eos=False, stats=stats)
            return tokens
        return run

    methods = {}
    for size in batch_sizes:
        methods[("spec", size)] = decode_work(size, k, spec_stats[size])
        methods[("baseline", size)] = decode_work(size, None, None)
    tallies = run_interleaved(pair, methods, [None] * rounds, max_new_tokens, clock)
    rows = []
    for size in batch_sizes:
        stats = spec_stats[size]
        # a row's target calls count its prefill, which target_forwards (verification passes) leaves out
        live = sum(s.target_calls - len(s.rows) for s in stats) / sum(len(s.rows) * s.target_forwards for s in stats)
        rows.append({"batch": size, "spec_tok_s": tallies[("spec", size)].tokens_per_s,
                     "baseline_tok_s": tallies[("baseline", size)].tokens_per_s,
                     "spec_overhead": round(tallies[("spec", size)].overhead, 3), "spec_live_rows": round(live, 2)})
    for row in rows:
        for name in ("spec", "baseline"):
            row[f"{name}_vs_batch_1"] = round(row[f"{name}_tok_s"] / rows[0][f"{name}_tok_s"], 2)
        row["spec_tok_s"], row["baseline_tok_s"] = round(row["spec_tok_s"], 1), round(row["baseline_tok_s"], 1)
    return rows


def markdown(rows: list[dict]) -> str:
    """Rows of the same keys as a Markdown table, values as they are (the benches round them first)."""
    header = list(rows[0])
    return markdown_table(header, [[row[key] for key in header] for row in rows])


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def positive_ints(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",")]


def temperatures(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = None
    if values is None or not all(value >= 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated temperatures >= 0 (0 is greedy), got {text!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    """Every value is checked here, before any model loads."""
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded", help="a load_pair preset: embedded, gpt2-xl-shaped, ...")
    parser.add_argument("--prompts", type=positive_int, default=24, help="prompts per configuration")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="times each prompt is decoded per method in the comparison with transformers")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--ks", type=positive_ints, default="1,2,3,4,5,6,7,8", help="draft lengths to compare")
    parser.add_argument("--temperatures", type=temperatures, default="0,1", help="sampling temperatures to compare")
    parser.add_argument("--batch-sizes", type=positive_ints, default="1,4,8,16")
    parser.add_argument("--repeats", type=positive_int, default=20, help="timed repeats per forward in the cost profile")
    parser.add_argument("--batch-rounds", type=positive_int, default=3, help="times the batch-scaling work is decoded")
    parser.add_argument("--skip-comparison", action="store_true", help="cost profile and batch scaling only")
    parser.add_argument("--compiled", action="store_true", help="also compare our compiled path (compile=True)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", default=None, help="directory for bench.md and bench.json")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_bench_pair(args.pair, args.prompts, args.device, args.dtype)
    clock = Clock(pair.target.device)
    device = f"{pair.target.device} {next(pair.target.parameters()).dtype}, torch threads {torch.get_num_threads()}"
    sections = [f"# specdec benchmark: {pair.name}\n\n{device}; {args.prompts} prompts x {args.max_new_tokens} new tokens, "
                f"{args.rounds} round(s) in the comparison"]

    profile = cost_profile(pair, clock, args.repeats)
    sections.append("## Cost profile (ms per forward, batch 1)\n\n" + markdown([profile]))
    print(sections[-1], flush=True)
    if not pair.meaningful_acceptance:
        sections.append("## Predicted speedup (random weights, so predicted only; measured c and verify costs)\n\n"
                        + markdown(predicted_table(profile, args.ks)))
        print(sections[-1], flush=True)
    if not args.skip_comparison:
        with torch.no_grad():
            rows = comparison_table(pair, args.ks, args.temperatures, args.max_new_tokens, clock, args.compiled,
                                    args.rounds)
        summary = baseline_summary(rows)
        sections.append("## Ours vs transformers (tokens/s, batch 1)\n\n" + markdown(rows) + "\n\n" + summary)
        print(summary, flush=True)
    with torch.no_grad():
        scaling = batch_scaling(pair, 4, args.batch_sizes, args.max_new_tokens, clock, args.batch_rounds)
    sections.append("## Batch scaling (greedy, k = 4, EOS ignored; the same prompts at every batch size)\n\n"
                    + markdown(scaling))
    print(sections[-1], flush=True)

    out = Path(args.out or f"outputs/bench/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text("\n\n".join(sections) + "\n")
    (out / "bench.json").write_text(json.dumps({"args": vars(args), "sections": sections}, indent=1))
    print(f"\nwritten to {out}/bench.md")


if __name__ == "__main__":
    main()
