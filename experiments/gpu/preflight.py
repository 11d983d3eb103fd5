"""The GPU suite's preflight: the device step proven on this device before any figure relies on it. Its checks
are the device step's own: greedy calls on a fresh and on a kept capture emit the host loop's tokens (a kept one
also after the matrix products' workspaces were cleared, as torch.compile's CUDA graphs clear them), and the
captures and replays are those its program counts (``DeviceProgram.num_captured``, ``num_replayed``); nothing of
torch is patched."""

from __future__ import annotations

import time
import traceback

import torch

import specdec
from experiments.gpu.models import release, tiny_gpt2
from experiments.gpu.plan import SuitePlan
from experiments.gpu.schedule import Budget, Suite, error_line
from experiments.common.harness import random_prompts
from specdec.batching import left_pad

# --- the preflight ------------------------------------------------------------------------------------------------


def preflight_section(suite: Suite, budget: Budget) -> None:
    """The device step proven on this device before any figure relies on it (see the module docstring). A failed
    check, or an error, refuses the device step to every later item, and the JSON's ``preflight`` says why."""
    start = time.monotonic()
    try:
        rows = preflight_checks(suite.plan)
    except Exception as err:  # a compile or a capture that breaks is the preflight's finding, not a crash
        traceback.print_exc()
        rows = [{"check": "the checks ran", "passed": False, "detail": f"{type(err).__name__}: {error_line(err)}"}]
    failed = [row for row in rows if not row["passed"]]
    if failed:
        suite.device_step_refused = f"{failed[0]['check']}: {failed[0]['detail']}"
        suite.results["preflight"] = f"failed: {suite.device_step_refused}"
    else:
        suite.results["preflight"] = "passed"
    suite.tables["preflight"] = rows
    suite.show("preflight", f"## Preflight: the device step on {suite.plan.device} (tiny GPT-2 pair, "
               f"{suite.plan.preflight_dtype}, compile={suite.plan.compile}, k = 3): {suite.results['preflight']} "
               f"in {time.monotonic() - start:.1f} s", rows,
               "Captures and replays are counted on CUDA only (CUDA graphs); elsewhere the step runs its Python "
               "each time, and the token checks still hold. A failed preflight skips every item that runs the "
               "device step.")


