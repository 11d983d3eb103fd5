"""The load-aware draft length (``draft_length=cost_optimal``) in the loop: exact greedy decoding under every k it
takes, plain decode steps (k = 0) included, while rows finish and leave the batch; the cost model it reads
(``specdec.costs``); the k histogram the loop reports. Its choice on synthetic costs is tested in test_policies.py.

The policy adapts k, so it runs on the host driver only (the device step takes a fixed k: ``adapts`` is False);
both forwards are checked. Models are tiny random GPT-2s in float64; transformers' greedy output is the reference.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import TickingClock, hf_greedy, left_pad, random_prompts, tiny_gpt2

import specdec
from specdec.costs import CostModel, CostTable, doubling_rows, interpolate, measure_costs, measure_table, monotone
from specdec.interfaces import DraftLengthPolicy

TARGET = tiny_gpt2(0, layers=3)
DRAFT = tiny_gpt2(1, layers=1)
NEW_TOKENS = 14


class Scripted(DraftLengthPolicy):
    """Answers k from a schedule with plain decode steps in it, as the load-aware policy does when drafting stops
    paying, and counts the rows it is told leave."""

    name = "scripted"
    SCHEDULE = (0, 3, 0, 0, 5, 1, 2, 0, 4)

    @property
    def max_k(self) -> int:
        return max(self.SCHEDULE)

    def start(self) -> None:
        self.answers = itertools.cycle(self.SCHEDULE)
        self.rows_left: list[int] = []

    def next_k(self) -> int:
        return next(self.answers)

    def select_rows(self, index: torch.Tensor) -> None:
        self.rows_left.append(index.shape[0])


def prompts_and_eos():
    """Ragged prompts, and an EOS that one row's greedy continuation reaches early, so rows finish apart."""
    prompts = random_prompts([3, 9, 5, 12], seed=7)
    eos = hf_greedy(TARGET, prompts[1], NEW_TOKENS)[4]
    return prompts, eos


def reference(prompts, eos) -> list[list[int]]:
    return [hf_greedy(TARGET, prompt, NEW_TOKENS, eos_token_id=eos) for prompt in prompts]


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_k_changes_with_plain_decode_steps_stay_exact_while_rows_leave(forward):
    prompts, eos = prompts_and_eos()
    ids, mask = left_pad(prompts)
    policy = Scripted()
    decoder = specdec.Decoder(TARGET, specdec.ModelDrafter(DRAFT, forward=forward), specdec.Speculative(), policy,
                              forward=forward, step="host")
    out = decoder.generate(ids, mask, NEW_TOKENS, eos_token_id=eos)
    assert out.tokens == reference(prompts, eos)
    assert policy.rows_left, "no row left the batch: the EOS should end a row early"
    for row in out.stats.rows:
        assert sum(row.steps_by_k) == row.target_calls  # every step the row generated in, counted once by its k
    assert out.stats.totals.steps_by_k[0] > 0 and sum(out.stats.totals.steps_by_k[1:]) > 0


def test_cost_optimal_measures_its_costs_in_the_decoder_and_stays_exact():
    prompts, eos = prompts_and_eos()
    ids, mask = left_pad(prompts)
    policy = specdec.CostOptimalLength(k_max=4, repeats=1)
    decoder = specdec.Decoder(TARGET, specdec.ModelDrafter(DRAFT), specdec.Speculative(), policy)
    for _ in range(2):  # the second call starts from the machine the first learned
        out = decoder.generate(ids, mask, NEW_TOKENS, eos_token_id=eos)
        assert out.tokens == reference(prompts, eos)
    assert policy.costs.target.rows == doubling_rows(len(prompts)) == [1, 2, 4]
    assert policy.costs.draft is not None and policy.step_costs() is not None
    assert sum(out.stats.totals.steps_by_k) == out.stats.target_calls


