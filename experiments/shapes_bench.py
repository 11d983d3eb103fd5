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

Timing as in ``experiments.common.harness``: one process, warm-up first (compiled methods on every prompt), methods
interleaved (the order balanced), device synchronised before every clock read. Prints Markdown tables and writes them
to --out.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import transformers

import specdec
from experiments.common.harness import (
    Decoded, Method, Report, argument_parser, cost_profile, default_out_dir, fractions, markdown,
    names_from, positive_int, positive_ints, random_prompts, run_interleaved,
    transformers_configuration, transformers_generate,
)
from experiments.common.refusal import check_device, check_dtype, check_pair, check_readable_file, check_writable
from specdec import Clock

MODES = {"eager": False, "compiled": True}  # mode -> compile
HF_METHODS = ["hf_generate", "hf_assisted"]


def parse_args(argv=None) -> argparse.Namespace:
    """Every value is checked here, before any model loads."""
    parser = argument_parser("experiments.shapes_bench", __doc__)
    parser.add_argument("--pair", default="gpt2-xl-shaped", help="a load_pair preset (default gpt2-xl-shaped)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--modes", type=names_from(MODES, "modes"), default="eager",
                        help="eager, compiled or both (comma-separated)")
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
    args = parser.parse_args(argv)
    if args.plot_from:
        parser.check(lambda: check_readable_file("--plot-from", args.plot_from),
                     lambda: check_writable("--plot-from's directory", Path(args.plot_from).parent))
        return args
    args.out = args.out or str(default_out_dir("shapes_bench"))
    parser.check(lambda: check_device("--device", args.device),
                 lambda: check_dtype("--dtype", args.dtype, args.device),
                 lambda: check_pair("--pair", args.pair, args.device, args.dtype),
                 lambda: check_writable("--out", args.out))
    return args


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


def generate_method(decoder: specdec.Decoder, device: torch.device, max_new_tokens: int, compiled: bool) -> Method:
    """Our decoder on each batch given (token lists), EOS ignored."""
    return Method(lambda batch, seed: Decoded.of(decoder.generate(torch.tensor(batch, device=device), None,
                                                                  max_new_tokens, None, seed)), compiled)


def autoregressive_sweep(pair, mode_names, batch_sizes, args, clock, bandwidth) -> list[dict]:
    """Baseline tokens/s per batch size and mode, every (size, mode) interleaved per round after a warm-up."""
    device, vocab_size = pair.target.device, pair.target.config.vocab_size

    def method(mode: str, size: int) -> Method:
        """Decodes the same ``size`` random prompts every round."""
        decoder = specdec.Decoder(pair.target, None, compile=MODES[mode], time_phases=False)
        prompts = torch.tensor(random_prompts(size, args.prompt_tokens, vocab_size, seed=size), device=device)
        return Method(lambda _, seed: Decoded.of(decoder.generate(prompts, None, args.max_new_tokens, None, seed)),
                      MODES[mode])

    methods = {(mode, size): method(mode, size) for mode in mode_names for size in batch_sizes}
    tallies = run_interleaved(methods, [None] * args.rounds, clock)
    per_token_bytes = weight_bytes(pair.target)
    rows = []
    for size in batch_sizes:
        row = {"batch": size}
        for mode in mode_names:
            row[f"{mode}_tok_s"] = round(tallies[(mode, size)].tokens_per_s, 1)
            row[f"{mode}_first_call_s"] = round(tallies[(mode, size)].warmup_seconds, 1)
        if bandwidth:
            bound = size * bandwidth / per_token_bytes  # every step reads every weight once
            row["weights_bound_tok_s"] = round(bound, 1)
            for mode in mode_names:
                row[f"{mode}_share_of_bound"] = round(row[f"{mode}_tok_s"] / bound, 3)
        rows.append(row)
    return rows


def speculative_curves(pair, mode: str, acceptances, ks, args, clock, profile_prompt: torch.Tensor) -> list[dict]:
    """Speedup over our baseline (same mode) at each synthetic acceptance and k; per k, the baseline and every
    acceptance are interleaved per prompt, the order balanced.

    Two measured speedups: end to end (tokens/s, prefill included) and of the decode phase (the time per token after
    each call's first step, whose target forward is the prefill), the one the predictions model. The costs a
    prediction uses (draft step, target step, verify of k + 1) are measured just before that k's runs, so a machine
    whose speed drifts over the sweep moves prediction and measurement together.
    """
    compile = MODES[mode]
    batches = [[prompt] for prompt in random_prompts(args.prompts, args.prompt_tokens, pair.target.config.vocab_size)]
    baseline = specdec.Decoder(pair.target, None, compile=compile, time_phases=False)
    rows = []
    for k in ks:
        costs = cost_profile(pair, profile_prompt, sorted({1, k + 1}), args.repeats, clock, compile)
        decoders = {"baseline": baseline}
        for alpha in acceptances:
            decoders[alpha] = specdec.Decoder(
                pair.target, specdec.ModelDrafter(pair.draft, compile=compile), specdec.SyntheticAcceptance(alpha),
                specdec.FixedLength(k), compile=compile, time_phases=False)
        methods = {name: generate_method(decoder, pair.target.device, args.max_new_tokens, compile)
                   for name, decoder in decoders.items()}
        tallies = run_interleaved(methods, batches, clock)
        base_decode_rate = decode_rate(tallies["baseline"].stats)
        for alpha in acceptances:
            measured_alpha = pooled_acceptance(tallies[alpha].stats)
            decode_speedup = decode_rate(tallies[alpha].stats) / base_decode_rate
            predicted = costs.speedup(measured_alpha, k)
            rows.append({
                "mode": mode,
                "acceptance": alpha,
                "k": k,
                "measured_acceptance": round(measured_alpha, 3),
                "baseline_tok_s": round(tallies["baseline"].tokens_per_s, 1),
                "spec_tok_s": round(tallies[alpha].tokens_per_s, 1),
                "speedup": round(tallies[alpha].tokens_per_s / tallies["baseline"].tokens_per_s, 2),
                "decode_speedup": round(decode_speedup, 2),
                "predicted_measured_costs": round(predicted, 2),
                "predicted_leviathan": round(specdec.predicted_speedup(measured_alpha, k, costs.cost_ratio()), 2),
                "decode_vs_predicted": round(decode_speedup / predicted, 3),
                "draft_ms": round(1000 * costs.draft_step(), 2),
                "target_ms": round(1000 * costs.target_step(), 2),
                "verify_ms": round(1000 * costs.verify(k), 2),
            })
        print(markdown(rows[-len(acceptances):]), flush=True)
    return rows


