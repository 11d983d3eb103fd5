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
(``expected``) and, where its pass fixed it, the class it had before (``before``). tests/test_adversarial.py runs
them. ``python tests/adversarial.py`` (from the repository root) runs them all and prints one table per pass, those
of docs/reliability.md's "Adversarial passes"; ``--issue 35`` runs one pass; ``-v`` lists every probe.
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
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

if __name__ == "__main__":  # run as a script: specdec, experiments and analysis import from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
ISSUES = (28, 35)  # the passes, in order


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


# --- Library: odd dtypes, shapes, devices and values ---------------------------------------------------------------

@probe(LIBRARY, CORRECT)
def int32_input_ids() -> Outcome:
    """input_ids as int32: the same tokens as int64."""
    return agreement(lambda: generate(batch()[0].int()), reference())


@probe(LIBRARY, CLEAR, before=CONFUSING)
def uint8_input_ids() -> Outcome:
    """input_ids as uint8 (an integer dtype the embedding refuses)."""
    return refusal(lambda: generate(batch()[0].to(torch.uint8)), "torch.uint8", "int64")


@probe(LIBRARY, CORRECT)
def strided_input_ids() -> Outcome:
    """Non-contiguous input_ids (every other column of a wider batch)."""
    wide = torch.tensor(random_prompts([12, 12, 12], seed=3))
    return agreement(lambda: generate(wide[:, ::2]), reference(wide[:, ::2].tolist()))


@probe(LIBRARY, CORRECT)
def expanded_input_ids() -> Outcome:
    """One prompt expanded (stride 0) to four rows."""
    return agreement(lambda: generate(batch()[0][:1].expand(4, -1)), [reference()[0]] * 4)


@probe(LIBRARY, CORRECT)
def bool_attention_mask() -> Outcome:
    """A bool attention mask on a ragged batch."""
    ids, mask = batch(RAGGED)
    return agreement(lambda: generate(ids, attention_mask=mask.bool()), reference(RAGGED))


@probe(LIBRARY, CORRECT)
def expanded_attention_mask() -> Outcome:
    """An attention mask expanded from one row."""
    return agreement(lambda: generate(attention_mask=torch.ones(1, 6, dtype=torch.long).expand(3, -1)), reference())


@probe(LIBRARY, CORRECT)
def negative_padding_ids() -> Outcome:
    """Padding positions holding -100 (a label id), masked out."""
    ids, mask = batch(RAGGED)
    return agreement(lambda: generate(ids.masked_fill(mask == 0, -100), attention_mask=mask), reference(RAGGED))


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def meta_input_ids_to_a_decoder() -> Outcome:
    """Decoder.generate with input_ids on the meta device (generate() checked devices, Decoder did not)."""
    import specdec

    return refusal(lambda: specdec.Decoder(models()[0]).generate(batch()[0].to("meta")), "meta", "cpu")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def meta_input_ids_to_the_device_step() -> Outcome:
    """The device step (step="device") given input_ids on the meta device."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), step="device")
    return refusal(lambda: decoder.generate(batch()[0].to("meta")), "meta", "cpu")


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_max_new_tokens() -> Outcome:
    """max_new_tokens as np.int64 (seeds and EOS ids took numpy integers, sizes did not)."""
    return agreement(lambda: generate(max_new_tokens=np.int64(10)), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_k() -> Outcome:
    """k as np.int64."""
    return agreement(lambda: generate(k=np.int64(3)), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_top_k() -> Outcome:
    """top_k=np.int64(1) at temperature 1: the argmax, so greedy tokens."""
    return agreement(lambda: generate(temperature=1.0, top_k=np.int64(1)), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_float32_temperature() -> Outcome:
    """temperature as np.float32 (np.float64 passed, being a float subclass), with top_k=1: greedy tokens."""
    return agreement(lambda: generate(temperature=np.float32(0.7), top_k=1), reference())


@probe(LIBRARY, CLEAR)
def numpy_temperature_below_the_floor() -> Outcome:
    """temperature np.float64(1e-40), below the floor."""
    return refusal(lambda: generate(temperature=np.float64(1e-40)), "temperature", "1e-30")


@probe(LIBRARY, CORRECT)
def one_new_token_with_k_4() -> Outcome:
    """max_new_tokens=1 with k=4."""
    return agreement(lambda: generate(k=4, max_new_tokens=1), [row[:1] for row in reference()])


@probe(LIBRARY, CORRECT)
def k_larger_than_the_budget() -> Outcome:
    """k=8 with max_new_tokens=3."""
    return agreement(lambda: generate(k=8, max_new_tokens=3), [row[:3] for row in reference()])


@probe(LIBRARY, CORRECT)
def top_p_1e_minus_9() -> Outcome:
    """top_p=1e-9 at temperature 1 keeps only the top token: greedy tokens."""
    return agreement(lambda: generate(temperature=1.0, top_p=1e-9), reference())


@probe(LIBRARY, CORRECT)
def min_p_1() -> Outcome:
    """min_p=1 at temperature 1 keeps only the top token: greedy tokens."""
    return agreement(lambda: generate(temperature=1.0, min_p=1.0), reference())


@probe(LIBRARY, CORRECT)
def temperature_1e30_drafting_with_the_target() -> Outcome:
    """temperature=1e30 (all but uniform) with the target as its own draft: every draft is accepted."""
    import specdec

    target = models()[0]
    return agreement(lambda: specdec.generate(target, batch()[0], draft=target, temperature=1e30, max_new_tokens=10)
                     .stats.acceptance_rate, 1.0)


@probe(LIBRARY, CORRECT)
def every_vocabulary_id_is_eos() -> Outcome:
    """eos_token_id listing all 97 ids: each row stops after one token."""
    return agreement(lambda: generate(eos_token_id=list(range(97))), [row[:1] for row in reference()])


@probe(LIBRARY, CORRECT)
def eos_ids_as_a_set() -> Outcome:
    """eos_token_id as a Python set."""
    eos = reference()[1][4]
    return agreement(lambda: generate(eos_token_id={eos, 96}), generate(eos_token_id=[eos, 96]))


@probe(LIBRARY, CORRECT)
def eos_equal_to_the_last_prompt_token() -> Outcome:
    """EOS equal to the prompt's last token: only an emitted EOS stops a row."""
    prompt = RAGGED[0]
    return agreement(lambda: generate(torch.tensor([prompt]), eos_token_id=prompt[-1], max_new_tokens=12),
                     reference([prompt], 12, prompt[-1]))


@probe(LIBRARY, CORRECT)
def the_target_drafting_for_itself() -> Outcome:
    """The same module object as draft and target."""
    return agreement(lambda: generate(draft=models()[0]), reference())


@probe(LIBRARY, CORRECT)
def float32_draft_for_a_float64_target() -> Outcome:
    """A float32 draft for a float64 target (greedy tokens are the target's)."""
    return agreement(lambda: generate(draft=tiny_gpt2(1, layers=1).float()), reference())


@probe(LIBRARY, CORRECT)
def bfloat16_draft() -> Outcome:
    """A bfloat16 draft for a float64 target."""
    return agreement(lambda: generate(draft=tiny_gpt2(1, layers=1).to(torch.bfloat16)), reference())


