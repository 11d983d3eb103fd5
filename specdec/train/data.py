"""Training data for drafters: what the target wrote (or fixed text, or the draft's own samples), written to disk
once as shards, and the target's hidden states over it, cached on disk or computed per batch.

- A ``Corpus`` is documents split once into training and held-out ones (``split_documents``, the same split that
  built the embedded pair: its registry corpus, split with seed 0 and 4% held out, gives back its held-out prompt
  set). Training data comes from training documents only; held-out prompts from held-out documents only.
- The ``data`` config group builds one of three specs (frozen dataclasses; their fields are the schema):
  ``TargetContinuations`` (the target's greedy or sampled continuations of document openings),
  ``DraftSamples`` (the draft's samples of the same openings, scored by the target: DistillSpec's on-policy data)
  and ``FixedText`` (windows of the documents themselves).
- ``write_sequences`` writes a spec's sequences as numbered shards under a directory named by a hash of the spec
  (but its size) and of the models' weights: a shard is written beside and renamed, so a kill loses at most the
  shard being written, and a later run (or a rerun after a kill, or a larger run) writes only the shards missing.
  Ranks of a data-parallel run write every world-th shard.
- ``write_hidden`` caches the target's hidden states at the layers a drafter reads (fp16 by default) the same way;
  ``choose_hidden`` says whether caching is cheaper than recomputing them per batch, and why.
- ``heldout_set``: held-out prompts (cut from held-out documents as the embedded pair's prompt set was) and the
  target's greedy continuations of them, the data simulated acceptance is measured on.
- ``Batches``: where the loop's batches come from, and the state a checkpoint keeps of them. ``StreamWindows`` and
  ``SampledRows`` are the embedded pair's (random windows of its text, random rows of the target's greedy
  continuations), drawn with one generator whose state is that; ``specdec.train.loop.SequenceBatches`` the
  drafters' (fixed sequences, an order the step alone decides).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from specdec.api import generate
from specdec.checkpoints import target_identity
from specdec.train.corpus import Corpus, check_corpus, heldout_prompts, read_corpus
from specdec.train.files import DamagedFile, load_tensors, save_tensors
from specdec.train.losses import TrainingBatch

HIDDEN_MODES = ("auto", "cache", "recompute")
DATA_FORMAT = 3  # in data directory names: 3, written by specdec's loop; 2, by transformers' generate; 1, EOS suppressed
SIZE_FIELDS = ("num_prompts", "num_sequences")  # not in data directory names: a larger run extends a smaller one


def check_fraction(heldout_fraction: object) -> None:
    if isinstance(heldout_fraction, bool) or not isinstance(heldout_fraction, (int, float)) \
            or not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be a number in (0, 1), got {heldout_fraction!r}")


def check_count(name: str, value: object, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

# Openings generated per batch. A shard is written in chunks of this many, each with the shard's seed plus its
# index (what ``continuations`` gives the batch itself), so the rows are the bits one call writes and the progress
# bar moves inside a shard.
GENERATION_BATCH = 64


@dataclass(frozen=True)
class Sequences:
    """Right-padded sequences: [N, W] tokens, [N, W] counts (position t's next token is trained on)."""

    tokens: torch.Tensor  # [N, W] long
    counts: torch.Tensor  # [N, W] bool

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """[N] each row's length: one past its last counted position's next token."""
        last = torch.where(self.counts.any(1), self.counts.shape[1] - 1 - self.counts.flip(1).int().argmax(1), -1)
        return last + 2


class DataSpec:
    """What a kind of training data is: a frozen dataclass whose fields are its schema (the ``data`` config group
    builds one), which draws its ``openings`` from a corpus and writes a shard of sequences from them."""

    writer: str | None = None  # which model writes the sequences ("target", "draft"), None: the text itself

    @property
    def width(self) -> int:
        """The sequences' padded length."""
        raise NotImplementedError

    def openings(self, corpus: Corpus, tokenizer) -> list[list[int]]:
        """The token ids each sequence starts from, in order (a larger run's first ones are a smaller run's)."""
        raise NotImplementedError

    def write_shard(self, models: dict[str, nn.Module], openings: list[list[int]], seed: int, pad_id: int
                    ) -> Sequences:
        """The sequences of ``openings``: ``models`` by role, ``seed`` the shard's, ``pad_id`` right-pads."""
        raise NotImplementedError

    def read_corpus(self) -> Corpus:
        """The documents the spec draws from (its ``corpus``), split into training and held-out ones."""
        return read_corpus(self.corpus, self.heldout_fraction)

    def heldout_texts(self, corpus: Corpus, tokenizer, first: int, count: int) -> list[str]:
        """Held-out prompts ``first`` .. ``first + count - 1``, which the target continues greedily to measure on."""
        return heldout_prompts(corpus, tokenizer, first, count)


@dataclass(frozen=True)
class TargetContinuations(DataSpec):
    """The target's continuations of the openings of ``num_prompts`` training documents, each cut to a random
    length in ``prompt_tokens`` and continued for exactly ``new_tokens`` tokens, through any EOS (the path the loop
    follows when EOS is ignored, as the held-out measurement runs), greedy at ``temperature`` 0, else sampled at it.
    Trained on the continuation."""

    corpus: str = "registry"
    num_prompts: int = 1024
    new_tokens: int = 96
    temperature: float = 0.0
    prompt_tokens: tuple[int, int] = (20, 60)
    heldout_fraction: float = 0.04
    shard_size: int = 128
    seed: int = 0

    writer = "target"  # which model writes the continuations

    def __post_init__(self) -> None:
        check_corpus(self.corpus)
        check_count("num_prompts", self.num_prompts)
        check_count("new_tokens", self.new_tokens)
        check_count("shard_size", self.shard_size)
        check_fraction(self.heldout_fraction)
        low, high = check_prompt_tokens(self.prompt_tokens)
        object.__setattr__(self, "prompt_tokens", (low, high))
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0 <= self.temperature < float("inf"):
            raise ValueError(f"temperature must be a number >= 0 (0 is greedy), got {self.temperature!r}")

    @property
    def width(self) -> int:
        return self.prompt_tokens[1] + self.new_tokens

    def openings(self, corpus: Corpus, tokenizer) -> list[list[int]]:
        """The first ``num_prompts`` training documents long enough, each cut to its drawn length."""
        rng = random.Random(self.seed)
        low, high = self.prompt_tokens
        openings = []
        for ids in tokenizer(corpus.train)["input_ids"]:
            if len(ids) >= high:
                openings.append(ids[:rng.randint(low, high)])
            if len(openings) == self.num_prompts:
                return openings
        raise ValueError(f"only {len(openings)} training documents have {high} tokens; num_prompts="
                         f"{self.num_prompts} wanted")

    def write_shard(self, models: dict[str, nn.Module], openings: list[list[int]], seed: int, pad_id: int) -> Sequences:
        """One shard: each opening continued by ``models[self.writer]``."""
        return continuations(models[self.writer], openings, self.new_tokens, self.temperature, self.width, seed,
                             pad_id)


@dataclass(frozen=True)
class DraftSamples(TargetContinuations):
    """DistillSpec's on-policy data: the draft's own samples (at ``temperature``, default 1) of the openings, which
    the target scores when its hidden states are read. Written once, by the draft the run starts from."""

    temperature: float = 1.0
    writer = "draft"


@dataclass(frozen=True)
class FixedText(DataSpec):
    """Windows of ``length`` tokens of the training documents (each document followed by EOS, as one stream),
    ``num_sequences`` of them at random offsets; trained at every position."""

    corpus: str = "registry"
    num_sequences: int = 1024
    length: int = 128
    heldout_fraction: float = 0.04
    shard_size: int = 128
    seed: int = 0

    writer = None

    def __post_init__(self) -> None:
        check_corpus(self.corpus)
        check_count("num_sequences", self.num_sequences)
        check_count("length", self.length, 2)
        check_count("shard_size", self.shard_size)
        check_fraction(self.heldout_fraction)

    @property
    def width(self) -> int:
        return self.length

    def openings(self, corpus: Corpus, tokenizer) -> list[list[int]]:
        stream = [token for ids in tokenizer(corpus.train)["input_ids"] for token in [*ids, tokenizer.eos_token_id]]
        if len(stream) <= self.length:
            raise ValueError(f"the training documents hold {len(stream)} tokens, fewer than length={self.length}")
        rng = random.Random(self.seed)
        starts = [rng.randrange(len(stream) - self.length + 1) for _ in range(self.num_sequences)]
        return [stream[start:start + self.length] for start in starts]

    def write_shard(self, models: dict[str, nn.Module], windows: list[list[int]], seed: int, pad_id: int) -> Sequences:
        tokens = torch.tensor(windows)  # [n, W]
        counts = torch.ones_like(tokens, dtype=torch.bool)
        counts[:, -1] = False  # the last token's next one is not in the window
        return Sequences(tokens, counts)


def check_prompt_tokens(prompt_tokens: object) -> tuple[int, int]:
    values = list(prompt_tokens) if isinstance(prompt_tokens, (list, tuple)) else None
    if values is None or len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values) \
            or not 1 <= values[0] <= values[1]:
        raise ValueError(f"prompt_tokens must be [low, high] with 1 <= low <= high, got {prompt_tokens!r}")
    return values[0], values[1]


