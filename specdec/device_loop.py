"""The step on the device (``Decoder(step="device")``): each decode step as one program over device-resident state.

The host loop (``specdec.decode``) reads a handful of scalars after every step to crop caches, narrow queues, retire
rows and bound k. Here nothing of that is read: the step's phases are the host loop's (propose, verify, judge, log,
emit, roll back, notify), over the same parts, with every bound computed on the device:

- the target's and the draft's caches are lean caches (``specdec.cache.LeanCache``): per-row lengths on the device,
  rollback is length arithmetic, the next write overwrites rejected slots, attention spans the whole capacity so
  every step of a given k has the same shapes;
- rows never leave the batch: a finished row feeds holes and emits nothing (its budget is 0);
- k is fixed (``FixedLength``); a draft always drafts k tokens (an EOS in it is cut when emitting);
- per-row state (emitted, remaining, active), the queues, the step log's row and the output are updated in place.

So after two eager steps (the prefill's, and one that compiles the decode shapes) the step is captured once as a
CUDA graph on CUDA (with the generator registered, so sampling replays exactly) and replayed; elsewhere it runs as
is. The capture is kept by the Decoder's ``DeviceProgram`` and replayed by every later call of the same shapes:
after its prefill's step, such a call copies its state into the tensors the graph reads (each owner adopts its own:
``device_state``/``adopt_device_state`` of the run, the target's context and cache, and the drafter) and goes on
with the graph's random stream from where its own stands. The host reads one small tensor per step, the step's flags (rows still generating; usable logits; a valid
verdict), one step late on CUDA through a pinned non-blocking copy, so the device never waits for the host. The
lagged read lets one step run past the end; it emits nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from specdec.cache import adopted, static_capacity
from specdec.context import CachedContext
from specdec.emit import GenerationOutput, check_flags, count_new, finish_call
from specdec.stats import DecodeStats, StepLog
from specdec.timing import Clock
from specdec.types import StepOutcome

FLAG_NAMES = ("generating", "target_usable", "drafts_finite", "verdict_in_range")


def device_step_blocker(decoder) -> str | None:
    """Why this decoder's steps cannot run on the device (one line), or None when they can."""
    if not decoder.runner.is_lean:
        return "the target has no lean forward (specdec.lean supports GPT-2 and the Llama family; forward='auto')"
    drafter, policy = decoder.drafter, decoder.draft_length
    if not (drafter.proposes_nothing or drafter.drafts_on_device):
        return (f"drafter {drafter.name!r} does not draft on the device (model drafters with a lean forward do; "
                f"trees and n-gram lookups run on the host)")
    if decoder.speculates and (policy.adapts or policy.stops_drafts):
        return f"draft-length policy {policy.name!r} adapts k from host reads; the device step takes FixedLength"
    return None


@dataclass
class Capture:
    """A captured step: its replay (returning the step's flags), the generator it replays, and the tensors it reads
    and writes, by name (a later call of the same shapes adopts them)."""

    replay: Callable[[], torch.Tensor]
    generator: torch.Generator
    state: dict[str, torch.Tensor]


