"""The probes of the command line: odd overrides, prompt files and environments for the run app; the report's odd
rows files; config groups; the benches and tree_search."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from probes.core import (
    CLEAR, CLI, CONFUSING, CORRECT, SILENTLY_ACCEPTED, TRACEBACK, cli, command, command_refusal, decoded,
    each_prompt_once, error_outcome, finished_rows, first_line, holds, Outcome, overrides, parse_refusal, parsed,
    probe, refusal, report, report_counts, rows_of_run, rows_on_disk, run_app, run_directory, scratch, time_limit,
    validated,
)


# --- CLI: odd overrides, prompt files, environment -----------------------------------------------------------------

@probe(CLI, CLEAR)
def nan_temperature() -> Outcome:
    """sampling.temperature=nan."""
    return refusal(lambda: validated("sampling=t1", "sampling.temperature=nan"), "sampling.temperature", "finite")


@probe(CLI, CLEAR)
def quoted_number_temperature() -> Outcome:
    """sampling.temperature='0.7' (a string)."""
    return refusal(lambda: validated("sampling=t1", "sampling.temperature='0.7'"), "sampling.temperature", "str")


@probe(CLI, CLEAR)
def float_k() -> Outcome:
    """draft_length.k=2.0."""
    return refusal(lambda: validated("draft_length.k=2.0"), "draft_length.k", "integer")


@probe(CLI, CLEAR)
def blank_group() -> Outcome:
    """group='  ' (blank)."""
    return refusal(lambda: validated("group='  '"), "group", "non-empty")


@probe(CLI, CLEAR)
def added_nested_unknown_key() -> Outcome:
    """+foo.bar=1, a new nested key nothing reads."""
    return refusal(lambda: validated("+foo.bar=1"), "foo", "not a key the run reads")


@probe(CLI, CLEAR, before=TRACEBACK)
def unresolvable_interpolation() -> Outcome:
    """group=${nonexistent}: OmegaConf's InterpolationKeyError reached the user as a traceback."""
    return refusal(lambda: validated("group=${nonexistent}"), "group", "nonexistent")


@probe(CLI, CLEAR, before=TRACEBACK)
def missing_environment_variable() -> Outcome:
    """group=${oc.env:SPECDEC_NO_SUCH_VARIABLE}."""
    return refusal(lambda: validated("group=${oc.env:SPECDEC_NO_SUCH_VARIABLE}"), "group", "SPECDEC_NO_SUCH_VARIABLE")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED)
def infinite_wandb_init_timeout() -> Outcome:
    """logger.init_timeout=inf (W&B could then wait for ever)."""
    return refusal(lambda: validated("logger=wandb", "logger.init_timeout=inf"), "logger.init_timeout", "inf")


@probe(CLI, CLEAR, before=TRACEBACK)
def infinite_prior_weight_from_the_cli() -> Outcome:
    """draft_length=cost_optimal draft_length.prior_weight=inf: validated, then a traceback once decoding began."""
    def run():
        validated("draft_length=cost_optimal", "draft_length.prior_weight=inf")
        run_app(scratch("prior_weight"), "draft_length=cost_optimal", "draft_length.prior_weight=inf")
    return refusal(run, "draft_length.prior_weight", "inf")


@probe(CLI, CORRECT, before=TRACEBACK)
def ngram_max_ngram_of_a_billion_from_the_cli() -> Outcome:
    """drafter=ngram drafter.max_ngram=1000000000: the run hung in the n-gram search."""
    run_dir = scratch("max_ngram")
    return holds(lambda: decoded(run_dir, "drafter=ngram", "drafter.max_ngram=1000000000"))


@probe(CLI, CLEAR, before=CONFUSING)
def prompt_source_that_is_a_directory() -> Outcome:
    """data.source=<a directory named prompts.jsonl>: it said "not found"."""
    directory = scratch("source") / "prompts.jsonl"
    directory.mkdir()
    return refusal(lambda: validated(f"data.source={directory}"), "data.source", "directory")


@probe(CLI, CORRECT)
def unicode_prompt_path_with_spaces() -> Outcome:
    """data.source='<dir>/prömpts ü.txt', quoted."""
    path = scratch("unicode") / "prömpts ü.txt"
    path.write_text("the first time he said\nshe was not there\n", encoding="utf-8")
    return holds(lambda: None if validated(f"data.source='{path}'")[1] is None else "skipped")


