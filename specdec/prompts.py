"""Prompt sets: shipped ones by name, or local .jsonl / .txt files."""
import json
from dataclasses import dataclass
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def shipped_sets() -> list[str]:
    """Names of the prompt sets shipped in specdec/prompts/."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))


def load_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """Load a shipped set by name, or a local .jsonl (objects with `text`, optional `id`) or .txt (one per line)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    path = resolve_source(source)
    prompts = read_jsonl(path) if path.suffix == ".jsonl" else read_txt(path)
    return prompts if limit is None else prompts[:limit]


def resolve_source(source: str) -> Path:
    """A shipped set name becomes its file; anything else must be an existing .jsonl or .txt path."""
    if source in shipped_sets():
        return PROMPTS_DIR / f"{source}.jsonl"
    path = Path(source)
    if path.suffix not in (".jsonl", ".txt"):
        raise ValueError(f"unknown prompt source {source!r}: expected a shipped set {shipped_sets()} "
                         "or a path to a .jsonl or .txt file")
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {source!r} not found (shipped sets: {shipped_sets()})")
    return path


def read_jsonl(path: Path) -> list[Prompt]:
    """One JSON object per non-empty line; ids default to `<file stem>-<line index>`."""
    prompts = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
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
        prompts.append(Prompt(id=str(record.get("id", f"{path.stem}-{len(prompts):03d}")), text=record["text"]))
    return prompts


def read_txt(path: Path) -> list[Prompt]:
    """One prompt per non-empty line, surrounding whitespace stripped."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [Prompt(id=f"{path.stem}-{i:03d}", text=line) for i, line in enumerate(filter(None, lines))]
