"""experiments.gpu_suite: the short plan's smoke run on CPU (JSON keys, tables, the preflight), the budget logic on a
fake clock, failures recorded rather than fatal, a failed preflight skipping the device step's items, the files
written after every item, the profile's timeline; and the device step its headline path runs, replayed under
CUDA-graph semantics emulated on CPU (the generator state a graph registers included)."""

from __future__ import annotations

import gzip
import json
import math
import tempfile
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec

from experiments import gpu_suite
from experiments.gpu import preflight, sections
from experiments.gpu.models import device_kind, tiny_gpt2
from experiments.gpu.plan import HEADLINE_KEYS, SHORT, smoke
from experiments.gpu.schedule import Budget, Estimates, Suite, section_budget
from specdec.trace import step_timeline, union_length
from specdec.batching import left_pad

SMOKE = smoke(SHORT)
ALL_BUT_STUDY = ",".join(name for name in SMOKE.sections if name != "study")


class FakeClock:
    """A clock the sections advance by hand."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One smoke run of the short plan, every section but the study job (the slow test below runs that one), with a
    budget no loaded machine runs out of: what the budgets skip is tested on a fake clock below."""
    out = tmp_path_factory.mktemp("smoke")
    payload = gpu_suite.main(["--smoke", "--out", str(out), "--sections", ALL_BUT_STUDY, "--budget", "36000"])
    return payload, out


def test_the_smoke_run_writes_every_headline_key_measured_on_cpu(smoke_run):
    payload, out = smoke_run
    written = json.loads((out / "gpu-cpu.json").read_text())
    assert list(written)[: len(HEADLINE_KEYS)] == list(HEADLINE_KEYS)
    assert written["device"] == "cpu" and written["copy_bandwidth_tbps"] is None  # a device copy is CUDA's
    assert written["preflight"] == "passed" and all(row["passed"] for row in written["tables"]["preflight"])
    assert written["spec_ks_measured"] == list(SHORT.ks) and set(SHORT.ks) >= {2, 3, 4, 5, 6}
    assert written["ar_batch1_share_of_bound"] is None  # no bandwidth, no bound
    for key in ("ar_batch1_tok_s", "hf_best_ar_batch1_tok_s", "draft_target_cost_ratio", "spec_speedup_a07_best",
                "spec_measured_over_predicted_a07", "embedded_ours_over_hf_assisted"):
        assert isinstance(written[key], float) and written[key] > 0, key
    assert written["spec_speedup_a07_best_k"] in SMOKE.ks
    assert written["identical_greedy_tokens"] is True
    assert written["host_reads_per_step"] <= 1  # the device step reads one small tensor per step
    assert list(written["sections"]) == ["preflight", *ALL_BUT_STUDY.split(",")]  # the plan's order
    assert all(record["status"] == "done" and not record["failed"] for record in written["sections"].values())