@probe(CLI, CLEAR)
def binary_prompt_file() -> Outcome:
    """A .txt prompt file that is not UTF-8."""
    path = scratch("binary") / "prompts.txt"
    path.write_bytes(b"\xff\xfe\x00abc\n")
    return refusal(lambda: validated(f"data.source={path}"), "data.source", "UTF-8")


@probe(CLI, CLEAR)
def infinite_prompt_id() -> Outcome:
    """A .jsonl prompt whose id is 1e400 (JSON reads inf)."""
    path = scratch("prompt_id") / "prompts.jsonl"
    path.write_text('{"id": 1e400, "text": "the first"}\n')
    return refusal(lambda: validated(f"data.source={path}"), "data.source", "'id'")


@probe(CLI, CLEAR)
def prompt_ids_1_and_quoted_1() -> Outcome:
    """Two prompts whose ids are 1 and "1" (the same id once read as text)."""
    path = scratch("prompt_ids") / "prompts.jsonl"
    path.write_text('{"id": 1, "text": "the first"}\n{"id": "1", "text": "she was"}\n')
    return refusal(lambda: run_app(scratch("prompt_ids_run"), f"data.source={path}"), "data.source", "repeated: 1")


@probe(CLI, CORRECT)
def one_new_token_per_prompt() -> Outcome:
    """max_new_tokens=1: every row emits one token."""
    run_dir = scratch("one_token")

    def check():
        run_app(run_dir, "max_new_tokens=1", "stop_at_eos=false")
        emitted = {row["emitted"] for row in rows_on_disk(run_dir)}
        return each_prompt_once(run_dir) or (None if emitted == {1} else f"emitted {emitted}")
    return holds(check)


@probe(CLI, CORRECT)
def batch_size_of_a_thousand() -> Outcome:
    """batch_size=1000 with 4 prompts: one batch of 4."""
    run_dir = scratch("batch_size")

    def check():
        run_app(run_dir, "batch_size=1000")
        sizes = {row["batch_size"] for row in rows_on_disk(run_dir)}
        return each_prompt_once(run_dir) or (None if sizes == {4} else f"batch_size column {sizes}")
    return holds(check)


@probe(CLI, CORRECT)
def more_prompts_asked_than_the_file_has() -> Outcome:
    """num_prompts=1000 with a file of 6 prompts: 6 rows."""
    run_dir = scratch("num_prompts")
    return holds(lambda: decoded(run_dir, "num_prompts=1000", count=6))


@probe(CLI, CLEAR, before=CONFUSING, slow=True)
def unquoted_unicode_run_directory() -> Outcome:
    """hydra.run.dir=<dir>/rün dïr unquoted: Hydra's override grammar refused it in several lines, exit 1 (until
    issue 35's pass; quoted, it works)."""
    directory = scratch("run_dir") / "rün dïr"
    return command_refusal(cli(f"hydra.run.dir={directory}"), "hydra.run.dir")


@probe(CLI, CORRECT, slow=True)
def unicode_run_directory_in_the_c_locale() -> Outcome:
    """hydra.run.dir='<dir>/ü dir' under LC_ALL=C."""
    run_dir = scratch("locale") / "ü dir"
    return holds(lambda: cli(f"hydra.run.dir='{run_dir}'", env={"LC_ALL": "C", "LANG": "C"}).returncode
                 or each_prompt_once(run_dir))


@probe(CLI, CLEAR, slow=True)
def config_error_with_hydra_full_error() -> Outcome:
    """HYDRA_FULL_ERROR=1 and draft_length.k=0: still one line."""
    done = cli("draft_length.k=0", f"hydra.run.dir={scratch('full_error')}", env={"HYDRA_FULL_ERROR": "1"})
    return command_refusal(done, "draft_length.k=0")


@probe(CLI, CORRECT, slow=True)
def bogus_wandb_mode_in_the_environment() -> Outcome:
    """WANDB_MODE=bogus with logger=wandb: one warning, the run completes."""
    run_dir = scratch("wandb_mode")

    def check():
        done = cli("logger=wandb", f"hydra.run.dir={run_dir}", env={"WANDB_MODE": "bogus"})
        if done.returncode or "Traceback" in done.stderr:
            return f"exit {done.returncode}: {first_line(done.stderr)}"
        return each_prompt_once(run_dir) or (None if "W&B init failed" in done.stderr else "no W&B warning")
    return holds(check)


