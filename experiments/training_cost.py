"""Seconds per training step of each drafter family at real vocabularies, on Llama-shaped targets with random
weights built in this process (no hub, no model directory):

    python -m experiments.training_cost                      # SmolLM2-135M's shape at 49,152 and 151,936 tokens
    python -m experiments.training_cost --layers 4 --vocabs 49152 --steps 2     # a quicker look
    python -m experiments.training_cost --device cuda --dtype bfloat16 --out outputs/training_cost/h200

The target: ``LlamaForCausalLM`` of SmolLM2-135M's shape by default (30 layers, width 576, 9 attention heads, 3
key-value heads, MLP 1536, tied embeddings), once per vocabulary in ``--vocabs`` (151,936 is Qwen2's). The
families are the train_drafter app's, built from its configs (configs/train/drafter/, their defaults):

- ``eagle``, ``eagle_reduced``: an EAGLE head over the whole vocabulary, and over ``--draft-vocab`` tokens (the
  most frequent of the data, as the app picks them);
- ``medusa``, ``medusa_reduced``: ``--medusa-heads`` Medusa heads, likewise;
- ``model``: a draft model distilled whole, the target's shape with ``--draft-layers`` layers.

A step is the app's own (``specdec.train.loop.training_step``: the family's loss under autocast where the target
is in half precision, backward, clipping, AdamW) on a batch of ``--batch-size`` random sequences of ``--seq-len``
tokens, made by the app's ``make_batch`` from hidden states computed beforehand (the app caches them when each
sequence is read more than once, ``hidden=auto``). The target's forward over one batch, what ``hidden=recompute``
adds to every step, is timed beside, as its own row.

Timing: ``--warmup`` steps of each family first; then ``--steps`` rounds, each timing one step of every family, the
order changing from round to round (``rotation``'s balanced design); the device synchronised before every clock read;
the median step. Peak memory is CUDA's ``max_memory_allocated`` over a family's steps (n/a on CPU). Every figure is
measured here: the ratios are of the medians printed beside them. Prints Markdown tables; ``--out`` writes them and a
JSON copy.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from experiments.common.harness import Report, argument_parser, bench_clock, names_from, positive_int, rotation
from experiments.common.refusal import check_device, check_dtype, check_writable
from specdec import Clock
from specdec.models import resolve_device, resolve_dtype
from specdec.train.data import Sequences, target_hidden
from specdec.train.loop import (Family, Ranks, Settings, TrainingData, build_family, frequent_tokens, make_batch,
                                make_optimizer, progress, training_step)
from specdec.train.losses import DIVERGENCES, masked_mean

DRAFTER_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "train" / "drafter"
FAMILIES = {  # name -> (the app's drafter option, over the reduced draft vocabulary)
    "eagle": ("eagle", False),
    "eagle_reduced": ("eagle", True),
    "medusa": ("medusa", False),
    "medusa_reduced": ("medusa", True),
    "model": ("model", False),
}
SHAPE = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)  # SmolLM2-135M
RECOMPUTE = "target forward (hidden=recompute adds it)"


def parse_args(argv=None) -> argparse.Namespace:
    """Every value is checked here, before any model is built."""
    parser = argument_parser("experiments.training_cost", __doc__)
    parser.add_argument("--vocabs", type=lambda text: [positive_int(v) for v in text.split(",")],
                        default=[49152, 151936], help="target vocabularies (default 49152,151936)")
    parser.add_argument("--layers", type=positive_int, default=30, help="the target's layers (SmolLM2-135M: 30)")
    parser.add_argument("--width", type=positive_int, default=SHAPE["hidden_size"])
    parser.add_argument("--heads", type=positive_int, default=SHAPE["num_attention_heads"])
    parser.add_argument("--kv-heads", type=positive_int, default=SHAPE["num_key_value_heads"])
    parser.add_argument("--intermediate", type=positive_int, default=SHAPE["intermediate_size"])
    parser.add_argument("--families", type=names_from(FAMILIES, "families"), default=list(FAMILIES))
    parser.add_argument("--draft-vocab", type=positive_int, default=8192, help="the reduced families' vocabulary")
    parser.add_argument("--medusa-heads", type=positive_int, default=4)
    parser.add_argument("--draft-layers", type=positive_int, default=2, help="layers of the model family's draft")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--seq-len", type=positive_int, default=128, help="tokens per training sequence")
    parser.add_argument("--loss", choices=DIVERGENCES, default="kl")
    parser.add_argument("--warmup", type=positive_int, default=1, help="untimed steps of each family first")
    parser.add_argument("--steps", type=positive_int, default=3, help="timed steps of each family (interleaved)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="the target's dtype (the trained module stays fp32)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=positive_int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the tables (Markdown) and a JSON copy here")
    args = parser.parse_args(argv)
    parser.check(lambda: check_device("--device", args.device),
                 lambda: check_dtype("--dtype", args.dtype, args.device),
                 lambda: check_shape(args),
                 *([lambda: check_writable("--out", args.out.parent)] if args.out else []))
    return args


def check_shape(args: argparse.Namespace) -> None:
    """What the target and the reduced families need of the sizes, in one line each."""
    if args.width % args.heads or args.heads % args.kv_heads:
        raise ValueError(f"--width {args.width}, --heads {args.heads}, --kv-heads {args.kv_heads}: the width must be "
                         f"a multiple of the heads, and the heads of the key-value heads")
    if any(family.endswith("_reduced") for family in args.families) and args.draft_vocab > min(args.vocabs):
        raise ValueError(f"--draft-vocab {args.draft_vocab} is larger than the vocabulary {min(args.vocabs)}: must "
                         f"be at most the smallest of --vocabs")
    if "medusa" in args.families or "medusa_reduced" in args.families:
        if args.medusa_heads >= args.seq_len:
            raise ValueError(f"--medusa-heads {args.medusa_heads} needs --seq-len above it, got {args.seq_len}")


@dataclass
class Models:
    """What ``build_family`` reads: the target, and the draft the model family distils."""

    target: torch.nn.Module
    draft: torch.nn.Module | None


def llama(args: argparse.Namespace, vocab: int, layers: int, device: torch.device, dtype: torch.dtype):
    """A random-weight Llama of the asked shape, in eval mode, frozen."""
    config = LlamaConfig(vocab_size=vocab, hidden_size=args.width, intermediate_size=args.intermediate,
                         num_hidden_layers=layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(2048, args.seq_len),
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=None)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval().requires_grad_(False)


def random_sequences(count: int, length: int, vocab: int, seed: int) -> Sequences:
    """[count, length] uniform random tokens, every position but the last trained on."""
    tokens = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(seed))
    counts = torch.ones_like(tokens, dtype=torch.bool)
    counts[:, -1] = False
    return Sequences(tokens, counts)


def family_of(name: str, args: argparse.Namespace, models: Models, sequences: Sequences) -> Family:
    """The family ``name`` as the app builds it from its drafter config (defaults), with its draft vocabulary."""
    option, reduced = FAMILIES[name]
    config = OmegaConf.load(DRAFTER_CONFIGS / f"{option}.yaml")
    if option == "medusa":
        config.head.num_heads = args.medusa_heads
    make_head = instantiate(config.head) if config.head is not None else None
    draft_ids = frequent_tokens(sequences, args.draft_vocab)[0] if reduced else None
    return build_family(option, make_head, instantiate(config.objective), models, draft_ids)


def timed(clock: Clock, work) -> float:
    start = clock.now()
    work()
    return clock.now() - start


@dataclass
class VocabularyCost:
    """What one vocabulary's run measured, by family name (and ``RECOMPUTE``)."""

    seconds: dict[str, list[float]]  # each timed step, in the order run
    peaks: dict[str, int]  # CUDA's peak bytes over the timed steps (0 on CPU)
    trained: dict[str, int]  # trained parameters (0 for the target's forward)