def test_cost_optimal_at_temperature_one_counts_every_step_in_its_k_histogram():
    """Sampling: the k histogram still counts every step of every row, plain decode steps included."""
    prompts = random_prompts([4, 8], seed=3)
    ids, mask = left_pad(prompts)
    costs = CostModel(CostTable({1: {n: 1.0 for n in range(1, 6)}, 2: {n: 1.0 + 0.6 * n for n in range(1, 6)}}),
                      CostTable({1: {1: 0.05}, 2: {1: 0.05}}))
    policy = specdec.CostOptimalLength(k_max=4, costs=costs)
    out = specdec.Decoder(TARGET, specdec.ModelDrafter(DRAFT), specdec.Speculative(), policy,
                          specdec.SamplingConfig(temperature=1.0)).generate(ids, mask, NEW_TOKENS, seed=1)
    assert [len(tokens) for tokens in out.tokens] == [NEW_TOKENS, NEW_TOKENS]
    for row in out.stats.rows:
        assert sum(row.steps_by_k) == row.target_calls


def test_the_baseline_counts_every_step_as_k_zero():
    prompts = random_prompts([5, 7], seed=1)
    ids, mask = left_pad(prompts)
    out = specdec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=6)
    assert [row.steps_by_k for row in out.stats.rows] == [[6], [6]]


# --- the cost model ---------------------------------------------------------------------------------------------


def test_a_cost_table_interpolates_linearly_and_extends_along_its_end_segments():
    table = CostTable({b: {n: 1.0 + 0.5 * b * n for n in (1, 3, 9)} for b in (1, 4, 16)})
    for rows, width in ((1, 1), (2, 2), (4, 5), (16, 9), (10, 7)):
        exact = 1.0 + 0.5 * rows * width
        assert table.at(rows, width) == pytest.approx(exact, rel=0.35)  # bilinear on a product: close, not exact
    assert table.at(4, 2) == pytest.approx(1.0 + 0.5 * 4 * 2)  # linear in the width at a measured row count
    assert interpolate({1: 1.0, 2: 2.0}, 4) == 4.0 and interpolate({1: 3.0}, 8) == 3.0
    assert interpolate({1: 2.0, 2: 1.0}, 5) == 0.0  # never below 0


def test_the_step_cost_is_k_drafts_a_verification_and_the_loops_overhead():
    costs = CostModel(CostTable.of_widths({1: 10.0, 3: 12.0}), CostTable.of_widths({1: 1.0}),
                      overhead={"chain": 0.5, "baseline": 0.25})
    assert costs.chain_step(2) == 2 * 1.0 + 12.0 + 0.5 and costs.baseline_step() == 10.25
    assert costs.speedup(0.5, 2) == pytest.approx(1.75 * 10.25 / 14.5)


class ScriptedDurations:
    """A clock read twice per timed forward (before, after), under which the forwards take ``durations`` seconds in
    turn, cycling."""

    def __init__(self, durations: list[float]):
        self.durations, self.readings, self.time = itertools.cycle(durations), 0, 0.0

    def now(self) -> float:
        self.readings += 1
        if self.readings % 2 == 0:
            self.time += next(self.durations)
        return self.time


def test_measured_tables_keep_a_dip_in_the_width_and_take_each_widths_fastest_round():
    assert monotone({1: 1.0, 2: 3.0, 3: 2.0}) == {1: 1.0, 2: 2.5, 3: 2.5}  # the tree search's fit
    assert doubling_rows(1) == [1] and doubling_rows(16) == [1, 2, 4, 8, 16] and doubling_rows(6) == [1, 2, 4, 6]
    # Widths 1, 2, 3 per round: a warm-up round, then rounds at 9, 3, 2 s and at 1, 5, 4 s (the 5 s: load).
    clock = ScriptedDurations([0.0, 0.0, 0.0, 9.0, 3.0, 2.0, 1.0, 5.0, 4.0])
    table = measure_table(tiny_gpt2(0, layers=1), [1], [1, 2, 3], repeats=2, context=8, clock=clock)
    assert table.seconds == {1: {1: 1.0, 2: 3.0, 3: 2.0}}  # 3 tokens cost less than 2: kept, as measured


def test_the_policys_costs_are_measured_at_every_width_it_can_choose():
    costs = measure_costs(tiny_gpt2(0, layers=1), tiny_gpt2(1, layers=1), 3, 5, repeats=1, clock=TickingClock())
    assert sorted(costs.target.seconds) == [1, 2, 3]
    assert all(sorted(widths) == [1, 2, 3, 4, 5, 6] for widths in costs.target.seconds.values())
    assert all(sorted(widths) == [1, 2] for widths in costs.draft.seconds.values())  # the first forward: 2 tokens