@probe(CLI, CLEAR, slow=True)
def sweep_mixing_valid_and_invalid_jobs() -> Outcome:
    """-m draft_length.k=2,0: the sweep is checked before any job starts, so the invalid job is named in one line,
    exit 2, and no job (not even the valid one) is launched."""
    sweep = scratch("sweep")
    done = command("-m", "experiments.run", "-m", *overrides(), "draft_length.k=2,0", f"hydra.sweep.dir={sweep}")
    if "Traceback" in done.stderr:
        return Outcome(TRACEBACK, first_line(done.stderr))
    last = [line for line in done.stderr.splitlines() if line.strip()][-1]
    launched = (sweep / "0").exists()
    if launched or done.returncode != 2 or "job 1" not in last or "draft_length.k=0" not in last:
        return Outcome(CONFUSING, f"exit {done.returncode}, {last!r}, a job was launched: {launched}")
    return Outcome(CLEAR, last)


# --- Report: odd rows files, huge files, mixed schema versions, environment ----------------------------------------

@probe(CLI, CORRECT)
def report_of_old_schema_rows_beside_new_ones() -> Outcome:
    """A run whose rows predate prompt_hash, lossless, compile_seconds, host and concurrent_jobs, beside a new run."""
    dropped = ("prompt_hash", "lossless", "compile_seconds", "host", "concurrent_jobs", "min_p")
    old = run_directory("old", [{k: v for k, v in row.items() if k not in dropped} for row in rows_of_run("old")])
    new = run_directory("new", rows_of_run("new"))
    out = scratch("out")
    return holds(lambda: report_counts(*report(old, new, out=out), out, runs=2, rows=8))


@probe(CLI, SILENTLY_ACCEPTED, before=TRACEBACK)
def report_of_metrics_outside_their_range() -> Outcome:
    """Rows with speedup -1 and acceptance_rate 5 (hand-edited): the clipped interval left its mean, and
    matplotlib refused negative error bars."""
    run_dir = run_directory("range", rows_of_run("range", speedup=-1.0, acceptance_rate=5.0))
    out = scratch("out")
    outcome = holds(lambda: report_counts(*report(run_dir, out=out), out, runs=1, rows=4))
    return Outcome(SILENTLY_ACCEPTED, "reported as given") if outcome.kind == CORRECT else outcome


@probe(CLI, CORRECT, before=TRACEBACK, slow=True)
def report_with_a_bogus_matplotlib_backend() -> Outcome:
    """MPLBACKEND=bogus in the environment: matplotlib's import raised."""
    run_dir = run_directory("backend", rows_of_run("backend"))
    done = command("-m", "analysis.report", str(run_dir), env={"MPLBACKEND": "bogus"})
    return holds(lambda: None if done.returncode == 0 else f"exit {done.returncode}: {first_line(done.stderr)}")


@probe(CLI, CORRECT)
def report_of_one_run_named_twice() -> Outcome:
    """The same run directory given twice, once through a symbolic link: counted once."""
    run_dir = run_directory("twice", rows_of_run("twice"))
    link = scratch("link") / "run"
    link.symlink_to(run_dir)
    out = scratch("out")
    return holds(lambda: report_counts(*report(run_dir, link, out=out), out, runs=1, rows=4))


@probe(CLI, CORRECT)
def report_of_a_sweep_and_one_of_its_jobs() -> Outcome:
    """A sweep directory and one of its job directories: each run counted once."""
    sweep = scratch("sweep")
    for job in ("0", "1"):
        (sweep / job).mkdir()
        (sweep / job / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows_of_run(f"job{job}")))
    out = scratch("out")
    return holds(lambda: report_counts(*report(sweep, sweep / "1", out=out), out, runs=2, rows=8))


@probe(CLI, CORRECT, slow=True)
def report_of_30000_rows() -> Outcome:
    """One run of 30000 rows (about 50 MB)."""
    row = json.loads(finished_rows()[0])
    rows = [{**row, "run_id": "big", "prompt_id": str(i), "prompt_hash": f"{i:012x}"} for i in range(30000)]
    run_dir, out = run_directory("big", rows), scratch("out")
    return holds(lambda: report_counts(*report(run_dir, out=out), out, runs=1, rows=30000))