def preflight_checks(plan: SuitePlan) -> list[dict]:
    """The preflight's checks, each a row {check, passed, detail}: greedy calls on a fresh and on a kept capture
    emit the host loop's tokens (with one capture, then none, and replays, on CUDA); a sampled call on a kept
    capture, after a call with another seed, emits what its seed emitted on the fresh capture."""
    device, dtype = torch.device(plan.device), getattr(torch, plan.preflight_dtype)
    target, draft = (tiny_gpt2(layers, seed).to(device=device, dtype=dtype) for layers, seed in ((2, 1), (1, 0)))
    prompts = random_prompts(4, 9, target.config.vocab_size, seed=21)
    batches = [left_pad([prompts[0][:5], prompts[1]], device=device),  # ragged: [2, 9] with its mask
               left_pad([prompts[2][:7], prompts[3][:2]], device=device)]  # [2, 7]: the same captured shapes

    def decoder(sampling: specdec.SamplingConfig, step: str = "device", compiled: bool = plan.compile):
        return specdec.Decoder(target, specdec.ModelDrafter(draft, compile=compiled), specdec.Speculative(),
                               specdec.FixedLength(3), sampling, compile=compiled, step=step)

    greedy, sampled = specdec.SamplingConfig(), specdec.SamplingConfig(temperature=1.0)
    on_device, host = decoder(greedy), decoder(greedy, "host", False)
    rows = [check_row("the device step is chosen", on_device.steps_on_device,
                      "Decoder(compile=..., step='device') runs it" if on_device.steps_on_device else "not chosen")]
    counting = device.type == "cuda"  # elsewhere the step runs its Python each time: nothing is captured
    if counting:
        leave_a_foreign_workspace(device)
    for capture, (ids, mask) in zip(("fresh", "kept"), batches):
        before = graph_counts(on_device)
        tokens = on_device.generate(ids, mask, max_new_tokens=16).tokens
        captures, replays = counted_since(on_device, before)
        expected = host.generate(ids, mask, max_new_tokens=16).tokens
        rows.append(check_row(f"greedy on a {capture} capture: the host loop's tokens", tokens == expected,
                              token_difference(tokens, expected)))
        if counting:
            wanted = 1 if capture == "fresh" else 0
            rows.append(check_row(f"greedy on a {capture} capture: {wanted} capture(s), replays",
                                  captures == wanted and replays > 0, f"{captures} capture(s), {replays} replay(s)"))
    if counting:
        ids, mask = batches[1]
        clear_workspaces_as_compiled_graphs_do(device)
        tokens = on_device.generate(ids, mask, max_new_tokens=16).tokens
        expected = host.generate(ids, mask, max_new_tokens=16).tokens
        rows.append(check_row("greedy on a kept capture after the matrix products' workspaces were cleared (as "
                              "torch.compile's CUDA graphs clear them): the host loop's tokens", tokens == expected,
                              token_difference(tokens, expected)))
    ids, mask = batches[0]
    seeded = decoder(sampled)
    before = graph_counts(seeded)
    first = seeded.generate(ids, mask, max_new_tokens=16, seed=4).tokens  # captures
    other = seeded.generate(ids, mask, max_new_tokens=16, seed=9).tokens  # the kept capture, another seed
    again = seeded.generate(ids, mask, max_new_tokens=16, seed=4).tokens  # the kept capture, the first seed
    captures, replays = counted_since(seeded, before)
    rows.append(check_row("sampled on a kept capture: the fresh capture's tokens for the same seed", again == first,
                          token_difference(again, first)))
    rows.append(check_row("sampled: another seed, other tokens", other != first,
                          "the seeds gave different tokens" if other != first else "seeds 4 and 9 gave the same tokens"))
    if counting:
        rows.append(check_row("sampled: 1 capture for three calls, replays", captures == 1 and replays > 0,
                              f"{captures} capture(s), {replays} replay(s)"))
    release(on_device, seeded)
    return rows


def leave_a_foreign_workspace(device: torch.device) -> None:
    """What an earlier program leaves behind on the capture stream (every ``torch.cuda.graph`` captures on one): a
    matrix product captured in a graph of its own, then dropped, whose cuBLAS workspace a later capture would reuse
    unless it clears the workspaces first (``specdec.cache.graph_capture``)."""
    square = torch.ones(256, 256, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        square @ square


def clear_workspaces_as_compiled_graphs_do(device: torch.device) -> None:
    """What torch.compile's CUDA graphs do at each recording (``clear_cublass_cache``), then the freed memory handed
    back to the driver: a captured step whose matrix products use a workspace it does not own now writes where
    nothing is allocated."""
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def graph_counts(decoder: specdec.Decoder) -> tuple[int, int]:
    """The steps the decoder's device step captured and replayed so far, as its program counts them."""
    program = decoder.device_program
    return (0, 0) if program is None else (program.num_captured, program.num_replayed)


def counted_since(decoder: specdec.Decoder, before: tuple[int, int]) -> tuple[int, int]:
    """Captures and replays since ``before`` (``graph_counts``)."""
    return tuple(after - earlier for after, earlier in zip(graph_counts(decoder), before))


def check_row(name: str, passed: bool, detail: str) -> dict:
    return {"check": name, "passed": bool(passed), "detail": detail}


def token_difference(tokens: list[list[int]], expected: list[list[int]]) -> str:
    """Where two batches of token rows first differ, in words ("equal" where they do not)."""
    for row, (got, wanted) in enumerate(zip(tokens, expected)):
        if got != wanted:
            at = next((i for i, (a, b) in enumerate(zip(got, wanted)) if a != b), min(len(got), len(wanted)))
            return f"row {row} differs from token {at} ({got[at:at + 4]} vs {wanted[at:at + 4]})"
    return "equal" if len(tokens) == len(expected) else f"{len(tokens)} rows vs {len(expected)}"