class DeviceProgram:
    """The device step of one ``Decoder``: runs its calls (``DeviceRun``) and keeps their captured steps, one per
    set of shapes (batch size, capacities, budget, k), for later calls; ``release`` frees them."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.captures: dict[tuple, Capture] = {}

    def run(self, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int) -> GenerationOutput:
        return DeviceRun(self, input_ids, attention_mask, max_new_tokens, eos_ids, seed).run()

    def release(self) -> None:
        self.captures.clear()


class DeviceRun:
    """One ``generate`` call on the device step. Owns the target's context and the per-row state."""

    def __init__(self, program: DeviceProgram, input_ids, attention_mask, max_new_tokens: int, eos_ids, seed: int):
        self.program, self.decoder = program, program.decoder
        decoder, self.input_ids, self.attention_mask = self.decoder, input_ids, attention_mask
        self.max_new_tokens, self.eos_ids = max_new_tokens, eos_ids
        self.device = device = input_ids.device
        batch_size, width = input_ids.shape
        self.k = decoder.k_max
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.clock = Clock(device)
        limit = decoder.context_limit if decoder.context_limit is not None else 2**62
        room = limit - attention_mask.sum(-1)  # [B]
        self.original = torch.arange(batch_size, device=device)  # [B]
        self.emitted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.remaining = room.clamp(max=max_new_tokens)  # [B] 0 once a row finished
        self.active = torch.ones(batch_size, dtype=torch.bool, device=device)  # [B]
        self.output = torch.zeros(batch_size, max_new_tokens + self.k + 1, dtype=torch.long, device=device)
        self.slot_offsets = torch.arange(self.k + 1, device=device)  # [k+1]
        # Every step emits a token to each generating row; the lagged stop may add one step that emits nothing.
        self.max_steps = max_new_tokens + 1
        self.log = StepLog(batch_size, self.k, max_steps=self.max_steps, device=device)
        self.capacity = static_capacity(width, max_new_tokens + 2 * (self.k + 1))
        self.lag = 1 if device.type == "cuda" else 0  # steps between a step and the host's read of its flags
        if device.type == "cuda":
            self.host_flags = torch.zeros(2, len(FLAG_NAMES), dtype=torch.bool, pin_memory=True)  # [2, 4]

    def run(self) -> GenerationOutput:
        decoder = self.decoder
        start = self.clock.now()
        decoder.draft_length.start()
        decoder.drafter.start(self.input_ids, self.attention_mask)
        decoder.drafter.fix_shapes(self.capacity)  # a captured step replays one set of shapes
        batch_size = self.input_ids.shape[0]
        cache = decoder.runner.new_cache(batch_size, self.capacity, self.device, fixed_span=True)
        padded = batch_size > 1 or not bool(self.attention_mask.all())  # one host read per call
        self.target = CachedContext(cache, self.input_ids, self.attention_mask if padded else None)
        generating = self.read(self.stash(self.step(), 0))  # the prefill's step: its tokens give the TTFT
        self.log.note(self.layout, self.overlap_is_acceptance)
        ttft = self.clock.now() - start
        first_step_forwards = decoder.drafter.num_forwards
        first_step_emitted = self.emitted.sum()  # [] read at the end
        steps, unread = 1, []  # unread: flags not read yet, oldest first
        if generating and self.max_steps > 1:
            run_step = self.kept_capture()
            if run_step is None:
                unread.append(self.stash(self.warm_up_step(), steps))  # eager: compiles the decode shapes
                self.log.note(self.layout, self.overlap_is_acceptance)
                steps, run_step = 2, self.captured_step()
            while True:
                if len(unread) > self.lag:
                    generating = self.read(unread.pop(0))
                if not generating or steps >= self.max_steps:
                    break
                unread.append(self.stash(run_step(), steps))
                steps += 1
                self.note_replay()
        for flags in unread:  # the flags of steps past the end still say whether their logits were usable
            self.read(flags)
        return finish_call(self.output, self.emitted, self.log, DecodeStats(
            rows=[],
            draft_forwards=decoder.drafter.num_forwards - first_step_forwards,
            target_forwards=steps - 1,
            draft_seconds=math.nan,  # phases run inside one program: only the call's wall time is measured
            target_seconds=math.nan,
            wall_seconds=self.clock.now() - start,
            ttft_seconds=ttft,
            first_step_emitted=int(first_step_emitted),
            draft_step_seconds=math.nan,
            target_step_seconds=math.nan,
        ))

    def step(self) -> torch.Tensor:
        """One step's phases, no host read; returns its [4] bool flags (``FLAG_NAMES``)."""
        decoder = self.decoder
        proposal = decoder.drafter.propose(self.k, decoder.sampling, self.generator)  # 1
        layout = proposal.layout
        target_logits = self.target.feed(proposal.tokens, layout, self.active, num_logits=layout.num_nodes + 1)  # 2
        judgement = decoder.verifier(proposal, target_logits, self.generator)  # 3
        verdict, active_during_step = judgement.verdict, self.active.clone()
        kept_or_idle = torch.where(active_during_step, verdict.num_accepted, -1)  # [B]
        self.log.add(self.original, kept_or_idle, proposal, judgement)  # 4
        self.layout, self.overlap_is_acceptance = layout, judgement.overlap_is_acceptance
        new_tokens, num_new = self.emit(layout, proposal, judgement)  # 5
        self.target.commit(layout, verdict.path, num_new, verdict.next_token, proposal.tokens, self.active,
                           None)  # 7 (no 6: nothing is read)
        outcome = StepOutcome(
            k=layout.depth, layout=layout, num_accepted=verdict.num_accepted, next_token=verdict.next_token,
            path=verdict.path, new_tokens=new_tokens, num_new=num_new, active=active_during_step,
            active_after=self.active, host=None, draft_seconds=math.nan, target_seconds=math.nan,
        )
        decoder.drafter.commit(outcome)  # 8
        decoder.draft_length.observe(outcome)
        flags = [self.active.any(), judgement.target_usable, proposal.finite, judgement.verdict_in_range]
        return torch.stack([flag if flag is not None else self.active.new_ones(()) for flag in flags])  # [4]

    def emit(self, layout, proposal, judgement) -> tuple[torch.Tensor, torch.Tensor]:
        """The host loop's emit, with the per-row state updated in place."""
        verdict, new_tokens = judgement.verdict, judgement.new_tokens
        if new_tokens is None:
            path_tokens = layout.path_tokens(proposal.tokens, verdict.path)  # [B, d]
            new_tokens = torch.cat([path_tokens, verdict.next_token.unsqueeze(1)], 1)  # [B, d+1]
            new_tokens.scatter_(1, verdict.num_accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))
        slot = self.slot_offsets[: layout.depth + 1]  # [d+1]
        num_new, no_eos = count_new(new_tokens, verdict.num_accepted, self.remaining, self.eos_ids, slot)
        slots = (self.emitted.unsqueeze(1) + slot).clamp(max=self.output.shape[1] - 1)  # [B, d+1]
        self.output.index_put_((self.original.unsqueeze(1), slots), new_tokens)  # past num_new: rewritten or unread
        self.emitted += num_new
        self.remaining -= num_new
        if no_eos is not None:
            self.remaining *= no_eos
        self.active.copy_(self.remaining > 0)
        return new_tokens, num_new

    def warm_up_step(self) -> torch.Tensor:
        """The second step, eager; on CUDA on a side stream, as capturing wants (lazy per-stream set-up happens
        outside the capture)."""
        if self.device.type != "cuda":
            return self.step()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            flags = self.step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return flags

    def stash(self, flags: torch.Tensor, step: int):
        """Start copying a step's flags to the host without waiting: on CUDA into a pinned buffer (two slots: at
        most the lag plus one are in flight), with an event marking the copy's end."""
        if self.device.type != "cuda":
            return flags
        slot = self.host_flags[step % 2]
        slot.copy_(flags, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return slot, done

    def captured_step(self):
        """How to run each later step: replay a CUDA graph of it on CUDA (captured here, kept for later calls of the
        same shapes), else run it."""
        if not self.captures():
            self.replays_run_python = True
            return self.step
        self.replays_run_python = False
        forwards = self.decoder.drafter.num_forwards  # capturing runs the Python, not the step
        replay = self.capture()
        self.decoder.drafter.num_forwards = forwards
        self.program.captures[self.shapes()] = Capture(replay, self.generator, self.device_state())
        return replay

    def captures(self) -> bool:
        """Whether later steps replay a captured graph (on CUDA) rather than run the Python."""
        return self.device.type == "cuda"

    def capture(self):
        """The step captured as a CUDA graph (the generator registered, so sampling replays); its replay."""
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        with torch.cuda.graph(graph):
            flags = self.step()

        def replay() -> torch.Tensor:
            graph.replay()
            return flags
        return replay

    def kept_capture(self):
        """A kept capture of this call's shapes, its state adopted (after the prefill's step) and its generator
        set to where this call's stream stands; None where there is none."""
        kept = self.program.captures.get(self.shapes()) if self.captures() else None
        if kept is None:
            return None
        self.adopt_device_state(kept.state)
        carry_random_stream(self.generator, kept.generator)
        self.generator, self.replays_run_python = kept.generator, False
        return kept.replay

    def shapes(self) -> tuple:
        """What a capture is specialised to: every state tensor's name, shape and dtype."""
        return tuple((name, tuple(tensor.shape), tensor.dtype) for name, tensor in sorted(self.device_state().items()))

    def device_state(self) -> dict[str, torch.Tensor]:
        """The tensors a captured step reads from the step before it, by name: this run's, the target's context's
        and the drafter's."""
        state = {"original": self.original, "emitted": self.emitted, "remaining": self.remaining,
                 "active": self.active, "output": self.output, "slot_offsets": self.slot_offsets,
                 **{f"log.{name}": tensor for name, tensor in self.log.device_state().items()}}
        if self.eos_ids is not None:
            state["eos_ids"] = self.eos_ids
        state.update({f"target.{name}": tensor for name, tensor in self.target.device_state().items()})
        state.update({f"drafter.{name}": tensor for name, tensor in self.decoder.drafter.device_state().items()})
        return state

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue in ``state``'s tensors: each owner copies its values there and uses them from now on."""
        for name in ("original", "emitted", "remaining", "active", "output", "slot_offsets", "eos_ids"):
            if name in state:
                setattr(self, name, adopted(state[name], getattr(self, name)))
        self.log.adopt_device_state(within(state, "log."))
        self.target.adopt_device_state(within(state, "target."))
        self.decoder.drafter.adopt_device_state(within(state, "drafter."))

    def note_replay(self) -> None:
        """What a later step did, recorded on the host (a replayed graph runs no Python)."""
        self.log.note(self.layout, self.overlap_is_acceptance)
        if not self.replays_run_python and not self.decoder.drafter.proposes_nothing:
            self.decoder.drafter.num_forwards += self.k

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
