"""The device driver (``Decoder(step="device")``): each decode step as one program over device-resident state.

The step's phases are ``specdec.step``'s, written once; this driver adds only what running them as one device
program takes. Nothing is read back per step but one small tensor of flags, so every bound is computed on the
device:

- the target's and the draft's caches are lean caches (``specdec.cache.LeanCache``) with fixed shapes: per-row
  lengths on the device, rollback is length arithmetic, the next write overwrites rejected slots, attention spans
  the whole capacity, and each context rewrites its queue in place;
- rows never leave the batch: a finished row feeds holes and emits nothing (its budget is 0);
- k is fixed (``FixedLength``); a draft always drafts k tokens (an EOS in it is cut when emitting).

Capture. After the prefill's step, steps run eager until one leaves the state's shapes as it found them (one step
for a model drafter; an EAGLE head's queue settles a step later); on CUDA the next step is captured once as a CUDA
graph (with the generator registered, so sampling replays exactly) and replayed; elsewhere every step runs as is. The
capture is kept by the Decoder's ``DeviceProgram`` and replayed by every later call whose state has its shapes:
such a call copies its state into the tensors the graph reads (each owner adopts its own: ``device_state`` /
``adopt_device_state`` of the run, the step log, the target's context and cache, and the drafter) and goes on with
the graph's random stream from where its own stands.

The lagged read. The host reads each step's flags (rows still generating; usable logits; finite drafts; a valid
verdict) one step late on CUDA, through a pinned non-blocking copy, so the device never waits for the host. The
lagged read lets one step run past the end; it emits nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specdec.cache import adopted, graph_capture, static_capacity
from specdec.emit import GenerationOutput, check_flags
from specdec.layout import Proposal, VerifyLayout
from specdec.step import DecodeRun
from specdec.verify import Judgement

FLAG_NAMES = ("generating", "target_usable", "drafts_finite", "verdict_in_range")


def device_step_blocker(decoder) -> str | None:
    """Why this decoder's steps cannot run on the device (one line), or None when they can."""
    if not decoder.runner.is_lean:
        return "the target has no lean forward (specdec.lean supports GPT-2 and the Llama family; forward='auto')"
    drafter, policy = decoder.drafter, decoder.draft_length
    if not (drafter.proposes_nothing or drafter.drafts_on_device):
        return (f"drafter {drafter.name!r} does not draft on the device (model drafters with a lean forward do; "
                f"trees and n-gram lookups run on the host)")
    if not drafter.trusted_proposals:
        return f"drafter {drafter.name!r} is checked with a host read every step (only specdec's drafters are not)"
    if decoder.speculates and (policy.adapts or policy.stops_drafts):
        return f"draft-length policy {policy.name!r} adapts k from host reads; the device step takes FixedLength"
    return None


@dataclass
class Capture:
    """A captured step: its replay (returning the step's flags), the generator it replays, the tensors it reads and
    writes by name (a later call of the same shapes adopts them), and what its Python recorded on the host, which a
    replay repeats: the step's layout for the step log and the drafter's forwards."""

    replay: Callable[[], torch.Tensor]
    generator: torch.Generator
    state: dict[str, torch.Tensor]
    layout: VerifyLayout
    overlap_is_acceptance: bool
    draft_forwards: int


