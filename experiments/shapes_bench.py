"""System curves at controlled acceptance on a pair's real shapes: autoregressive throughput per batch size
against the memory bound, and speculative speedup at synthetic acceptance, eager and compiled.

    python -m experiments.shapes_bench                                     # GPT-2 small -> XL shapes, bf16, CPU
    python -m experiments.shapes_bench --device cuda --modes eager,compiled --batch-sizes 1,2,4,8,16,32,64

The pair has random weights (``gpt2-xl-shaped``), so acceptance is set, not found: ``SyntheticAcceptance(a)``
accepts each draft with probability a, and the cost of speculation on given shapes depends only on how many drafts
are accepted. Each speculative speedup stands beside two predictions at the acceptance it measured: Leviathan's
formula, which assumes verifying k+1 tokens costs one target step, and the same expected tokens per step over the
costs measured here (draft step and verify forward of k+1 tokens, same mode). The transformers comparison runs
assisted generation at the same algorithm (constant k, no confidence cut-off) beside ours with greedy verification,
both eager, on the same random pair (acceptance near 0, the same for both since greedy tokens are identical).

Timing as in bench.py: one process, warm-up first, methods interleaved (order rotating), device synchronised before
every clock read. Prints Markdown tables and writes them to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import transformers

import specdec
from experiments.bench import HF_ASSISTANT_SETTINGS, markdown, positive_int, positive_ints, transformers_best_options
from specdec import Clock
from specdec.profile import time_forwards

MODES = {"eager": False, "compiled": True}


def fractions(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = None
    if values is None or not all(0 <= value <= 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated acceptances in [0, 1], got {text!r}")
    return values


def modes(text: str) -> list[str]:
    names = text.split(",")
    if not names or not all(name in MODES for name in names):
        raise argparse.ArgumentTypeError(f"expected comma-separated modes from {', '.join(MODES)}, got {text!r}")
    return names


def parse_args(argv=None) -> argparse.Namespace:
    """Every value is checked here, before any model loads."""
    parser = argparse.ArgumentParser(prog="python -m experiments.shapes_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="gpt2-xl-shaped", help="a load_pair preset (default gpt2-xl-shaped)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--modes", type=modes, default="eager", help="eager, compiled or both (comma-separated)")
    parser.add_argument("--acceptances", type=fractions, default="0.5,0.6,0.7,0.8,0.9")
    parser.add_argument("--ks", type=positive_ints, default="1,2,3,4,5,6,7,8")
    parser.add_argument("--batch-sizes", type=positive_ints, default="1", help="autoregressive throughput sweep")
    parser.add_argument("--prompts", type=positive_int, default=4, help="prompts per speculative setting (batch 1)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=32, help="tokens per random prompt")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed repeats per forward (cost profile)")
    parser.add_argument("--rounds", type=positive_int, default=2, help="rounds of the batch-size sweep")
    parser.add_argument("--hf-ks", type=positive_ints, default=None, help="k values for the transformers comparison")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default=None, help="directory for shapes.md and the speedup plots")
    parser.add_argument("--plot-from", default=None, metavar="SHAPES_MD",
                        help="only redraw the speedup plots from an earlier shapes.md (next to it); loads no model")
    return parser.parse_args(argv)


def curves_from_markdown(text: str) -> list[dict]:
    """The rows of every speculative-speedup table in a shapes.md."""
    rows, header = [], None
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            header = None
        elif cells[:3] == ["mode", "acceptance", "k"]:
            header = cells
        elif header and not set(cells[0]) <= set("-"):
            rows.append({key: value if key == "mode" else float(value) for key, value in zip(header, cells)})
    return rows


def plot_curves(rows: list[dict], out: Path) -> list[Path]:
    """speedup_<mode>.png: measured decode speedup vs k, one colour per acceptance, the prediction from measured
    costs dashed beside it. (Tables written before the decode column existed plot their end-to-end speedup.)"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for mode in dict.fromkeys(row["mode"] for row in rows):
        figure, axes = plt.subplots(figsize=(6.4, 4.2))
        mode_rows = [row for row in rows if row["mode"] == mode]
        for index, alpha in enumerate(sorted({row["acceptance"] for row in mode_rows})):
            curve = sorted((row for row in mode_rows if row["acceptance"] == alpha), key=lambda row: row["k"])
            ks = [row["k"] for row in curve]
            colour = f"C{index}"
            measured = [row.get("decode_speedup", row["speedup"]) for row in curve]
            axes.plot(ks, measured, "o-", color=colour, label=f"a = {alpha:g} measured")
            axes.plot(ks, [row["predicted_measured_costs"] for row in curve], "--", color=colour, alpha=0.7,
                      label=f"a = {alpha:g} predicted from measured costs")
        axes.axhline(1.0, color="grey", linewidth=0.8)
        axes.set(xlabel="draft length k", ylabel="decode speedup over our baseline",
                 title=f"Speedup at synthetic acceptance, {mode}")
        axes.legend(fontsize=7, ncol=2)
        figure.tight_layout()
        path = out / f"speedup_{mode}.png"
        figure.savefig(path, dpi=120)
        plt.close(figure)
        written.append(path)
    return written


