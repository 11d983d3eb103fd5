"""The README is a guide: its first code block is the set-up and the tests (the command CI runs), it stays within
250 lines, every relative link in it and in docs/ leads somewhere (a file, and the heading an anchor names), and
every page of docs/ can be reached from it by following links."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
TEST_COMMAND = "python -m pytest"
MAIN_JOB = "python -m experiments.run"
# Pages the README links that another branch of the current pass writes; a missing one is tolerated until it lands,
# a present one is checked like any other page.
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def outside_fences(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def code_blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of a Markdown text, each as its lines."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not hyphens), spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives the headings of ``page`` (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in outside_fences(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def links(page: Path) -> list[str]:
    """The link targets of a Markdown page; a link inside code is text."""
    return [target for line in outside_fences(page.read_text(encoding="utf-8"))
            for target in LINK.findall(INLINE_CODE.sub("", line))]


def is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file or heading does not exist, as 'target (why)'."""
    broken = []
    for target in links(page):
        if is_external(target):
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target} (no such file)")
            continue
        if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


def test_the_first_code_block_is_the_main_job_and_the_tests():
    first = [line.split(" #")[0].strip() for line in code_blocks(README.read_text(encoding="utf-8"))[0]]
    commands = [line for line in first if line]
    assert len(commands) == 2, f"the README's first code block must hold two commands, found {commands}"
    set_up, tests = commands
    assert set_up.split("&&")[-1].strip() == MAIN_JOB, f"the first command must end running {MAIN_JOB}: {set_up}"
    assert set_up.startswith("pip install"), f"the first command must install the project first: {set_up}"
    assert tests == TEST_COMMAND


def test_ci_runs_exactly_the_readmes_test_command():
    ci_lines = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert TEST_COMMAND in ci_lines


def test_the_readme_is_at_most_250_lines():
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_README_LINES, f"README.md has {count} lines; the guide keeps to {MAX_README_LINES}"


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_every_docs_page_is_reachable_from_the_readme():
    reached, frontier = set(), [README]
    while frontier:
        page = frontier.pop()
        for target in links(page):
            path_part = target.partition("#")[0]
            if is_external(target) or not path_part:
                continue
            destination = (page.parent / path_part).resolve()
            found = sorted(destination.rglob("*.md")) if destination.is_dir() else [destination]
            for linked in found:
                if linked.suffix == ".md" and linked.exists() and linked not in reached:
                    reached.add(linked)
                    frontier.append(linked)
    unreached = [str(page.relative_to(ROOT)) for page in sorted(DOCS.rglob("*.md")) if page not in reached]
    assert unreached == []


def test_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# The rule for comparisons\n## 3. The pair (bench.py, k = 4)\n## Notes\n## Notes\n"
                    "```\n# not a heading\n```\n", encoding="utf-8")
    assert anchors(page) == {"the-rule-for-comparisons", "3-the-pair-benchpy-k--4", "notes", "notes-1"}


def test_a_missing_file_and_a_missing_heading_are_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Present\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#present) [b](other.md#absent) [c](gone.md) [d](https://example.org) "
                    "`[e](in-code.md)`\n", encoding="utf-8")
    assert broken_links(page) == ["other.md#absent (no heading with that anchor)", "gone.md (no such file)"]
