"""Prompt sets: the shipped held-out set, local .jsonl/.txt files, and clear errors."""
import json

import pytest

from specdec.prompts import Prompt, load_prompts, shipped_sets


def test_shipped_heldout_set_has_200_unique_prompts():
    prompts = load_prompts("embedded_heldout")
    assert len(prompts) == 200 and len({p.id for p in prompts}) == 200
    assert prompts[0].id == "heldout-000" and all(p.text.strip() for p in prompts)
    assert "embedded_heldout" in shipped_sets()


def test_limit_truncates():
    assert [p.id for p in load_prompts("embedded_heldout", limit=3)] == ["heldout-000", "heldout-001", "heldout-002"]
    with pytest.raises(ValueError, match="-1"):
        load_prompts("embedded_heldout", limit=-1)


def test_jsonl_file_loads_with_default_ids(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "Hello"}) + "\n\n" + json.dumps({"text": "World"}) + "\n")
    assert load_prompts(str(path)) == [Prompt("a", "Hello"), Prompt("mine-001", "World")]


def test_txt_file_loads_one_prompt_per_non_empty_line(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("First prompt\n\n  Second prompt  \n")
    assert load_prompts(str(path)) == [Prompt("mine-000", "First prompt"), Prompt("mine-001", "Second prompt")]


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
