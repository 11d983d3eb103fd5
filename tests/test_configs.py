"""Every config option composes, names a real constructor whose signature accepts its keys, and builds."""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import re

import pytest
from conftest import CONFIGS, REPO, tiny_overrides
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_method, instantiate
from omegaconf import OmegaConf

import specdec

GROUPS = ("pair", "drafter", "strategy", "draft_length", "sampling", "system", "data", "logger")
OPTIONS = [(group, path.stem) for group in GROUPS for path in sorted((CONFIGS / group).glob("*.yaml"))]
MODEL_FREE = ("drafter", "strategy", "draft_length", "sampling", "system", "logger")


def compose_run(overrides=(), hydra=False):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("run", overrides=list(overrides), return_hydra_config=hydra)


def test_every_group_has_the_expected_options():
    names = {group: {option for g, option in OPTIONS if g == group} for group in GROUPS}
    assert names["pair"] == {"embedded", "gpt2-xl", "gpt2-large", "gpt2-medium", "gpt2-xl-shaped",
                             "gpt2-large-shaped", "gpt2-medium-shaped"}
    assert names["strategy"] == {"greedy", "speculative", "block", "traversal", "typical", "topk", "synthetic"}
    assert {"greedy", "t1", "t07_topp09"} <= names["sampling"]
    assert names["draft_length"] == {"fixed", "heuristic", "confidence", "cost_optimal"}
    assert names["drafter"] == {
        "model", "chains", "ngram", "early_exit", "tree", "dynamic_tree", "tree_searched", "cross_tokenizer", "eagle",
        "medusa"
    }
    assert names["data"] == {"embedded_heldout", "file", "task_suite"} and names["logger"] == {"none", "wandb"}
    assert names["system"] == {"specdec", "hf_generate", "hf_assisted"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_its_constructor_accepts_its_keys(group, option, tiny):
    extra = [f"data.source={tiny['prompts']}"] if (group, option) == ("data", "file") else []
    cfg = compose_run([f"{group}={option}", *extra])
    node = OmegaConf.to_container(cfg[group], resolve=True)
    target = get_method(node.pop("_target_"))
    node.pop("_partial_", None)
    inspect.signature(target).bind_partial(**node)  # the constructor signature is the schema
    if group in MODEL_FREE:
        built = instantiate(cfg[group])
        if group == "drafter":
            assert built.func == target  # the class's factory (a bound classmethod, equal but not identical)
            target.__self__.check_options(**node)  # the factory takes **options: the class says which it takes
        else:
            assert type(built).__name__ == target.__name__


@pytest.mark.parametrize("option", ["greedy", "speculative", "typical", "topk", "synthetic"])
def test_strategy_options_build_the_library_strategies(option):
    strategy = instantiate(compose_run([f"strategy={option}"]).strategy)
    assert strategy.name == option and isinstance(strategy, specdec.STRATEGIES[option])


def test_data_and_pair_options_load_through_the_library(tiny):
    cfg = compose_run(tiny_overrides(tiny))
    prompts = instantiate(cfg.data)
    assert [p.id for p in prompts] == ["p0", "p1", "p2", "p3"]
    pair = instantiate(cfg.pair)
    assert pair.target.config.vocab_size == pair.draft.config.vocab_size == len(pair.tokenizer)


def test_embedded_pair_and_heldout_prompts_load():
    cfg = compose_run(["device=cpu", "num_prompts=3"])
    pair = instantiate(cfg.pair)
    assert pair.name == "embedded" and pair.draft.config.vocab_size == pair.target.config.vocab_size
    assert [p.id for p in instantiate(cfg.data)] == ["heldout-000", "heldout-001", "heldout-002"]


def test_defaults_and_run_keys():
    cfg = compose_run()
    assert cfg.pair.preset == "embedded" and cfg.strategy._target_ == "specdec.Speculative"
    assert cfg.draft_length.k == 4 and cfg.sampling.temperature == 0 and cfg.batch_size == 1
    assert cfg.data.limit == cfg.num_prompts and cfg.pair.device == cfg.device and cfg.pair.dtype == cfg.dtype
    assert cfg.resume is False and cfg.group is None
    assert compose_run(["draft_length.k=8"]).draft_length.k == 8


def test_hydra_directories():
    cfg = compose_run(hydra=True)
    assert cfg.hydra.run.dir.startswith("outputs/") and cfg.hydra.sweep.dir.startswith("multirun/")
    subdir = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"]
    assert subdir == "${hydra.job.num}" and cfg.hydra.job.chdir is False


def sweep_jobs(params: dict) -> list[dict]:
    """The jobs Hydra's basic sweeper makes of a params block: the cartesian product of its axes."""
    overrides = OverridesParser.create().parse_overrides([f"{key}={value}" for key, value in params.items()])
    axes = [[(o.key_or_group, v) for v in o.sweep_string_iterator()] for o in overrides]
    return [dict(combo) for combo in itertools.product(*axes)]


def test_gpt2_xl_study_preset():
    cfg = compose_run(["experiment=gpt2_xl_study"], hydra=True)
    assert cfg.pair.preset == "gpt2-xl" and cfg.device == "cuda" and cfg.logger._target_.endswith("WandbLogger")
    jobs = sweep_jobs(cfg.hydra.sweeper.params)
    assert len(jobs) == 4 * 2 * 8
    assert {job["draft_length.k"] for job in jobs} == {str(k) for k in range(1, 9)}
    assert {job["strategy"] for job in jobs} == {"greedy", "speculative", "typical", "topk"}
    assert {job["sampling"] for job in jobs} == {"greedy", "t1"}


def test_task_suite_preset_runs_mt_bench_humaneval_and_prose_on_the_embedded_pair():
    cfg = compose_run(["experiment=task_suite"])
    assert cfg.pair.preset == "embedded" and cfg.device == "cpu" and cfg.num_prompts is None
    prompts = instantiate(cfg.data)
    counts = {category: sum(p.category == category for p in prompts) for category in {p.category for p in prompts}}
    assert counts == {"writing": 10, "roleplay": 10, "reasoning": 10, "math": 10, "coding": 10, "extraction": 10,
                      "stem": 10, "humanities": 10, "humaneval": 80, "prose": 80}


def test_embedded_sweep_preset_and_command_line_wins():
    cfg = compose_run(["experiment=embedded_sweep"], hydra=True)
    assert cfg.pair.preset == "embedded" and cfg.device == "cpu" and cfg.num_prompts == 8
    assert len(sweep_jobs(cfg.hydra.sweeper.params)) == 4
    assert compose_run(["experiment=embedded_sweep", "num_prompts=2"]).num_prompts == 2
    assert compose_run(["experiment=gpt2_xl_study", "logger=none"]).logger._target_.endswith("NullLogger")


def test_every_key_has_a_one_line_comment():
    key_line = re.compile(r"^\s*(- )?[A-Za-z_./\-]+:")
    missing = [f"{path.relative_to(CONFIGS)}:{number}: {line.strip()}"
               for path in sorted(CONFIGS.rglob("*.yaml"))
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if key_line.match(line) and " # " not in line]
    assert not missing, "keys without a comment:\n" + "\n".join(missing)


def imported_modules(path, top_level_only=False) -> set[str]:
    """Top-level package names a Python file imports (only module-level statements if ``top_level_only``)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_library_never_imports_hydra_or_wandb():
    for path in sorted((REPO / "specdec").rglob("*.py")):
        assert not imported_modules(path) & {"hydra", "omegaconf", "wandb"}, path


def test_wandb_is_imported_only_inside_the_wandb_logger():
    for path in sorted((REPO / "experiments").rglob("*.py")):
        if "wandb" in imported_modules(path):
            assert path.name == "loggers.py", path
            assert "wandb" not in imported_modules(path, top_level_only=True), "wandb imported at module level"