@probe(LIBRARY, CORRECT)
def seed_minus_one() -> Outcome:
    """seed=-1, which torch wraps to 2**64 - 1."""
    return agreement(lambda: generate(temperature=1.0, seed=-1), generate(temperature=1.0, seed=2**64 - 1))


@probe(LIBRARY, CORRECT)
def prompt_one_short_of_the_context_with_k_4() -> Outcome:
    """A prompt of 127 tokens (context 128) with k=4: one token fits."""
    prompt = random_prompts([127], seed=5)[0]
    return agreement(lambda: generate(torch.tensor([prompt]), k=4, max_new_tokens=5), reference([prompt], 1))


@probe(LIBRARY, CORRECT)
def a_million_new_tokens() -> Outcome:
    """max_new_tokens=10**6 with a 128-position context: the context bounds the output."""
    prompt = RAGGED[0]
    return agreement(lambda: generate(torch.tensor([prompt]), max_new_tokens=10**6), reference([prompt], 125))


@probe(LIBRARY, CORRECT)
def a_thousand_one_token_prompts() -> Outcome:
    """A batch of 1000 one-token prompts; some rows compared with the same prompt alone."""
    ids = torch.randint(1, 97, (1000, 1), generator=torch.Generator().manual_seed(0))
    rows = [0, 17, 999]
    return agreement(lambda: [generate(ids, k=3, max_new_tokens=4)[row] for row in rows],
                     reference([ids[row].tolist() for row in rows], 4))


@probe(LIBRARY, CORRECT)
def a_thousand_one_token_prompts_on_the_device_step() -> Outcome:
    """The same batch of 1000 one-token prompts on the device step."""
    import specdec

    target, draft = models()
    ids = torch.randint(1, 97, (1000, 1), generator=torch.Generator().manual_seed(0))
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Greedy(), specdec.FixedLength(3),
                              step="device")
    rows = [0, 17, 999]
    return agreement(lambda: [decoder.generate(ids, max_new_tokens=4).tokens[row] for row in rows],
                     reference([ids[row].tolist() for row in rows], 4))


def batch_sizes_on_one_decoder(decoder, release_after: set[int]) -> list[list[list[int]]]:
    """Calls with batch sizes 1, 5, 2, 7 on one decoder, released after the sizes in ``release_after``."""
    results = []
    for size in (1, 5, 2, 7):
        prompts = random_prompts([3 + i for i in range(size)], seed=size)
        results.append(decoder.generate(*batch(prompts), max_new_tokens=8).tokens)
        if size in release_after:
            decoder.release()
    return results


def each_alone(sizes=(1, 5, 2, 7)) -> list[list[list[int]]]:
    return [reference(random_prompts([3 + i for i in range(size)], seed=size), 8) for size in sizes]


@probe(LIBRARY, CORRECT)
def batch_sizes_with_release_between_calls() -> Outcome:
    """One Decoder called with batch sizes 1, 5, 2, 7, released after every call."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Greedy(), specdec.FixedLength(3))
    return agreement(lambda: batch_sizes_on_one_decoder(decoder, {1, 5, 2, 7}), each_alone())


@probe(LIBRARY, CORRECT)
def static_caches_across_batch_sizes() -> Outcome:
    """Static caches and transformers' forward, batch sizes 1, 5, 2, 7, released once midway."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft, cache_layout="static", forward="transformers"),
                              specdec.Greedy(), specdec.FixedLength(3), cache_layout="static", forward="transformers")
    return agreement(lambda: batch_sizes_on_one_decoder(decoder, {5}), each_alone())


@probe(LIBRARY, CORRECT)
def int32_ids_for_every_drafter_and_policy() -> Outcome:
    """int32 ids and mask, a ragged batch whose rows end at an EOS at different steps, for each of 4 drafters x 4
    policies: each row equals its prompt alone."""
    import specdec

    target, draft = models()
    prompts = random_prompts([3, 7, 5, 9, 4], seed=11)
    eos = reference(prompts, 12)[1][3]
    ids, mask = batch(prompts)
    drafters = [lambda: specdec.ModelDrafter(draft), lambda: specdec.NGramDrafter(),
                lambda: specdec.TreeDrafter(draft, (2, 1)), lambda: specdec.EarlyExitDrafter(target, 1)]
    policies = [lambda: specdec.FixedLength(3), lambda: specdec.HeuristicLength(), lambda: specdec.ConfidenceLength(0.3, 5),
                lambda: specdec.CostOptimalLength()]

    def every_pairing():
        return [specdec.Decoder(target, make_drafter(), specdec.Speculative(), make_policy())
                .generate(ids.int(), mask.int(), 12, eos).tokens for make_drafter in drafters for make_policy in policies]
    return agreement(every_pairing, [reference(prompts, 12, eos)] * 16)


@probe(LIBRARY, CORRECT)
def a_tree_of_200_levels() -> Outcome:
    """TreeDrafter with 200 levels of one child, drafting 60 levels a step."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.TreeDrafter(draft, (1,) * 200), specdec.Greedy(),
                              specdec.FixedLength(60))
    return agreement(lambda: decoder.generate(batch()[0], max_new_tokens=10).tokens, reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_tree_branching() -> Outcome:
    """TreeDrafter branching (np.int64(2), 1): it was refused, naming the list, as if np.int64(2) were no integer."""
    import specdec

    return agreement(lambda: specdec.TreeDrafter(models()[1], (np.int64(2), 1)).branching, (2, 1))


@probe(LIBRARY, CORRECT, before=TRACEBACK)
def ngram_max_ngram_of_a_billion() -> Outcome:
    """NGramDrafter(max_ngram=10**9): its search looped over every n up to 10**9 each step (a hang)."""
    import specdec

    target = models()[0]
    decoder = specdec.Decoder(target, specdec.NGramDrafter(max_ngram=10**9), specdec.Greedy(), specdec.FixedLength(3))
    return agreement(lambda: decoder.generate(batch()[0], max_new_tokens=10).tokens, reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def a_draft_with_a_shorter_context() -> Outcome:
    """A draft of 16 positions for a target of 128, max_new_tokens=30 after 6-token prompts: the output stops at the
    draft's context (10 tokens), as tests/test_cross_tokenizer.py expects; nothing said why, and now a warning does."""
    cut = [row[:10] for row in reference(new=30)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = agreement(lambda: generate(draft=tiny_gpt2(1, layers=1, positions=16), max_new_tokens=30), cut)
    said = [str(warning.message) for warning in caught if "drafter's context (16 positions)" in str(warning.message)]
    if outcome.kind == CORRECT and not said:
        return Outcome(CONFUSING, "the target's greedy tokens, cut at the draft's context (10 of 30), unexplained")
    return outcome


@probe(LIBRARY, CLEAR)
def nan_only_in_the_padding_tokens_embedding() -> Outcome:
    """NaN in the embedding of the padding id alone (no prompt uses it), a padded batch: NaN flows through the
    masked padding, and the call refuses."""
    target = tiny_gpt2(0, layers=3)
    with torch.no_grad():
        target.transformer.wte.weight[0] = float("nan")
    import specdec

    ids, mask = batch(RAGGED)
    return refusal(lambda: specdec.generate(target, ids, attention_mask=mask, max_new_tokens=6), "target", "NaN")


# --- Library: custom parts with bugs -------------------------------------------------------------------------------

def scripted_drafter(make: Callable[[int, int], object]):
    """A custom drafter whose proposal is ``make(batch_size, k)``: a drafter with a bug."""
    import specdec

    class Scripted(specdec.Drafter):
        name = "scripted"

        def start(self, input_ids, attention_mask):
            self.batch_size = input_ids.shape[0]

        def propose(self, k, sampling, generator, stop=None):
            return make(self.batch_size, k)

        def commit(self, outcome):
            """Learns nothing."""

    return Scripted()


def proposal(tokens: torch.Tensor, probs: torch.Tensor | None = None):
    from specdec.layout import Proposal

    return Proposal(tokens, probs)


def decode_with(drafter=None, policy=None, strategy=None, temperature: float = 1.0) -> list[list[int]]:
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, drafter or specdec.ModelDrafter(draft), strategy or specdec.Speculative(),
                              policy or specdec.FixedLength(3), specdec.SamplingConfig(temperature=temperature))
    return decoder.generate(batch()[0], max_new_tokens=10).tokens