@torch.no_grad()
def continuations(model: nn.Module, openings: list[list[int]], new_tokens: int, temperature: float, width: int,
                  seed: int, pad_id: int, batch_size: int = GENERATION_BATCH) -> Sequences:
    """Each opening continued by ``model`` for exactly ``new_tokens`` tokens, right-padded to ``width``; counts mark
    the positions whose next token is a continuation token. The continuations are specdec's own autoregressive loop
    (``specdec.generate`` without a draft) over left-padded batches of ``batch_size`` openings: exact per row (the
    ragged-batch greedy-equality tests), and EOS does not stop a row (an EOS the model chooses is kept and followed,
    as in the loop with EOS ignored). Sampling (temperature > 0, no top-k or top-p) draws from ``seed`` and the batch's
    index."""
    device = next(model.parameters()).device
    tokens = torch.full((len(openings), width), pad_id, dtype=torch.long)  # [n, W]
    counts = torch.zeros(len(openings), width, dtype=torch.bool)  # [n, W]
    for first in range(0, len(openings), batch_size):
        chunk = openings[first:first + batch_size]
        longest = max(map(len, chunk))
        prompts = torch.tensor([[pad_id] * (longest - len(ids)) + ids for ids in chunk], device=device)  # [b, L]
        mask = torch.tensor([[0] * (longest - len(ids)) + [1] * len(ids) for ids in chunk], device=device)  # [b, L]
        written = generate(model, prompts, attention_mask=mask, max_new_tokens=new_tokens, temperature=temperature,
                           eos_token_id=None, seed=seed + first // batch_size).tokens
        for row, (ids, new) in enumerate(zip(chunk, written)):
            tokens[first + row, :len(ids) + new_tokens] = torch.tensor(ids + new)
            counts[first + row, len(ids) - 1:len(ids) - 1 + new_tokens] = True
    return Sequences(tokens, counts)


# Shards on disk ----------------------------------------------------------------------------------------------------

def data_directory(root: Path, spec: DataSpec, corpus: Corpus, models: dict[str, nn.Module], tokenizer) -> Path:
    """Where ``spec``'s sequences live: named by the spec (but its size), by the content of the corpus's training
    documents (a corpus edited in place is read again) and by the weights of the models that write or score them,
    so that a change of any writes new data and the same ones reuse it. The size is left out:
    openings are drawn in order, so a larger run's first shards are a smaller run's (``missing_shards``)."""
    fields = {name: value for name, value in asdict(spec).items() if name not in SIZE_FIELDS}
    key = {"spec": {"kind": type(spec).__name__, **fields}, "corpus": corpus.digest, "vocabulary": len(tokenizer),
           "format": DATA_FORMAT,
           "models": {role: asdict(target_identity(model)) for role, model in sorted(models.items())}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / f"{type(spec).__name__.lower()}-{digest}"


def shard_names(rows: int, shard_size: int) -> list[str]:
    """The files of ``rows`` rows in shards of ``shard_size``: a full shard is named by its index alone (any run
    whose data covers it shares it); a last, shorter one also by its row count (it belongs to runs of this size)."""
    names = []
    for index in range(-(-rows // shard_size)):
        held = min(shard_size, rows - index * shard_size)
        names.append(f"shard-{index:05d}.safetensors" if held == shard_size else
                     f"shard-{index:05d}-{held}.safetensors")
    return names


def missing_shards(directory: Path, rows: int, shard_size: int) -> list[int]:
    return [index for index, name in enumerate(shard_names(rows, shard_size)) if not (directory / name).is_file()]


def write_sequences(directory: Path, spec: DataSpec, openings: list[list[int]], tokenizer,
                    models: dict[str, nn.Module], rank: int = 0, world: int = 1,
                    progress: Callable[[int, int], None] | None = None) -> None:
    """Write the shards of ``spec`` (over its ``openings``) this rank owns (every ``world``-th) that are not on disk
    yet, a chunk of ``GENERATION_BATCH`` openings at a time. ``progress(done, total)`` in sequences, after each
    chunk."""
    directory.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        fields = {name: value for name, value in asdict(spec).items() if name not in SIZE_FIELDS}
        manifest = {"spec": {"kind": type(spec).__name__, **fields}, "width": spec.width, "format": DATA_FORMAT}
        (directory / "data.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    names = shard_names(len(openings), spec.shard_size)
    missing = [index for index in missing_shards(directory, len(openings), spec.shard_size) if index % world == rank]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    total = sum(len(openings[index * spec.shard_size:(index + 1) * spec.shard_size]) for index in missing)
    done = 0
    if progress is not None:
        progress(done, total)  # the total, before the first chunk
    for index in missing:
        first = index * spec.shard_size
        rows, parts = openings[first:first + spec.shard_size], []
        for start in range(0, len(rows), GENERATION_BATCH):
            chunk = rows[start:start + GENERATION_BATCH]
            parts.append(spec.write_shard(models, chunk, spec.seed * 1_000_003 + index + start // GENERATION_BATCH,
                                          pad_id or 0))
            done += len(chunk)
            if progress is not None:
                progress(done, total)
        shard = Sequences(torch.cat([part.tokens for part in parts]), torch.cat([part.counts for part in parts]))
        save_tensors({"tokens": shard.tokens.int(), "counts": shard.counts.to(torch.uint8)}, directory / names[index])


def read_sequences(directory: Path, rows: int, shard_size: int, width: int, vocabulary: int) -> Sequences:
    """The ``rows`` sequences of [``width``] tokens below ``vocabulary``; a damaged shard is named."""
    tokens, counts = [], []
    for index, name in enumerate(shard_names(rows, shard_size)):
        held = min(shard_size, rows - index * shard_size)
        shard = load_tensors(directory / name, {"tokens": (held, width), "counts": (held, width)},
                             "delete it and run again: it is written again", {"tokens": vocabulary, "counts": 2})
        tokens.append(shard["tokens"])
        counts.append(shard["counts"])
    return Sequences(torch.cat(tokens).long(), torch.cat(counts).bool())


# The target's hidden states ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HiddenPlan:
    """Whether the target's hidden states are cached on disk or computed per batch, and why (one line)."""

    cache: bool
    reason: str


def choose_hidden(mode: str, sequences: int, width: int, layers: int, hidden_size: int, reads: float,
                  limit_gb: float, bytes_per_value: int = 2) -> HiddenPlan:
    """Caching costs one target forward per sequence and ``layers * hidden_size`` values a token on disk;
    recomputing costs one target forward per sequence read. ``reads``: how many times training reads each
    sequence (steps * batch_size / sequences)."""
    size_gb = sequences * width * layers * hidden_size * bytes_per_value / 1e9
    if mode == "cache":
        return HiddenPlan(True, f"cached on disk ({size_gb:.2f} GB): data.hidden=cache")
    if mode == "recompute":
        return HiddenPlan(False, f"computed per batch: data.hidden=recompute (each sequence read {reads:.1f} times)")
    if reads <= 1:
        return HiddenPlan(False, f"computed per batch: each sequence is read {reads:.2f} times, so a cache would "
                                 f"cost the same target forwards and {size_gb:.2f} GB of disk")
    if size_gb > limit_gb:
        return HiddenPlan(False, f"computed per batch: the cache would take {size_gb:.2f} GB, over "
                                 f"cache_limit_gb={limit_gb}")
    return HiddenPlan(True, f"cached on disk ({size_gb:.2f} GB): each sequence is read {reads:.1f} times, so one "
                            f"target forward per sequence instead of {reads:.1f}")


@torch.no_grad()
def target_hidden(target: nn.Module, tokens: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """[B, T] tokens -> [B, T, H, D] the target's hidden states at ``layers`` (transformers' numbering)."""
    states = target(tokens, output_hidden_states=True).hidden_states
    return torch.stack([states[layer] for layer in layers], 2)


def hidden_directory(directory: Path, layers: tuple[int, ...], dtype: torch.dtype) -> Path:
    return directory / f"hidden-{'-'.join(map(str, layers))}-{str(dtype).removeprefix('torch.')}"


def write_hidden(directory: Path, sequences: Sequences, shard_size: int, target: nn.Module, layers: tuple[int, ...],
                 dtype: torch.dtype, rank: int = 0, world: int = 1, batch_size: int = 16,
                 progress: Callable[[int, int], None] | None = None) -> None:
    """Cache the target's hidden states at ``layers`` over ``sequences``, one file per sequence shard (this rank's
    missing ones), in ``dtype``."""
    directory.mkdir(parents=True, exist_ok=True)
    device = next(target.parameters()).device
    missing = [index for index in missing_shards(directory, len(sequences), shard_size) if index % world == rank]
    for done, index in enumerate(missing, 1):
        rows = range(index * shard_size, min((index + 1) * shard_size, len(sequences)))
        parts = [target_hidden(target, sequences.tokens[first:min(first + batch_size, rows.stop)].to(device),
                               layers).to(dtype).cpu()  # a shard smaller than a batch holds its own rows alone
                 for first in range(rows.start, rows.stop, batch_size)]
        save_tensors({"hidden": torch.cat(parts)}, directory / shard_names(len(sequences), shard_size)[index])
        if progress is not None:
            progress(done, len(missing))


def read_hidden(directory: Path, sequences: Sequences, shard_size: int, layers: int, hidden_size: int
                ) -> torch.Tensor:
    """[N, W, H, D] the cached states of the sequences, in memory; a damaged cache file is named."""
    rows, width = sequences.tokens.shape
    parts = []
    for index, name in enumerate(shard_names(rows, shard_size)):
        held = min(shard_size, rows - index * shard_size)
        cached = load_tensors(directory / name, {"hidden": (held, width, layers, hidden_size)},
                              "delete it and run again: it is written again")["hidden"]
        if not bool(torch.isfinite(cached).all()):
            raise DamagedFile(f"{directory / name} holds non-finite hidden states: delete it and run again (with "
                              f"cache_dtype=float32 if the target's states overflow float16)")
        parts.append(cached)
    return torch.cat(parts)


# Held-out data -----------------------------------------------------------------------------------------------------

def heldout_set(directory: Path, prompts: list[str], tokenizer, target: nn.Module, new_tokens: int) -> Sequences:
    """The held-out ``prompts`` and the target's greedy continuations of them (``new_tokens`` each, through EOS),
    written once under ``directory`` (named by the target and the prompts)."""
    key = json.dumps({"target": asdict(target_identity(target)), "vocabulary": len(tokenizer), "prompts": prompts,
                      "new_tokens": new_tokens, "format": DATA_FORMAT}, sort_keys=True)
    path = directory / f"heldout-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"
    if path.is_file():
        saved = load_tensors(path, {"tokens": (len(prompts), None), "counts": (len(prompts), None)},
                             "delete it and run again: it is written again",
                             {"tokens": len(tokenizer), "counts": 2})
        return Sequences(saved["tokens"].long(), saved["counts"].bool())
    directory.mkdir(parents=True, exist_ok=True)
    openings = [tokenizer(text)["input_ids"] for text in prompts]
    width = max(map(len, openings)) + new_tokens
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sequences = continuations(target, openings, new_tokens, 0.0, width, 0, pad_id or 0)
    save_tensors({"tokens": sequences.tokens.int(), "counts": sequences.counts.to(torch.uint8)}, path)
    return sequences


# Batches -----------------------------------------------------------------------------------------------------------

class Batches(Protocol):
    """Where the loop's batches come from: ``draw(step)`` is step ``step``'s batch (this rank's share), and
    ``state()`` what a checkpoint keeps so that a resumed run draws the batches an uninterrupted one would
    (``restore(state)`` puts it back)."""

    def draw(self, step: int) -> TrainingBatch: ...

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...


class DrawnBatches(Batches):
    """Batches drawn with one generator seeded once, the embedded pair's data order; the generator's state is what a
    checkpoint keeps. ``rows(generator)`` draws [B, T+1] tokens and the [B, T] positions whose next token is
    trained on."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self, step: int) -> TrainingBatch:
        tokens, trained = self.rows(self.generator)  # [B, T+1], [B, T]
        counts = torch.cat([trained, torch.zeros_like(trained[:, :1])], 1)  # [B, T+1]: the last token has no label
        return TrainingBatch(tokens, None, counts)

    def rows(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def restore(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class StreamWindows(DrawnBatches):
    """Random windows of ``seq_len`` + 1 tokens of a token stream; every position is trained (the pair's text)."""

    def __init__(self, stream: torch.Tensor, batch_size: int, seq_len: int, seed: int):
        super().__init__(seed)
        self.stream, self.batch_size, self.seq_len = stream, batch_size, seq_len

    def rows(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.stream) - self.seq_len - 1, (self.batch_size,), generator=generator)
        batch = torch.stack([self.stream[s:s + self.seq_len + 1] for s in starts.tolist()])  # [B, T+1]
        return batch, torch.ones_like(batch[:, 1:], dtype=torch.bool)


class SampledRows(DrawnBatches):
    """Random rows, drawn with replacement, of fixed sequences [N, T+1] and the [N, T] positions trained (the pair's
    greedy continuations). ``make()`` gives them on the first draw: a finished stage draws none, so its costly
    data is never made."""

    def __init__(self, make: Callable[[], tuple[torch.Tensor, torch.Tensor]], batch_size: int, seed: int):
        super().__init__(seed)
        self.make, self.batch_size = make, batch_size
        self.made: tuple[torch.Tensor, torch.Tensor] | None = None

    def rows(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self.made is None:
            self.made = self.make()
        sequences, trained = self.made
        picked = torch.randint(0, len(sequences), (self.batch_size,), generator=generator)  # [B]
        return sequences[picked], trained[picked]