@probe(CLI, CORRECT, before=TRACEBACK, slow=True)
def report_of_rows_that_lost_every_newline() -> Outcome:
    """10000 rows on one line (every newline lost): each parsed row copied the rest of the line (quadratic: a hang)."""
    row = json.loads(finished_rows()[0])
    run_dir = scratch("one_line")
    rows = [{**row, "run_id": "merged", "prompt_id": str(i), "prompt_hash": f"{i:012x}"} for i in range(10000)]
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(row) for row in rows) + "\n")
    out = scratch("out")
    return holds(lambda: report_counts(*report(run_dir, out=out), out, runs=1, rows=10000))


@probe(CLI, CLEAR, before=TRACEBACK, slow=True)
def report_of_a_megabyte_of_braces() -> Outcome:
    """A rows.jsonl line of 10**6 "{" after the rows: every "{" was tried and set aside alone (quadratic: a hang)."""
    run_dir = run_directory("braces", rows_of_run("braces"))
    with open(run_dir / "rows.jsonl", "a") as rows_file:
        rows_file.write("{" * 10**6 + "\n")
    out = scratch("out")
    try:
        with time_limit():
            code, err = report(run_dir, out=out)
    except Exception as error:  # every kind is classified
        return error_outcome(error, ())
    problem = report_counts(code, err, out, runs=1, rows=4)
    lines = [line for line in err.splitlines() if "left out" in line]
    if problem or len(lines) != 1 or len(lines[0]) > 300:
        return Outcome(CONFUSING, problem or f"warnings: {lines[:2]}")
    return Outcome(CLEAR, lines[0])


@probe(CLI, CORRECT)
def report_of_a_thousand_draft_positions() -> Outcome:
    """Rows with per_position_acceptance of 1000 entries (k up to the GPT-2 context)."""
    run_dir = run_directory("positions", rows_of_run("positions", k=1000, per_position_acceptance=[0.5] * 1000))
    out = scratch("out")
    return holds(lambda: report_counts(*report(run_dir, out=out), out, runs=1, rows=4))


@probe(CLI, CLEAR)
def report_of_a_metric_written_as_text() -> Outcome:
    """A row with "speedup": "1.5"."""
    return report_refusal(run_directory("text", rows_of_run("text", speedup="1.5")), named=("speedup", "'1.5'"))


def report_refusal(*paths: Path, named: tuple[str, ...]) -> Outcome:
    """A report that must refuse its input: clear when it exits 2 with one line naming ``named``."""
    try:
        with time_limit():
            code, err = report(*paths, out=scratch("out"))
    except Exception as error:  # every kind is classified
        return error_outcome(error, ())
    lines = [line for line in err.splitlines() if line.strip()]
    missing = [name for name in named if name not in err]
    if code == 0:
        return Outcome(SILENTLY_ACCEPTED, "report written")
    if code != 2 or len(lines) != 1 or missing:
        return Outcome(CONFUSING, f"exit {code}: {first_line(err)}")
    return Outcome(CLEAR, lines[0][:300])


@probe(CLI, CORRECT)
def report_of_pipes_and_backticks_in_names() -> Outcome:
    """A run directory and ids holding "|", "`" and non-ASCII letters."""
    rows = [{**row, "prompt_id": f"p|`{i}", "pair": "pä|ir"} for i, row in enumerate(rows_of_run("ü|n`i*"))]
    run_dir, out = run_directory("ünï|cødé`", rows), scratch("out")
    return holds(lambda: report_counts(*report(run_dir, out=out), out, runs=1, rows=4))


@probe(CLI, CORRECT)
def report_of_nan_and_infinity_literals() -> Outcome:
    """Rows holding the JSON extensions NaN and Infinity as metrics: read as undefined."""
    rows = rows_of_run("nan", speedup=float("inf"), cost_ratio=float("nan"))
    run_dir, out = run_directory("nan", rows), scratch("out")
    return holds(lambda: report_counts(*report(run_dir, out=out), out, runs=1, rows=4))