LONG = torch.long


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_more_than_k() -> Outcome:
    """A custom drafter proposing k + 5 tokens."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k + 5, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "scripted", "k=")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_dropping_a_row() -> Outcome:
    """A custom drafter proposing for B - 1 rows."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b - 1, k, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "scripted", "rows")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_floats() -> Outcome:
    """A custom drafter proposing float32 tokens."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k)))
    return refusal(lambda: decode_with(drafter), "scripted", "torch.float32")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_on_another_device() -> Outcome:
    """A custom drafter proposing tokens on the meta device."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k, dtype=LONG, device="meta")))
    return refusal(lambda: decode_with(drafter), "scripted", "meta")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_ids_outside_the_vocabulary() -> Outcome:
    """A custom drafter proposing token id 500 (vocabulary 97), greedy."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.full((b, k), 500, dtype=LONG)))
    return refusal(lambda: decode_with(drafter, temperature=0.0), "scripted", "vocabulary")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_negative_ids() -> Outcome:
    """A custom drafter proposing token id -1, sampling."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.full((b, k), -1, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "scripted", "vocabulary")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_returning_a_tensor() -> Outcome:
    """A custom drafter returning a bare tensor instead of a Proposal."""
    drafter = scripted_drafter(lambda b, k: torch.ones(b, k, dtype=LONG))
    return refusal(lambda: decode_with(drafter), "scripted", "Proposal")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_with_probs_over_another_vocabulary() -> Outcome:
    """A custom drafter whose q spans 5 tokens (the target's vocabulary: 97)."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k, dtype=LONG), torch.full((b, k, 5), 0.2)))
    return refusal(lambda: decode_with(drafter), "scripted", "probs")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_building_a_one_dimensional_proposal() -> Outcome:
    """A custom drafter building Proposal(tokens [B]) (no draft axis)."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "tokens", "[B, N]")


