"""Every bad input to `python -m experiments.run` is refused in one line before any model loads (exit 2 from the
command line): pair, logger, data, drafter, run and launcher keys, keys nothing reads, lengths beyond the pair's
context. Most cases call the validation directly; a few run the command end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS, REPO, WORDS, tiny_gpt2, tiny_overrides
from hydra import compose, initialize_config_dir

import specdec
from experiments.common.config_checks import MAX_NEW_TOKENS, ConfigError, check_directory, check_sweep, validate
from specdec.sampling import MIN_TEMPERATURE

TINY_CONTEXT = 128  # n_positions of the tiny pair (conftest.tiny)


def compose_run(overrides, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("run", overrides=list(overrides), return_hydra_config=hydra)


def refusal(overrides, tiny) -> str:
    """The one-line ConfigError that validating the tiny run with ``overrides`` raises."""
    with pytest.raises(ConfigError) as error:
        validate(compose_run([*tiny_overrides(tiny), *overrides]))
    message = str(error.value)
    assert "\n" not in message
    return message


def absent_device() -> str:
    return "mps" if torch.cuda.is_available() else "cuda"


REFUSED = [
    (["pair.preset=foo"], "pair.preset='foo': unknown preset 'foo'; known presets: ['embedded'"),
    (["pair.dtype=fp8"], "pair.dtype='fp8': unknown dtype 'fp8'"),
    ([f"pair.device={absent_device()}"], f"pair.device='{absent_device()}': device '{absent_device()}' was requested "
                                         f"but is not available"),
    (["pair.draft=/nonexistent"], "pair.draft='/nonexistent': could not load draft '/nonexistent': no such "
                                  "directory, and not a Hugging Face hub id"),
    (["logger=wandb", "logger.init_timeout=-5"], "logger.init_timeout=-5: init_timeout must be a number of seconds > 0"),
    (["logger=wandb", "logger.tags=notalist"], "logger.tags='notalist' is not allowed: must be a list of strings"),
    (["logger=wandb", "logger.tags=[1,2]"], "logger.tags=[1, 2] is not allowed: must be a list of strings"),
    (["data.limit=abc"], "data.limit='abc' is not allowed: must be an integer >= 1"),
    (["max_new_tokens=10000000000"], f"max_new_tokens=10000000000 is not allowed: must be an integer in [1, "
                                     f"{MAX_NEW_TOKENS}]"),
    ([f"max_new_tokens={TINY_CONTEXT}"], f"the pair attends over {TINY_CONTEXT} positions, so at most "
                                         f"{TINY_CONTEXT - 1} tokens follow"),
    (["draft_length.k=1000000000000"], f"draft_length: drafts of up to 1000000000000 tokens do not fit the pair's "
                                       f"context of {TINY_CONTEXT} positions"),
    (["draft_length=heuristic", f"draft_length.k_max={TINY_CONTEXT}"], f"drafts of up to {TINY_CONTEXT} tokens"),
    (["drafter=tree", "drafter.branching=[9000]"], "drafter.branching=[9000]: branching [9000] makes a tree of 9000 "
                                                   "nodes; at most 1024"),
    (["drafter=tree", "drafter.branching=5"], "drafter.branching=5: branching must be a non-empty list"),
    (["drafter=tree", "drafter.branching=[]"], "drafter.branching=[]: branching must be a non-empty list"),
    (["drafter=tree", "drafter.branching=[0,2]"], "drafter.branching=[0, 2]: branching must be a non-empty list"),
    (["drafter=tree", "compile=true"], "drafter: token trees run eager on the dynamic cache layout: compile=true "
                                       "cannot draft trees"),
    (["drafter=tree", "+drafter.branchin=[2]"], "TreeDrafter got unknown options ['branchin']; it takes branching"),
    (["forward=fast"], "forward='fast' is not allowed: must be one of auto, lean, transformers"),
    (["sampling=t1", "sampling.temperature=1e-31"], "sampling.temperature=1e-31: temperature must be 0 (greedy) or "
                                                    "at least 1e-30"),
    (["sampling=t1", "sampling.temperature=1e-40"], "sampling.temperature=1e-40"),
    (["resume=/no/such/run"], "resume='/no/such/run' is not allowed"),
    ([f"seed={2**64}"], f"seed={2**64} is not allowed: must be an integer in [0, 2**64 - 1]"),
]


@pytest.mark.parametrize("overrides, named", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_bad_input_is_refused_in_one_line_before_loading(overrides, named, tiny, loads):
    assert named in refusal(overrides, tiny)
    assert loads == {"pair": 0, "prompts": 0}


UNREAD = [
    (["+max_new_token=8"], "max_new_token=8 is not a key the run reads (configs/run.yaml); did you mean "
                           "max_new_tokens?"),
    (["+strategy.lenienc=0.5"], "strategy.lenienc=0.5 is not a parameter of specdec.Speculative; did you mean "
                                "strategy.lenience?"),
    (["+pair.dtyp=float32"], "pair.dtyp='float32' is not a parameter of specdec.models.load_pair; did you mean "
                             "pair.dtype?"),
    (["logger=wandb", "+logger.tag=[a]"], "logger.tag=['a'] is not a parameter of experiments.common.loggers.WandbLogger; "
                                          "did you mean logger.tags?"),
]


@pytest.mark.parametrize("overrides, named", UNREAD, ids=[" ".join(o) for o, _ in UNREAD])
def test_a_key_nothing_reads_is_refused_naming_the_nearest(overrides, named, tiny):
    """(Without the ``loads`` fixture: its wrapper of load_pair hides the signature these keys are checked against.)"""
    assert named in refusal(overrides, tiny)


def test_a_pair_member_that_is_a_file_or_has_no_config_is_named(tiny, tmp_path):
    afile = tmp_path / "model.bin"
    afile.write_text("weights")
    assert f"pair.draft='{afile}': could not load draft '{afile}': it is a file" in refusal([f"pair.draft={afile}"], tiny)
    assert f"pair.target='{tmp_path}': could not load target" in refusal([f"pair.target={tmp_path}"], tiny)


def test_a_prompt_longer_than_the_context_is_refused_before_the_models_load(tiny, tmp_path, loads):
    prompts = tmp_path / "prompts.jsonl"
    long_text = " ".join(WORDS[i % len(WORDS)] for i in range(TINY_CONTEXT + 10))  # one token per word
    records = [{"id": "short", "text": "the first time"}, {"id": "long", "text": long_text}]
    prompts.write_text("".join(json.dumps(record) + "\n" for record in records))
    message = refusal([f"data.source={prompts}", "num_prompts=null"], tiny)
    assert f"prompt long has {TINY_CONTEXT + 10} tokens" in message and f"context of {TINY_CONTEXT} positions" in message
    assert loads["pair"] == 0


def test_the_longest_settings_inside_the_context_pass(tiny, loads):
    objects, skip = validate(compose_run([*tiny_overrides(tiny), f"max_new_tokens={TINY_CONTEXT - 1}"]))
    assert skip is None and isinstance(objects["sampling"], specdec.SamplingConfig) and loads["pair"] == 0


def test_temperature_at_the_floor_passes_from_the_cli(tiny):
    objects, _ = validate(compose_run([*tiny_overrides(tiny), "sampling=t1", f"sampling.temperature={MIN_TEMPERATURE}"]))
    assert objects["sampling"].temperature == MIN_TEMPERATURE


def test_a_skipped_sweep_job_reads_nothing_of_the_pair(tiny, loads):
    """Greedy verification while sampling is skipped in a sweep: its pair and prompts are never looked at."""
    _, skip = validate(compose_run([*tiny_overrides(tiny), "strategy=greedy", "sampling=t1", "pair.draft=/nonexistent"]))
    assert "greedy" in skip and loads == {"pair": 0, "prompts": 0}


@pytest.mark.parametrize("option, drafter_class", [("model", specdec.ModelDrafter), ("tree", specdec.TreeDrafter),
                                                   ("early_exit", specdec.EarlyExitDrafter)])
def test_drafters_that_need_the_pair_are_built_by_their_factory_from_it(option, drafter_class, tiny):
    objects, _ = validate(compose_run([*tiny_overrides(tiny), f"drafter={option}"]))
    assert objects["drafter"] is None
    pair = SimpleNamespace(draft=tiny_gpt2(1, layers=1), target=tiny_gpt2(0, layers=3), tokenizer=None)
    drafter = objects["drafter_factory"](pair, compile=False)
    assert type(drafter) is drafter_class
    assert drafter.models()[0] is pair.draft or option == "early_exit"


def test_a_drafter_that_reads_no_pair_is_built_before_loading(tiny):
    objects, _ = validate(compose_run([*tiny_overrides(tiny), "drafter=ngram", "drafter.max_ngram=4"]))
    assert isinstance(objects["drafter"], specdec.NGramDrafter) and objects["drafter"].max_ngram == 4


def test_a_drafter_class_is_built_through_its_factory_and_anything_else_is_refused(tiny):
    """A drafter class (a custom one's, issue 34) is as good as its factory; a target that is neither is refused."""
    objects, _ = validate(compose_run([*tiny_overrides(tiny), "drafter._target_=specdec.ModelDrafter"]))
    assert objects["drafter_factory"].func == specdec.ModelDrafter.from_pair and objects["drafter_name"] == "model"
    message = refusal(["drafter._target_=specdec.SamplingConfig"], tiny)
    assert ("drafter._target_='specdec.SamplingConfig' is not allowed: must be a drafter class (a subclass of "
            "specdec.Drafter) or its factory") in message


# --- Hydra keys, checked by the CheckLaunch callback before any directory or job ---------------------------------


def test_an_empty_run_directory_is_refused():
    with pytest.raises(ConfigError, match=r"hydra.run.dir='' is not allowed: must be a directory path"):
        check_directory(compose_run(["hydra.run.dir=''"], hydra=True), "hydra.run.dir")
    check_directory(compose_run([], hydra=True), "hydra.run.dir")


@pytest.mark.parametrize("overrides, named", [
    (["hydra/launcher=local", "hydra.launcher.timeout_min=-1"], "hydra.launcher.timeout_min=-1 is not allowed"),
    (["hydra/launcher=local", "hydra.launcher.cpus_per_task=0"], "hydra.launcher.cpus_per_task=0 is not allowed"),
    (["hydra/launcher=slurm", "hydra.launcher.array_parallelism=0"], "hydra.launcher.array_parallelism=0"),
    (["hydra/launcher=slurm", "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=120"],
     "hydra.launcher.signal_delay_s=120 is not allowed: the signal must come before the time limit"),
    (["hydra.sweep.dir=''"], "hydra.sweep.dir='' is not allowed"),
])
def test_bad_sweep_settings_are_refused_before_any_job(overrides, named):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with pytest.raises(ConfigError) as error:
        check_sweep(compose_run(overrides, hydra=True))
    assert named in str(error.value) and "\n" not in str(error.value)


def test_the_shipped_launchers_pass():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    for launcher in ("local", "slurm"):
        check_sweep(compose_run([f"hydra/launcher={launcher}"], hydra=True))


# --- end to end: exit 2 and one line on stderr --------------------------------------------------------------------


@pytest.mark.parametrize("argv, named", [
    (["pair.preset=foo"], "config error: pair.preset='foo'"),
    (["+max_new_token=8"], "did you mean max_new_tokens?"),
    (["hydra.run.dir="], "config error: hydra.run.dir='' is not allowed"),
    (["-m", "hydra/launcher=local", "hydra.launcher.timeout_min=-1"], "hydra.launcher.timeout_min=-1"),
], ids=["pair", "typo", "run-dir", "launcher"])
def test_the_command_exits_2_with_one_line(argv, named, tiny, tmp_path):
    if "hydra/launcher=local" in argv:
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    directories = [] if "hydra.run.dir=" in argv else [f"hydra.run.dir={tmp_path / 'run'}",
                                                      f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    done = subprocess.run([sys.executable, "-m", "experiments.run", *argv, *tiny_overrides(tiny), *directories],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and named in lines[0], done.stderr
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "run" / "rows.jsonl").exists()


def test_the_forward_switch_reaches_the_target_and_the_drafter(tiny, tmp_path, monkeypatch):
    """``forward=transformers`` runs transformers' forward for both models (the reference path); a run with it
    writes the same greedy tokens' counts as the default lean run."""
    built = []
    original = specdec.Decoder.__init__

    def record(self, target, drafter=None, *args, **kwargs):
        original(self, target, drafter, *args, **kwargs)
        built.append((self.runner.is_lean, getattr(getattr(self.drafter, "runner", None), "is_lean", None)))
    monkeypatch.setattr(specdec.Decoder, "__init__", record)
    cfg = compose_run([*tiny_overrides(tiny), "forward=transformers"])
    assert validate(cfg) is not None and cfg.forward == "transformers"
    from experiments.common.runner import Job, run
    run(cfg, Job(tmp_path / "run", "g", {}, tmp_path))
    assert built and all(target is False and drafter in (False, None) for target, drafter in built)


@pytest.mark.parametrize("override, named", [
    ("unknown_key=1", "unknown_key is not a key of the config; known: batch_size"),
    ("num_promts=3", "did you mean num_prompts?"),
])
def test_an_unknown_top_level_key_is_one_line_before_hydra_composes(override, named):
    """Hydra's 'not in struct' for a key the run config lacks is many lines; the pre-launch check names the key,
    the nearest one, and the + that adds a key of one's own. A known key and a + key pass."""
    from experiments.common.refusal import check_group_options

    problem = check_group_options([override], CONFIGS)
    assert problem is not None and named in problem and "\n" not in problem and "+" in problem
    assert check_group_options(["num_prompts=3", "+my_key=1", "sampling=t1"], CONFIGS) is None