@probe(CLI, CLEAR)
def report_of_a_copied_run_directory() -> Outcome:
    """A run directory and a copy of it (one run_id in two places): refused rather than counted twice."""
    run_dir = run_directory("original", rows_of_run("copied"))
    copy = scratch("copy") / "run"
    shutil.copytree(run_dir, copy)
    return report_refusal(run_dir, copy, named=("run_id", "also used by"))


# --- CLI: config groups, overrides and the run command ----------------------------------------------------------------

@probe(CLI, CLEAR, before=CONFUSING, slow=True, issue=35)
def sweep_over_an_unknown_sampling_option() -> Outcome:
    """-m sampling=t1,t9: Hydra's "Could not find" in 11 lines, exit 1."""
    return command_refusal(command("-m", "experiments.run", "-m", *overrides(), "sampling=t1,t9",
                                   f"hydra.sweep.dir={scratch('sweep')}"), "sampling=t9", "t07_topp09")


@probe(CLI, CLEAR, before=CONFUSING, slow=True, issue=35)
def misspelt_launcher() -> Outcome:
    """hydra/launcher=slurmm."""
    return command_refusal(command("-m", "experiments.run", "-m", *overrides(), "hydra/launcher=slurmm",
                                   "draft_length.k=2", f"hydra.sweep.dir={scratch('sweep')}"), "hydra/launcher=slurmm",
                           "slurm")


@probe(CLI, CLEAR, before=CONFUSING, slow=True, issue=35)
def added_logger_with_a_misspelt_option() -> Outcome:
    """+logger=wand (an added group)."""
    return command_refusal(cli("+logger=wand", f"hydra.run.dir={scratch('run')}"), "logger=wand", "wandb")


@probe(CLI, CLEAR, before=CONFUSING, slow=True, issue=35)
def unknown_primary_config() -> Outcome:
    """--config-name nosuch."""
    return command_refusal(command("-m", "experiments.run", "--config-name", "nosuch"), "nosuch", "run")


@probe(CLI, CLEAR, before=CONFUSING, slow=True, issue=35)
def override_with_an_unclosed_bracket() -> Outcome:
    """drafter=tree drafter.branching=[2,1 (no closing bracket)."""
    return command_refusal(cli("drafter=tree", "drafter.branching=[2,1", f"hydra.run.dir={scratch('run')}"),
                           "drafter.branching=[2,1")


@probe(CLI, CORRECT, issue=35)
def cross_tokenizer_text_path_from_the_cli() -> Outcome:
    """drafter=cross_tokenizer drafter.translate=text on the tiny pair (one tokenizer, through its text)."""
    run_dir = scratch("text_path")
    return holds(lambda: decoded(run_dir, "drafter=cross_tokenizer", "drafter.translate=text"))


@probe(CLI, CLEAR, issue=35)
def cross_tokenizer_switch_as_yes() -> Outcome:
    """pair.cross_tokenizer=yes."""
    return refusal(lambda: validated("pair.cross_tokenizer=yes"), "pair.cross_tokenizer", "'yes'")


@probe(CLI, CORRECT, issue=35)
def dynamic_tree_with_typical_acceptance() -> Outcome:
    """drafter=dynamic_tree sampling=t1 strategy=typical."""
    run_dir = scratch("typical_tree")
    return holds(lambda: decoded(run_dir, "drafter=dynamic_tree", "sampling=t1", "strategy=typical"))


@probe(CLI, CLEAR, before=TRACEBACK, issue=35)
def tree_wider_than_the_tiny_vocabulary_from_the_cli() -> Outcome:
    """drafter=tree drafter.branching=[100] on the tiny pair (71 token ids)."""
    return refusal(lambda: run_app(scratch("wide_tree"), "drafter=tree", "drafter.branching=[100]"), "branching",
                   "71")


# --- CLI: the benches and tree_search -------------------------------------------------------------------------------

def tree_search_parse(argv: list[str]):
    from experiments import tree_search

    return tree_search.parse_args(argv)


@probe(CLI, CLEAR, before=CONFUSING, issue=35)
def tree_search_of_depth_zero() -> Outcome:
    """tree_search --max-depth 0."""
    return parse_refusal(tree_search_parse, ["--max-depth", "0"], "--max-depth", "'0'")