@probe(LIBRARY, CORRECT)
def custom_drafter_proposing_nothing() -> Outcome:
    """A custom drafter proposing zero tokens when asked for k: plain greedy decoding."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, 0, dtype=LONG)))
    return agreement(lambda: decode_with(drafter, temperature=0.0), reference())


def scripted_policy(k: object, max_k: object = 4):
    """A custom draft-length policy answering ``k`` with ``max_k``: a policy with a bug."""
    import specdec

    class Scripted(specdec.DraftLengthPolicy):
        name = "scripted"

        @property
        def max_k(self):
            return max_k

        def next_k(self):
            return k

    return Scripted()


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def policy_answering_a_float() -> Outcome:
    """A custom policy whose next_k() is 2.5."""
    return refusal(lambda: decode_with(policy=scripted_policy(2.5)), "scripted", "2.5")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def policy_answering_beyond_its_max_k() -> Outcome:
    """A custom policy asking k=9 with max_k=4, sampling."""
    return refusal(lambda: decode_with(policy=scripted_policy(9, 4)), "scripted", "9", "max_k=4")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def policy_without_a_max_k() -> Outcome:
    """A custom policy whose max_k is None."""
    return refusal(lambda: decode_with(policy=scripted_policy(2, None)), "scripted", "max_k")


@probe(LIBRARY, CORRECT)
def policy_answering_zero() -> Outcome:
    """A custom policy answering k=0 every step: plain greedy decoding."""
    return agreement(lambda: decode_with(policy=scripted_policy(0), temperature=0.0), reference())


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def cost_optimal_with_an_infinite_prior_weight() -> Outcome:
    """CostOptimalLength(prior_weight=inf): NaN acceptance, then min() of an empty sequence at the first step."""
    import specdec

    return refusal(lambda: decode_with(policy=specdec.CostOptimalLength(prior_weight=float("inf"))), "prior_weight")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED)
def cost_optimal_with_an_infinite_margin() -> Outcome:
    """CostOptimalLength(margin=inf): no draft could ever be taken."""
    import specdec

    return refusal(lambda: specdec.CostOptimalLength(margin=float("inf")), "margin", "inf")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_verdict_on_another_device() -> Outcome:
    """A custom strategy returning its verdict on the meta device."""
    import specdec

    def rule(draft_tokens, draft_probs, target_probs, generator):
        zeros = torch.zeros(draft_tokens.shape[0], dtype=LONG, device="meta")
        return specdec.Verdict(zeros, zeros)
    return refusal(lambda: decode_with(strategy=rule), "function", "meta")


@probe(LIBRARY, SILENTLY_ACCEPTED)
def custom_chain_verdict_with_a_path() -> Outcome:
    """A custom chain rule returning a path other than 1..k: ignored (a chain's path is 1..k), output unharmed."""
    import specdec

    def rule(draft_tokens, draft_probs, target_probs, generator):
        verdict = specdec.Greedy()(draft_tokens, draft_probs, target_probs, generator)
        return specdec.Verdict(verdict.num_accepted, verdict.next_token, torch.ones_like(draft_tokens))
    outcome = agreement(lambda: decode_with(strategy=rule, temperature=0.0), reference())
    return Outcome(SILENTLY_ACCEPTED, "path ignored, tokens right") if outcome.kind == CORRECT else outcome


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def check_lossless_with_ten_billion_samples() -> Outcome:
    """check_lossless(samples=10**10): the allocator's error, naming nothing."""
    import specdec
    from specdec.testing import check_lossless

    return refusal(lambda: check_lossless(specdec.Speculative(), samples=10**10), "samples")


@probe(LIBRARY, CORRECT, before=CONFUSING)
def check_lossless_with_a_numpy_k() -> Outcome:
    """check_lossless(k=np.int64(2)) on a lossless rule."""
    import specdec
    from specdec.testing import check_lossless

    return agreement(lambda: check_lossless(specdec.Speculative(), k=np.int64(2)).lossless, True)


@probe(LIBRARY, CORRECT)
def check_lossless_with_top_p_1e_minus_9() -> Outcome:
    """check_lossless under top_p=1e-9 (one possible continuation), 50 samples."""
    import specdec
    from specdec.testing import check_lossless

    sampling = specdec.SamplingConfig(temperature=1.0, top_p=1e-9)
    return agreement(lambda: check_lossless(specdec.Speculative(), sampling=sampling, samples=50).p_value, 1.0)


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


# --- Durability: files replaced by links and directories, kills at new points, concurrency, permissions ------------

def partial_run(name: str, keep: int = 2) -> Path:
    """A run directory of 4 prompts that was killed after ``keep`` rows (no summary)."""
    run_dir = scratch(name)
    run_app(run_dir)
    lines = (run_dir / "rows.jsonl").read_text().splitlines()[:keep]
    (run_dir / "rows.jsonl").write_text("".join(line + "\n" for line in lines))
    (run_dir / "summary.json").unlink()
    return run_dir


def resumed(run_dir: Path) -> Outcome:
    """Continue ``run_dir``: correct when every prompt ends decoded once."""
    return holds(lambda: decoded(run_dir))


def resume_refusal(run_dir: Path, *named: str) -> Outcome:
    return refusal(lambda: run_app(run_dir), *named)


@probe(DURABILITY, CLEAR, before=SILENTLY_WRONG)
def rows_file_linked_to_another_runs() -> Outcome:
    """rows.jsonl a symbolic link to another unfinished run's rows.jsonl: resume kept that run's rows as its own,
    appended its new rows into the other directory, and both directories counted them."""
    other = partial_run("other")
    before = (other / "rows.jsonl").read_bytes()
    run_dir = partial_run("linked", keep=0)
    (run_dir / "rows.jsonl").unlink()
    (run_dir / "rows.jsonl").symlink_to(other / "rows.jsonl")
    outcome = resume_refusal(run_dir, "rows.jsonl", "symbolic link")
    if outcome.kind == SILENTLY_ACCEPTED and (other / "rows.jsonl").read_bytes() != before:
        return Outcome(SILENTLY_WRONG, "rows appended into the other run's directory, counted by both")
    return outcome


@probe(DURABILITY, CLEAR, before=CONFUSING)
def rows_file_a_dangling_link() -> Outcome:
    """rows.jsonl a symbolic link to nothing: "No such file or directory (ENOENT) ... fix that"."""
    run_dir = partial_run("dangling")
    (run_dir / "rows.jsonl").unlink()
    (run_dir / "rows.jsonl").symlink_to(run_dir / "nowhere" / "rows.jsonl")
    return resume_refusal(run_dir, "rows.jsonl", "symbolic link")


@probe(DURABILITY, CLEAR, before=CONFUSING)
def rows_file_linked_to_dev_null() -> Outcome:
    """rows.jsonl a symbolic link to /dev/null: "Invalid argument (EINVAL) ... fix that"."""
    run_dir = partial_run("dev_null")
    (run_dir / "rows.jsonl").unlink()
    (run_dir / "rows.jsonl").symlink_to("/dev/null")
    return resume_refusal(run_dir, "rows.jsonl", "symbolic link")


@probe(DURABILITY, CLEAR, before=CONFUSING)
def lock_file_linked_to_dev_null() -> Outcome:
    """run.lock a symbolic link to /dev/null: "Invalid argument (EINVAL) ... fix that"."""
    run_dir = partial_run("lock_link")
    (run_dir / "run.lock").symlink_to("/dev/null")
    return resume_refusal(run_dir, "run.lock", "symbolic link")


@probe(DURABILITY, CLEAR)
def lock_file_a_directory() -> Outcome:
    """run.lock a directory."""
    run_dir = partial_run("lock_dir")
    (run_dir / "run.lock").mkdir()
    return resume_refusal(run_dir, "run.lock", "directory")


@probe(DURABILITY, CORRECT)
def config_a_directory() -> Outcome:
    """config.yaml a directory: moved aside, the run goes on."""
    run_dir = partial_run("config_dir")
    (run_dir / "config.yaml").unlink()
    (run_dir / "config.yaml").mkdir()
    return resumed(run_dir)


@probe(DURABILITY, CORRECT)
def summary_a_directory() -> Outcome:
    """summary.json a directory: the report loads the run as partial; resume moves it aside and finishes."""
    run_dir = partial_run("summary_dir")
    (run_dir / "summary.json").mkdir()
    out = scratch("out")

    def check():
        problem = report_counts(*report(run_dir, out=out), out, runs=1, rows=2)
        return problem or decoded(run_dir)
    return holds(check)


@probe(DURABILITY, CORRECT)
def set_aside_file_linked_to_dev_full() -> Outcome:
    """rows.set-aside.jsonl a symbolic link to /dev/full, with a damaged line to set aside: moved aside."""
    run_dir = partial_run("dev_full")
    with open(run_dir / "rows.jsonl", "a") as rows_file:
        rows_file.write("not a row\n")
    (run_dir / "rows.set-aside.jsonl").symlink_to("/dev/full")
    return resumed(run_dir)


@probe(DURABILITY, CORRECT)
def stale_staging_files() -> Outcome:
    """Staging files a killed atomic write left (.rows.jsonl.tmp, .config.yaml.tmp, .summary.json.tmp) hold
    garbage."""
    run_dir = partial_run("staging")
    for name in (".rows.jsonl.tmp", ".config.yaml.tmp", ".summary.json.tmp"):
        (run_dir / name).write_bytes(b"\x00garbage{")
    return resumed(run_dir)


KILLED_RUN = """
import os, signal, sys
from experiments import rundir, runner

def die():
    os.kill(os.getpid(), signal.SIGKILL)

{patch}
sys.argv = ["experiments/run.py", *{argv!r}]
from experiments.run import main
main()
"""


def killed_at(run_dir: Path, patch: str, *extra: str) -> Outcome | None:
    """Run into ``run_dir`` in a child process that ``patch`` SIGKILLs at some point; None once it died so."""
    code = KILLED_RUN.format(patch=patch, argv=[*overrides(), f"hydra.run.dir={run_dir}", *extra])
    done = command("-c", code)
    if done.returncode != -signal.SIGKILL:
        return Outcome(CONFUSING, f"the child was not killed (exit {done.returncode}): {first_line(done.stderr)}")
    return None


@probe(DURABILITY, CORRECT, slow=True)
def killed_between_setting_aside_and_rewriting_rows() -> Outcome:
    """SIGKILL in resume after the pieces reached rows.set-aside.jsonl, before rows.jsonl was rewritten: the
    duplicates are in both files; the next resume counts each prompt once."""
    run_dir = partial_run("set_aside_kill")
    rows = (run_dir / "rows.jsonl").read_text()
    (run_dir / "rows.jsonl").write_text(rows + rows + "torn{\n")
    patch = ("real = rundir.append_pieces\n"
             "def append_then_die(path, pieces):\n    real(path, pieces)\n    die()\n"
             "rundir.append_pieces = append_then_die")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_before_config_is_renamed() -> Outcome:
    """SIGKILL after config.yaml's new content was staged, before its rename."""
    run_dir = partial_run("config_kill")
    patch = ("real = os.replace\n"
             "def replace(source, target):\n"
             "    if str(target).endswith('config.yaml'):\n        die()\n    return real(source, target)\n"
             "os.replace = replace")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_after_the_last_row_before_the_summary() -> Outcome:
    """SIGKILL once every row is written, before summary.json."""
    run_dir = scratch("summary_kill")
    patch = ("real = rundir.write_json\n"
             "def write_json(path, data):\n"
             "    if path.name == 'summary.json':\n        die()\n    return real(path, data)\n"
             "rundir.write_json = write_json")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_while_signing_the_lock() -> Outcome:
    """SIGKILL after run.lock was emptied, before this process wrote itself into it."""
    run_dir = partial_run("lock_kill")
    patch = ("def sign(self):\n    os.ftruncate(self.fd, 0)\n    die()\n"
             "rundir.RunLock.sign = sign")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_in_the_warm_up() -> Outcome:
    """SIGKILL in the warm-up of a fresh run (config.yaml written, no row yet)."""
    run_dir = scratch("warmup_kill")
    patch = "runner.warm_up = lambda *args, **kwargs: die()"
    return killed_at(run_dir, patch, "warmup=1") or holds(lambda: decoded(run_dir, "warmup=1"))


SLOW_ROWS = """
import sys, time
from experiments import rundir
real = rundir.RowWriter.write
def write(self, row):
    real(self, row)
    time.sleep(1.5)
rundir.RowWriter.write = write
sys.argv = ["experiments/run.py", *{argv!r}]
from experiments.run import main
main()
"""


@probe(DURABILITY, CORRECT, slow=True)
def report_and_resume_while_a_run_writes() -> Outcome:
    """While a run writes its rows (1.5 s apart): a report of the directory, then a second writer resuming it. The
    report reads a partial run and writes nothing into it; the second writer is refused; the run ends whole."""
    run_dir = scratch("concurrent")
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    code = SLOW_ROWS.format(argv=[*overrides(), f"hydra.run.dir={run_dir}"])
    writer = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=environment, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)

    def check():
        with time_limit(120):
            while not (run_dir / "rows.jsonl").exists() or not (run_dir / "rows.jsonl").read_text():
                if writer.poll() is not None:
                    return f"the writer ended early: {writer.stderr.read()[-300:]}"
        before = sorted(path.name for path in run_dir.iterdir())
        code, err = report(run_dir, out=scratch("out"))
        if code or "partial" not in err or sorted(path.name for path in run_dir.iterdir()) != before:
            return f"report during the run: exit {code}, {first_line(err)}"
        second = resume_refusal(run_dir, "being written by")
        writer.wait(timeout=120)
        return (None if second.kind == CLEAR else f"second writer: {second.kind}: {second.detail}") \
            or each_prompt_once(run_dir)
    try:
        return holds(check)
    finally:
        writer.kill()
        writer.wait()


