"""A bench run in fresh processes, one after another, each a fresh draw of the machine: on a CPU the forwards' costs
differ between processes (docs/load.md). Shared by ``experiments.load_bench`` and ``experiments.cost_check``
(``--processes N``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from experiments.common.harness import non_negative_int, positive_int


def fresh_process_argv(args: argparse.Namespace, out: Path, index: int, calls: int) -> list[str]:
    """A bench's options for the ``index``-th of its ``--processes`` (each timing up to ``calls`` calls per method
    and setting): its own options as parsed (lists joined by commas; None left to the default), its own ``--out``,
    and ``--first-call`` after the last process's calls. The pooled calls are then distinct calls, with their own
    prompts and seeds (at T > 0 the same seeds in every process drew the same samples, their luck counted once per
    process), that run the methods in the rows of one balanced design (``harness.rotation``). The bench's options
    all take a value (no flags)."""
    argv = []
    for key, value in vars(args).items():
        if key in ("processes", "out", "first_call") or value is None:
            continue
        argv += [f"--{key.replace('_', '-')}", ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv + ["--out", str(out), "--first-call", str(args.first_call + index * calls)]


def add_process_options(parser: argparse.ArgumentParser) -> None:
    """``--processes`` and ``--first-call``, as every bench that runs in fresh processes takes them."""
    parser.add_argument("--processes", type=positive_int, default=1,
                        help="fresh processes to run the bench in, one after another, their calls pooled")
    parser.add_argument("--first-call", type=non_negative_int, default=0,
                        help="the index of the first timed call: call i takes the prompts from i x batch size on "
                             "(cycled), seed i and row i of the methods' balanced order "
                             "(experiments.common.harness.rotation); --processes gives each process the calls after "
                             "the last one's")


def run_in_processes(module: str, args: argparse.Namespace, written: str, calls: int) -> list[dict]:
    """``python -m module`` run afresh ``args.processes`` times, one after another (``<out>/process-<i>``, options
    from ``fresh_process_argv``; ``calls``: the most timed calls a process makes per method and setting): the JSON
    each wrote to ``written``, in order. On a CPU the forwards' costs differ between processes, so one process is one
    draw of the machine."""
    results = []
    for index in range(args.processes):
        out = Path(args.out) / f"process-{index}"
        print(f"\n# process {index + 1} of {args.processes}: {out}", flush=True)
        subprocess.run([sys.executable, "-m", module, *fresh_process_argv(args, out, index, calls)], check=True)
        results.append(json.loads((out / written).read_text()))
    return results