def test_the_smoke_tables_hold_what_the_headline_is_read_from(smoke_run):
    payload, out = smoke_run
    tables = payload["tables"]
    spec = tables["speculative"]
    assert [(row["acceptance"], row["k"]) for row in spec] == [(0.7, k) for k in SHORT.ks] + [
        (alpha, k) for k in SHORT.ks for alpha in SHORT.more_acceptances]  # the headline's first
    assert all(row["compiles"] == 0 for row in spec)  # uncompiled on CPU: what a k compiles is 0
    best = max((row for row in spec if row["acceptance"] == 0.7), key=lambda row: row["speedup"])
    assert (payload["spec_speedup_a07_best"], payload["spec_speedup_a07_best_k"]) == (best["speedup"], best["k"])
    for row in spec:
        # both factors rounded to 3 decimals: a ratio near 2.5 carries ~0.2% from their rounding
        assert row["measured_over_predicted"] == pytest.approx(row["decode_speedup"] / row["predicted"], rel=1e-2)
    batch1 = {row["method"]: row for row in tables["ar_batch1"]}
    assert set(batch1) == {*SMOKE.modes, *SMOKE.peers}
    assert payload["ar_batch1_tok_s"] == max(batch1[mode]["tok_s"] for mode in SMOKE.modes)
    assert payload["hf_best_ar_batch1_tok_s"] == max(batch1[peer]["tok_s"] for peer in SMOKE.peers)
    assert all(row["tokens_equal_reference"] for row in batch1.values())  # fp32: every path emits the same tokens
    assert [row["batch"] for row in tables["ar_batch2"]] == [2] * len(SMOKE.modes)  # no peers past batch 1
    assert payload["draft_target_cost_ratio"] == tables["cost_ratio"][0]["cost_ratio"]
    markdown = (out / "gpu-cpu.md").read_text()
    for heading in ("## Preflight: the device step on cpu", "## Autoregressive, batch 1", "## Cost ratio",
                    "## Speculative at synthetic acceptance", "## The embedded pair", "## Host reads per step",
                    "## Headline figures", "## Sections (time lines)"):
        assert heading in markdown, heading
    assert "| spec_speedup_a07_best | " in markdown


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    def broken(suite, budget):
        raise RuntimeError("no device copy here\nsecond line")

    monkeypatch.setitem(sections.SECTIONS, "bandwidth", broken)
    payload = gpu_suite.main(["--smoke", "--out", str(tmp_path), "--sections", "bandwidth,host_reads"])
    assert payload["sections"]["bandwidth"]["status"] == "failed"
    assert payload["sections"]["bandwidth"]["error"] == "RuntimeError: no device copy here"
    assert payload["sections"]["host_reads"]["status"] == "done" and payload["host_reads_per_step"] is not None
    assert "**Section `bandwidth` failed**: RuntimeError: no device copy here" in (tmp_path / "gpu-cpu.md").read_text()
    assert list(payload["sections"]) == ["preflight", "bandwidth", "host_reads"]  # --sections left the others out


@pytest.mark.parametrize("arguments, message", [
    (["--sections", "bandwidth,warp_speed"], "--sections: expected comma-separated sections from preflight, bandwidth"),
    (["--plan", "medium"], "--plan: invalid choice: 'medium'"),
    (["--budget", "-5"], "--budget: expected a positive number of seconds, got '-5'"),
    (["--budget", "nan"], "--budget: expected a positive number of seconds, got 'nan'"),
    (["--pair", "gpt5"], "--pair: invalid choice: 'gpt5'"),
    (["--profile", "0"], "--profile: expected a k from 1 to 16, got '0'"),
])
def test_bad_arguments_are_refused_in_one_line_with_exit_2(arguments, message, capsys):
    with pytest.raises(SystemExit) as refused:
        gpu_suite.main(["--smoke", *arguments])
    assert refused.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the GPU plans")
def test_the_gpu_plans_refuse_a_machine_without_cuda(capsys):
    with pytest.raises(SystemExit) as refused:
        gpu_suite.main(["--out", "/tmp/never-written"])
    assert refused.value.code == 2
    assert "the GPU suite needs CUDA (torch sees no GPU); --smoke runs it on CPU" in capsys.readouterr().err


def test_a_failed_preflight_skips_every_device_step_item_and_says_why(tmp_path, monkeypatch):
    """The device step refused: the items that run it are skipped with the preflight's reason; the others run."""
    monkeypatch.setattr(preflight, "preflight_checks", lambda plan: [
        preflight.check_row("greedy on a fresh capture: the host loop's tokens", True, "equal"),
        preflight.check_row("greedy on a kept capture: the host loop's tokens", False, "row 1 differs from token 3")])
    payload = gpu_suite.main(["--smoke", "--out", str(tmp_path), "--sections",
                              "ar_batch1,cost_ratio,speculative,spec_acceptances,host_reads"])
    why = "greedy on a kept capture: the host loop's tokens: row 1 differs from token 3"
    assert payload["preflight"] == f"failed: {why}"
    batch1 = {row["method"]: row for row in payload["tables"]["ar_batch1"]}
    assert batch1["lean_compiled"]["tok_s"] is None and batch1["hf_static"]["tok_s"] > 0
    assert payload["tables"]["speculative"] == [] and payload["spec_ks_measured"] is None
    assert payload["draft_target_cost_ratio"] > 0  # timed uncaptured: not the device step
    assert [row["step"] for row in payload["tables"]["host_reads"]] == ["host"]
    sections = payload["sections"]
    assert sections["ar_batch1"]["skipped"] == [f"skipped lean_compiled at batch 1 (first call): the preflight "
                                                f"failed ({why})"]
    assert sections["speculative"]["skipped"] == [f"skipped k = {k} at acceptance 0.7: the preflight failed "
                                                  f"({why})" for k in SHORT.ks]
    assert "failed: greedy on a kept capture" in (tmp_path / "gpu-cpu.md").read_text()