def without_root_privileges() -> tuple[str, ...] | None:
    """A command prefix under which permissions apply (root drops the capabilities that bypass them); None where
    that cannot be done here."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search") if setpriv else None


NOT_RUN = "not run"  # a probe this machine cannot run (counted nowhere)


@probe(DURABILITY, CLEAR, before=CONFUSING, slow=True)
def read_only_run_directory() -> Outcome:
    """Resume into a run directory whose permissions are r-x (a real refusal, not an injected one)."""
    prefix = without_root_privileges()
    if prefix is None:
        return Outcome(NOT_RUN, "root without setpriv: permissions cannot apply")
    run_dir = partial_run("read_only")
    run_dir.chmod(0o555)
    try:
        return command_refusal(cli(f"hydra.run.dir={run_dir}", prefix=prefix), str(run_dir), "resume=")
    finally:
        run_dir.chmod(0o755)


@probe(DURABILITY, CLEAR, before=CONFUSING, slow=True)
def read_only_rows_file() -> Outcome:
    """Resume with prompts left into a writable directory whose rows.jsonl is r--."""
    prefix = without_root_privileges()
    if prefix is None:
        return Outcome(NOT_RUN, "root without setpriv: permissions cannot apply")
    run_dir = partial_run("read_only_rows")
    (run_dir / "rows.jsonl").chmod(0o444)
    done = cli(f"hydra.run.dir={run_dir}", prefix=prefix)
    outcome = command_refusal(done, "rows.jsonl", "Permission denied", "resume=")
    kept = len(rows_on_disk(run_dir))
    return outcome if kept == 2 else Outcome(SILENTLY_WRONG, f"{kept} rows left of 2")


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


# --- Library: trees and dynamic trees --------------------------------------------------------------------------------

@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def tree_branching_as_a_numpy_array() -> Outcome:
    """TreeDrafter(draft, np.array([2, 1])): a 1-d array of children was refused as "not a list"."""
    import specdec

    return agreement(lambda: decoded_with(specdec.TreeDrafter(models()[1], np.array([2, 1]))), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def tree_branching_as_a_tensor() -> Outcome:
    """TreeDrafter(draft, torch.tensor([2, 2, 1]))."""
    import specdec

    return agreement(lambda: specdec.TreeDrafter(models()[1], torch.tensor([2, 2, 1])).branching, (2, 2, 1))


@probe(LIBRARY, CLEAR, issue=35)
def tree_branching_with_a_float() -> Outcome:
    """TreeDrafter branching [2, 1.0]."""
    import specdec

    return refusal(lambda: specdec.TreeDrafter(models()[1], [2, 1.0]), "branching", "[2, 1.0]")


@probe(LIBRARY, CLEAR, issue=35)
def tree_of_4094_nodes() -> Outcome:
    """TreeDrafter branching of eleven 2s (2 + 4 + ... + 2048 = 4094 nodes)."""
    import specdec

    return refusal(lambda: specdec.TreeDrafter(models()[1], (2,) * 11), "4094 nodes", "1024")


@probe(LIBRARY, CORRECT, issue=35)
def tree_as_wide_as_the_vocabulary() -> Outcome:
    """TreeDrafter (8, 1) on a pair with 8 token ids: every token is a child of the root."""
    import specdec

    target, draft = small_models()
    prompt = random_prompts([5], seed=4, vocab=8)[0]
    return agreement(lambda: specdec.generate(target, torch.tensor([prompt]), draft=specdec.TreeDrafter(draft, (8, 1)),
                                              k=2, max_new_tokens=8).tokens, [hf_greedy(target, prompt, 8)])


@probe(LIBRARY, CORRECT, issue=35)
def dynamic_tree_with_numpy_sizes() -> Outcome:
    """DynamicTreeDrafter(draft, np.int64(8), np.int64(3), np.int64(2))."""
    import specdec

    drafter = specdec.DynamicTreeDrafter(models()[1], np.int64(8), np.int64(3), np.int64(2))
    return agreement(lambda: decoded_with(drafter), reference())


@probe(LIBRARY, CORRECT, issue=35)
def dynamic_tree_of_one_node() -> Outcome:
    """DynamicTreeDrafter(draft, 1, 1, 1): a chain of one draft token."""
    import specdec

    return agreement(lambda: decoded_with(specdec.DynamicTreeDrafter(models()[1], 1, 1, 1)), reference())


@probe(LIBRARY, CLEAR, issue=35)
def dynamic_tree_budget_of_true() -> Outcome:
    """DynamicTreeDrafter(draft, node_budget=True)."""
    import specdec

    return refusal(lambda: specdec.DynamicTreeDrafter(models()[1], node_budget=True), "node_budget", "True")


@probe(LIBRARY, CORRECT, issue=35)
def dynamic_tree_sampling_under_top_k_1() -> Outcome:
    """A dynamic tree at temperature 1 with top_k=1 sampling (q a point mass; 4 draws without replacement from it):
    the target's argmax, so greedy tokens."""
    import specdec

    target, draft = models()
    return agreement(lambda: specdec.generate(target, batch()[0], draft=specdec.DynamicTreeDrafter(draft, 8, 3, 4),
                                              k=3, max_new_tokens=10, temperature=1.0, top_k=1).tokens, reference())


