"""The step on the device (``Decoder(step="device")``, specdec.device_loop): the same tokens as the host loop,
exact sampling, and one host read per step."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import specdec
from conftest import hf_greedy, left_pad, random_prompts
from specdec.device_loop import DeviceRun
from specdec.testing import check_lossless


def decoders(target, drafter_for, k):
    return {step: specdec.Decoder(target, drafter_for(), specdec.Speculative(), specdec.FixedLength(k), step=step)
            for step in ("host", "device")}


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("drafted", [True, False], ids=["model-drafter", "baseline"])
def test_device_steps_emit_the_host_loops_greedy_tokens(target, draft, k, drafted):
    """Ragged rows, an EOS that ends rows at different steps, a draft rejected often: token for token the host
    loop's output, which equals transformers' greedy decoding."""
    prompts = random_prompts([3, 14, 8, 1], seed=7)
    ids, mask = left_pad(prompts)
    eos = hf_greedy(target, prompts[2], 9)[-1]
    outputs = {step: decoder.generate(ids, mask, max_new_tokens=30, eos_token_id=eos)
               for step, decoder in decoders(target, lambda: specdec.ModelDrafter(draft) if drafted else None,
                                             k).items()}
    assert outputs["device"].tokens == outputs["host"].tokens
    assert outputs["device"].tokens[0] == hf_greedy(target, prompts[0], 30)[: len(outputs["device"].tokens[0])]
    assert outputs["device"].stats.emitted == outputs["host"].stats.emitted
    if drafted:
        assert 0 < outputs["device"].stats.accepted < outputs["device"].stats.drafted


def test_device_step_with_a_batch_of_one_and_a_draft_equal_to_the_target(target):
    prompt = random_prompts([9], seed=3)[0]
    decoder = specdec.Decoder(target, specdec.ModelDrafter(target), specdec.Greedy(), specdec.FixedLength(4),
                              step="device")
    out = decoder.generate(torch.tensor([prompt]), max_new_tokens=23)
    assert out.tokens == [hf_greedy(target, prompt, 23)] and out.stats.acceptance_rate == 1.0


def test_the_device_step_is_lossless_at_temperature_one():
    report = check_lossless(specdec.Speculative(), step="device")
    assert report.lossless and 0.05 < report.acceptance_rate < 0.95


def test_a_deliberately_wrong_rule_fails_the_check_on_the_device_step():
    assert not check_lossless(specdec.Speculative(lenience=0.3), step="device").lossless


class HostReads:
    """Counts the ways a host reads a tensor's values: item, tolist, bool, int, float, index."""

    METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, original=original):
                self.count += 1
                return original(tensor, *args)
            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("drafted", [True, False], ids=["model-drafter", "baseline"])
def test_the_device_step_reads_the_host_once_per_step(target, draft, monkeypatch, drafted):
    """Reads at the call's start and end are a constant; each further step adds at most one (its flags)."""
    ids, mask = left_pad(random_prompts([5, 9], seed=4))
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft) if drafted else None, specdec.Speculative(),
                              specdec.FixedLength(3), step="device")
    decoder.generate(ids, mask, max_new_tokens=4)  # warm: nothing counted is a first-call cost
    reads = HostReads(monkeypatch)
    counts = {}
    for max_new_tokens in (10, 40):
        reads.count = 0
        out = decoder.generate(ids, mask, max_new_tokens=max_new_tokens)
        counts[max_new_tokens] = (reads.count, out.stats.target_forwards + 1)  # steps: the prefill's and the rest
    (short_reads, short_steps), (long_reads, long_steps) = counts[10], counts[40]
    assert long_steps > short_steps + 5
    assert long_reads - short_reads <= long_steps - short_steps
    host = specdec.Decoder(target, specdec.ModelDrafter(draft) if drafted else None, specdec.Speculative(),
                           specdec.FixedLength(3), step="host")
    reads.count = 0
    host_steps = host.generate(ids, mask, max_new_tokens=40).stats.target_forwards + 1
    assert reads.count >= host_steps + 2  # the counter sees the host loop's reads (one a step, and more): it can fail


def test_what_cannot_run_on_the_device_is_refused_in_one_line(target, draft):
    cases = {
        "no lean forward": dict(drafter=specdec.ModelDrafter(draft), forward="transformers"),
        "does not draft on the device": dict(drafter=specdec.NGramDrafter()),
        "trees and n-gram lookups run on the host": dict(drafter=specdec.TreeDrafter(draft, (2, 1))),
        "adapts k from host reads": dict(drafter=specdec.ModelDrafter(draft), draft_length=specdec.HeuristicLength()),
    }
    for message, options in cases.items():
        drafter = options.pop("drafter")
        with pytest.raises(ValueError, match=f"step='device' cannot run this decoder: .*{message}"):
            specdec.Decoder(target, drafter, step="device", **options)
    assert specdec.Decoder(target, specdec.ModelDrafter(draft), compile=True).device_program is not None
    assert specdec.Decoder(target, specdec.NGramDrafter(), compile=True).device_program is None  # auto: host


class StepReads(TorchDispatchMode):
    """Records the storage of every tensor an operation reads or writes, and of every tensor one makes."""

    def __init__(self):
        super().__init__()
        self.touched, self.made = {}, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = [t for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)]
        result = func(*args, **(kwargs or {}))
        before = {storage_of(t) for t in inputs}
        self.touched.update({storage_of(t): str(func) for t in inputs if t.numel()})
        self.made.update(storage_of(t) for t in tree_leaves(result)
                         if isinstance(t, torch.Tensor) and storage_of(t) not in before)
        return result


def storage_of(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


@pytest.mark.parametrize("drafted", [True, False], ids=["model-drafter", "baseline"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_captured_step_touches_only_what_its_capture_keeps(target, draft, drafted, temperature):
    """A CUDA graph replays on the addresses its capture saw, so every tensor the step reads or writes must be the
    models' parameters, the state a kept capture holds (``device_state``) or made by the step itself: anything else
    is freed when its call ends and a later call's replay would touch freed memory. Checked on the step a capture
    records (the first after the shapes settle), on any device."""
    ids, mask = left_pad(random_prompts([3, 11, 6], seed=5))
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft) if drafted else None, specdec.Speculative(),
                              specdec.FixedLength(3), specdec.SamplingConfig(temperature=temperature), step="device")
    run = DeviceRun(decoder.device_program, ids, mask, 20, None, 0)
    run.begin(run.capacity, fixed_shapes=True)
    run.device_step(first=True)
    run.device_step()  # the eager step after which a model drafter's shapes have settled
    reads = StepReads()
    with reads:
        run.device_step()
    kept = {storage_of(t) for model in (target, draft) for t in (*model.parameters(), *model.buffers())}
    kept |= {storage_of(t) for t in run.device_state().values()}
    outside = {func for storage, func in reads.touched.items() if storage not in kept | reads.made}
    assert reads.touched and not outside
