"""Training data of one's own: conversations the target answers in its chat template, and continuations already
written elsewhere.

- ``ChatConversations`` (``data=chat``): a ``.jsonl`` of conversations, one ``{"messages": [{"role", "content"},
  ...]}`` per line (the OpenAI / ShareGPT-converted form SpecForge and EAGLE regenerate from). Each conversation up
  to its last user turn is formatted with the target tokenizer's own chat template (``apply_chat_template`` with
  the generation prompt), and the target writes the assistant's reply, ``new_tokens`` of it: what an instruct
  target meets when it serves. Earlier assistant turns in the file stay as the conversation's history; a trailing
  one is dropped (the target writes its own). The held-out prompts are held-out conversations formatted the same
  way. ``corpus: chat`` is the 48 short prompts shipped in ``specdec/prompts/conversations/chat.jsonl`` (written
  for specdec, MIT like the project).
- ``Continuations`` (``data=continuations``): prompts and completions already generated (by the target elsewhere, a
  serving engine's logs, a data set), as texts (``{"prompt", "completion"}``) or token ids (``{"prompt_ids",
  "completion_ids"}``), one per line; trained on the completion. No model writes anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specdec.train.corpus import Corpus, split_documents
from specdec.train.data import DataSpec, Sequences, TargetContinuations, check_count, check_fraction

CONVERSATIONS_DIR = Path(__file__).resolve().parents[1] / "prompts" / "conversations"
ROLES = ("system", "user", "assistant")


def read_conversations(path: Path) -> list[list[dict]]:
    """Each line's ``messages``, checked: a list of {"role": system|user|assistant, "content": text} holding a
    user turn. A bad line is refused naming it."""
    conversations = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{number} is not a JSON object with \"messages\"") from None
        well_formed = isinstance(messages, list) and all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages)
        if not well_formed or not any(m["role"] == "user" for m in messages):
            raise ValueError(f"{path}:{number}: messages must be a list of {{\"role\": {'|'.join(ROLES)}, "
                             f"\"content\": text}} holding a user turn")
        conversations.append(messages)
    return conversations


def chat_prompt(tokenizer, messages: list[dict]) -> str:
    """The conversation up to its last user turn in the tokenizer's chat template, ending with the prompt that
    opens the assistant's reply."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("data=chat formats conversations with the target tokenizer's chat template, and this "
                         "tokenizer has none (a base model's): use data=greedy or data=continuations")
    last_user = max(index for index, message in enumerate(messages) if message["role"] == "user")
    return tokenizer.apply_chat_template(messages[:last_user + 1], add_generation_prompt=True, tokenize=False)