def test_a_preflight_that_raises_fails_with_its_error(tmp_path, monkeypatch):
    def broken(plan):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(preflight, "preflight_checks", broken)
    payload = gpu_suite.main(["--smoke", "--out", str(tmp_path), "--sections", "host_reads"])
    assert payload["preflight"] == ("failed: the checks ran: RuntimeError: CUDA error: operation not permitted when "
                                    "stream is capturing")
    assert payload["sections"]["preflight"]["status"] == "done" and payload["host_reads_per_step"] is None


def test_both_files_are_written_after_every_item(tmp_path, monkeypatch):
    """What the JSON said each time it was written: the k values measured grow one item at a time."""
    written = []
    write = gpu_suite.write

    def recording_write(suite, path):
        payload = write(suite, path)
        assert json.loads(path.with_suffix(".json").read_text()) == json.loads(json.dumps(payload))
        written.append(payload["spec_ks_measured"])
        return payload

    monkeypatch.setattr(gpu_suite, "write", recording_write)
    gpu_suite.main(["--smoke", "--out", str(tmp_path), "--sections", "speculative"])
    growing = [ks for index, ks in enumerate(written) if ks and ks != written[index - 1]]
    assert growing == [list(SHORT.ks[: n]) for n in range(1, len(SHORT.ks) + 1)]


def test_the_profile_traces_a_call_on_a_kept_capture(tmp_path):
    payload = gpu_suite.main(["--smoke", "--profile", "4", "--out", str(tmp_path)])
    [row] = payload["tables"]["profile"]
    assert row["k"] == 4 and row["emitted"] == sections.PROFILE_NEW_TOKENS and row["target_forwards"] > 1
    assert row["graph_launches"] == 0  # CPU: no graphs, no device kernels
    with gzip.open(tmp_path / "trace-k4.json.gz") as trace:
        assert json.load(trace)["traceEvents"]
    assert (tmp_path / "profile-k4.md").exists() and (tmp_path / "profile-k4.json").exists()


