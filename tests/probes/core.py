"""The adversarial passes (issue 28's, then issue 35's, each "What it must show"): inputs nobody had tried before,
across the library, the experiment CLI, the benches and the report, and run-directory durability.

Each probe is a small function that tries one input and returns the ``Outcome`` it observed, in one of these classes:

- correct: a valid input, whose result is checked against a reference (greedy tokens, rows on disk, a report);
- clear: a bad input refused in one line, raised by a check of ours, naming the value and what is allowed;
- confusing: refused in several lines, by a message that misnames the problem, by another tool (Hydra), or a
  valid input refused; also a valid input whose result is right but surprising and unexplained;
- traceback: an error no check of ours raised (torch's, an IndexError, a Python traceback on stderr), or a hang
  (no result within the probe's time limit: the user must kill it);
- silently wrong: a wrong output, or a row lost or counted twice;
- silently accepted: a bad input that runs.

``PROBES`` lists every probe with the pass it belongs to (``issue``: 28 or 35), the class it must have now
(``expected``) and, where its pass fixed it, the class it had before (``before``). This module holds the classes,
the registry, the shared material and the table; the probes live beside it by the part they try (``library``,
``drafters``, ``cli``, ``durability``). tests/test_adversarial.py runs them. ``python tests/adversarial.py`` (from
the repository root) runs them all and prints one table per pass, those of docs/reliability.md's "Adversarial
passes"; ``--issue 35`` runs one pass; ``-v`` lists every probe.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from conftest import CONFIGS, REPO, WORDS, hf_greedy, left_pad, random_prompts, tiny_gpt2, tiny_overrides

CORRECT, CLEAR, CONFUSING = "correct", "clear", "confusing"
TRACEBACK, SILENTLY_WRONG, SILENTLY_ACCEPTED = "traceback", "silently wrong", "silently accepted"
CLASSES = (CORRECT, CLEAR, CONFUSING, TRACEBACK, SILENTLY_WRONG, SILENTLY_ACCEPTED)
FAILURES = (TRACEBACK, SILENTLY_WRONG)  # what no probe may show
LIBRARY, CLI, DURABILITY = "library", "CLI and report", "durability"
AREAS = (LIBRARY, CLI, DURABILITY)
OUR_CODE = tuple(str(REPO / package) + os.sep for package in ("specdec", "experiments", "analysis"))
TIME_LIMIT = 60  # seconds a probe's call may take before it counts as a hang


@dataclass(frozen=True)
class Outcome:
    kind: str  # one of CLASSES
    detail: str  # what was seen: the error's first line, or what differed


@dataclass(frozen=True)
class Probe:
    area: str
    name: str
    run: Callable[[], Outcome]
    expected: str  # the class it must have
    before: str | None  # the class it had before its pass fixed it; None: unchanged
    slow: bool  # runs subprocesses or large inputs (tests/test_adversarial.py marks it slow)
    issue: int  # the pass that added it (ISSUES)

    @property
    def description(self) -> str:
        return " ".join((self.run.__doc__ or self.name).split())


PROBES: list[Probe] = []
ISSUES = (28, 35, 43)  # the passes, in order


def probe(area: str, expected: str, before: str | None = None, slow: bool = False, issue: int = 28):
    """Register the decorated function as a probe of ``area``, added by the pass of ``issue``, that must now be
    ``expected``."""
    def register(function: Callable[[], Outcome]) -> Callable[[], Outcome]:
        PROBES.append(Probe(area, function.__name__, function, expected, before, slow, issue))
        return function
    return register


# --- Classifying what happened ---------------------------------------------------------------------------------------

class Hang(Exception):
    """A call ran past ``TIME_LIMIT``."""


@contextlib.contextmanager
def time_limit(seconds: int = TIME_LIMIT):
    """Raise ``Hang`` in the main thread once ``seconds`` have passed (Python code is interrupted between lines)."""
    def hang(signum, frame):
        raise Hang(f"no result after {seconds} s")
    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def first_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def raised_by_a_check(error: BaseException) -> bool:
    """Whether ``error`` was raised on purpose by specdec, experiments or analysis (a ``raise`` line of ours), not by
    torch, Python or a bug of ours that tripped over the input."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return frame.filename.startswith(OUR_CODE) and (frame.line or "").lstrip().startswith("raise")


