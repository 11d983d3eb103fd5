"""Measure a trained drafter in the loop against its simulated acceptance, on held-out prompts of the embedded pair.

    python -m experiments.measure_drafter --kind eagle --checkpoint DIR          # an EAGLE head (train_drafter's drafter/)
    python -m experiments.measure_drafter --kind medusa --checkpoint embedded    # the shipped Medusa heads
    python -m experiments.measure_drafter --kind model --checkpoint DIR --temperature 1   # a distilled draft
    python -m experiments.measure_drafter --kind model                           # the pair's own draft
    python -m experiments.measure_drafter --pair gpt2-xl-shaped --kind eagle --checkpoint untrained   # cost only

Each of the first ``--prompts`` ``embedded_heldout`` prompts is decoded alone (batch 1) for ``--new-tokens`` tokens
with EOS ignored (the loop goes on through it), at k = ``--k``: greedy (``Greedy``) at temperature 0, else speculative
sampling (seed = the prompt's index). One JSON line: tau = emitted / target calls, per-position acceptance, acceptance
rate, the cost ratio c (one draft forward / one target forward, timed in the same run), Leviathan's predicted speedup
from the acceptance rate and c, vLLM's acceptance length (``drafting_tau``: over the steps that drafted), and at
temperature 0 the simulated tau (``specdec.train.losses``) on the target's greedy continuations of the same prompts, the
figure training reports, and the walked tau (``walked_acceptance``): the same matches followed step by step as the
loop takes them, which the loop's tau should equal. On a ``*-shaped`` pair (random weights) only the cost ratio means
anything: ``--checkpoint untrained`` times a fresh EAGLE head of the default options there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import specdec
from experiments.common.config_checks import ConfigError
from specdec.train.data import heldout_set
from specdec.train.loop import Family, evaluate, heldout_batches, hidden_layers
from specdec.eagle import SHIPPED as EAGLE_SHIPPED
from specdec.eagle import EagleDrafter
from specdec.heads import EagleHead
from specdec.models import EMBEDDED_DIR, PRESETS, load_pair
from specdec.prompts import load_prompts
from specdec.results import leviathan_speedup
from specdec.stats import DecodeStats, vllm_acceptance_length

KINDS = ("eagle", "medusa", "model")
SUMMED = ("draft_forwards", "target_forwards", "draft_seconds", "target_seconds", "wall_seconds", "ttft_seconds",
          "first_step_emitted", "draft_step_seconds", "target_step_seconds")  # DecodeStats' fields over calls
ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded", help="embedded, or a *-shaped pair for cost ratios")
    parser.add_argument("--kind", required=True, help="eagle, medusa or model")
    parser.add_argument("--checkpoint", default=None,
                        help="a train_drafter drafter/ directory, 'embedded' for the shipped heads, or 'untrained' "
                             "(eagle, for cost ratios); for --kind model, none measures the pair's own draft")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--label", default=None, help="a name for the JSON line")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "outputs" / "train_data" / "heldout",
                        help="where the held-out greedy continuations are written once")
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    return args


def check_arguments(args: argparse.Namespace) -> None:
    if args.kind not in KINDS:
        raise ConfigError(f"--kind {args.kind!r} is not allowed: must be one of {', '.join(KINDS)}")
    if args.kind != "model" and args.checkpoint is None:
        raise ConfigError(f"--kind {args.kind} needs --checkpoint (a drafter directory, or embedded)")
    if args.pair not in PRESETS:
        raise ConfigError(f"--pair {args.pair!r} is not allowed: must be one of {', '.join(PRESETS)}")
    if args.checkpoint == "untrained" and args.kind != "eagle":
        raise ConfigError("--checkpoint untrained is for --kind eagle (a fresh head, timed for its cost)")
    if args.checkpoint not in (None, "embedded", "untrained") and not (Path(args.checkpoint) / "drafter.json").is_file():
        raise ConfigError(f"--checkpoint {args.checkpoint!r} is not allowed: no drafter.json there")
    for name in ("prompts", "new_tokens", "k", "threads"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(args, name)} is not allowed: must be >= 1")
    if not args.temperature >= 0:
        raise ConfigError(f"--temperature {args.temperature} is not allowed: must be >= 0")


def shipped(kind: str, checkpoint: str) -> Path:
    return EAGLE_SHIPPED["embedded"] if kind == "eagle" and checkpoint == "embedded" else \
        EMBEDDED_DIR / "heads" / "medusa" if checkpoint == "embedded" else Path(checkpoint)


def build(args: argparse.Namespace, pair) -> tuple[object, torch.nn.Module]:
    """The drafter for the loop and the module whose simulated acceptance is measured."""
    target = pair.target
    if args.checkpoint == "untrained":
        torch.manual_seed(0)
        head = EagleHead(target).eval()
        return EagleDrafter(head, target), head
    if args.kind == "eagle":
        drafter = EagleDrafter.from_pretrained(shipped("eagle", args.checkpoint), target)
        return drafter, drafter.head
    if args.kind == "medusa":
        directory = shipped("medusa", args.checkpoint)
        from specdec.medusa import MedusaDrafter

        drafter = MedusaDrafter.from_pretrained(directory, target)
        return drafter, drafter.heads
    drafter = specdec.ModelDrafter.from_pair(pair, checkpoint=args.checkpoint)
    return drafter, drafter.model


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, device="cpu", dtype="float32")
    target, tokenizer = pair.target, pair.tokenizer
    try:
        drafter, module = build(args, pair)
    except (ValueError, FileNotFoundError) as err:  # a checkpoint for another target, or of another kind
        print(f"config error: --checkpoint {args.checkpoint}: {err}", file=sys.stderr)
        sys.exit(2)
    texts = [prompt.text for prompt in load_prompts("embedded_heldout", limit=args.prompts)]
    greedy = args.temperature == 0
    strategy = specdec.Greedy() if greedy else specdec.Speculative()
    decoder = specdec.Decoder(target, drafter, strategy, specdec.FixedLength(args.k),
                              specdec.SamplingConfig(temperature=args.temperature))
    decoder.generate(torch.tensor([tokenizer(texts[0]).input_ids]), max_new_tokens=8)  # warm-up
    started = time.perf_counter()
    runs = [decoder.generate(torch.tensor([tokenizer(text).input_ids]), max_new_tokens=args.new_tokens,
                             seed=index).stats for index, text in enumerate(texts)]
    stats = DecodeStats([row for run in runs for row in run.rows],
                        **{name: sum(getattr(run, name) for run in runs) for name in SUMMED})
    wall = time.perf_counter() - started
    totals = stats.totals
    drafting_steps = sum(totals.steps_by_k[1:])  # a head's draftless first call and k cut by the budget count apart
    drafted_k = totals.drafted / drafting_steps if drafting_steps else 0
    result = {"label": args.label or f"{args.kind}:{args.checkpoint}", "pair": args.pair, "kind": args.kind,
              "checkpoint": args.checkpoint, "temperature": args.temperature, "k": args.k, "prompts": len(texts),
              "new_tokens": args.new_tokens, "tau": totals.mean_accepted_length, "drafting_tau": vllm_acceptance_length(totals.steps_by_accepted),
              "per_position": totals.per_position,
              "acceptance_rate": totals.acceptance_rate, "cost_ratio": stats.cost_ratio,
              "drafted_k": drafted_k,  # what the steps drafted (4 Medusa heads under k = 8 draft 4), not args.k
              "predicted_speedup": leviathan_speedup(totals.acceptance_rate, drafted_k, stats.cost_ratio),
              "seconds": round(wall, 1), "threads": args.threads}
    if greedy and args.pair == "embedded":
        continuations = heldout_set(args.data_dir, texts, tokenizer, target, args.new_tokens)
        features = getattr(module, "feature_layers", ())
        family = Family(args.kind, module, None, hidden_layers(target, features), len(features))
        batches = heldout_batches(continuations, family, target, torch.device("cpu"), 16)
        found = evaluate(family, target, batches, args.k)
        result.update(simulated_tau=found.tau, simulated_per_position=found.per_position,
                      walked_tau=found.walked_tau, walked_per_position=found.walked_per_position)
    return result


def main(argv: list[str] | None = None) -> None:
    print(json.dumps(measure(parse_args(argv))), flush=True)


if __name__ == "__main__":
    main()