def test_the_step_timeline_counts_device_time_against_gaps_from_the_first_graph_launch():
    events = [
        {"cat": "kernel", "name": "prefill", "ts": 10, "dur": 50},  # before the first launch: not counted
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 100, "dur": 5},
        {"cat": "kernel", "name": "gemv", "ts": 110, "dur": 40},
        {"cat": "kernel", "name": "attention", "ts": 150, "dur": 20},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 200, "dur": 5},
        {"cat": "kernel", "name": "gemv", "ts": 210, "dur": 50},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 255, "dur": 25},  # overlaps the gemv by 5
        {"cat": "cpu_op", "name": "aten::copy_", "ts": 120, "dur": 300},
    ]
    timeline = step_timeline(events)
    assert timeline["graph_launches"] == 2 and timeline["window_us"] == 180  # 100 .. 280
    assert timeline["busy_us"] == 60 + 70 and timeline["gap_us"] == 50 and timeline["busy_share"] == round(130 / 180, 3)
    assert timeline["step_us"] == 90 and timeline["kernel_us_per_step"] == 55 and timeline["kernels_per_step"] == 1.5
    assert [(row["kernel"], row["count"], row["total_us"]) for row in timeline["top_kernels"]] == [
        ("gemv", 2, 90), ("attention", 1, 20)]
    assert step_timeline([{"cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}])["busy_share"] is None
    assert union_length([(0, 10), (5, 12), (20, 25)]) == 17


# --- the budget logic ---------------------------------------------------------------------------------------------


def test_a_budget_allows_what_fits_and_names_what_it_skips():
    clock = FakeClock()
    budget = Budget(30, clock.now)
    assert budget.allows("k = 3", 30)
    clock.t = 20
    assert not budget.allows("k = 4", 12.4)
    assert budget.skipped == ["skipped k = 4: needs ~12 s, 10 s left in the section"]
    clock.t = 45
    assert not budget.allows("k = 5", 1) and budget.skipped[-1].endswith("0 s left in the section")


def test_estimates_are_the_longest_measured_else_the_guess():
    estimates = Estimates()
    assert estimates.of("first:eager", 5.0) == 5.0
    estimates.add("first:eager", 2.0)
    estimates.add("first:eager", 3.0)
    estimates.add("first:eager", 1.0)
    assert estimates.of("first:eager", 5.0) == 3.0 and estimates.of("first:lean", 7.0) == 7.0


def test_a_section_gets_what_is_left_less_the_later_sections_shares():
    assert section_budget(left=100, later_shares=30) == 70
    assert section_budget(left=20, later_shares=30) == 0


def test_unused_time_goes_to_the_next_section_and_later_shares_stay_reserved():
    clock = FakeClock()
    plan = replace(SMOKE, budget_seconds=100, shares={"a": 40, "b": 30, "c": 30})
    suite = Suite(plan, now=clock.now)
    budgets = {}

    def section(name, spend):
        def run(suite, budget):
            budgets[name] = budget.left()
            clock.t += spend
        return run

    suite.run({"a": section("a", 10), "b": section("b", 60), "c": section("c", 5)})
    assert budgets["a"] == 40  # 100 left, 60 reserved for b and c
    assert budgets["b"] == 60  # a's unused 30 came to b; c's 30 still reserved
    assert budgets["c"] == 30  # b overran its budget by 0: c keeps its share
    assert [suite.records[name].seconds for name in "abc"] == [10, 60, 5]
    assert all(record.status == "done" for record in suite.records.values())


def test_attempt_skips_items_that_cannot_fit_and_learns_from_those_that_ran():
    clock = FakeClock()
    suite = Suite(replace(SMOKE, budget_seconds=100, shares={}), now=clock.now)
    ran = []

    def item(k, seconds):
        def work():
            ran.append(k)
            clock.t += seconds
            return k
        return work

    budget = Budget(50, clock.now)
    assert suite.attempt(budget, "k = 3", "spec_k", 10, item(3, 30)) == 3  # guessed 10, took 30
    assert suite.attempt(budget, "k = 4", "spec_k", 10, item(4, 1)) is None  # now estimated at 30, 20 left
    assert ran == [3] and budget.skipped == ["skipped k = 4: needs ~30 s, 20 s left in the section"]


def test_attempt_records_an_item_that_raises_and_the_section_goes_on():
    clock = FakeClock()
    suite = Suite(replace(SMOKE, shares={}), now=clock.now)
    budget = Budget(50, clock.now)

    def broken():
        raise ValueError("fullgraph capture failed")

    assert suite.attempt(budget, "hf_static_compiled at batch 1", "first:x", 1, broken) is None
    assert budget.failed == ["hf_static_compiled at batch 1: ValueError: fullgraph capture failed"]
    assert suite.attempt(budget, "eager at batch 1", "first:eager", 1, lambda: "ran") == "ran"


@pytest.mark.parametrize("name, kind", [("NVIDIA H100 80GB HBM3", "nvidia-h100"), ("NVIDIA H200", "nvidia-h200"),
                                        ("cpu", "cpu"), ("AMD Instinct MI300X", "amd-instinct-mi300x")])
def test_the_files_are_named_by_the_device_tools_kind(name, kind):
    assert device_kind(name) == kind


@pytest.mark.slow
def test_the_study_job_runs_with_wandb_offline(tmp_path, monkeypatch):
    """One short experiment=gpt2_xl_study job (embedded pair on CPU, eager) as the suite runs it: a subprocess."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its scratch run directory
    payload = gpu_suite.main(["--smoke", "--out", str(tmp_path), "--sections", "study"])
    [row] = payload["tables"]["study"]
    assert row["exit_code"] == 0 and row["status"] == "complete" and row["wandb_offline_runs"] == 1
    assert row["logger"] == "wandb" and row["run_dir"].startswith(str(tmp_path))
    assert row["compile"] is False and row["compile_seconds"] is None and row["speedup_mean"] > 0
    assert payload["study_ok"] is True


# --- the device step under CUDA-graph semantics, emulated on CPU --------------------------------------------------
# The GPU suite's headline path replays each step as a CUDA graph (specdec.device_loop.DeviceRun.captured_step). A
# replay runs the captured kernels over the tensors the capture saw, and none of the Python around them, so a step
# that rebinds a state tensor instead of writing it in place, reads the host, or sizes a tensor from data breaks
# there and nowhere on CPU. GraphRecorder gives CPU those semantics.


class GraphRecorder(TorchDispatchMode):
    """``with recorder: fn()`` notes every tensor op ``fn`` runs, as a CUDA graph capture does; ``replay()`` runs the
    noted ops again over the very same tensors, without the Python around them, writing each op's result into the
    tensor the recording returned. A capture runs no kernel, so ``undo()`` gives back the tensors the recording
    wrote in place their earlier values, and poisons the ones it allocated (NaN, or a huge integer) until a replay
    writes them. Ops that hand a value to the host are listed in ``host_reads`` (a capture refuses them).
    ``registered``: the generator state registered with the graph (``CudaLikeGenerator.graphsafe_get_state()`` at
    capture, as ``CUDAGraph.register_generator_state`` registers it): every random op of a replay draws from it,
    whatever the generator the recording saw points at by then."""

    def __init__(self, registered: torch.Generator | None = None):
        super().__init__()
        self.registered = registered
        self.ops, self.saved, self.fresh, self.host_reads = [], [], [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for argument, value in zip(func._schema.arguments, [*args, *kwargs.values()]):
            if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.Tensor):
                self.saved.append((value, value.clone()))
        out = func(*args, **kwargs)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        if not all(isinstance(tensor, torch.Tensor) for tensor in outputs):
            self.host_reads.append(str(func))
        # An op that may return a view (``to``, ``contiguous``) returns a new tensor when it must convert: only an
        # output sharing an input's storage is written by the replay itself.
        inputs = {value.untyped_storage().data_ptr() for value in [*args, *kwargs.values()]
                  if isinstance(value, torch.Tensor)}
        aliased = any(result.alias_info is not None for result in func._schema.returns) and all(
            isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() in inputs for tensor in outputs)
        if not aliased:
            self.fresh += [tensor for tensor in outputs if isinstance(tensor, torch.Tensor)]
        self.ops.append((func, args, kwargs, outputs, aliased))
        return out

    def undo(self) -> None:
        for tensor, before in reversed(self.saved):
            tensor.copy_(before)
        for tensor in self.fresh:
            if tensor.is_floating_point():
                tensor.fill_(math.nan)
            elif tensor.dtype != torch.bool:
                tensor.fill_(2**40 if tensor.element_size() == 8 else 2**30)

    def inputs(self) -> dict[int, str]:
        """The storages the recording read without making them (state from before the capture), by data pointer,
        each with the first op that read it."""
        made, read = set(), {}
        for func, args, kwargs, outputs, _ in self.ops:
            for value in [*args, *kwargs.values()]:
                for tensor in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(tensor, torch.Tensor) and tensor.numel():
                        pointer = tensor.untyped_storage().data_ptr()
                        if pointer not in made:
                            read.setdefault(pointer, f"{func} of a {tensor.dtype} {list(tensor.shape)}")
            made |= {tensor.untyped_storage().data_ptr() for tensor in outputs if isinstance(tensor, torch.Tensor)}
        return read

    def replay(self) -> None:
        for func, args, kwargs, outputs, aliased in self.ops:
            if kwargs.get("generator") is not None and self.registered is not None:
                kwargs = {**kwargs, "generator": self.registered}
            results = func(*args, **kwargs)
            if not aliased:  # views and in-place ops already wrote the tensors the recording saw
                results = results if isinstance(results, (tuple, list)) else (results,)
                for recorded, result in zip(outputs, results):
                    recorded.copy_(result)


class CudaLikeGenerator(torch.Generator):
    """A CPU generator with a CUDA generator's two levels: the generator object points at a state object
    (``graphsafe_get_state``), which is what a graph capture registers and its replays draw from and advance.
    ``graphsafe_set_state`` re-points the generator at another's state object, leaving the registered one behind;
    ``set_state`` copies a state by value into the state object the generator points at; ``get_state`` reads it. The
    state object it is born pointing at is its own torch state, the one ops called with it draw from. It reports
    device "cuda", so code that branches on the device takes the CUDA path. (Draws by eager ops after a re-pointing
    are not modelled: after adopting a kept capture the device step draws through replays only.)"""

    points_at: torch.Generator

    @classmethod
    def holding(cls, generator: torch.Generator) -> CudaLikeGenerator:
        """A new one at ``generator``'s place in its stream."""
        made = cls()
        made.points_at = made
        made.set_state(generator.get_state())
        return made

    @property
    def device(self) -> torch.device:
        return torch.device("cuda")

    def graphsafe_get_state(self) -> torch.Generator:
        return self.points_at

    def graphsafe_set_state(self, state: torch.Generator) -> None:
        self.points_at = state

    def get_state(self) -> torch.Tensor:
        return torch.Generator.get_state(self.points_at)

    def set_state(self, state: torch.Tensor) -> None:
        torch.Generator.set_state(self.points_at, state)


def emulated_capture(self):
    """``DeviceRun.capture`` as on CUDA, with a GraphRecorder for the graph (the generator's state registered) and
    CUDA's one-step-late read."""
    self.lag = 1
    recorder = GraphRecorder(registered=self.generator.graphsafe_get_state())
    random_state = self.generator.get_state()  # a capture draws no random number: its replays do
    with recorder:
        flags = self.device_step()
    recorder.undo()
    self.generator.set_state(random_state)
    self.recorders.append(recorder)
    held = storages_held(self)  # what the run still holds once the capture is over: the rest a CUDA run frees
    self.orphan_reads.extend(what for pointer, what in recorder.inputs().items() if pointer not in held)

    def replay():
        recorder.replay()
        return flags
    return replay


def storages_held(root, depth: int = 10) -> set[int]:
    """Data pointers of every tensor reachable from ``root`` through attributes, containers and modules' parameters
    and buffers."""
    held, seen, todo = set(), set(), [(root, 0)]
    while todo:
        item, level = todo.pop()
        if id(item) in seen or level > depth:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            held.add(item.untyped_storage().data_ptr())
        elif isinstance(item, torch.nn.Module):
            held |= {tensor.untyped_storage().data_ptr() for tensor in [*item.parameters(), *item.buffers()]}
        elif isinstance(item, dict):
            todo += [(value, level + 1) for value in item.values()]
        elif isinstance(item, (list, tuple, set)):
            todo += [(value, level + 1) for value in item]
        elif hasattr(item, "__dict__"):
            todo += [(value, level + 1) for value in vars(item).values()]
    return held


@pytest.fixture
def graph_semantics(monkeypatch):
    """Every device step captured and replayed as a CUDA graph would be, its random draws from the generator state
    registered at capture (each run's generator a ``CudaLikeGenerator``); yields the recorders made. Each run's
    ``orphan_reads`` lists what its capture read from tensors the run no longer holds once the capture is over
    (rebound to new ones during it): on CUDA their blocks go back to the allocator while the graph still reads them."""
    from specdec.device_loop import DeviceRun

    recorders, orphan_reads = [], []
    start_run = DeviceRun.__init__

    def start_run_with_a_cuda_like_generator(self, *args, **kwargs):
        start_run(self, *args, **kwargs)
        self.generator = CudaLikeGenerator.holding(self.generator)

    monkeypatch.setattr(DeviceRun, "__init__", start_run_with_a_cuda_like_generator)
    monkeypatch.setattr(DeviceRun, "recorders", recorders, raising=False)
    monkeypatch.setattr(DeviceRun, "orphan_reads", orphan_reads, raising=False)
    monkeypatch.setattr(DeviceRun, "capture", emulated_capture)
    monkeypatch.setattr(DeviceRun, "captures", lambda self: True)
    return recorders, orphan_reads


def test_the_recorder_replays_like_a_graph_and_catches_a_rebound_state_tensor():
    """In-place state advances on every replay; state rebound to a new tensor stays where the capture left it."""
    in_place, rebound = torch.zeros(2), torch.zeros(2)

    def step():
        nonlocal rebound
        in_place.add_(1)
        rebound = rebound + 1

    recorder = GraphRecorder()
    with recorder:
        step()
    recorder.undo()
    assert in_place.tolist() == [0, 0]  # a capture runs nothing
    for _ in range(3):
        recorder.replay()
    assert in_place.tolist() == [3, 3] and rebound.tolist() == [1, 1]
    with GraphRecorder() as reads:
        bool(in_place.sum() > 0)
    assert reads.host_reads


def replayed_and_host_outputs(drafted: bool) -> dict:
    """Ragged rows and an EOS, greedy, k = 3, decoded by the host loop and by the device step (whose steps after the
    first two replay as a graph under ``graph_semantics``)."""
    target, draft = (tiny_gpt2(layers, seed).double() for layers, seed in ((2, 1), (1, 0)))
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 200, (n,), generator=generator).tolist() for n in (3, 14, 8, 1)]
    ids, mask = left_pad(prompts)
    outputs = {}
    for step in ("host", "device"):
        drafter = specdec.ModelDrafter(draft) if drafted else None
        decoder = specdec.Decoder(target, drafter, specdec.Greedy(), specdec.FixedLength(3), step=step)
        outputs[step] = decoder.generate(ids, mask, max_new_tokens=24, eos_token_id=17)
    return outputs


@pytest.mark.parametrize("drafted", [True, False], ids=["model-drafter", "baseline"])
def test_replayed_device_steps_emit_the_host_loops_greedy_tokens(graph_semantics, drafted):
    """Token for token the host loop's output, and the capture read nothing from the host."""
    outputs = replayed_and_host_outputs(drafted)
    recorders, _ = graph_semantics
    assert recorders and all(not recorder.host_reads for recorder in recorders)
    assert outputs["device"].tokens == outputs["host"].tokens
    assert outputs["device"].stats.emitted == outputs["host"].stats.emitted


@pytest.mark.parametrize("drafted", [True, False], ids=["model-drafter", "baseline"])
def test_a_captured_step_reads_no_tensor_the_run_let_go_of(graph_semantics, drafted):
    replayed_and_host_outputs(drafted)
    _, orphan_reads = graph_semantics
    assert orphan_reads == []


def test_a_kept_capture_serves_later_calls_of_the_same_shapes(graph_semantics):
    """One capture per set of shapes, kept by the Decoder: a later call adopts its tensors after its own prefill's
    step and replays it, with the host loop's greedy tokens; another budget (other shapes) captures its own;
    ``release`` frees them."""
    recorders, orphan_reads = graph_semantics
    target, draft = (tiny_gpt2(layers, seed).double() for layers, seed in ((2, 1), (1, 0)))
    generator = torch.Generator().manual_seed(3)
    batches = [left_pad([torch.randint(1, 200, (n,), generator=generator).tolist() for n in widths])
               for widths in ((3, 9), (7, 2), (4, 4))]

    def decoder(step, sampling=specdec.SamplingConfig()):
        return specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Speculative(), specdec.FixedLength(3),
                               sampling, step=step)

    device, host = decoder("device"), decoder("host")
    for ids, mask in batches:
        assert device.generate(ids, mask, max_new_tokens=20).tokens == host.generate(ids, mask, max_new_tokens=20).tokens
    assert len(recorders) == 1 and len(device.device_program.captures) == 1 and orphan_reads == []
    captured, replayed = preflight.graph_counts(device)  # the program's own counts, which the preflight reads
    assert captured == 1 and replayed > 0
    ids, mask = batches[0]
    assert device.generate(ids, mask, max_new_tokens=30).tokens == host.generate(ids, mask, max_new_tokens=30).tokens
    assert len(recorders) == 2
    device.release()
    assert not device.device_program.captures