def error_outcome(error: BaseException, named: tuple[str, ...]) -> Outcome:
    """A refusal: clear when one line of ours names every string of ``named``; confusing when ours but not that;
    a traceback otherwise."""
    message = str(error).strip()
    if isinstance(error, Hang) or not raised_by_a_check(error):
        return Outcome(TRACEBACK, f"{type(error).__name__}: {first_line(message)}")
    missing = [name for name in named if name not in message]
    if "\n" in message or missing:
        return Outcome(CONFUSING, f"{first_line(message)}" + (f" (does not name {missing})" if missing else ""))
    return Outcome(CLEAR, message[:300])


def refusal(call: Callable[[], object], *named: str) -> Outcome:
    """The outcome of a call that must refuse its input, naming each of ``named``."""
    try:
        with time_limit():
            call()
    except Exception as error:  # every kind is classified
        return error_outcome(error, named)
    return Outcome(SILENTLY_ACCEPTED, "ran without complaint")


def agreement(call: Callable[[], object], expected: object) -> Outcome:
    """The outcome of a call with valid input whose result must equal ``expected``."""
    try:
        with time_limit():
            result = call()
    except Exception as error:  # every kind is classified
        outcome = error_outcome(error, ())
        return outcome if outcome.kind == TRACEBACK else Outcome(CONFUSING, f"valid input refused: {outcome.detail}")
    if result == expected:
        return Outcome(CORRECT, "as expected")
    return Outcome(SILENTLY_WRONG, f"got {str(result)[:150]}, expected {str(expected)[:150]}")


def holds(call: Callable[[], str | None]) -> Outcome:
    """The outcome of a valid input checked by ``call``, which returns what is wrong (None when all is right)."""
    return agreement(call, None)


# --- Shared material -------------------------------------------------------------------------------------------------

@functools.cache
def scratch_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="specdec-adversarial-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def scratch(name: str) -> Path:
    """A new empty directory for one probe."""
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch_root()))


@functools.cache
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """(target, draft): tiny float64 GPT-2s sharing a 97-token vocabulary, 128 positions."""
    return tiny_gpt2(0, layers=3), tiny_gpt2(1, layers=1)


PROMPTS = random_prompts([6, 6, 6], seed=3)  # three rows, no padding
RAGGED = random_prompts([3, 7, 5], seed=11)  # three rows, left-padded


def batch(prompts: list[list[int]] = PROMPTS) -> tuple[torch.Tensor, torch.Tensor]:
    return left_pad(prompts)


@functools.cache
def greedy(prompts: tuple[tuple[int, ...], ...], new: int, eos: int | None = None) -> list[list[int]]:
    """transformers' greedy continuation of each prompt alone: the reference."""
    return [hf_greedy(models()[0], list(prompt), new, eos_token_id=eos) for prompt in prompts]


def reference(prompts: list[list[int]] = PROMPTS, new: int = 10, eos: int | None = None) -> list[list[int]]:
    return greedy(tuple(map(tuple, prompts)), new, eos)


def generate(input_ids=None, draft="default", **options) -> list[list[int]]:
    """``specdec.generate`` on the tiny target (drafted by the tiny draft unless ``draft`` says otherwise)."""
    import specdec

    target, default_draft = models()
    input_ids = batch()[0] if input_ids is None else input_ids
    draft = default_draft if draft == "default" else draft
    return specdec.generate(target, input_ids, draft=draft, **{"max_new_tokens": 10, **options}).tokens


