"""experiments.tree_search: the shapes it searches, its acceptance models against the real loop (greedy traces
replayed give the loop's own tau for every static tree; the synthetic schedule's expectation matches decoding with
``SyntheticAcceptance``), its argument checks, and a whole run on a tiny pair that writes a config a sweep can use."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml

import specdec
from conftest import CONFIGS, random_prompts, tiny_gpt2
from experiments import tree_search
from experiments.common.harness import Pair
from experiments.tree_search import RankTraces, Schedule, all_branchings, greedy_traces, num_nodes


@pytest.fixture(scope="module")
def pair():
    """A draft that is the target with a little noise: it agrees about half the time, and ranks the target's token
    second or third often enough for trees to matter."""
    target = tiny_gpt2(0, init=0.3)
    draft = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(0)
    for parameter in draft.parameters():
        parameter.add_(0.02 * torch.randn(parameter.shape, generator=noise, dtype=parameter.dtype))
    return Pair("tiny", draft, target, random_prompts([5, 8, 3, 6], seed=2), None, True)


def test_every_branching_within_the_budget_and_depth_is_searched():
    assert set(all_branchings(3, 3)) == {(1,), (2,), (1, 1), (3,), (1, 2), (1, 1, 1)}
    shapes = all_branchings(16, 5)
    assert len(shapes) == len(set(shapes)) and all(num_nodes(s) <= 16 and len(s) <= 5 for s in shapes)
    assert (2, 2, 1, 1) in shapes and (16,) in shapes and (1, 1, 1, 1, 1) in shapes and (2, 2, 2) in shapes
    assert (2, 2, 2, 1) not in shapes and (1, 1, 1, 1, 1, 1) not in shapes


def test_a_trace_is_replayed_as_the_loop_decodes():
    traces = RankTraces([[1, 2, 1, 3, 1, 1]], max_new_tokens=6)
    # (2, 1): step 1 keeps tokens 1 (rank 1 <= 2) and 2 (rank 2 > 1 at depth 2: no) -> keeps 1, emits 2;
    # step 2 starts at token 3: rank 1 <= 2, then token 4 rank 3 > 1 -> emits 2; step 3 at token 5: budget leaves
    # 1 draft: keeps it (rank 1), emits 2. Six tokens in three calls.
    steps = traces.steps((2, 1))
    assert (steps.tokens, steps.calls, steps.decode_tokens, steps.decode_calls) == (6, 3, 4, 2)
    # A chain of 1 on [2, 1, 1, 1, 3, 1]: token 1 is not the draft's first choice (emits 1); then tokens 2 and 4 are
    # (emit 2 each, the second of each pair the target's own); the budget leaves the last call no draft.
    assert RankTraces([[2, 1, 1, 1, 3, 1]], 6).steps((1,)).calls == 4


@pytest.mark.parametrize("branching", [(1, 1, 1), (2, 1), (3, 2), (2, 2, 1, 1)], ids=str)
def test_replayed_traces_give_the_loops_own_tau_for_every_tree(pair, branching):
    traces = greedy_traces(pair, pair.prompts, max_new_tokens=24)
    drafter = (specdec.ModelDrafter(pair.draft) if set(branching) == {1}
               else specdec.TreeDrafter(pair.draft, branching))
    decoder = specdec.Decoder(pair.target, drafter, specdec.Speculative(), specdec.FixedLength(len(branching)))
    emitted = calls = 0
    for prompt in pair.prompts:
        stats = decoder.generate(torch.tensor([prompt]), None, 24).stats
        emitted, calls = emitted + stats.emitted, calls + stats.target_calls
    predicted = traces.steps(branching)
    assert (predicted.tokens, predicted.calls) == (emitted, calls)
    assert len(pair.prompts) * 24 / (len(branching) + 1) < calls < len(pair.prompts) * 24  # drafts kept and lost


def test_the_schedules_expectation_matches_decoding_at_synthetic_acceptance(pair):
    schedule = Schedule([0.9, 0.6, 0.3], decay=1.0, prompts=64, max_new_tokens=20)
    branching = (2, 1, 1)
    drafter = specdec.TreeDrafter(pair.draft, branching)
    decoder = specdec.Decoder(pair.target, drafter, schedule.strategy, specdec.FixedLength(3))
    prompts = random_prompts([6] * 64, seed=5)
    out = decoder.generate(torch.tensor(prompts), None, 20, seed=3)
    predicted = schedule.steps(branching)
    assert out.stats.emitted == predicted.tokens
    assert out.stats.target_calls == pytest.approx(predicted.calls, rel=0.04)  # ~570 calls: 4 % is ~4 sigma


def test_noisy_costs_are_fitted_non_decreasing_without_carrying_a_spike_forward():
    fitted = tree_search.monotone({1: 1.0, 2: 3.0, 3: 2.0, 4: 4.0, 8: 1.0, 16: 5.0})
    assert list(fitted.values()) == pytest.approx([1.0, 2.5, 2.5, 2.5, 2.5, 5.0])


def test_a_decay_schedule_falls_per_position():
    schedule = Schedule([0.8], decay=0.5, prompts=1, max_new_tokens=8)
    assert schedule.rates(3) == pytest.approx([0.8, 0.4, 0.2])
    assert schedule.kept_distribution((1, 1), 2) == pytest.approx([0.2, 0.8 * 0.6, 0.8 * 0.4])


@pytest.mark.parametrize("argv, message", [
    (["--pair", "gpt2-xl-shaped"], "has random weights: give its synthetic per-position --acceptance"),
    (["--acceptance", "0.8"], "--acceptance is for \\*-shaped pairs"),
    (["--pair", "gpt2-xl-shaped", "--acceptance", "0.8,0.7", "--decay", "0.9"], "applies to a single --acceptance"),
    (["--node-budget", "2000"], "--node-budget must be at most 1024"),
    (["--compare", "2-0"], "expected an integer >= 1"),
    (["--config-name", "../x"], "--config-name must be letters"),
])
def test_bad_arguments_are_one_line_before_any_model_loads(argv, message, capsys, loads):
    with pytest.raises(SystemExit):
        tree_search.parse_args(argv)
    assert message.replace("\\", "") in capsys.readouterr().err and loads["pair"] == 0


def test_a_search_on_a_tiny_pair_reports_and_writes_a_tree_option(pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tree_search, "load_bench_pair", lambda name, count, device, dtype: Pair(
        name, pair.draft, pair.target, random_prompts([5] * count, seed=1), None, True))
    tree_search.main(["--node-budget", "4", "--max-depth", "3", "--profile-prompts", "4", "--prompts", "2",
                      "--max-new-tokens", "10", "--repeats", "1", "--compare", "2-1", "--config-dir",
                      str(tmp_path / "drafter"), "--config-name", "searched", "--out", str(tmp_path / "out")])
    written = yaml.safe_load((tmp_path / "drafter" / "searched.yaml").read_text())
    result = json.loads((tmp_path / "out" / "tree_search.json").read_text())
    assert written["_target_"] == "specdec.TreeDrafter.from_pair" and written["branching"] == result["chosen"]
    assert num_nodes(tuple(written["branching"])) <= 4 and set(written["branching"]) != {1}
    roles = [row["role"] for row in result["checked"]]
    assert roles[:2] == ["chosen tree", "best chain"]
    assert all(row["same tokens as baseline"] for row in result["checked"])
    assert "## Prediction and measurement" in (tmp_path / "out" / "tree_search.md").read_text()
    specdec.TreeDrafter.check_options(**{k: v for k, v in written.items() if not k.startswith("_")})
    assert (CONFIGS / "drafter" / "tree.yaml").exists()  # the searched option sits beside it in a real run