def random_prompts(count: int, width: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (count, width), generator=generator)  # [count, width]


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights counted once


def copy_bandwidth(device: torch.device, clock: Clock, gigabytes: float = 2.0) -> float | None:
    """Bytes/s of a large device-to-device copy (bytes read plus bytes written); None off CUDA."""
    if device.type != "cuda":
        return None
    source = torch.randn(int(gigabytes * 2**30) // 4, device=device)
    target = torch.empty_like(source)
    times = []
    for _ in range(12):
        start = clock.now()
        target.copy_(source)
        times.append(clock.now() - start)
    return 2 * source.numel() * 4 / statistics.median(times[2:])


def timed_generate(decoder: specdec.Decoder, prompts: torch.Tensor, max_new_tokens: int, clock: Clock, seed: int):
    start = clock.now()
    out = decoder.generate(prompts, None, max_new_tokens, None, seed)
    return out, clock.now() - start


def autoregressive_sweep(pair, mode_names, batch_sizes, args, clock, bandwidth) -> list[dict]:
    """Baseline tokens/s per batch size and mode, every (size, mode) interleaved per round after a warm-up."""
    decoders = {(mode, size): specdec.Decoder(pair.target, None, compile=MODES[mode], time_phases=False)
                for mode in mode_names for size in batch_sizes}
    prompts = {size: random_prompts(size, args.prompt_tokens, pair.target.config.vocab_size, seed=size).to(
        pair.target.device) for size in batch_sizes}
    warmup, tokens, seconds = {}, dict.fromkeys(decoders, 0), dict.fromkeys(decoders, 0.0)
    for key, decoder in decoders.items():
        warmup[key] = timed_generate(decoder, prompts[key[1]], args.max_new_tokens, clock, 0)[1]
    keys = list(decoders)
    for round_index in range(args.rounds):
        shift = round_index % len(keys)
        for key in keys[shift:] + keys[:shift]:
            out, elapsed = timed_generate(decoders[key], prompts[key[1]], args.max_new_tokens, clock, round_index)
            tokens[key] += sum(map(len, out.tokens))
            seconds[key] += elapsed
    per_token_bytes = weight_bytes(pair.target)
    rows = []
    for size in batch_sizes:
        row = {"batch": size}
        for mode in mode_names:
            row[f"{mode}_tok_s"] = round(tokens[(mode, size)] / seconds[(mode, size)], 1)
            row[f"{mode}_first_call_s"] = round(warmup[(mode, size)], 1)
        if bandwidth:
            bound = size * bandwidth / per_token_bytes  # every step reads every weight once
            row["weights_bound_tok_s"] = round(bound, 1)
            for mode in mode_names:
                row[f"{mode}_share_of_bound"] = round(row[f"{mode}_tok_s"] / bound, 3)
        rows.append(row)
    return rows


def cost_profile(pair, mode: str, widths, prompt: torch.Tensor, clock: Clock, repeats: int) -> dict:
    """Seconds per forward over ``prompt`` in the mode given, on the cache layout that mode decodes with (eager:
    dynamic, compiled: static): the draft's of one token and the target's of each of ``widths`` tokens."""
    layout = "static" if MODES[mode] else "dynamic"

    def seconds(model, widths, label):
        return time_forwards(model, prompt, widths, repeats, cache_layout=layout, compile=MODES[mode], clock=clock,
                             label=label)

    draft = seconds(pair.draft, [1], "draft")
    target = seconds(pair.target, widths, "target")
    return {"draft": draft[1], **{f"target_{n}": value for n, value in target.items()}}


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per step when each draft is accepted with probability alpha: sum_{i=0..k} alpha^i."""
    return sum(alpha**i for i in range(k + 1))


def speculative_curves(pair, mode: str, acceptances, ks, args, clock, profile_prompt: torch.Tensor) -> list[dict]:
    """Speedup over our baseline (same mode) at each synthetic acceptance and k; per k, the baseline and every
    acceptance are interleaved per prompt, order rotating.

    Two measured speedups: end to end (tokens/s, prefill included) and of the decode phase (the time per token after
    each call's first step, whose target forward is the prefill), the one the predictions model. The costs a prediction uses (draft
    step, target step, verify of k + 1) are measured just before that k's runs, so a machine whose speed drifts
    over the sweep moves prediction and measurement together.
    """
    compile = MODES[mode]
    prompts = random_prompts(args.prompts, args.prompt_tokens, pair.target.config.vocab_size).to(pair.target.device)
    baseline = specdec.Decoder(pair.target, None, compile=compile, time_phases=False)
    rows = []
    for k in ks:
        profile = cost_profile(pair, mode, sorted({1, k + 1}), profile_prompt, clock, args.repeats)
        step, draft_step, verify = profile["target_1"], profile["draft"], profile[f"target_{k + 1}"]
        decoders = {"baseline": baseline}
        for alpha in acceptances:
            decoders[alpha] = specdec.Decoder(
                pair.target, specdec.ModelDrafter(pair.draft, compile=compile), specdec.SyntheticAcceptance(alpha),
                specdec.FixedLength(k), compile=compile, time_phases=False)
        tokens, seconds = dict.fromkeys(decoders, 0), dict.fromkeys(decoders, 0.0)
        decode_tokens, decode_seconds = dict.fromkeys(decoders, 0), dict.fromkeys(decoders, 0.0)
        drafted, accepted = dict.fromkeys(decoders, 0), dict.fromkeys(decoders, 0)
        for decoder in decoders.values():
            decoder.generate(prompts[:1], None, args.max_new_tokens, None, 0)  # warm-up (and compile) per shape
        names = list(decoders)
        for index in range(len(prompts)):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                out, elapsed = timed_generate(decoders[name], prompts[index : index + 1], args.max_new_tokens, clock,
                                              index)
                tokens[name] += sum(map(len, out.tokens))
                seconds[name] += elapsed
                decode_tokens[name] += out.stats.decode_tokens  # those after the first step (the prefill's)
                decode_seconds[name] += out.stats.wall_seconds - out.stats.ttft_seconds
                # Per-position acceptance, pooled: accepted drafts over drafts verified (a draft after a rejection
                # is never verified), the estimator of the alpha the synthetic rule is set to.
                drafted[name] += sum(sum(row.position_attempts) for row in out.stats.rows)
                accepted[name] += sum(sum(row.position_accepts) for row in out.stats.rows)
        base_rate = tokens["baseline"] / seconds["baseline"]
        base_decode_rate = decode_tokens["baseline"] / decode_seconds["baseline"]
        for alpha in acceptances:
            measured_alpha = accepted[alpha] / drafted[alpha]
            decode_speedup = decode_tokens[alpha] / decode_seconds[alpha] / base_decode_rate
            predicted = expected_tokens(measured_alpha, k) * step / (k * draft_step + verify)
            rows.append({
                "mode": mode,
                "acceptance": alpha,
                "k": k,
                "measured_acceptance": round(measured_alpha, 3),
                "baseline_tok_s": round(base_rate, 1),
                "spec_tok_s": round(tokens[alpha] / seconds[alpha], 1),
                "speedup": round(tokens[alpha] / seconds[alpha] / base_rate, 2),
                "decode_speedup": round(decode_speedup, 2),
                "predicted_measured_costs": round(predicted, 2),
                "predicted_leviathan": round(specdec.predicted_speedup(measured_alpha, k, draft_step / step), 2),
                "decode_vs_predicted": round(decode_speedup / predicted, 3),
                "draft_ms": round(1000 * draft_step, 2),
                "target_ms": round(1000 * step, 2),
                "verify_ms": round(1000 * verify, 2),
            })
        print(markdown(rows[-len(acceptances):]), flush=True)
    return rows


def transformers_comparison(pair, ks, args, clock) -> list[dict]:
    """Greedy, batch 1, eager: ours (greedy verification) vs assisted generation at the same algorithm and
    vs generate(), interleaved per prompt; tokens must be identical."""
    prompts = random_prompts(args.prompts, args.prompt_tokens, pair.target.config.vocab_size).to(pair.target.device)

    def hf(k, ids):
        assistant = {}
        if k:
            for key, value in HF_ASSISTANT_SETTINGS["same_algorithm"](k).items():
                setattr(pair.draft.generation_config, key, value)
            assistant = dict(assistant_model=pair.draft)
        out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                   min_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0, **assistant,
                                   **transformers_best_options(pair.target))
        return out[0, ids.shape[1]:].tolist()

    rows = []
    for k in ks:
        ours = specdec.Decoder(pair.target, specdec.ModelDrafter(pair.draft), specdec.Greedy(), specdec.FixedLength(k))
        methods = {
            "ours_speculative": lambda ids: ours.generate(ids, None, args.max_new_tokens).tokens[0],
            "hf_assisted": lambda ids: hf(k, ids),
            "hf_generate": lambda ids: hf(None, ids),
        }
        for method in methods.values():
            method(prompts[:1])
        tokens, seconds, outputs = dict.fromkeys(methods, 0), dict.fromkeys(methods, 0.0), {m: [] for m in methods}
        names = list(methods)
        for index in range(len(prompts)):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                start = clock.now()
                output = methods[name](prompts[index : index + 1])
                seconds[name] += clock.now() - start
                tokens[name] += len(output)
                outputs[name].append(output)
        rate = {name: tokens[name] / seconds[name] for name in methods}
        rows.append({"k": k, **{f"{name}_tok_s": round(value, 1) for name, value in rate.items()},
                     "ours_vs_hf_assisted": round(rate["ours_speculative"] / rate["hf_assisted"], 2),
                     "ours_equals_hf_assisted": outputs["ours_speculative"] == outputs["hf_assisted"],
                     "ours_equals_hf_generate": outputs["ours_speculative"] == outputs["hf_generate"]})
        print(markdown(rows[-1:]), flush=True)
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.plot_from:
        source = Path(args.plot_from)
        for path in plot_curves(curves_from_markdown(source.read_text(encoding="utf-8")), source.parent):
            print(f"wrote {path}")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = specdec.load_pair(args.pair, device=args.device, dtype=args.dtype)
    device = pair.target.device
    clock = Clock(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    sections = [f"# Shapes benchmark: {pair.name}\n\n{name}; {next(pair.target.parameters()).dtype}; torch "
                f"{torch.__version__}, transformers {transformers.__version__}; prompts of {args.prompt_tokens} random "
                f"tokens, {args.max_new_tokens} new tokens, EOS ignored"]
    bandwidth = copy_bandwidth(device, clock)
    memory = {"target_weight_gb": round(weight_bytes(pair.target) / 1e9, 3),
              "draft_weight_gb": round(weight_bytes(pair.draft) / 1e9, 3)}
    if bandwidth:
        memory["copy_bandwidth_tb_s"] = round(bandwidth / 1e12, 2)
        memory["batch_1_bound_tok_s"] = round(bandwidth / weight_bytes(pair.target), 1)
    sections.append("## Memory bound (copy bandwidth measured: bytes read + written by a 2 GiB device copy)\n\n"
                    + markdown([memory]))
    print("\n\n".join(sections), flush=True)

    with torch.inference_mode():
        sweep = autoregressive_sweep(pair, args.modes, args.batch_sizes, args, clock, bandwidth)
        sections.append("## Autoregressive throughput (our baseline; first_call_s includes compilation)\n\n"
                        + markdown(sweep))
        print(sections[-1], flush=True)
        prompt = random_prompts(1, args.prompt_tokens, pair.target.config.vocab_size, seed=99).to(device)
        all_curves = []
        for mode in args.modes:
            profile = cost_profile(pair, mode, range(1, max(args.ks) + 2), prompt, clock, args.repeats)
            sections.append(f"## Cost profile, {mode} (ms per forward, batch 1)\n\n"
                            + markdown([{key: round(1000 * value, 3) for key, value in profile.items()}]))
            print(sections[-1], flush=True)
            curves = speculative_curves(pair, mode, args.acceptances, args.ks, args, clock, prompt)
            all_curves += curves
            sections.append(f"## Speculative speedup at synthetic acceptance, {mode} (batch 1)\n\n" + markdown(curves))
        if args.hf_ks:
            comparison = transformers_comparison(pair, args.hf_ks, args, clock)
            sections.append("## Ours vs transformers assisted generation at the same algorithm (eager, greedy, batch "
                            "1; random pair, so acceptance is near 0 for both)\n\n" + markdown(comparison))

    out = Path(args.out or f"outputs/shapes_bench/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "shapes.md").write_text("\n\n".join(sections) + "\n")
    plot_curves(all_curves, out)
    print(f"\nwritten to {out}/shapes.md and speedup_<mode>.png")


if __name__ == "__main__":
    main()