def measure_vocabulary(vocab: int, args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                       clock: Clock) -> VocabularyCost:
    """Every family's training steps (and the target's forward) at vocabulary ``vocab``, timed interleaved."""
    torch.manual_seed(args.seed)
    target = llama(args, vocab, args.layers, device, dtype)
    draft = llama(args, vocab, args.draft_layers, device, dtype) if "model" in args.families else None
    models = Models(target, draft)
    sequences = random_sequences(args.batch_size, args.seq_len, vocab, args.seed)
    rows = torch.arange(args.batch_size)
    layers = (target.config.num_hidden_layers,)  # every family here reads the last layer alone
    with torch.no_grad():
        hidden = target_hidden(target, sequences.tokens.to(device), layers).cpu()  # [B, T, 1, D]
    cached, recompute = TrainingData(sequences, hidden), TrainingData(sequences, None)
    settings = Settings(steps=args.warmup + args.steps, batch_size=args.batch_size, lr=1e-4, divergence=args.loss)
    ranks = Ranks()
    families = {name: family_of(name, args, models, sequences) for name in args.families}
    optimizers = {}
    for name, family in families.items():
        family.module.to(device)
        optimizers[name] = make_optimizer(family.module, settings)

    def step(name: str, index: int) -> None:
        batch = make_batch(cached, rows, families[name], target, device)
        training_step(index, progress(index, 0.0, settings), families[name], target, batch, optimizers[name],
                      settings, ranks, masked_mean)

    def forward() -> None:
        with torch.no_grad():
            make_batch(recompute, rows, families[args.families[0]], target, device)

    names = [*args.families, RECOMPUTE]
    work = {name: (forward if name == RECOMPUTE else None) for name in names}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, int] = {name: 0 for name in names}
    for index in range(args.warmup + args.steps):
        for name in rotation(names, index):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            elapsed = timed(clock, work[name] or (lambda name=name: step(name, index)))
            if index >= args.warmup:
                seconds[name].append(elapsed)
                if device.type == "cuda":
                    peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated(device))
    trained = {name: sum(p.numel() for p in family.module.parameters() if p.requires_grad)
               for name, family in families.items()}
    return VocabularyCost(seconds, peaks, {**trained, RECOMPUTE: 0})


