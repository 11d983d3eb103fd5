"""The GPU suite: the headline figures of a GPU in one command, planned for a 15-minute lease (issue 36).

    python -m experiments.gpu_suite --out "$OUT"                 # the short plan: at most 8 minutes on one H100
    python -m experiments.gpu_suite --plan full --out "$OUT"     # every figure, ~9 minutes (a longer lease)
    python -m experiments.gpu_suite --sections speculative       # the preflight, then some sections only
    python -m experiments.gpu_suite --smoke --out /tmp/smoke     # the plan rehearsed on CPU, tiny models, ~20 s
    python -m experiments.gpu_suite --profile 4 --out "$OUT"     # a torch.profiler trace of the device step, k = 4

The short plan, in order (the most wanted first, so a short lease loses the least):

0. ``preflight`` (~30 s, tiny models, float64): the device step (``Decoder(compile=True, step="device")``)
   captures its step, replays it, reuses the kept capture in a later call with the host loop's greedy tokens, and
   a sampled call on a kept capture emits what the same seed emits on a fresh one. If it fails, the suite says why
   and skips every item that runs the device step, rather than paying a compile for each.
1. ``bandwidth``: a device-to-device copy (bytes read + written): the memory bound's rate.
2. ``ar_batch1``: compiled autoregressive ``gpt2-xl-shaped`` at batch 1 (``lean_compiled``: the lean forward,
   compiled, the step on the device) beside the bound (weight bytes / bandwidth per token), with transformers'
   static-cache ``generate`` (``hf_static``, which transformers compiles itself on CUDA) as the peer.
3. ``cost_ratio``: draft step / target step, each compiled forward timed as a CUDA graph replay, as the device step
   runs it (``harness.cost_profile``).
4. ``speculative``: our fastest path at synthetic acceptance 0.7 for each k of the plan (2..6, the likely best
   first), speedup over the same path's autoregressive baseline, beside the prediction from measured costs. The
   compiled forward serves every k with one graph (``specdec.cache.width_dynamic``), so a k after the first costs a
   capture, not a compile: each row says what its first call cost (``first_call_s``, ``compiles``).
5. ``embedded``: the shipped pair, ours vs transformers' assisted generation at the same algorithm, greedy, k = 4,
   and whether every method emitted identical tokens.

Then, only with the time left: ``ar_batches`` (batches 8 and 64), ``spec_acceptances`` (0.6 and 0.8 at the k
values 0.7 measured), ``study`` (one short ``experiment=gpt2_xl_study`` job, W&B offline where wandb is installed),
``host_reads`` (host reads per step of the device step and of the host loop). The full plan measures more modes and
peers in the same sections, on a longer budget.

Each section has a share of the suite's budget (the rest have none: they get what the headline left); time a section
leaves unused goes to the next. Inside a section each item (a method's first call, a k) is first estimated (the
longest item of its kind so far, or a first guess) and skipped with a line saying so when it does not fit. An item
or a section that fails is recorded with its error and the suite goes on. Both files (Markdown and JSON) are written
again after every item, so a run stopped at its time limit leaves what it measured. Timing as in
``experiments.harness``: warm-up first, methods interleaved, the device synchronised before every clock read.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import torch
import transformers

from experiments.gpu.models import device_kind, device_name
from experiments.gpu.plan import PLANS, SuitePlan, smoke
from experiments.gpu.schedule import Suite
from experiments.gpu.sections import SECTIONS, profile_step
from experiments.harness import argument_parser, default_out_dir, names_from
from experiments.refusal import check_writable

REPO = Path(__file__).resolve().parents[1]


# --- the command --------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    """The arguments, each checked before anything loads: a refusal is one line and exit 2 (argparse's)."""
    from specdec.models import PRESETS

    parser = argument_parser("experiments.gpu_suite", __doc__)
    parser.add_argument("--plan", choices=tuple(PLANS), default="short",
                        help="short: the headline in 8 minutes on an H100 (default); full: every figure")
    parser.add_argument("--smoke", action="store_true", help="the plan rehearsed on CPU with tiny models and budgets")
    parser.add_argument("--compile", action="store_true",
                        help="compile on CPU too (the smoke plan does not by default; it measures what a k compiles)")
    parser.add_argument("--pair", choices=("tiny", *PRESETS), default=None,
                        help="the pair of the main sections: a load_pair preset or 'tiny' (default: the plan's)")
    parser.add_argument("--out", default=None,
                        help="directory for gpu-<kind>.md and .json (default docs/bench; --smoke: outputs/gpu_suite/)")
    parser.add_argument("--sections", type=names_from(SECTIONS, "sections"), default=None,
                        help="comma-separated sections to run after the preflight, in the plan's order (default: the "
                             "plan's)")
    parser.add_argument("--budget", type=positive_seconds, default=None,
                        help="seconds for the whole suite (default: the plan's)")
    parser.add_argument("--profile", type=k_to_profile, default=None, metavar="K",
                        help="instead of the suite: a torch.profiler trace of a call on a kept capture at this k")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("the GPU suite needs CUDA (torch sees no GPU); --smoke runs it on CPU")
    args.out = args.out or str(default_out_dir("gpu_suite") if args.smoke else REPO / "docs" / "bench")
    parser.check(lambda: check_writable("--out", args.out))
    return args


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return seconds


def k_to_profile(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 16:
        raise argparse.ArgumentTypeError(f"expected a k from 1 to 16, got {text!r}")
    return int(text)


def plan_from(args: argparse.Namespace) -> SuitePlan:
    """The plan the (checked) arguments ask for."""
    plan = smoke(PLANS[args.plan]) if args.smoke else PLANS[args.plan]
    if args.budget is not None:
        plan = replace(plan, budget_seconds=args.budget)
    if args.pair is not None:
        plan = replace(plan, pair=args.pair)
    if args.compile:
        plan = replace(plan, compile=True)
    if args.sections is not None:
        plan = replace(plan, sections=tuple(name for name in plan.sections if name in args.sections))
    return plan


def main(argv=None) -> dict:
    args = parse_args(argv)
    plan = plan_from(args)
    out = Path(args.out)
    if plan.threads:
        torch.set_num_threads(plan.threads)
    name = device_name(torch.device(plan.device))
    path = out / (f"gpu-{device_kind(name)}.md" if args.profile is None else f"profile-k{args.profile}.md")
    suite = Suite(plan, checkpoint=lambda: write(suite, path))
    suite.results["device"] = name
    suite.header = suite_header(plan, name)
    start = time.monotonic()
    with torch.inference_mode():
        if args.profile is not None:
            profile_step(suite, args.profile, out)
        else:
            suite.run({section: SECTIONS[section] for section in ("preflight", *plan.sections)})
    payload = write(suite, path)
    print(f"[gpu_suite] {time.monotonic() - start:.0f} s in all; wrote {path} and its .json", flush=True)
    return payload


def write(suite: Suite, path: Path) -> dict:
    """The Markdown and the JSON, written again after every item and section, so a run stopped at its time limit
    still leaves what it measured."""
    payload = suite.payload()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(suite.markdown())
    path.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    return payload


def suite_header(plan: SuitePlan, name: str) -> str:
    gpu = f"{name}, " if name != "cpu" else ""
    return (f"# GPU suite: {name}\n\n{datetime.date.today().isoformat()}; {gpu}torch {torch.__version__}, "
            f"transformers {transformers.__version__} (figures of transformers' methods are this version's); plan "
            f"`{plan.name}`, pair `{plan.pair}` in {plan.dtype}, compile={plan.compile}. Written by "
            f"`python -m experiments.gpu_suite`; the JSON beside this file holds every figure.")


if __name__ == "__main__":
    main()