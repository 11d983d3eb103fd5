"""Making a run directory whole before a resumed run appends to it (``recover``), and which prompts it has left
(``prompts_left``): rows that decoded another prompt set or disagree with themselves are set aside, files that
cannot be read are moved aside (what it guarantees: docs/run-directories.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from experiments.common.config_checks import ConfigError
from experiments.common.rundir import identity_difference, move_aside, open_fd, write_all, write_atomic, writing
from specdec.results import (
    CONFIG,
    FAILURE,
    INCONSISTENT,
    ROWS,
    SET_ASIDE,
    STALE,
    SUMMARY,
    Piece,
    describe_pieces,
    dump,
    read_config,
    read_failure,
    read_rows_file,
    read_summary,
    round_of,
)


@dataclass(frozen=True)
class Recovery:
    """What ``recover`` found: the rows kept (one per prompt of the set), the pieces it set aside, and the damaged
    files it moved aside, each as 'name (why) -> new name'."""

    rows: list[dict]
    set_aside: list[Piece]
    moved: list[str]

    def report(self, note: str, left: int) -> str:
        """One line: 'continuing <dir>: 2 row(s) kept, 3 set aside in rows.set-aside.jsonl (...), 2 prompt(s)
        left'."""
        parts = [f"{note}: {len(self.rows)} row(s) kept"]
        if self.set_aside:
            parts.append(f"{len(self.set_aside)} set aside in {SET_ASIDE} ({describe_pieces(self.set_aside)})")
        parts += [f"moved aside: {moved}" for moved in self.moved]
        return ", ".join([*parts, f"{left} prompt(s) left"])


def recover(run_dir: Path, prompts: list, columns: dict) -> Recovery:
    """Before rows are appended: keep one row per prompt of ``prompts``, move aside files that cannot be read,
    append every other piece of rows.jsonl to rows.set-aside.jsonl, then rewrite rows.jsonl as the rows kept, one
    per line. The pieces reach the side file before rows.jsonl is replaced (atomically), so a kill at any point
    leaves each row in one of the two. Kept rows of another setting (``columns``) end the run in one line, before
    anything is moved."""
    found = read_rows_file(run_dir)
    hashes, ids = {prompt.hash for prompt in prompts}, {str(prompt.id) for prompt in prompts}
    id_of_hash = {prompt.hash: str(prompt.id) for prompt in prompts}
    rows, stale, inconsistent = [], [], []
    for row in found.rows:
        if not decodes_one_of(row, hashes, ids):
            stale.append(row)
        else:
            (inconsistent if disagreement(row, id_of_hash) else rows).append(row)
    difference = identity_difference(rows, columns)
    if difference:
        raise ConfigError(f"run directory {run_dir} holds rows of another setting ({difference}); use a new "
                          "hydra.run.dir or resume with the same settings")
    moved = move_damaged_files(run_dir)
    pieces = (found.set_aside + [Piece(0, dump(row), STALE) for row in stale]
              + [Piece(0, dump(row), INCONSISTENT) for row in inconsistent])
    path = run_dir / ROWS
    if pieces:
        with writing(run_dir / SET_ASIDE, run_dir):
            append_pieces(run_dir / SET_ASIDE, pieces)
    clean = b"".join(dump(row) + b"\n" for row in rows)
    if path.exists() and path.read_bytes() != clean:
        with writing(path, run_dir):
            write_atomic(path, clean)
    return Recovery(rows, pieces, moved)


def disagreement(row: dict, id_of_hash: dict[str, str]) -> str | None:
    """What makes a row read back on resume disagree with itself or with its prompt (a hand edit, a tampered
    file), or None: its token lists against their counts and against ``identical_output``, and its ``prompt_id``
    against the id the prompt set gives its ``prompt_hash``. Columns a row lacks (older rows) are not compared."""
    for tokens, count in (("tokens", "emitted"), ("baseline_tokens", "baseline_emitted")):
        if tokens in row or count in row:
            listed = row.get(tokens)
            if not isinstance(listed, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in listed):
                return f"{tokens} is not a list of token ids"
            if row.get(count) != len(listed):
                return f"{count}={row.get(count)!r} but {tokens} holds {len(listed)}"
    identical = row.get("identical_output")
    if identical is not None and "tokens" in row and identical != (row["tokens"] == row.get("baseline_tokens")):
        return f"identical_output={identical!r} disagrees with tokens and baseline_tokens"
    if has_hash(row) and row["prompt_hash"] in id_of_hash and row["prompt_id"] != id_of_hash[row["prompt_hash"]]:
        return f"prompt_id={row['prompt_id']!r} but its prompt_hash is prompt {id_of_hash[row['prompt_hash']]!r}'s"
    return None


def has_hash(row: dict) -> bool:
    """Rows written before rows carried a prompt_hash are known by their prompt_id alone."""
    return isinstance(row.get("prompt_hash"), str) and bool(row["prompt_hash"])


def decodes_one_of(row: dict, hashes: set[str], ids: set[str]) -> bool:
    """Whether a row decoded a prompt with one of these hashes (a row without a hash: one of these ids)."""
    return row["prompt_hash"] in hashes if has_hash(row) else row["prompt_id"] in ids


def prompts_left(prompts: list, rows: list[dict], round_number: int = 0) -> list:
    """The prompts that no row of round ``round_number`` decoded yet, in their order (a row without a round is of
    round 0)."""
    rows = [row for row in rows if round_of(row) == round_number]
    hashes = {row["prompt_hash"] for row in rows if has_hash(row)}
    ids = {row["prompt_id"] for row in rows if not has_hash(row)}
    return [prompt for prompt in prompts if prompt.hash not in hashes and str(prompt.id) not in ids]


def append_pieces(path: Path, pieces: list[Piece]) -> None:
    fd = open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        write_all(fd, b"".join(piece.raw + b"\n" for piece in pieces))
        os.fsync(fd)
    finally:
        os.close(fd)


def move_damaged_files(run_dir: Path) -> list[str]:
    """Move aside, whole, each file of the directory that cannot be read as what it should be: a config.yaml,
    summary.json or failure.json that is empty, binary or not parseable, and a rows.jsonl or rows.set-aside.jsonl
    that is not a file. They are rewritten as the run goes on."""
    problems = {
        CONFIG: read_config(run_dir).problem,
        SUMMARY: read_summary(run_dir).problem,
        FAILURE: read_failure(run_dir).problem,
        ROWS: read_rows_file(run_dir).problem,
        SET_ASIDE: "not a file" if (run_dir / SET_ASIDE).exists() and not (run_dir / SET_ASIDE).is_file() else None,
    }
    moved = []
    for name, problem in problems.items():
        if problem is not None:
            with writing(run_dir / name, run_dir):
                target = move_aside(run_dir / name)
            moved.append(f"{name} ({problem.removeprefix(str(run_dir / name)).strip()}) -> {target.name}")
    return moved