def decode_rate(stats: list) -> float:
    """Tokens per second of the decode phase: those after each call's first step (the prefill's), over its time."""
    return sum(s.decode_tokens for s in stats) / sum(s.wall_seconds - s.ttft_seconds for s in stats)


def pooled_acceptance(stats: list) -> float:
    """Accepted drafts over drafts verified (a draft after a rejection is never verified), pooled: the estimator
    of the alpha the synthetic rule is set to."""
    attempts = sum(sum(row.position_attempts) for s in stats for row in s.rows)
    return sum(sum(row.position_accepts) for s in stats for row in s.rows) / attempts


def transformers_comparison(pair, ks, args, clock) -> list[dict]:
    """Greedy, batch 1, eager: ours (greedy verification) vs assisted generation at the same algorithm and
    vs generate(), interleaved per prompt; tokens must be identical."""
    batches = [[prompt] for prompt in random_prompts(args.prompts, args.prompt_tokens, pair.target.config.vocab_size)]
    rows = []
    for k in ks:
        ours = specdec.Decoder(pair.target, specdec.ModelDrafter(pair.draft), specdec.Greedy(), specdec.FixedLength(k))
        methods = {
            "ours_speculative": generate_method(ours, pair.target.device, args.max_new_tokens, False),
            "hf_assisted": Method(lambda b, i, k=k: transformers_generate(pair.target, pair.draft, b,
                                                                          args.max_new_tokens, k, seed=i)),
            "hf_generate": Method(lambda b, i: transformers_generate(pair.target, pair.draft, b, args.max_new_tokens,
                                                                     seed=i)),
        }
        tallies = run_interleaved(methods, batches, clock)
        rate = {name: tally.tokens_per_s for name, tally in tallies.items()}
        ours_outputs = tallies["ours_speculative"].outputs
        rows.append({"k": k, **{f"{name}_tok_s": round(value, 1) for name, value in rate.items()},
                     "ours_vs_hf_assisted": round(rate["ours_speculative"] / rate["hf_assisted"], 2),
                     "ours_equals_hf_assisted": ours_outputs == tallies["hf_assisted"].outputs,
                     "ours_equals_hf_generate": ours_outputs == tallies["hf_generate"].outputs})
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
    report = Report()
    report.add(f"# Shapes benchmark: {pair.name}\n\n{name}; {next(pair.target.parameters()).dtype}; torch "
               f"{torch.__version__}, transformers {transformers.__version__}; prompts of {args.prompt_tokens} random "
               f"tokens, {args.max_new_tokens} new tokens, EOS ignored")
    bandwidth = copy_bandwidth(device, clock)
    memory = {"target_weight_gb": round(weight_bytes(pair.target) / 1e9, 3),
              "draft_weight_gb": round(weight_bytes(pair.draft) / 1e9, 3)}
    if bandwidth:
        memory["copy_bandwidth_tb_s"] = round(bandwidth / 1e12, 2)
        memory["batch_1_bound_tok_s"] = round(bandwidth / weight_bytes(pair.target), 1)
    report.table("## Memory bound (copy bandwidth measured: bytes read + written by a 2 GiB device copy)", [memory])

    with torch.inference_mode():
        sweep = autoregressive_sweep(pair, args.modes, args.batch_sizes, args, clock, bandwidth)
        report.table("## Autoregressive throughput (our baseline; first_call_s includes compilation)", sweep)
        prompt = torch.tensor(random_prompts(1, args.prompt_tokens, pair.target.config.vocab_size, seed=99),
                              device=device)  # [1, T]
        all_curves = []
        for mode in args.modes:
            costs = cost_profile(pair, prompt, range(1, max(args.ks) + 2), args.repeats, clock, MODES[mode])
            report.table(f"## Cost profile, {mode} (ms per forward, batch 1)",
                         [{key: round(ms, 3) for key, ms in costs.milliseconds().items()}])
            curves = speculative_curves(pair, mode, args.acceptances, args.ks, args, clock, prompt)
            all_curves += curves
            report.table(f"## Speculative speedup at synthetic acceptance, {mode} (batch 1)", curves, echo=False)
        if args.hf_ks:
            comparison = transformers_comparison(pair, args.hf_ks, args, clock)
            report.table("## Ours vs transformers assisted generation at the same algorithm (eager, greedy, batch "
                         "1; random pair, so acceptance is near 0 for both)", comparison,
                         transformers_configuration(pair.target, HF_METHODS), echo=False)

    out = Path(args.out)
    report.write(out / "shapes.md")
    plot_curves(all_curves, out)
    print(f"\nwritten to {out}/shapes.md and speedup_<mode>.png")


if __name__ == "__main__":
    main()