@probe(LIBRARY, CLEAR, issue=35)
def dynamic_tree_on_the_device_step() -> Outcome:
    """step="device" with a dynamic tree (drafted on the host)."""
    import specdec

    drafter = specdec.DynamicTreeDrafter(models()[1], 8, 3, 2)
    return refusal(lambda: decoded_with(drafter, step="device"), "step='device'", "dynamic_tree")


@probe(LIBRARY, CORRECT, issue=35)
def static_tree_over_static_caches() -> Outcome:
    """A token tree with the target's cache preallocated (cache_layout="static")."""
    import specdec

    drafter = specdec.TreeDrafter(models()[1], (2, 1))
    return agreement(lambda: decoded_with(drafter, cache_layout="static"), reference())


@probe(LIBRARY, CLEAR, issue=35)
def tree_with_compile() -> Outcome:
    """compile=True with a token tree."""
    import specdec

    return refusal(lambda: decoded_with(specdec.TreeDrafter(models()[1], (2, 1)), compile=True), "compile=True")


@probe(LIBRARY, CLEAR, issue=35)
def tree_judged_by_a_plain_function() -> Outcome:
    """A token tree with a custom callable strategy (no tree rule)."""
    import specdec

    target, draft = models()
    rule = lambda *args: None  # noqa: E731 - a rule that is never called
    return refusal(lambda: specdec.generate(target, batch()[0], draft=specdec.TreeDrafter(draft), strategy=rule,
                                            temperature=1.0), "no rule for token trees")


@probe(LIBRARY, CORRECT, issue=35)
def early_exit_on_the_device_step() -> Outcome:
    """EarlyExitDrafter(target, 2) on the device step."""
    import specdec

    return agreement(lambda: decoded_with(specdec.EarlyExitDrafter(models()[0], 2), step="device"), reference())


# --- Library: what the constructors are handed ---------------------------------------------------------------------

@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def base_model_without_a_head_as_the_draft() -> Outcome:
    """ModelDrafter(GPT2Model(...)): hidden states, not logits."""
    import specdec
    from transformers import GPT2Config, GPT2Model

    base = GPT2Model(GPT2Config(vocab_size=97, n_layer=1, n_embd=32, n_head=2, bos_token_id=0, eos_token_id=0))
    return refusal(lambda: specdec.ModelDrafter(base), "GPT2Model", "language-model head")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def linear_layer_as_the_draft() -> Outcome:
    """ModelDrafter(torch.nn.Linear(2, 2))."""
    import specdec

    return refusal(lambda: specdec.ModelDrafter(torch.nn.Linear(2, 2)), "ModelDrafter's model", "Linear")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def draft_with_weights_on_the_meta_device() -> Outcome:
    """TreeDrafter of a draft moved to the meta device (no weights)."""
    import specdec

    return refusal(lambda: specdec.TreeDrafter(tiny_gpt2(1, layers=1).to("meta")), "meta device")


@probe(LIBRARY, CLEAR, issue=35)
def policy_class_as_draft_length() -> Outcome:
    """Decoder(..., draft_length=specdec.FixedLength) (the class)."""
    import specdec

    target, draft = models()
    return refusal(lambda: specdec.Decoder(target, specdec.ModelDrafter(draft), draft_length=specdec.FixedLength),
                   "draft_length", "FixedLength")


@probe(LIBRARY, CLEAR, issue=35)
def sampling_class_as_sampling() -> Outcome:
    """Decoder(..., sampling=specdec.SamplingConfig) (the class)."""
    import specdec

    return refusal(lambda: specdec.Decoder(models()[0], sampling=specdec.SamplingConfig), "sampling",
                   "SamplingConfig")


@probe(LIBRARY, CLEAR, before=CONFUSING, issue=35)
def drafter_class_as_the_draft() -> Outcome:
    """generate(draft=specdec.ModelDrafter) (the class): "got type"."""
    import specdec

    return refusal(lambda: specdec.generate(models()[0], batch()[0], draft=specdec.ModelDrafter), "draft",
                   "ModelDrafter")


@probe(LIBRARY, CLEAR, issue=35)
def cache_layout_in_capitals() -> Outcome:
    """ModelDrafter(draft, cache_layout="Static")."""
    import specdec

    return refusal(lambda: specdec.ModelDrafter(models()[1], cache_layout="Static"), "'Static'", "static")


# --- Library: the helpers -------------------------------------------------------------------------------------------

@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=35)
def logits_without_a_vocabulary_axis() -> Outcome:
    """logits_to_probs(torch.zeros(0), greedy): torch's "Expected reduction dim 0 to have non-zero size"."""
    from specdec.sampling import SamplingConfig, logits_to_probs

    return refusal(lambda: logits_to_probs(torch.zeros(0), SamplingConfig()), "logits", "(0,)")


@probe(LIBRARY, CORRECT, issue=35)
def integer_logits() -> Outcome:
    """logits_to_probs of an int64 tensor, greedy."""
    from specdec.sampling import SamplingConfig, logits_to_probs

    return agreement(lambda: logits_to_probs(torch.tensor([1, 5, 2]), SamplingConfig()).tolist(), [0.0, 1.0, 0.0])


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def predicted_speedup_of_a_bool() -> Outcome:
    """predicted_speedup(True, 3, 0.1)."""
    import specdec

    return refusal(lambda: specdec.predicted_speedup(True, 3, 0.1), "alpha", "True")


@probe(LIBRARY, CORRECT, issue=35)
def predicted_speedup_of_numpy_scalars() -> Outcome:
    """predicted_speedup(np.float32(0.5), np.int64(3), np.float64(0.1))."""
    import specdec

    return agreement(lambda: round(specdec.predicted_speedup(np.float32(0.5), np.int64(3), np.float64(0.1)), 9),
                     round((1 + 0.5 + 0.25 + 0.125) / 1.3, 9))


