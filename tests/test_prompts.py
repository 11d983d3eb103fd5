"""Prompt sets: the shipped held-out set, local .jsonl/.txt files, ids by content, and clear errors."""
import json

import pytest

from specdec.prompts import Prompt, content_hash, load_prompts, shipped_sets


def test_shipped_heldout_set_has_200_unique_prompts():
    prompts = load_prompts("embedded_heldout")
    assert len(prompts) == 200 and len({p.id for p in prompts}) == 200
    assert prompts[0].id == "heldout-000" and all(p.text.strip() for p in prompts)
    assert "embedded_heldout" in shipped_sets()


def test_limit_truncates():
    assert [p.id for p in load_prompts("embedded_heldout", limit=3)] == ["heldout-000", "heldout-001", "heldout-002"]
    with pytest.raises(ValueError, match="-1"):
        load_prompts("embedded_heldout", limit=-1)


def test_jsonl_file_loads_with_its_ids_or_the_texts_hash(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "Hello"}) + "\n\n" + json.dumps({"text": "World"}) + "\n"
                    + json.dumps({"id": 7, "text": "Seven"}) + "\n")
    world = content_hash("mine.jsonl", "World")
    assert load_prompts(str(path)) == [Prompt("a", "Hello", "mine.jsonl"), Prompt(world, "World", "mine.jsonl"),
                                       Prompt("7", "Seven", "mine.jsonl")]
    assert len(world) == 12 and int(world, 16) >= 0


def test_txt_file_loads_one_prompt_per_non_empty_line_known_by_its_hash(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("First prompt\n\n  Second prompt  \n")
    prompts = load_prompts(str(path))
    assert [p.text for p in prompts] == ["First prompt", "Second prompt"]
    assert [p.id for p in prompts] == [p.hash for p in prompts] == [content_hash("mine.txt", "First prompt"),
                                                                    content_hash("mine.txt", "Second prompt")]


def test_ids_follow_the_text_not_the_line_a_prompt_is_on(tmp_path):
    """Issue 28: ids were line positions, so a line inserted at the top renamed every prompt after it."""
    path = tmp_path / "mine.txt"
    path.write_text("alpha\nbeta\n")
    before = {p.text: p.hash for p in load_prompts(str(path))}
    path.write_text("inserted\nalpha\nbeta changed\n")
    after = {p.text: p.hash for p in load_prompts(str(path))}
    assert after["alpha"] == before["alpha"] and after["beta changed"] != before["beta"]
    assert len(set(after.values())) == 3


def test_the_hash_names_the_source_so_two_sets_never_share_ids(tmp_path):
    (tmp_path / "a.txt").write_text("same text\n")
    (tmp_path / "b.txt").write_text("same text\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("same text\n")
    [a], [b], [moved] = (load_prompts(str(path)) for path in (tmp_path / "a.txt", tmp_path / "b.txt",
                                                              tmp_path / "sub" / "a.txt"))
    assert a.hash != b.hash and a.hash == moved.hash  # the file's name, not its directory
    shipped = load_prompts("embedded_heldout", limit=1)[0]
    assert shipped.hash == content_hash("embedded_heldout", shipped.text) and shipped.id == "heldout-000"


@pytest.mark.parametrize("name, content, message", [
    ("twice.txt", "one\ntwo\n  one \n", "twice.txt:3: the same text as line 1"),
    ("twice.jsonl", '{"id": "a", "text": "x"}\n{"id": "b", "text": "x"}\n', "twice.jsonl:2: the same text as line 1"),
    ("ids.jsonl", '{"id": true, "text": "x"}\n',
     "ids.jsonl:1: 'id' must be a non-empty string or an integer, got True"),
    ("ids.jsonl", '{"id": "", "text": "x"}\n', "got ''"),
    ("binary.txt", b"\xff\xfeok\n", "binary.txt: not UTF-8 text"),
])
def test_bad_prompt_files_are_refused_naming_the_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_prompts(str(path))


def test_prompt_is_frozen():
    with pytest.raises(AttributeError):
        Prompt("a", "b").text = "c"


def test_unknown_set_name_lists_known_sets():
    with pytest.raises(ValueError, match="'nope'.*embedded_heldout"):
        load_prompts("nope")


def test_missing_file_is_named(tmp_path):
    missing = str(tmp_path / "absent.jsonl")
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        load_prompts(missing)


def test_bad_jsonl_line_is_located(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"prompt": "no text field"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_prompts(str(path))


def test_per_category_takes_the_first_n_prompts_of_every_category():
    from specdec.prompts import load_suite

    everything = load_suite("task_suite", ["mt_bench", "humaneval", "embedded_heldout"], {"embedded_heldout": "prose"})
    chosen = load_suite("task_suite", ["mt_bench", "humaneval", "embedded_heldout"], {"embedded_heldout": "prose"},
                        per_category=2)
    categories = list(dict.fromkeys(p.category for p in everything))
    assert len(categories) == 10  # MT-bench's eight, humaneval, prose
    expected = [p for c in categories for p in [q for q in everything if q.category == c][:2]]
    assert sorted(p.id for p in chosen) == sorted(p.id for p in expected)
    assert [p.id for p in chosen] == [p.id for p in everything if p in chosen]  # suite order kept
    with pytest.raises(ValueError, match="per_category must be an integer >= 1"):
        load_suite("s", ["mt_bench"], per_category=0)