def encode(tokenizer, text: str) -> list[int]:
    """A formatted prompt's ids: the template writes its own special tokens (a BOS among them, where it has one)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class ChatConversations(TargetContinuations):
    """The target's replies to ``num_prompts`` training conversations of ``corpus`` (see the module docstring),
    ``new_tokens`` each through any EOS, greedy at ``temperature`` 0; conversations whose formatted prompt is
    outside ``prompt_tokens`` tokens are skipped. Trained on the reply."""

    corpus: str = "chat"
    num_prompts: int = 40
    new_tokens: int = 64
    temperature: float = 0.0
    prompt_tokens: tuple[int, int] = (1, 192)
    heldout_fraction: float = 0.1
    shard_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        path = CONVERSATIONS_DIR / f"{self.corpus}.jsonl" if (CONVERSATIONS_DIR / f"{self.corpus}.jsonl").is_file() \
            else Path(str(self.corpus))
        shipped = sorted(p.stem for p in CONVERSATIONS_DIR.glob("*.jsonl"))
        if path.suffix != ".jsonl" or not path.is_file():
            raise ValueError(f"corpus must be a shipped conversation set ({', '.join(shipped)}) or an existing "
                             f".jsonl file of {{\"messages\": [...]}} lines, got {self.corpus!r}")
        object.__setattr__(self, "corpus", str(path))
        super().__post_init__()

    def read_corpus(self) -> Corpus:
        documents = [json.dumps(messages, sort_keys=True) for messages in read_conversations(Path(self.corpus))]
        return Corpus(*split_documents(documents, self.heldout_fraction, self.seed))

    def openings(self, corpus: Corpus, tokenizer) -> list[list[int]]:
        low, high = self.prompt_tokens
        prompts = [encode(tokenizer, chat_prompt(tokenizer, json.loads(document))) for document in corpus.train]
        openings = [ids for ids in prompts if low <= len(ids) <= high][:self.num_prompts]
        if len(openings) < self.num_prompts:
            raise ValueError(f"only {len(openings)} training conversations of {self.corpus} format to "
                             f"{low}..{high} tokens; num_prompts={self.num_prompts} wanted")
        return openings

    def heldout_texts(self, corpus: Corpus, tokenizer, first: int, count: int) -> list[str]:
        held = corpus.heldout[first:first + count]
        if len(held) < count:
            raise ValueError(f"{self.corpus} holds {len(corpus.heldout)} held-out conversations "
                             f"(heldout_fraction={self.heldout_fraction}); heldout.first={first} and "
                             f"heldout.count={count} need {first + count}")
        return [chat_prompt(tokenizer, json.loads(document)) for document in held]


@dataclass(frozen=True)
class Continuations(DataSpec):
    """``num_sequences`` prompt/completion records of ``source`` (see the module docstring), each cut to
    ``length`` tokens; trained on the completion's tokens. Each opening carries its prompt's length first."""

    source: str = ""
    num_sequences: int = 256
    length: int = 256
    heldout_fraction: float = 0.05
    shard_size: int = 64
    seed: int = 0

    writer = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or Path(self.source).suffix != ".jsonl" or not Path(self.source).is_file():
            raise ValueError(f"source must be an existing .jsonl file of {{\"prompt\", \"completion\"}} or "
                             f"{{\"prompt_ids\", \"completion_ids\"}} lines, got {self.source!r}")
        check_count("num_sequences", self.num_sequences)
        check_count("length", self.length, 2)
        check_count("shard_size", self.shard_size)
        check_fraction(self.heldout_fraction)

    @property
    def corpus(self) -> str:
        return self.source

    @property
    def width(self) -> int:
        return self.length

    def read_corpus(self) -> Corpus:
        lines = [line for line in Path(self.source).read_text(encoding="utf-8").splitlines() if line.strip()]
        for number, line in enumerate(lines, 1):
            record = json.loads(line) if line.lstrip().startswith("{") else None
            if not isinstance(record, dict) or not ({"prompt", "completion"} <= set(record)
                                                    or {"prompt_ids", "completion_ids"} <= set(record)):
                raise ValueError(f"{self.source}:{number} holds neither \"prompt\" and \"completion\" nor "
                                 f"\"prompt_ids\" and \"completion_ids\"")
        return Corpus(*split_documents(lines, self.heldout_fraction, self.seed))

    def ids(self, record: dict, tokenizer) -> tuple[list[int], list[int]]:
        if "prompt_ids" in record:
            return list(record["prompt_ids"]), list(record["completion_ids"])
        return tokenizer(record["prompt"])["input_ids"], encode(tokenizer, record["completion"])

    def openings(self, corpus: Corpus, tokenizer) -> list[list[int]]:
        openings = []
        for document in corpus.train:
            prompt, completion = self.ids(json.loads(document), tokenizer)
            if prompt and completion and len(prompt) < self.length:
                openings.append([len(prompt), *(prompt + completion)[:self.length]])
        if len(openings) < self.num_sequences:
            raise ValueError(f"only {len(openings)} training records of {self.source} have a prompt shorter than "
                             f"length={self.length} and a completion; num_sequences={self.num_sequences} wanted")
        vocabulary = len(tokenizer)
        outside = [token for opening in openings for token in opening[1:] if not 0 <= token < vocabulary]
        if outside:
            raise ValueError(f"{self.source}: token id {outside[0]} is outside the tokenizer's {vocabulary} ids")
        return openings[:self.num_sequences]

    def heldout_texts(self, corpus: Corpus, tokenizer, first: int, count: int) -> list[str]:
        held = corpus.heldout[first:first + count]
        if len(held) < count:
            raise ValueError(f"{self.source} holds {len(corpus.heldout)} held-out records; heldout.first={first} "
                             f"and heldout.count={count} need {first + count}")
        texts = []
        for document in held:
            record = json.loads(document)
            texts.append(record["prompt"] if "prompt" in record
                         else tokenizer.decode(record["prompt_ids"], skip_special_tokens=False))
        return texts

    def write_shard(self, models: dict[str, nn.Module], openings: list[list[int]], seed: int, pad_id: int
                    ) -> Sequences:
        tokens = torch.full((len(openings), self.length), pad_id, dtype=torch.long)  # [n, W]
        counts = torch.zeros(len(openings), self.length, dtype=torch.bool)  # [n, W]
        for row, (prompt_length, *ids) in enumerate(openings):
            tokens[row, :len(ids)] = torch.tensor(ids)
            counts[row, prompt_length - 1:len(ids) - 1] = True  # position t is trained on token t + 1
        return Sequences(tokens, counts)