def test_a_sampled_call_depends_only_on_its_seed_whether_its_capture_is_fresh_or_kept(graph_semantics):
    """Temperature 1, speculative sampling: a call replaying a kept capture, after a call with another seed, emits
    what its seed emitted on a fresh capture, and what another decoder's fresh capture emits for that seed. A graph
    replays the generator state registered at its capture, so a call's stream must be copied into that state by
    value: re-pointing the generator (``graphsafe_set_state``) would leave the graph drawing on from the last
    call's stream (issue 36)."""
    recorders, _ = graph_semantics
    target, draft = (tiny_gpt2(layers, seed).double() for layers, seed in ((2, 1), (1, 0)))
    generator = torch.Generator().manual_seed(5)
    ids, mask = left_pad([torch.randint(1, 200, (n,), generator=generator).tolist() for n in (5, 8)])

    def decoder():
        return specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Speculative(), specdec.FixedLength(3),
                               specdec.SamplingConfig(temperature=1.0), step="device")

    kept = decoder()
    first = kept.generate(ids, mask, max_new_tokens=24, seed=4).tokens  # captures
    other_seed = kept.generate(ids, mask, max_new_tokens=24, seed=9).tokens  # replays the kept capture
    assert kept.generate(ids, mask, max_new_tokens=24, seed=4).tokens == first  # so does this one
    assert len(recorders) == 1 and other_seed != first  # the seed matters
    assert preflight.graph_counts(kept)[0] == 1 and preflight.graph_counts(kept)[1] > 0  # what the preflight reads
    assert decoder().generate(ids, mask, max_new_tokens=24, seed=4).tokens == first  # a fresh capture
    assert len(recorders) == 2