@functools.cache
def tiny_files() -> dict:
    """A saved draft/target pair with a word-level tokenizer and a prompt file (as tests/conftest.py's ``tiny``)."""
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    root = scratch("tiny")
    vocab = {token: i for i, token in enumerate(["<unk>", "<pad>", "<eos>", *WORDS])}
    core = Tokenizer(token_models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    for role, layers, seed in (("target", 2, 0), ("draft", 1, 1)):
        torch.manual_seed(seed)
        config = GPT2Config(vocab_size=len(vocab), n_positions=128, n_embd=32, n_layer=layers, n_head=2,
                            bos_token_id=2, eos_token_id=2)
        GPT2LMHeadModel(config).save_pretrained(root / role)
        tokenizer.save_pretrained(root / role)
    texts = ["the first time he said", "she was not there", "they will have one more", "what is it that you",
             "in the new time we", "it was the only one of them"]
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return {"draft": str(root / "draft"), "target": str(root / "target"), "prompts": str(prompts),
            "num_prompts": len(texts)}


def overrides(**extra) -> list[str]:
    """A run of 4 prompts of 4 new tokens on the tiny pair, without warm-up, with ``extra`` keys."""
    return tiny_overrides(tiny_files(), **{"num_prompts": 4, "max_new_tokens": 4, "warmup": 0, **extra})


def composed(extra: list[str], hydra: bool = False):
    """The composed run config of ``overrides()`` and ``extra``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("run", overrides=[*overrides(), *extra], return_hydra_config=hydra)


def validated(*extra: str) -> object:
    """Validate a run config as `python -m experiments.run` does before any model loads."""
    from experiments.config_checks import validate

    return validate(composed(list(extra)))


def run_app(run_dir: Path, *extra: str) -> str:
    """One run in-process into ``run_dir`` (the runner `python -m experiments.run` calls); returns its stderr."""
    from omegaconf import open_dict

    from experiments import runner

    cfg = composed(list(extra), hydra=True)
    job = runner.Job(run_dir, run_dir.name, dict(cfg.hydra.runtime.choices), run_dir.parent)
    with open_dict(cfg):
        del cfg["hydra"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        runner.run(cfg, job)
    return err.getvalue()


def command(*args: str, env: dict | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root (offline, W&B offline), optionally under ``prefix`` (setpriv)."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                   "WANDB_DIR": str(scratch("wandb")), **(env or {})}
    return subprocess.run([*prefix, sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          env=environment, timeout=300)


def cli(*extra: str, env: dict | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return command("-m", "experiments.run", *overrides(), *extra, env=env, prefix=prefix)


def command_refusal(done: subprocess.CompletedProcess, *named: str) -> Outcome:
    """A command that must refuse its input: clear when it exits 2 with one line on stderr naming ``named``."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if "Traceback (most recent call last)" in done.stderr:
        return Outcome(TRACEBACK, lines[-1] if lines else "")
    if done.returncode == 0:
        return Outcome(SILENTLY_ACCEPTED, "exit 0")
    missing = [name for name in named if name not in done.stderr]
    if done.returncode != 2 or len(lines) != 1 or missing:
        return Outcome(CONFUSING, f"exit {done.returncode}, {len(lines)} line(s): {first_line(done.stderr)}")
    return Outcome(CLEAR, lines[0][:300])


def rows_on_disk(run_dir: Path) -> list[dict]:
    """Strictly: every line of rows.jsonl is one JSON row."""
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def each_prompt_once(run_dir: Path, count: int = 4) -> str | None:
    """What is wrong with a finished run directory (None: every prompt once, one run, a summary counting them)."""
    rows = rows_on_disk(run_dir)
    times = Counter(row["prompt_id"] for row in rows)
    if len(times) != count or set(times.values()) != {1}:
        return f"{len(rows)} rows for {count} prompts: {dict(times)}"
    if len({row["run_id"] for row in rows}) != 1:
        return "rows of several runs"
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("status") != "complete" or summary.get("prompts") != count:
        return f"summary counts {summary.get('prompts')} prompts, status {summary.get('status')}"
    return None


def decoded(run_dir: Path, *extra: str, count: int = 4) -> str | None:
    """Run in-process into ``run_dir``; what is wrong with the result (None: every prompt once)."""
    run_app(run_dir, *extra)
    return each_prompt_once(run_dir, count)


@functools.cache
def finished_rows() -> tuple[str, ...]:
    """The rows of one finished run of the tiny pair, as JSON lines."""
    run_dir = scratch("finished")
    run_app(run_dir)
    return tuple(line for line in (run_dir / "rows.jsonl").read_text().splitlines())


def run_directory(name: str, rows: list[dict], summary: bool = True) -> Path:
    """A run directory holding ``rows`` (and a summary: the run finished)."""
    run_dir = scratch(name)
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if summary:
        (run_dir / "summary.json").write_text(json.dumps({"status": "complete", "prompts": len(rows)}))
    return run_dir


def rows_of_run(run_id: str, **columns) -> list[dict]:
    """The finished run's rows under another run_id, with ``columns`` set in each."""
    return [{**json.loads(line), "run_id": run_id, **columns} for line in finished_rows()]


def report(*paths: Path, out: Path) -> tuple[int, str]:
    """``python -m analysis.report PATHS --out OUT`` in-process: (exit code, stderr)."""
    from analysis import report as report_app

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = report_app.main([*map(str, paths), "--out", str(out)])
    return code, err.getvalue()


def report_counts(code: int, err: str, out: Path, runs: int, rows: int) -> str | None:
    """What is wrong with a report that must load ``runs`` runs of ``rows`` rows in all."""
    if code != 0:
        return f"exit {code}: {first_line(err)}"
    header = (out / "report.md").read_text().splitlines()[3]
    if f"- {runs} runs, {rows} (run, prompt) rows" not in header:
        return f"report says {header!r}"
    return None


NOT_RUN = "not run"  # a probe this machine cannot run (counted nowhere)


# === Issue 35's pass: the newest parts (trees, dynamic trees, the cross-tokenizer drafter, the benches and
# tree_search, the config groups, damaged run directories), none of them tried above or in issue 35's list ========

def parse_refusal(parse: Callable[[list[str]], object], argv: list[str], *named: str) -> Outcome:
    """A command's argument parsing (``parse_args``, in-process) that must refuse ``argv``: clear when it exits 2
    with one line on stderr naming ``named``."""
    err = io.StringIO()
    try:
        with time_limit(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(argv)
    except SystemExit as exited:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        missing = [name for name in named if name not in err.getvalue()]
        if exited.code != 2 or len(lines) != 1 or missing:
            return Outcome(CONFUSING, f"exit {exited.code}, {len(lines)} line(s): {first_line(err.getvalue())}")
        return Outcome(CLEAR, lines[0][:300])
    except Exception as error:  # every kind is classified
        return error_outcome(error, named)
    return Outcome(SILENTLY_ACCEPTED, "parsed without complaint")


def parsed(parse: Callable[[list[str]], object], argv: list[str], check: Callable[[object], str | None]) -> Outcome:
    """A command's valid arguments: parsed without complaint, and ``check(args)`` finds nothing wrong."""
    def run():
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                return check(parse(argv))
            except SystemExit as exited:
                return f"refused (exit {exited.code})"
    return holds(run)


def small_models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """(target, draft) sharing a vocabulary of 8 ids."""
    return tiny_gpt2(0, layers=2, vocab=8), tiny_gpt2(1, layers=1, vocab=8)


def decoded_with(drafter, temperature: float = 0.0, new: int = 10, prompts: list[list[int]] = PROMPTS,
                 **options) -> list[list[int]]:
    """The tiny target's tokens with ``drafter`` (k = 3), from a Decoder built with ``options``."""
    import specdec

    decoder = specdec.Decoder(models()[0], drafter, specdec.Speculative(), specdec.FixedLength(3),
                              specdec.SamplingConfig(temperature), **options)
    return decoder.generate(*batch(prompts), max_new_tokens=new).tokens


# --- The table -------------------------------------------------------------------------------------------------------

def run_probe(probe_: Probe) -> Outcome:
    """The probe's outcome; an error escaping the probe itself is a traceback."""
    try:
        torch.set_num_threads(1)
        return probe_.run()
    except Exception as error:  # a probe that breaks counts against the pass, never silently
        return Outcome(TRACEBACK, f"the probe itself raised {type(error).__name__}: {first_line(str(error))}")


def table(outcomes: dict[str, Outcome], issue: int | None = None) -> str:
    """The Markdown table of docs/reliability.md: tries and outcomes by area, for the probes of one pass (``issue``;
    None: all) that ran (probes not run are left out)."""
    probes = [probe_ for probe_ in PROBES if issue in (None, probe_.issue) and probe_.name in outcomes]
    header = ["area", "tries", *CLASSES]
    lines = [header, ["---"] * len(header)]
    for area in (*AREAS, "all"):
        kinds = [outcome.kind for probe_ in probes if area in (probe_.area, "all")
                 for outcome in [outcomes[probe_.name]] if outcome.kind != NOT_RUN]
        lines.append([area, len(kinds), *(sum(kind == name for kind in kinds) or "–" for name in CLASSES)])
    return "\n".join("| " + " | ".join(map(str, line)) + " |" for line in lines)


def before_table(issue: int) -> str:
    """The same table as the probes of one pass were registered before that pass fixed them (``before``)."""
    return table({probe_.name: Outcome(probe_.before or probe_.expected, "") for probe_ in PROBES
                  if probe_.issue == issue}, issue)


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    issues = [int(argv[argv.index("--issue") + 1])] if "--issue" in argv else list(ISSUES)
    outcomes = {}
    for probe_ in PROBES:
        if probe_.issue not in issues:
            continue
        start = time.perf_counter()
        outcomes[probe_.name] = outcome = run_probe(probe_)
        if verbose:
            flag = "" if outcome.kind == probe_.expected else f"  (expected {probe_.expected})"
            print(f"{probe_.issue} {probe_.area:>14} | {outcome.kind:<17} | {time.perf_counter() - start:5.1f} s | "
                  f"{probe_.name}: {outcome.detail[:160]}{flag}", flush=True)
    for issue in issues:
        print(f"\nIssue {issue}'s pass\n\n{table(outcomes, issue)}")
    unexpected = [name for name, outcome in outcomes.items()
                  if outcome.kind in FAILURES or outcome.kind not in (NOT_RUN, next(p.expected for p in PROBES
                                                                                      if p.name == name))]
    return 1 if unexpected else 0