def table_rows(vocab: int, measured: VocabularyCost, device: torch.device) -> list[dict]:
    """The table's rows: each name's median over its timed steps, and the ratios of those medians."""
    medians = {name: statistics.median(values) for name, values in measured.seconds.items()}
    reference = medians.get("eagle")
    rows = []
    for name, median in medians.items():
        trained = measured.trained[name]
        rows.append({
            "vocabulary": vocab, "family": name,
            "trained parameters (M)": f"{trained / 1e6:.2f}" if trained else "-",
            "s / step (median)": f"{median:.3f}",
            "timed steps": len(measured.seconds[name]),
            "x eagle": f"{median / reference:.2f}" if reference else "n/a (eagle not timed)",
            "x full-vocabulary same family": reduced_ratio(name, medians),
            "peak memory (GiB)": f"{measured.peaks[name] / 2**30:.2f}" if device.type == "cuda" else "n/a (CPU)",
        })
    return rows


def reduced_ratio(name: str, medians: dict[str, float]) -> str:
    """A reduced family's median over its full-vocabulary family's."""
    if not name.endswith("_reduced"):
        return "-"
    full = name.removesuffix("_reduced")
    return f"{medians[name] / medians[full]:.2f}" if full in medians else "n/a (full not timed)"


def main(argv=None) -> dict:
    args = parse_args(argv)
    clock = bench_clock(args)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    setting = (f"Llama-shaped target, random weights: {args.layers} layers, width {args.width}, {args.heads} heads "
               f"({args.kv_heads} key-value), MLP {args.intermediate}; batch {args.batch_size} x {args.seq_len} "
               f"tokens, loss {args.loss}, reduced vocabulary {args.draft_vocab}, {args.medusa_heads} Medusa heads, "
               f"draft model of {args.draft_layers} layers; {args.dtype} on {device}, {torch.get_num_threads()} "
               f"threads; median of {args.steps} interleaved steps after {args.warmup} warm-up")
    report = Report()
    report.add(f"# Training cost per step\n\n{setting}")
    results = {"setting": setting, "rows": [], "seconds": {}}
    for vocab in args.vocabs:
        measured = measure_vocabulary(vocab, args, device, dtype, clock)
        rows = table_rows(vocab, measured, device)
        report.table(f"## Vocabulary {vocab:,}", rows)
        results["rows"].extend(rows)
        results["seconds"][vocab] = measured.seconds
    if args.out:
        report.write(args.out.with_suffix(".md"), results)
    return results


if __name__ == "__main__":
    main()