@probe(LIBRARY, CORRECT, before=TRACEBACK, issue=35)
def left_pad_of_a_2d_numpy_array() -> Outcome:
    """left_pad(np.array([[1, 2], [3, 4]]))."""
    return agreement(lambda: [t.tolist() for t in left_pad(np.array([[1, 2], [3, 4]]))],
                     [[[1, 2], [3, 4]], [[1, 1], [1, 1]]])


@probe(LIBRARY, CORRECT, issue=35)
def left_pad_with_pad_id_minus_one() -> Outcome:
    """left_pad(ragged, pad_id=-1): padding outside the vocabulary is never fed."""
    return agreement(lambda: generate(*left_pad(RAGGED, pad_id=-1)[:1], attention_mask=left_pad(RAGGED)[1]),
                     reference(RAGGED))


@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=35)
def left_pad_of_one_flat_prompt() -> Outcome:
    """left_pad([5, 6, 7]) (one prompt, not a list of prompts)."""
    return refusal(lambda: left_pad([5, 6, 7]), "prompts[0]", "5")


# --- Library: the cross-tokenizer drafter ---------------------------------------------------------------------------

@functools.cache
def cross_material() -> dict:
    """Two tokenizers trained in tests/test_token_bridge (byte-level BPE, SentencePiece-style), a bigram target and
    draft telling one story in each (tests/test_cross_tokenizer), and a word-level tokenizer sharing no token with
    them."""
    from test_cross_tokenizer import STORY, bigram_model, encode
    from test_token_bridge import train_byte_level, train_metaspace
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level, metaspace = train_byte_level(400), train_metaspace(300)
    words = ["<unk>", "<eos>", "THE", "QUICK", "BROWN", "FOX"]
    core = Tokenizer(token_models.WordLevel(vocab={word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    upper = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    story = encode(metaspace, STORY)
    return {"draft_tok": byte_level, "target_tok": metaspace, "upper": upper,
            "target": bigram_model(metaspace, story), "draft": bigram_model(byte_level, encode(byte_level, STORY)),
            "prompts": [story[:8], story[20:31]], "bigram_model": bigram_model, "encode": encode, "story": STORY}


def across(drafter, temperature: float = 0.0, new: int = 12, k: int = 4, seed: int = 0, **sampling) -> list[list[int]]:
    """The bigram target's tokens on the cross-tokenizer prompts, drafted by ``drafter``."""
    import specdec

    material = cross_material()
    decoder = specdec.Decoder(material["target"], drafter, specdec.Speculative(), specdec.FixedLength(k),
                              specdec.SamplingConfig(temperature, **sampling))
    return decoder.generate(*left_pad(material["prompts"]), max_new_tokens=new, seed=seed).tokens


def across_greedy(new: int = 12) -> list[list[int]]:
    material = cross_material()
    return [hf_greedy(material["target"], prompt, new) for prompt in material["prompts"]]


def cross_drafter(draft=None, draft_tok=None, **options):
    from specdec.cross_tokenizer import CrossTokenizerDrafter

    material = cross_material()
    return CrossTokenizerDrafter(material["draft"] if draft is None else draft,
                                 material["draft_tok"] if draft_tok is None else draft_tok, material["target_tok"],
                                 **options)


@probe(LIBRARY, CORRECT, before=TRACEBACK, issue=35)
def tokenizers_sharing_no_token_sampling() -> Outcome:
    """A draft whose word-level tokenizer spells no token as the target's does, at temperature 1: torch's argmax of
    an empty set. It now proposes nothing, with a warning at construction: the target's own sampling."""
    import specdec

    material = cross_material()
    ids, mask = left_pad(material["prompts"])
    plain = specdec.generate(material["target"], ids, attention_mask=mask, max_new_tokens=12, temperature=1.0).tokens
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = agreement(lambda: across(cross_drafter(tiny_gpt2(3, layers=1, vocab=len(material["upper"])),
                                                         material["upper"]), temperature=1.0), plain)
    if outcome.kind == CORRECT and not any("spell no token the same" in str(w.message) for w in caught):
        return Outcome(CONFUSING, "nothing proposed, and no warning said why")
    return outcome


@probe(LIBRARY, CORRECT, issue=35)
def tokenizers_sharing_no_token_greedy() -> Outcome:
    """The same drafter at temperature 0: the text path, the target's greedy tokens."""
    material = cross_material()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        drafter = cross_drafter(tiny_gpt2(3, layers=1, vocab=len(material["upper"])), material["upper"])
    return agreement(lambda: across(drafter), across_greedy())


@probe(LIBRARY, CORRECT, issue=35)
def cross_tokenizer_sampling_under_top_p_1e_minus_9() -> Outcome:
    """Across tokenizers at temperature 1 with top_p=1e-9 (q' a point mass): the target's greedy tokens."""
    return agreement(lambda: across(cross_drafter(), temperature=1.0, top_p=1e-9), across_greedy())


@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def cross_tokenizer_numpy_options() -> Outcome:
    """look_behind=np.int64(5), hold_back=np.int64(1): refused as "must be an integer >= 1, got np.int64(5)"."""
    return agreement(lambda: across(cross_drafter(look_behind=np.int64(5), hold_back=np.int64(1))), across_greedy())


@probe(LIBRARY, CLEAR, issue=35)
def cross_tokenizer_translate_in_capitals() -> Outcome:
    """translate="TEXT"."""
    return refusal(lambda: cross_drafter(translate="TEXT"), "translate", "'TEXT'")


@probe(LIBRARY, CLEAR, issue=35)
def cross_tokenizer_without_hold_back() -> Outcome:
    """hold_back=0."""
    return refusal(lambda: cross_drafter(hold_back=0), "hold_back", "0")


@probe(LIBRARY, CORRECT, issue=35)
def cross_tokenizer_prompt_id_past_the_tokenizer() -> Outcome:
    """A target with 20 padded embedding ids past its tokenizer's, and a prompt holding one of them (no text)."""
    material = cross_material()
    width = len(material["target_tok"]) + 20
    padded = tiny_gpt2(0, layers=1, vocab=width)
    prompt = material["prompts"][0] + [width - 5]
    import specdec

    drafter = cross_drafter(target_vocab_size=width)
    return agreement(lambda: specdec.Decoder(padded, drafter).generate(torch.tensor([prompt]), max_new_tokens=8).tokens,
                     [hf_greedy(padded, prompt, 8)])


@probe(LIBRARY, CLEAR, issue=35)
def cross_tokenizer_draft_in_training_mode() -> Outcome:
    """A cross-tokenizer drafter whose draft was put in training mode after it was built."""
    material = cross_material()
    draft_tok = material["draft_tok"]
    draft = material["bigram_model"](draft_tok, material["encode"](draft_tok, material["story"]))
    drafter = cross_drafter(draft)
    draft.train()
    return refusal(lambda: across(drafter), "training mode")


@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def cross_tokenizer_k_40_with_a_16_position_draft() -> Outcome:
    """k=40 and 30 new tokens with a draft of 16 positions (the target has 256): a step drafts at most 8 draft
    tokens, and the output is the target's greedy output to the end."""
    material = cross_material()
    short = material["bigram_model"](material["draft_tok"], material["encode"](material["draft_tok"],
                                                                             material["story"]), positions=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = agreement(lambda: across(cross_drafter(short), new=30, k=40), across_greedy(30))
    warned = any("drafter's context" in str(warning.message) for warning in caught)
    return Outcome(CONFUSING, f"cut short, with a warning: {outcome.detail}") if outcome.kind == SILENTLY_WRONG \
        and warned else outcome


@probe(LIBRARY, CLEAR, issue=35)
def token_bridge_look_behind_of_zero() -> Outcome:
    """TokenBridge(draft_tok, target_tok, look_behind=0)."""
    from specdec.token_bridge import TokenBridge

    material = cross_material()
    return refusal(lambda: TokenBridge(material["draft_tok"], material["target_tok"], look_behind=0), "look_behind")


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


# --- Durability: config.yaml and rows.jsonl as other tools leave them, and resume ------------------------------------

def unfinished_run_in(root: Path, keep: int = 2) -> Path:
    """A run of 4 prompts killed after ``keep`` rows, alone under ``root`` (so that resume=true searches only it)."""
    run_dir = root / "first"
    run_dir.mkdir()
    run_app(run_dir)
    lines = (run_dir / "rows.jsonl").read_text().splitlines()[:keep]
    (run_dir / "rows.jsonl").write_text("".join(line + "\n" for line in lines))
    (run_dir / "summary.json").unlink()
    return run_dir


def resumed_from_elsewhere(root: Path, run_dir: Path, *extra: str) -> str | None:
    """resume=true from a new directory beside ``run_dir``: what is wrong (None: ``run_dir`` was continued and holds
    every prompt once, and the new directory holds no row)."""
    other = root / "second"
    other.mkdir()
    run_app(other, "resume=true", *extra)
    if (other / "rows.jsonl").exists() and (other / "rows.jsonl").read_text():
        return f"a new run decoded {len((other / 'rows.jsonl').read_text().splitlines())} prompts again"
    return each_prompt_once(run_dir)


def config_edited(name: str, edit: Callable[[str], str]) -> Outcome:
    root = scratch(name)
    run_dir = unfinished_run_in(root)
    (run_dir / "config.yaml").write_bytes(edit((run_dir / "config.yaml").read_text()).encode("utf-8"))
    return holds(lambda: resumed_from_elsewhere(root, run_dir))


@probe(DURABILITY, CORRECT, issue=35)
def config_with_a_byte_order_mark() -> Outcome:
    """config.yaml saved with a UTF-8 byte order mark."""
    return config_edited("bom", lambda text: "\ufeff" + text)


@probe(DURABILITY, CORRECT, issue=35)
def config_with_windows_line_endings() -> Outcome:
    """config.yaml with CRLF line endings."""
    return config_edited("crlf", lambda text: text.replace("\n", "\r\n"))


@probe(DURABILITY, CORRECT, issue=35)
def config_with_comments_added() -> Outcome:
    """config.yaml with a comment line and end-of-line comments added by hand."""
    return config_edited("comments", lambda text: "# rerun of Tuesday\n" + text.replace("seed: 0", "seed: 0  # why"))


@probe(DURABILITY, CORRECT, issue=35)
def config_with_its_sections_reordered() -> Outcome:
    """config.yaml rewritten by another tool with its top-level settings in another order."""
    import yaml

    return config_edited("reordered", lambda text: yaml.safe_dump(dict(reversed(list(yaml.safe_load(text).items())))))


@probe(DURABILITY, CORRECT, issue=35)
def config_without_its_last_new_line() -> Outcome:
    """config.yaml whole but for its final new line (an editor stripped it)."""
    return config_edited("no_newline", lambda text: text.rstrip("\n"))


@probe(DURABILITY, CORRECT, issue=35)
def config_holding_a_list() -> Outcome:
    """config.yaml replaced by a YAML list: the rows' setting columns decide."""
    return config_edited("list", lambda text: "- not\n- a\n- mapping\n")


@probe(DURABILITY, CORRECT, issue=35)
def rows_with_windows_line_endings() -> Outcome:
    """rows.jsonl with CRLF line endings, resumed in place."""
    run_dir = partial_run("rows_crlf")
    (run_dir / "rows.jsonl").write_bytes((run_dir / "rows.jsonl").read_bytes().replace(b"\n", b"\r\n"))
    return resumed(run_dir)


@probe(DURABILITY, CORRECT, issue=35)
def rows_with_a_byte_order_mark() -> Outcome:
    """rows.jsonl starting with a UTF-8 byte order mark: the mark is set aside, both rows kept."""
    run_dir = partial_run("rows_bom")
    (run_dir / "rows.jsonl").write_bytes(b"\xef\xbb\xbf" + (run_dir / "rows.jsonl").read_bytes())
    return resumed(run_dir)


@probe(DURABILITY, CORRECT, issue=35)
def two_unfinished_runs_of_one_setting() -> Outcome:
    """Two killed runs of one setting under the search root: resume=true continues the newer; the older is left."""
    root = scratch("two_runs")
    older = unfinished_run_in(root, keep=1)
    older = older.rename(root / "older")
    time.sleep(0.05)
    newer = unfinished_run_in(root)

    def check():
        before = (older / "rows.jsonl").read_text()
        return resumed_from_elsewhere(root, newer) or (None if (older / "rows.jsonl").read_text() == before
                                                       else "the older run changed")
    return holds(check)


@probe(DURABILITY, CORRECT, issue=35)
def resume_of_a_finished_run_by_path() -> Outcome:
    """resume=<a finished run's directory>: nothing left to decode, its rows unchanged."""
    root = scratch("finished_resume")
    run_dir = root / "first"
    run_dir.mkdir()
    run_app(run_dir)
    before = (run_dir / "rows.jsonl").read_text()

    def check():
        other = root / "second"
        other.mkdir()
        run_app(other, f"resume={run_dir}")
        return each_prompt_once(run_dir) or (None if (run_dir / "rows.jsonl").read_text() == before else "rewritten")
    return holds(check)


@probe(DURABILITY, CLEAR, issue=35)
def resume_path_of_the_rows_file() -> Outcome:
    """resume=<run directory>/rows.jsonl (the file, not its directory)."""
    run_dir = partial_run("resume_file")
    return refusal(lambda: validated(f"resume={run_dir / 'rows.jsonl'}"), "resume=", "run directory")


@probe(DURABILITY, CORRECT, issue=35)
def lock_file_holding_garbage() -> Outcome:
    """run.lock holding bytes that are no JSON (left by another tool)."""
    run_dir = partial_run("lock_garbage")
    (run_dir / "run.lock").write_bytes(b"\x00\x01not json")
    return resumed(run_dir)


@probe(DURABILITY, CORRECT, issue=35)
def resume_under_another_group_name() -> Outcome:
    """Resume in place with group=renamed (a key free to change on resume)."""
    run_dir = partial_run("group_rename")
    return holds(lambda: decoded(run_dir, "group=renamed"))


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
