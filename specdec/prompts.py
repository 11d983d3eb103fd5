"""Prompt sets: shipped ones by name, or local .jsonl / .txt files; a task suite is several sets as one
(``load_suite``), each prompt keeping its ``category`` (MT-bench's eight, ``humaneval``, ``prose``), so that results
can be read per category, as Spec-Bench's are. The shipped sets and their licences: specdec/prompts/README.md.

A prompt's identity is its ``hash``: a short hex digest of its text and its source's name. Results are keyed by
it (the ``prompt_hash`` column), so editing a prompt file (a line inserted, a text changed) can never pair a row
with another prompt's text. ``id`` is the name the set gives a prompt, or its hash where the set gives none.
"""
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
HASH_DIGITS = 12  # 48 bits: no two of a million prompts share one with probability > 0.998


def content_hash(source: str, text: str) -> str:
    """The identity of ``text`` read from ``source`` (a set's name or a file's name): short lowercase hex."""
    return hashlib.sha256(f"{source}\0{text}".encode("utf-8")).hexdigest()[:HASH_DIGITS]


@dataclass(frozen=True)
class Prompt:
    id: str  # the set's name for it, or its hash where the set gives none
    text: str
    source: str = ""  # the set's name, or the prompt file's name (not its directory: moving a file keeps ids)
    category: str | None = None  # the set's category for it (e.g. MT-bench's "writing"), None where it gives none

    @property
    def hash(self) -> str:
        return content_hash(self.source, self.text)


def shipped_sets() -> list[str]:
    """Names of the prompt sets shipped in specdec/prompts/."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))


def load_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """Load a shipped set by name, or a local .jsonl (objects with `text`, optional `id` and `category`) or .txt
    (one per line). Every text of a set must be distinct: a prompt is known by its text."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    path = resolve_source(source)
    name = source if source in shipped_sets() else path.name
    numbered = read_jsonl(path, name) if path.suffix == ".jsonl" else read_txt(path, name)
    check_distinct(path, numbered)
    prompts = [prompt for _, prompt in numbered]
    return prompts if limit is None else prompts[:limit]


def resolve_source(source: str) -> Path:
    """A shipped set name becomes its file; anything else must be an existing .jsonl or .txt path."""
    if source in shipped_sets():
        return PROMPTS_DIR / f"{source}.jsonl"
    path = Path(source)
    if path.suffix not in (".jsonl", ".txt"):
        raise ValueError(f"unknown prompt source {source!r}: expected a shipped set {shipped_sets()} "
                         "or a path to a .jsonl or .txt file")
    if path.is_dir():
        raise IsADirectoryError(f"prompt file {source!r} is a directory; name a .jsonl or .txt file in it")
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {source!r} not found (shipped sets: {shipped_sets()})")
    return path


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None


def read_jsonl(path: Path, source: str) -> list[tuple[int, Prompt]]:
    """(line number, prompt) for each JSON object of a non-empty line; an absent id becomes the prompt's hash."""
    numbered = []
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{path}:{lineno}: expected an object with a string 'text' field")
        if not record["text"].strip():
            raise ValueError(f"{path}:{lineno}: empty 'text': a prompt needs at least one token")
        given = record.get("id")
        if "id" in record and (isinstance(given, bool) or not isinstance(given, (str, int)) or given == ""):
            raise ValueError(f"{path}:{lineno}: 'id' must be a non-empty string or an integer, got {given!r}")
        category = record.get("category")
        if category is not None and (not isinstance(category, str) or not category.strip()):
            raise ValueError(f"{path}:{lineno}: 'category' must be a non-empty string, got {category!r}")
        text = record["text"]
        numbered.append((lineno, Prompt(str(given) if "id" in record else content_hash(source, text), text, source,
                                        category)))
    return numbered


def read_txt(path: Path, source: str) -> list[tuple[int, Prompt]]:
    """(line number, prompt) for each non-empty line, surrounding whitespace stripped; its id is its hash."""
    numbered = []
    for lineno, line in enumerate(read_lines(path), start=1):
        text = line.strip()
        if text:
            numbered.append((lineno, Prompt(content_hash(source, text), text, source)))
    return numbered


def check_distinct(path: Path, numbered: list[tuple[int, Prompt]]) -> None:
    """Two prompts with one text would share one identity: refuse the set, naming both lines."""
    first_line: dict[str, int] = {}
    for lineno, prompt in numbered:
        earlier = first_line.setdefault(prompt.text, lineno)
        if earlier != lineno:
            raise ValueError(f"{path}:{lineno}: the same text as line {earlier}; every prompt of a set must be "
                             "distinct (results are keyed by the text)")


def load_suite(name: str, sets: list[str], categories: dict[str, str] | None = None, per_set: int | None = None,
               limit: int | None = None, per_category: int | None = None) -> list[Prompt]:
    """A task suite called ``name``: the prompt ``sets`` (names or files, as ``load_prompts`` takes them) one after
    the other, the first ``per_set`` of each (None: all), then the first ``per_category`` of each category, in
    suite order (None: all; prompts without a category count as one), then the first ``limit`` of the whole
    (None: all). A prompt whose set gives it no category takes ``categories[set]`` (e.g.
    {"embedded_heldout": "prose"})."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string naming the suite, got {name!r}")
    if isinstance(sets, str) or not isinstance(sets, Sequence) or not sets:
        raise ValueError(f"sets must be a non-empty list of prompt sets, got {sets!r}")
    for option, value in (("per_set", per_set), ("per_category", per_category)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{option} must be an integer >= 1 or None, got {value!r}")
    categories = dict(categories or {})
    unknown = sorted(set(categories) - set(sets))
    if unknown:
        raise ValueError(f"categories names {unknown[0]!r}, which is not one of the sets {list(sets)}")
    prompts = [prompt if prompt.category is not None or source not in categories
               else replace(prompt, category=categories[source])
               for source in sets for prompt in load_prompts(source, per_set)]
    if per_category is not None:
        prompts = first_of_each_category(prompts, per_category)
    return prompts if limit is None else prompts[:limit]


def first_of_each_category(prompts: list[Prompt], n: int) -> list[Prompt]:
    """The first ``n`` prompts of each category (prompts without one count as one category), in their order."""
    taken: dict[str | None, int] = {}
    kept = []
    for prompt in prompts:
        if taken.get(prompt.category, 0) < n:
            taken[prompt.category] = taken.get(prompt.category, 0) + 1
            kept.append(prompt)
    return kept