def test_the_cuda_like_generator_replays_the_state_registered_at_capture():
    """The emulation's generator semantics, as CUDA's: a replay draws from the state registered at capture and
    advances it; re-pointing the generator leaves the graph on the registered state; ``set_state`` writes it."""

    def captured_draw(generator):
        recorder = GraphRecorder(registered=generator.graphsafe_get_state())
        state = generator.get_state()
        with recorder:
            drawn = torch.rand(4, generator=generator)  # [4]
        recorder.undo()
        generator.set_state(state)  # a capture draws nothing
        return recorder, drawn

    def draws(seed, count):
        stream = torch.Generator().manual_seed(seed)
        return [torch.rand(4, generator=stream) for _ in range(count)]

    repointed = CudaLikeGenerator.holding(torch.Generator().manual_seed(1))
    recorder, drawn = captured_draw(repointed)
    recorder.replay()
    assert torch.equal(drawn, draws(1, 1)[0])
    repointed.graphsafe_set_state(CudaLikeGenerator.holding(torch.Generator().manual_seed(2)).graphsafe_get_state())
    assert torch.equal(repointed.get_state(), torch.Generator().manual_seed(2).get_state())
    recorder.replay()
    assert torch.equal(drawn, draws(1, 2)[1])  # the registered stream went on
    by_value = CudaLikeGenerator.holding(torch.Generator().manual_seed(1))
    recorder, drawn = captured_draw(by_value)
    by_value.set_state(torch.Generator().manual_seed(2).get_state())
    recorder.replay()
    assert torch.equal(drawn, draws(2, 1)[0])