@probe(CLI, CLEAR, before=CONFUSING, issue=35)
def tree_search_with_an_empty_acceptance() -> Outcome:
    """tree_search --pair gpt2-xl-shaped --acceptance ''."""
    return parse_refusal(tree_search_parse, ["--pair", "gpt2-xl-shaped", "--acceptance", ""], "--acceptance")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def tree_search_over_the_shipped_tree_option() -> Outcome:
    """tree_search --config-name tree: it would overwrite configs/drafter/tree.yaml, the shipped option."""
    return parse_refusal(tree_search_parse, ["--config-name", "tree"], "tree.yaml", "not written by this search")


@probe(CLI, CORRECT, issue=35)
def tree_search_over_its_own_earlier_option() -> Outcome:
    """tree_search --config-name tree_searched (its own earlier output, rewritten)."""
    return parsed(tree_search_parse, ["--config-name", "tree_searched", "--out", str(scratch("out"))],
                  lambda args: None if args.config_name == "tree_searched" else "another name")


def tree_bench_parse(argv: list[str]):
    from experiments import tree_bench

    return tree_bench.parse_args(argv)


@probe(CLI, CLEAR, before=CONFUSING, issue=35)
def tree_bench_at_nan_temperature() -> Outcome:
    """tree_bench --temperature nan."""
    return parse_refusal(tree_bench_parse, ["--temperature", "nan"], "--temperature", "'nan'")


@probe(CLI, CLEAR, before=CONFUSING, issue=35)
def tree_bench_dynamic_tree_deeper_than_its_budget() -> Outcome:
    """tree_bench --dynamic 8-9-1."""
    return parse_refusal(tree_bench_parse, ["--dynamic", "8-9-1"], "--dynamic", "depth=9")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def tree_bench_writing_under_a_file() -> Outcome:
    """tree_bench --out <a file>/x (its tables are written after every method was measured)."""
    file = scratch("out") / "file"
    file.write_text("")
    return parse_refusal(tree_bench_parse, ["--out", str(file / "x" / "tables")], "--out", "is a file")


def bench_parse(argv: list[str]):
    from experiments import bench

    return bench.parse_args(argv)


@probe(CLI, CLEAR, before=CONFUSING, issue=35)
def bench_with_an_empty_k() -> Outcome:
    """bench --ks 1,,2."""
    return parse_refusal(bench_parse, ["--ks", "1,,2"], "--ks", "''")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def bench_output_directory_is_a_file() -> Outcome:
    """bench --out <an existing file>."""
    file = scratch("out") / "bench.md"
    file.write_text("")
    return parse_refusal(bench_parse, ["--out", str(file)], "--out", "is a file")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def bench_of_an_unknown_device() -> Outcome:
    """bench --device xla."""
    return parse_refusal(bench_parse, ["--device", "xla"], "--device", "'xla'")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def shapes_bench_plots_from_a_directory() -> Outcome:
    """shapes_bench --plot-from <a directory>."""
    from experiments import shapes_bench

    return parse_refusal(shapes_bench.parse_args, ["--plot-from", str(scratch("plots"))], "--plot-from", "directory")


@probe(CLI, CLEAR, before=CONFUSING, issue=35)
def gpu_suite_of_no_sections() -> Outcome:
    """gpu_suite --smoke --sections ''."""
    from experiments import gpu_suite

    return parse_refusal(gpu_suite.parse_args, ["--smoke", "--sections", ""], "--sections")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def train_pair_holding_out_everything() -> Outcome:
    """train_pair --heldout-frac 1 (no document left to train on)."""
    from experiments import train_pair

    return parse_refusal(train_pair.parse_args, ["--heldout-frac", "1"], "--heldout-frac", "(0, 1)")


@probe(CLI, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def train_pair_prompts_under_a_file() -> Outcome:
    """train_pair --prompts-out <a file>/prompts.jsonl (written after hours of training)."""
    from experiments import train_pair

    file = scratch("prompts") / "file"
    file.write_text("")
    return parse_refusal(train_pair.parse_args, ["--prompts-out", str(file / "prompts.jsonl")], "--prompts-out",
                         "is a file")


@probe(CLI, CLEAR, before=CONFUSING, issue=35)
def report_with_out_missing_its_value() -> Outcome:
    """analysis.report <dir> --out (no value): argparse's usage block and its error."""
    from analysis.report import parse_args

    return parse_refusal(parse_args, [str(scratch("runs")), "--out"], "--out")