class DeviceProgram:
    """The device step of one ``Decoder``: runs its calls (``DeviceRun``) and keeps their captured steps, one per
    set of shapes (batch size, capacities, budget, k), for later calls; ``release`` frees them."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.captures: dict[tuple, Capture] = {}
        self.num_captured = 0  # steps captured as CUDA graphs, over the program's calls
        self.num_replayed = 0  # steps run as a replay of a captured graph

    def run(self, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int) -> GenerationOutput:
        return DeviceRun(self, input_ids, attention_mask, max_new_tokens, eos_ids, seed).run()

    def release(self) -> None:
        self.captures.clear()


class DeviceRun(DecodeRun):
    """The device driver of one ``generate`` call (see the module docstring)."""

    def __init__(self, program: DeviceProgram, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int):
        self.program = program
        decoder = program.decoder
        # Every step emits a token to each generating row; the lagged stop may add one step that emits nothing.
        super().__init__(decoder, input_ids, attention_mask, max_new_tokens, eos_ids, seed, decoder.k_max,
                         max_steps=max_new_tokens + 1)
        self.k = decoder.k_max
        self.max_steps = max_new_tokens + 1
        self.device = input_ids.device
        self.capacity = static_capacity(input_ids.shape[1], max_new_tokens + 2 * (self.k + 1))
        self.lag = 1 if self.device.type == "cuda" else 0  # steps between a step and the host's read of its flags
        if self.device.type == "cuda":
            self.host_flags = torch.zeros(2, len(FLAG_NAMES), dtype=torch.bool, pin_memory=True)  # [2, 4]

    def run(self) -> GenerationOutput:
        start = self.clock.now()
        self.begin(self.capacity, fixed_shapes=True)
        generating = self.read(self.stash(self.device_step(first=True)))  # the prefill's step: its tokens give the TTFT
        self.note_step(self.last_layout, self.last_overlap_is_acceptance)
        ttft = self.clock.now() - start
        first_step_emitted = self.rows.emitted.sum()  # [] read at the end
        unread, replay, settled = [], None, False  # unread: flags not read yet, oldest first
        while True:
            if len(unread) > self.lag:
                generating = self.read(unread.pop(0))
            if not generating or self.steps >= self.max_steps:
                break
            if replay is None and self.captures():
                replay = self.kept_capture() or (self.captured_step() if settled else None)
            if replay is not None:
                flags = replay()
                self.program.num_replayed += 1
                self.note_replay()
                unread.append(self.stash(flags))
                continue
            shapes = self.shapes()
            unread.append(self.stash(self.eager_step()))
            self.note_step(self.last_layout, self.last_overlap_is_acceptance)
            settled = shapes == self.shapes()  # the step left the shapes as it found them: capture the next
        for flags in unread:  # the flags of steps past the end still say whether their logits were usable
            self.read(flags)
        return self.finish(self.clock.now() - start, ttft, first_step_emitted, timed=False)

    def device_step(self, first: bool = False) -> torch.Tensor:
        """One step's phases, no host read; its [4] bool flags (``FLAG_NAMES``)."""
        self.step(self.k, first)
        return self.flags

    def sync(self, proposal: Proposal, judgement: Judgement, num_new: torch.Tensor,
             kept_or_idle: torch.Tensor) -> None:
        """Nothing is read now: the step's flags wait on the device for the lagged read."""
        flags = [self.rows.active.any(), judgement.target_usable, proposal.finite, judgement.verdict_in_range]
        self.flags = torch.stack([flag if flag is not None else self.rows.active.new_ones(()) for flag in flags])
        return None

    def eager_step(self) -> torch.Tensor:
        """A step run eagerly before the capture (it compiles the decode shapes); on CUDA on a side stream, as
        capturing wants (lazy per-stream set-up happens outside the capture)."""
        if self.device.type != "cuda":
            return self.device_step()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            flags = self.device_step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return flags

    def stash(self, flags: torch.Tensor):
        """Start copying a step's flags to the host without waiting: on CUDA into a pinned buffer (two slots: at
        most the lag plus one are in flight), with an event marking the copy's end."""
        if self.device.type != "cuda":
            return flags
        slot = self.host_flags[self.steps % 2]
        slot.copy_(flags, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return slot, done

    def captured_step(self) -> Callable[[], torch.Tensor]:
        """The replay of this step captured as a CUDA graph, kept for later calls of the same shapes."""
        drafter = self.decoder.drafter
        forwards = drafter.num_forwards  # capturing runs the step's Python, but none of its work
        replay = self.capture()
        self.program.num_captured += 1
        self.capture_record = Capture(replay, self.generator, self.device_state(), self.last_layout,
                                      self.last_overlap_is_acceptance, drafter.num_forwards - forwards)
        drafter.num_forwards, self.steps = forwards, self.steps - 1
        self.program.captures[self.shapes()] = self.capture_record
        return replay

    def captures(self) -> bool:
        """Whether later steps replay a captured graph (on CUDA) rather than run the Python."""
        return self.device.type == "cuda"

    def capture(self) -> Callable[[], torch.Tensor]:
        """The step captured as a CUDA graph (the generator registered, so sampling replays); its replay."""
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        with graph_capture(graph):
            flags = self.device_step()

        def replay() -> torch.Tensor:
            graph.replay()
            return flags
        return replay

    def kept_capture(self) -> Callable[[], torch.Tensor] | None:
        """A kept capture of this call's current shapes, its state adopted and its generator set to where this
        call's stream stands; None where there is none."""
        kept = self.program.captures.get(self.shapes()) if self.captures() else None
        if kept is None:
            return None
        self.adopt_device_state(kept.state)
        carry_random_stream(self.generator, kept.generator)
        self.generator, self.capture_record = kept.generator, kept
        return kept.replay

    def note_replay(self) -> None:
        """What a replayed step did, recorded on the host (a replayed graph runs no Python)."""
        record = self.capture_record
        self.note_step(record.layout, record.overlap_is_acceptance)
        self.decoder.drafter.num_forwards += record.draft_forwards
        self.steps += 1

    def shapes(self) -> tuple:
        """What a capture is specialised to: every state tensor's name, shape and dtype."""
        return tuple((name, tuple(tensor.shape), tensor.dtype) for name, tensor in sorted(self.device_state().items()))

    def device_state(self) -> dict[str, torch.Tensor]:
        """The tensors a captured step reads from the step before it, by name: this run's, the target's context's
        and the drafter's."""
        rows = self.rows
        state = {"original": rows.original, "emitted": rows.emitted, "remaining": rows.remaining,
                 "active": rows.active, "output": self.output, "slot_offsets": self.slot_offsets,
                 **{f"log.{name}": tensor for name, tensor in self.log.device_state().items()}}
        if self.eos_ids is not None:
            state["eos_ids"] = self.eos_ids
        state.update({f"target.{name}": tensor for name, tensor in self.target.device_state().items()})
        state.update({f"drafter.{name}": tensor for name, tensor in self.decoder.drafter.device_state().items()})
        return state

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue in ``state``'s tensors: each owner copies its values there and uses them from now on."""
        rows = self.rows
        for name in ("original", "emitted", "remaining", "active"):
            setattr(rows, name, adopted(state[name], getattr(rows, name)))
        self.output = adopted(state["output"], self.output)
        self.slot_offsets = adopted(state["slot_offsets"], self.slot_offsets)
        if self.eos_ids is not None:
            self.eos_ids = adopted(state["eos_ids"], self.eos_ids)
        self.log.adopt_device_state(within(state, "log."))
        self.target.adopt_device_state(within(state, "target."))
        self.decoder.drafter.adopt_device_state(within(state, "drafter."))

    def read(self, stashed) -> bool:
        """The one host read of a step: its flags (waiting for that step only); refuses unusable logits or
        verdicts. Whether rows still generate."""
        if self.device.type == "cuda":
            flags, done = stashed
            done.synchronize()
        else:
            flags = stashed
        values = dict(zip(FLAG_NAMES, flags.tolist()))
        check_flags(values, self.decoder.strategy.name)
        return values["generating"]


def within(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``state`` under ``prefix``, without it."""
    return {name.removeprefix(prefix): tensor for name, tensor in state.items() if name.startswith(prefix)}


def carry_random_stream(source: torch.Generator, target: torch.Generator) -> None:
    """Let ``target`` go on where ``source``'s random stream stands: ``source``'s state copied by value into the
    state ``target`` holds, the one a CUDA graph registered at its capture replays (and advances). So a call on a
    kept capture draws its own seed's stream. (``graphsafe_set_state`` would re-point ``target`` at ``source``'s
    state instead, while the graph went on drawing from the state it registered: the last call's stream.)"""
    target.set_state(source.get_state())
