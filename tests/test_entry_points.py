"""Reliability 3, command-line side (issue 35): every entry point refuses through one path
(``experiments.refusal``): exit 2 and one line on stderr, before any model loads, an unwritable output checked
before anything is measured; and resume finds a run whose config.yaml was cut short, or names it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, REPO, tiny_overrides

from experiments import bench, gpu_suite, shapes_bench, train_pair, tree_bench, tree_search
from experiments.refusal import check_group_options, check_writable

NO_GPU = "cuda" if not torch.cuda.is_available() else None


def refused(parse, argv: list[str], capsys) -> str:
    """The one line ``parse(argv)`` refuses with (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exited.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def a_file(tmp_path) -> str:
    """A path under a regular file: no one can write there, root included."""
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file" / "out")


# --- tree_search ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, named", [
    (["--pair", "gpt5"], "--pair 'gpt5': unknown preset 'gpt5'; known presets:"),
    (["--device", "tpu"], "--device 'tpu': unknown device 'tpu'; allowed:"),
    (["--node-budget", "1"], "--node-budget must be at least 2"),
    (["--decay", "0.5"], "--decay applies to a *-shaped pair's --acceptance; embedded's acceptance is measured"),
    (["--decay", "1"], "--decay applies to a *-shaped pair's --acceptance"),
    (["--pair", "gpt2-xl-shaped", "--acceptance", "0.8", "--decay", "nan"], "--decay must be in (0, 1]"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_tree_search_refuses_in_one_line_before_loading(argv, named, capsys, loads):
    assert named in refused(tree_search.parse_args, argv, capsys)
    assert loads["pair"] == 0


@pytest.mark.skipif(NO_GPU is None, reason="this machine has a GPU")
def test_tree_search_refuses_a_device_this_machine_lacks(capsys):
    assert "--device 'cuda': device 'cuda' was requested but is not available" in refused(
        tree_search.parse_args, ["--device", "cuda"], capsys)


@pytest.mark.parametrize("option", ["--config-dir", "--out"])
def test_tree_search_checks_where_it_writes_before_measuring(option, tmp_path, capsys, loads):
    line = refused(tree_search.parse_args, [option, a_file(tmp_path)], capsys)
    assert f"{option} '{a_file(tmp_path)}' cannot be written: {tmp_path / 'file'} is a file" in line
    assert loads["pair"] == 0


def test_tree_search_refusal_from_the_command_line_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "experiments.tree_search", "--node-budget", "1", "--out",
                           str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and lines == ["python -m experiments.tree_search: error: --node-budget must be at "
                                              "least 2 (a tree has a node with 2 children; 1 node is a chain), got 1"]
    assert not (tmp_path / "out").exists()


# --- the other benches and commands ---------------------------------------------------------------------------------

@pytest.mark.parametrize("parse, argv, named", [
    (tree_bench.parse_args, ["--pair", "gpt5"], "--pair 'gpt5': unknown preset"),
    (tree_bench.parse_args, ["--verify-costs", "gpt5"], "--verify-costs 'gpt5': unknown preset"),
    (tree_bench.parse_args, ["--trees", "9000"], "argument --trees: branching [9000] makes a tree of 9000 nodes"),
    (tree_bench.parse_args, ["--device", "tpu"], "--device 'tpu'"),
    (bench.parse_args, ["--pair", "gpt5"], "--pair 'gpt5': unknown preset"),
    (bench.parse_args, ["--dtype", "fp8"], "--dtype 'fp8': unknown dtype 'fp8'"),
    (bench.parse_args, ["--device", "tpu"], "--device 'tpu'"),
    (shapes_bench.parse_args, ["--pair", "gpt5"], "--pair 'gpt5': unknown preset"),
    (shapes_bench.parse_args, ["--plot-from", "/no/such/shapes.md"], "--plot-from '/no/such/shapes.md': not found"),
    (gpu_suite.parse_args, ["--smoke", "--budget", "inf"], "--budget: expected a positive number of seconds"),
    (train_pair.parse_args, ["--draft-width", "100"], "--draft-width must be a multiple of 64"),
    (train_pair.parse_args, ["--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
    (train_pair.parse_args, ["--target-lr", "nan"], "--target-lr must be a positive number, got nan"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_every_bench_refuses_in_one_line(parse, argv, named, capsys, loads):
    assert named in refused(parse, argv, capsys)
    assert loads["pair"] == 0


@pytest.mark.parametrize("parse, option", [
    (tree_bench.parse_args, "--out"), (bench.parse_args, "--out"), (shapes_bench.parse_args, "--out"),
    (gpu_suite.parse_args, "--out"), (train_pair.parse_args, "--out-dir"), (train_pair.parse_args, "--corpus-dir"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_every_bench_checks_where_it_writes_before_any_work(parse, option, tmp_path, capsys):
    argv = [option, a_file(tmp_path) + ("/x" if parse is tree_bench.parse_args else "")]
    argv = argv + (["--smoke"] if parse is gpu_suite.parse_args else [])
    assert "cannot be written" in refused(parse, argv, capsys)


def test_the_report_refuses_in_one_line(capsys):
    from analysis.report import parse_args

    assert "the following arguments are required: paths" in refused(parse_args, [], capsys)


def test_a_writable_directory_passes_and_nothing_is_made(tmp_path):
    check_writable("--out", tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


def test_a_tree_the_pairs_vocabulary_cannot_hold_is_refused_before_measuring(monkeypatch, capsys):
    """Only the loaded pair knows its vocabulary: the methods are built before the first is timed."""
    from conftest import tiny_gpt2
    from experiments.harness import Pair

    small = Pair("small", tiny_gpt2(1, layers=1, vocab=8), tiny_gpt2(0, vocab=8), [[1, 2, 3]], None, True)
    monkeypatch.setattr(tree_bench, "run_interleaved", lambda *args, **kwargs: pytest.fail("measured"))
    args = tree_bench.parse_args(["--dynamic", "12-1-12"])
    with pytest.raises(SystemExit) as exited:
        tree_bench.compare(small, tree_bench.groups_from(args), args, None)
    assert exited.value.code == 2
    assert "top_k=12 gives a node 12 children, more than the draft's vocabulary of 8" in capsys.readouterr().err


# --- experiments.run: options of config groups -----------------------------------------------------------------------

@pytest.mark.parametrize("argv, named", [
    (["sampling=t2"], "sampling=t2 is not an option of sampling; options: greedy, t07, t07_topp09, t1"),
    (["-m", "sampling=t1,t3"], "sampling=t3 is not an option of sampling"),
    (["-m", "sampling=choice(t1,hot)"], "sampling=hot is not an option of sampling"),
    (["drafter=modle"], "drafter=modle is not an option of drafter; options: chains, cross_tokenizer, dynamic_tree, "
                        "eagle, early_exit, medusa, model, ngram, tree, tree_searched; did you mean drafter=model?"),
    (["+strategy=fast"], "strategy=fast is not an option of strategy"),
    (["hydra/launcher=nope"], "hydra/launcher=nope is not an option of hydra/launcher"),
    (["pair=gpt5"], "pair=gpt5 is not an option of pair"),
    (["data=web"], "data=web is not an option of data"),
    (["hydra.run.dir=/tmp/ünï"], "cannot parse the override 'hydra.run.dir=/tmp/ünï'"),
])
def test_an_unknown_option_of_a_config_group_is_named_with_the_options(argv, named):
    assert named in check_group_options(argv, CONFIGS)


@pytest.mark.parametrize("argv", [["sampling=t1"], ["-m", "sampling=t1,greedy", "draft_length.k=1,2"],
                                  ["~logger"], ["drafter=tree", "drafter.branching=[2,1]"], ["sampling@x=t1"],
                                  ["hydra.run.dir='/tmp/ünï'"], ["--cfg", "job"]])
def test_known_options_and_other_keys_pass(argv):
    assert check_group_options(argv, CONFIGS) is None


@pytest.mark.slow
def test_an_unknown_option_from_the_command_line_is_one_line_and_exit_2(tiny, tmp_path):
    done = subprocess.run([sys.executable, "-m", "experiments.run", "sampling=t2", *tiny_overrides(tiny),
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("config error: sampling=t2 is not an option of sampling; options: greedy")
    assert not (tmp_path / "run").exists()


def test_two_copies_of_one_tokenizer_pass_as_one_tokenizer(tiny):
    """pair.cross_tokenizer=true with the tiny pair, whose draft and target hold copies of one tokenizer: the
    tokenizers are compared by content, so drafter=model is allowed (it said "the tokenizers differ (71 vs 71)")."""
    from test_cli_validation import compose_run

    from experiments.config_checks import validate

    objects, skip = validate(compose_run([*tiny_overrides(tiny), "pair.cross_tokenizer=true", "drafter=model"]))
    assert skip is None and objects["drafter"] is None


# --- resume with a damaged config.yaml --------------------------------------------------------------------------------

def cut_config(run_dir, cut_after: str) -> None:
    """config.yaml cut right after the first occurrence of ``cut_after``, inside its line (as a kill in another
    tool's write leaves it): it still parses, with its last value or key cut."""
    text = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(text[: text.index(cut_after) + len(cut_after)])


@pytest.mark.parametrize("cut_after", ["\n  dtype: fl", "\n  source: /t", "\n  _target_: experiments.loggers.Null",
                                       "\n  lenie", "max_new_tok"])
def test_resume_true_finds_a_run_whose_config_was_cut_mid_line(tiny, tmp_path, capsys, cut_after):
    """Issue 35: a config.yaml cut inside a line ('dtype: fl') parsed as another setting, so resume=true said "no
    unfinished run" and decoded every prompt again."""
    from experiments import runner
    from test_experiments import compose_run
    from test_rundir import FOUR, assert_each_prompt_once, killed_run, resume_line

    first = tmp_path / "outputs" / "first"
    overrides = killed_run(tiny, first)
    cut_config(first, cut_after)
    capsys.readouterr()
    runner.run(*compose_run([*overrides, "resume=true"], tmp_path / "outputs" / "second"))
    assert_each_prompt_once(first, FOUR)
    assert resume_line(capsys.readouterr().err).startswith(f"resuming {first}: 2 row(s) kept")
    assert not (tmp_path / "outputs" / "second" / "rows.jsonl").exists()


def test_a_cut_config_of_another_setting_is_not_resumed(tiny, tmp_path, capsys):
    from experiments import runner
    from test_experiments import compose_run
    from test_rundir import killed_run, rows_of

    first = tmp_path / "outputs" / "first"
    overrides = killed_run(tiny, first)
    rows_before = rows_of(first)
    cut_config(first, "\n  _target_: experiments.loggers.Null")  # draft_length.k=4 stays whole
    second = tmp_path / "outputs" / "second"
    runner.run(*compose_run([*overrides, "resume=true", "draft_length.k=2"], second))
    assert rows_of(first) == rows_before and len(rows_of(second)) == 4
    assert "no unfinished run with this config" in capsys.readouterr().err


def test_a_damaged_config_without_rows_is_named_with_how_to_resume_it(tiny, tmp_path, capsys):
    """Nothing tells that run's setting: resume=true names it in one line rather than decode everything again, and
    resume=<its path> continues it."""
    from experiments import runner
    from experiments.config_checks import ConfigError
    from test_experiments import compose_run
    from test_rundir import FOUR, assert_each_prompt_once, killed_run

    first = tmp_path / "outputs" / "first"
    overrides = killed_run(tiny, first, after=1)
    (first / "rows.jsonl").write_text("")
    (first / "config.yaml").write_bytes(b"\x00\xff garbage")
    second = tmp_path / "outputs" / "second"
    with pytest.raises(ConfigError) as error:
        runner.run(*compose_run([*overrides, "resume=true"], second))
    message = str(error.value)
    assert "\n" not in message and f"but {first} is unfinished and its setting cannot be told" in message
    assert f"to continue it: resume={first}; to start a new run: resume=false" in message
    assert not (second / "rows.jsonl").exists()
    runner.run(*compose_run([*overrides, f"resume={first}"], second))
    assert_each_prompt_once(first, FOUR)
