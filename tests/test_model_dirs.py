"""Any model directory, one key: ``pair.target=DIR`` alone is a target without a draft model (loaded once) for the
drafters that read the target alone, ``pair.draft=DIR pair.target=DIR`` a pair drafting with a model; rows name the
pair by its models. The directories are tiny Llama-shaped models saved in-process (tests/llama_dirs.py)."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_overrides
from llama_dirs import save_tiny_llama
from test_experiments import compose_run, rows_of

import specdec.models
from experiments import runner
from experiments.config_checks import ConfigError
from specdec.models import load_pair, model_name, plan_pair, resolve_pair_ids


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict:
    """A target (2 layers) and a draft (1 layer) of one tokenizer, in directories named as downloads are."""
    root = tmp_path_factory.mktemp("models")
    return {"target": str(save_tiny_llama(root / "TinyLlama-Instruct", seed=0)),
            "draft": str(save_tiny_llama(root / "TinyLlama-Small", seed=1, layers=1))}


@pytest.fixture
def model_loads(monkeypatch) -> list[str]:
    """The sources load_model was called with, in order."""
    loaded, real = [], specdec.models.load_model
    monkeypatch.setattr(specdec.models, "load_model", lambda source, *a: loaded.append(source) or real(source, *a))
    return loaded


def run_overrides(llama: dict, tiny: dict, *extra: str) -> list[str]:
    """The tiny run's sizes on the Llama directory's target alone (its prompts are the tiny pair's words)."""
    size = [o for o in tiny_overrides(tiny, num_prompts=2, max_new_tokens=8, warmup=0) if not o.startswith("pair.")]
    return [*size, "stop_at_eos=false", f"pair.target={llama['target']}", *extra]


def test_a_target_alone_is_named_by_its_directory_and_has_no_draft(llama, model_loads):
    spec = resolve_pair_ids("embedded", target=llama["target"])
    assert (spec.name, spec.draft, spec.target) == ("TinyLlama-Instruct", None, llama["target"])
    pair = load_pair(target=llama["target"], device="cpu", dtype="float32")
    assert pair.draft is None and type(pair.target).__name__ == "LlamaForCausalLM" and pair.name == "TinyLlama-Instruct"
    assert model_loads == [llama["target"]]  # the target, once
    assert plan_pair(target=llama["target"], device="cpu").context_limit == 256


def test_a_draft_and_a_target_are_named_by_both(llama, model_loads):
    pair = load_pair(None, draft=llama["draft"], target=llama["target"], device="cpu", dtype="float32")
    assert pair.name == "TinyLlama-Small->TinyLlama-Instruct" and model_loads == [llama["draft"], llama["target"]]
    assert resolve_pair_ids("gpt2-xl", draft=llama["draft"]).name == "TinyLlama-Small->gpt2-xl"


def test_model_names_of_directories_hub_ids_and_hub_cache_snapshots(tmp_path):
    snapshot = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / "a1b2c3"
    snapshot.mkdir(parents=True)
    assert model_name(str(snapshot)) == "SmolLM2-135M-Instruct"
    assert model_name("HuggingFaceTB/SmolLM2-135M") == "SmolLM2-135M"
    assert model_name(str(tmp_path) + "/") == tmp_path.name


@pytest.mark.parametrize("drafter", ["ngram", "early_exit"])
def test_a_target_alone_decodes_losslessly_with_a_drafter_that_reads_it(llama, tiny, tmp_path, drafter, model_loads):
    run_dir = tmp_path / "run"
    extra = ["drafter.num_layers=1"] if drafter == "early_exit" else []
    runner.run(*compose_run(run_overrides(llama, tiny, f"drafter={drafter}", *extra), run_dir))
    rows = rows_of(run_dir)
    assert {row["pair"] for row in rows} == {"TinyLlama-Instruct"} and model_loads == [llama["target"]]
    assert all(row["identical_output"] is True and row["emitted"] == 8 for row in rows)
    assert json.loads((run_dir / "summary.json").read_text())["pair"] == "TinyLlama-Instruct"


@pytest.mark.parametrize("drafter", ["model", "tree", "dynamic_tree"])
def test_a_drafter_that_needs_a_draft_model_is_refused_before_loading(llama, tiny, tmp_path, drafter, loads):
    with pytest.raises(ConfigError) as error:
        runner.run(*compose_run(run_overrides(llama, tiny, f"drafter={drafter}"), tmp_path / "run"))
    message = str(error.value)
    assert "\n" not in message and loads["pair"] == 0
    assert message.startswith(f"pair.target={llama['target']!r} alone is a target without a draft model")
    assert "give the draft too (pair.draft=DIR)" in message


def test_a_draft_directory_beside_the_target_drafts_with_it(llama, tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run(run_overrides(llama, tiny, f"pair.draft={llama['draft']}"), run_dir))
    rows = rows_of(run_dir)
    assert {(row["pair"], row["drafter"]) for row in rows} == {("TinyLlama-Small->TinyLlama-Instruct", "model")}
    assert all(row["identical_output"] is True and row["drafted"] > 0 for row in rows)
