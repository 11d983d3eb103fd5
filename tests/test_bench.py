"""The benchmark's measuring parts on a tiny pair: what it counts, and that its comparisons compare like with like.
(Speed itself is never asserted: the script reports it.)"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter

import pytest
import torch
from conftest import TickingClock, random_prompts, tiny_gpt2

import specdec
from experiments import bench, tree_bench
from experiments.common import harness
from specdec.batching import left_pad
from specdec.cache import CachedModel
from specdec.costs import CostModel
from specdec.profile import time_forwards


def tiny_pair() -> harness.Pair:
    target, draft = tiny_gpt2(0, layers=2), tiny_gpt2(1, layers=1)
    return harness.Pair("tiny", draft, target, random_prompts([5, 7, 6], seed=3), None, True)


@pytest.mark.parametrize("forward", ["transformers", "lean"])
def test_forward_timer_counts_a_body_call_inside_its_model_once(forward):
    """transformers' forward through module hooks (a body call alone counts, and once inside its model); the lean
    forward, which has no hooks, through its call; forwards of models not given are not timed."""
    model, other = tiny_gpt2(0, layers=1), tiny_gpt2(1, layers=1)
    timer = harness.ForwardTimer(TickingClock(), model)
    caches = [CachedModel(m, "target", forward=forward).new_cache(1, 16, torch.device("cpu")) for m in (model, other)]
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        for cache in caches:
            cache.feed(ids, logit_columns=torch.arange(0))  # the body alone: one timed call
            cache.feed(ids[:, :1])  # the model, whose body runs inside: one timed call
    timer.remove()
    assert timer.seconds == 2.0 and timer.depth == 0


@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_time_forwards_times_each_width_over_the_same_cache(layout):
    """With a clock that ticks once per reading, every forward takes one tick; each is rolled back, so every width
    is measured on top of the prompt alone."""
    model = tiny_gpt2(0, layers=1)
    prompt = torch.tensor([[3, 4, 5, 6, 7]])
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (kwargs["input_ids"].shape[1], kwargs["past_key_values"].get_seq_length())), with_kwargs=True)
    times = time_forwards(model, prompt, [1, 3], repeats=2, warmup=1, cache_layout=layout, clock=TickingClock(),
                          forward="transformers")
    hook.remove()
    assert times == {1: 1.0, 3: 1.0}
    # widths interleaved, one forward each per round (1 warm-up + 2 timed), each over the prompt alone (5 slots)
    assert seen == [(1, 5), (3, 5)] * 3


def test_time_forwards_refuses_widths_the_prompt_cannot_supply():
    with pytest.raises(ValueError, match=r"widths must be integers in \[1, 2\]"):
        time_forwards(tiny_gpt2(0, layers=1), torch.tensor([[3, 4]]), [1, 3])


def test_left_pad_pads_on_the_left_with_a_zero_mask():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=1)
    assert ids.tolist() == [[5, 6, 7], [1, 1, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="at least one prompt"):
        left_pad([])


def test_bench_tables_are_markdown_with_values_as_given():
    assert harness.markdown([{"k": 1, "tok_s": 1234.5, "note": "n/a (sampled)"}]) == (
        "| k | tok_s | note |\n| --- | --- | --- |\n| 1 | 1234.5 | n/a (sampled) |")


def test_comparison_runs_every_method_and_finds_identical_greedy_tokens(monkeypatch):
    """Ours, generate(), assisted generation at the same algorithm and at transformers' defaults: identical greedy
    tokens. The same-algorithm run drafts a constant k with the confidence cut-off off; the default run leaves
    transformers' own settings."""
    pair = tiny_pair()
    seen = []
    original = bench.transformers_generate

    def recording(target, draft, batch, max_new_tokens, k=None, *args, **kwargs):
        out = original(target, draft, batch, max_new_tokens, k, *args, **kwargs)
        config = draft.generation_config
        seen.append((kwargs.get("assistant_setting", "same_algorithm"), k, config.num_assistant_tokens,
                     config.num_assistant_tokens_schedule, config.assistant_confidence_threshold))
        return out

    monkeypatch.setattr(bench, "transformers_generate", recording)
    [row] = bench.comparison_table(pair, ks=[3], temperatures=[0.0], max_new_tokens=10, clock=TickingClock())
    assert row["identical_tokens"] is True
    assert {"ours_baseline_tok_s", "ours_speculative_tok_s", "hf_generate_tok_s", "hf_assisted_tok_s",
            "hf_assisted_default_tok_s"} <= set(row)
    assert ("same_algorithm", 3, 3, "constant", 0.0) in seen
    assert ("default", 1, None, None, None) in seen


def test_baseline_summary_averages_each_temperatures_rows():
    rows = [{"temperature": 0.0, "ours_baseline_tok_s": 99.0, "hf_generate_tok_s": 100.0},
            {"temperature": 0.0, "ours_baseline_tok_s": 103.0, "hf_generate_tok_s": 100.0},
            {"temperature": 1.0, "ours_baseline_tok_s": 90.0, "hf_generate_tok_s": 100.0}]
    assert bench.baseline_summary(rows).splitlines() == [
        "Baseline vs `generate()` at temperature 0.0: mean 1.010 over 2 interleaved measurements (min 0.99, max 1.03).",
        "Baseline vs `generate()` at temperature 1.0: mean 0.900 over 1 interleaved measurements (min 0.90, max 0.90).",
    ]


def test_batch_scaling_decodes_the_same_rows_at_every_batch_size(monkeypatch):
    pair = tiny_pair()
    calls = []
    original = bench.ours

    def counting(pair, k, temperature, max_new_tokens, batch, seed, stop_at_eos=True):
        calls.append((k, len(batch), stop_at_eos))
        return original(pair, k, temperature, max_new_tokens, batch, seed, stop_at_eos)

    monkeypatch.setattr(bench, "ours", counting)
    rows = bench.batch_scaling(pair, 2, [1, 2, 4], max_new_tokens=6, clock=TickingClock(), rounds=2)
    assert [row["batch"] for row in rows] == [1, 2, 4]
    assert rows[0]["spec_live_rows"] == 1.0  # a lone row generates until it is done
    assert all(0 < row["spec_live_rows"] <= 1 for row in rows)
    for size in (1, 2, 4):
        rows_decoded = sum(batch for _, batch, _ in calls if batch == size)
        assert rows_decoded == (1 + 2) * 2 * 4  # 4 rows, warm-up and two rounds, speculative and baseline each
    assert not any(stop for _, _, stop in calls)


@pytest.mark.parametrize("argv, message", [
    (["--ks", "2,0"], "--ks: expected an integer >= 1, got '0'"),
    (["--batch-sizes", "1,x"], "--batch-sizes: expected an integer >= 1, got 'x'"),
    (["--temperatures", "0,-1"], "--temperatures: expected comma-separated temperatures >= 0"),
    (["--batch-rounds", "0"], "--batch-rounds: expected an integer >= 1"),
])
def test_bad_arguments_stop_before_any_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


# --- shapes_bench: curves at synthetic acceptance ---------------------------------------------------------------


def shapes_args(**overrides):
    from experiments import shapes_bench

    argv = ["--prompts", "2", "--prompt-tokens", "5", "--max-new-tokens", "12", "--repeats", "1", "--rounds", "1"]
    return shapes_bench.parse_args(argv + [str(part) for item in overrides.items() for part in item])


def test_shapes_bench_curves_measure_the_set_acceptance_beside_both_predictions():
    """The costs each k's predictions use are measured for that k (a ticking clock: every forward one second)."""
    from experiments import shapes_bench

    pair = tiny_pair()
    args = shapes_args()
    clock = TickingClock()
    with torch.inference_mode():
        rows = shapes_bench.speculative_curves(pair, "eager", [0.0, 1.0], [1, 2], args, clock,
                                               torch.tensor([[3, 4, 5, 6, 7]]))
    assert [(row["acceptance"], row["k"]) for row in rows] == [(0.0, 1), (1.0, 1), (0.0, 2), (1.0, 2)]
    for row in rows:  # a = 0 and a = 1 leave no randomness: exactly what was set
        assert row["measured_acceptance"] == row["acceptance"]
        assert row["draft_ms"] == row["target_ms"] == row["verify_ms"] == 1000.0
        assert row["predicted_leviathan"] == round(specdec.predicted_speedup(row["acceptance"], row["k"], 1.0), 2)
        expected_tokens = row["k"] + 1 if row["acceptance"] == 1 else 1
        predicted = expected_tokens / (row["k"] + 1)
        assert row["predicted_measured_costs"] == round(predicted, 2)
        rounding = 0.005 / predicted + 0.0005  # decode_speedup is rounded to 0.01, the ratio to 0.001
        assert row["decode_speedup"] > 0 and row["decode_vs_predicted"] == pytest.approx(
            row["decode_speedup"] / predicted, abs=rounding)


def test_shapes_bench_throughput_sweep_and_transformers_comparison_on_a_tiny_pair():
    from experiments import shapes_bench

    pair = tiny_pair()
    args = shapes_args()
    with torch.inference_mode():
        sweep = shapes_bench.autoregressive_sweep(pair, ["eager"], [1, 3], args, TickingClock(), bandwidth=None)
    assert [row["batch"] for row in sweep] == [1, 3] and all(row["eager_tok_s"] > 0 for row in sweep)
    [row] = shapes_bench.transformers_comparison(pair, [2], args, TickingClock())
    assert row["ours_equals_hf_assisted"] is True and row["ours_equals_hf_generate"] is True


@pytest.mark.parametrize("argv, message", [
    (["--acceptances", "0.5,1.5"], "--acceptances: expected comma-separated acceptances in [0, 1]"),
    (["--modes", "eager,fast"], "--modes: expected comma-separated modes from eager, compiled"),
    (["--ks", "0"], "--ks: expected an integer >= 1, got '0'"),
])
def test_shapes_bench_rejects_bad_arguments_before_loading(argv, message, capsys):
    from experiments import shapes_bench

    with pytest.raises(SystemExit):
        shapes_bench.main(argv)
    assert message in capsys.readouterr().err


def test_shapes_bench_redraws_its_plots_from_its_own_markdown(tmp_path):
    from experiments import shapes_bench

    rows = [{"mode": "compiled", "acceptance": alpha, "k": float(k), "measured_acceptance": alpha,
             "baseline_tok_s": 100.0, "spec_tok_s": 100.0 + k, "speedup": 1 + alpha * k / 10,
             "predicted_measured_costs": 1.0, "predicted_leviathan": 1.1} for alpha in (0.6, 0.8) for k in (1, 2)]
    shapes_md = tmp_path / "shapes.md"
    shapes_md.write_text("# title\n\n## Speculative speedup\n\n" + harness.markdown(rows) + "\n\n| other | table |\n|---|---|\n| 1 | 2 |\n")
    assert shapes_bench.curves_from_markdown(shapes_md.read_text()) == rows
    shapes_bench.main(["--plot-from", str(shapes_md)])
    assert (tmp_path / "speedup_compiled.png").stat().st_size > 10_000


def test_comparison_rounds_decode_every_prompt_that_many_times_per_method(monkeypatch):
    pair = tiny_pair()
    decoded = []
    original = bench.ours

    def counting(pair, k, temperature, max_new_tokens, batch, seed, *args, **kwargs):
        decoded.append((k, tuple(batch[0])))
        return original(pair, k, temperature, max_new_tokens, batch, seed, *args, **kwargs)

    monkeypatch.setattr(bench, "ours", counting)
    bench.comparison_table(pair, ks=[2], temperatures=[0.0], max_new_tokens=6, clock=TickingClock(), rounds=3)
    speculative = [prompt for k, prompt in decoded if k == 2]
    # One warm-up decode, then every prompt three times.
    assert sorted(speculative[1:]) == sorted([tuple(p) for p in pair.prompts] * 3)


def test_transformers_runs_without_the_slow_bf16_cpu_head_slice_and_gives_the_same_tokens():
    """On CPU in bfloat16 transformers' generate() gets logits_to_keep=0 (its integer slice hits a slow matmul);
    the tokens are the ones its default gives."""
    pair = tiny_pair()
    assert harness.transformers_best_options(pair.target) == {}  # float64: its defaults
    bf16 = harness.Pair("tiny-bf16", pair.draft.to(torch.bfloat16), pair.target.to(torch.bfloat16), pair.prompts, None,
                      True)
    assert harness.transformers_best_options(bf16.target) == {"logits_to_keep": 0}
    ids = torch.tensor([bf16.prompts[0]])
    default = bf16.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                   pad_token_id=0)
    for k in (None, 3):
        decoded = harness.transformers_generate(bf16.target, bf16.draft, [bf16.prompts[0]], 8, k)
        assert decoded.tokens == [default[0, ids.shape[1]:].tolist()]


def test_compiled_methods_warm_up_on_every_distinct_prompt_so_no_compilation_is_timed():
    """A compiled method meets a new shape with each prompt width; the warm-up covers every distinct prompt (eager
    methods: the first only), so the timed calls compile nothing, and the count says so."""
    pair = tiny_pair()
    torch._dynamo.reset()
    doubled = torch.compile(lambda x: x * 2)
    calls = {"ours_compiled": [], "ours": []}

    def method(name):
        def decode(batch, seed):
            calls[name].append(len(batch[0]))
            return harness.Decoded([doubled(torch.tensor(batch[0])).tolist()])
        return harness.Method(decode, compiled=name == "ours_compiled")

    prompts = [[p] for p in pair.prompts] * 2  # widths 5, 7, 6, twice
    tallies = harness.run_interleaved({name: method(name) for name in calls}, prompts, TickingClock())
    assert calls["ours_compiled"][:3] == [5, 7, 6] and calls["ours"][:1] == [5]
    assert len(calls["ours_compiled"]) == 3 + 6 and len(calls["ours"]) == 1 + 6
    assert tallies["ours_compiled"].compilations_while_timed == 0
    assert tallies["ours_compiled"].warmup_seconds == 1  # one clock tick around its three warm-up calls


def test_a_compilation_in_the_timed_calls_is_counted():
    torch._dynamo.reset()
    doubled = torch.compile(lambda x: x * 2)
    widths = iter([3, 3, 4])  # the warm-up sees width 3; a timed call meets width 4

    def decode(batch, seed):
        return harness.Decoded([doubled(torch.ones(next(widths))).tolist()])

    tallies = harness.run_interleaved({"ours_compiled": harness.Method(decode, compiled=True)}, [[[1]], [[1]]],
                                      TickingClock())
    assert tallies["ours_compiled"].compilations_while_timed == 1


# --- the harness every bench shares -----------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7])
def test_rotation_balances_each_methods_place_and_the_method_run_before_it(count):
    """Over one cycle of the design (n orders, 2n for an odd count n) every method runs in every place equally often,
    and right after every other method equally often (a plain rotation always ran each one after the same one)."""
    names = [f"m{i}" for i in range(count)]
    cycle = count if count % 2 == 0 else 2 * count
    orders = [harness.rotation(names, index) for index in range(cycle)]
    assert all(sorted(order) == names for order in orders)
    places = Counter((order[place], place) for order in orders for place in range(count))
    assert len(places) == count * count and set(places.values()) == {cycle // count}
    successions = Counter(pair for order in orders for pair in zip(order, order[1:]))
    assert len(successions) == count * (count - 1)
    assert set(successions.values()) <= {cycle // count}
    assert harness.rotation(names, cycle) == orders[0]  # the design repeats


def test_run_interleaved_warms_up_each_method_then_rotates_the_order_per_batch():
    """Warm-up: one call per method on the first batch; then per batch every method once, the order rotating, the
    batch's index as the seed. With a ticking clock each timed call lasts one tick."""
    calls = []

    def method(name):
        def decode(batch, seed):
            calls.append((name, batch[0][0], seed))
            return harness.Decoded([[seed] * len(name)])
        return harness.Method(decode)

    batches = [[[10]], [[11]], [[12]]]
    tallies = harness.run_interleaved({name: method(name) for name in ("a", "bb", "ccc")}, batches, TickingClock())
    assert calls == [("a", 10, 0), ("bb", 10, 0), ("ccc", 10, 0),
                     ("a", 10, 0), ("bb", 10, 0), ("ccc", 10, 0),
                     ("bb", 11, 1), ("ccc", 11, 1), ("a", 11, 1),
                     ("ccc", 12, 2), ("a", 12, 2), ("bb", 12, 2)]
    assert tallies["bb"].outputs == [[[0, 0]], [[1, 1]], [[2, 2]]]  # timed calls only, in batch order
    assert tallies["bb"].tokens == 6 and tallies["bb"].seconds == 3.0
    assert all(math.isnan(tally.forward_seconds) for tally in tallies.values())  # no models given to time


def test_a_method_still_measuring_the_machine_warms_up_until_it_is_done(capsys):
    """A method measuring the machine after its warm-up call (a policy's calibration under way) is warmed up on the
    same batch until it is not; one that measures nothing is warmed up once; one that never finishes gets
    ``SETTLING_CALLS`` calls more and a warning, and its timed calls go ahead."""
    for measuring_calls, expected_warmups in ((0, 1), (2, 3), (10**6, 1 + harness.SETTLING_CALLS)):
        calls = []

        def decode(batch, seed):
            calls.append((batch[0][0], seed))
            return harness.Decoded([[seed]])

        method = harness.Method(decode, measuring=lambda: 0 < len(calls) <= measuring_calls)
        tallies = harness.run_interleaved({"policy": method}, [[[10]], [[11]]], TickingClock())
        assert calls == [(10, 0)] * expected_warmups + [(10, 0), (11, 1)]
        assert tallies["policy"].outputs == [[[0]], [[1]]]  # the timed calls only
        warned = "still measures the machine" in capsys.readouterr().err
        assert warned == (measuring_calls > harness.SETTLING_CALLS)


def test_cost_optimal_finishes_its_calibration_in_the_warm_up_at_any_batch_above_one():
    """Through a real decoder: the calibration (2 rounds of k = 0..3) outlasts a warm-up call of 8 tokens at batch
    2, so the warm-up goes on until it is done, and the timed calls take no calibration step; at batch 1 it never
    begins, and one warm-up call is all."""
    pair = tiny_pair()
    for rows, calibrated in ((2, True), (1, False)):
        policy = specdec.CostOptimalLength(k_max=3, calibration_rounds=2)
        decoder = specdec.Decoder(pair.target, specdec.ModelDrafter(pair.draft), draft_length=policy)
        seeds = []

        def decode(batch, seed):
            seeds.append(seed)
            return harness.Decoded.of(decoder.generate(torch.tensor(batch), None, max_new_tokens=8, seed=seed))

        method = harness.Method(decode, measuring=lambda: decoder.measuring)
        batch = [[5, 6, 7, 8]] * rows
        harness.warm_up_method(method, [batch], TickingClock())
        assert not decoder.measuring
        assert (not policy.calibration) == calibrated and (len(seeds) > 1) == calibrated
        before = len(policy.calibration)
        decode(batch, 1)
        assert len(policy.calibration) == before  # no calibration step in a timed call


def test_calls_from_first_call_take_its_seeds_and_rows_of_the_order():
    """Calls numbered from ``first_call``: call i runs with seed i in row i of the order, so a second process's calls
    (--processes) are new draws at T > 0, not the first process's samples again."""
    calls = []

    def method(name):
        def decode(batch, seed):
            calls.append((name, seed))
            return harness.Decoded([[seed]])
        return harness.Method(decode)

    harness.run_interleaved({name: method(name) for name in ("a", "bb", "ccc")}, [[[10]], [[11]]], TickingClock(),
                            first_call=4)
    timed = calls[3:]
    assert timed == [(name, 4) for name in harness.rotation(["a", "bb", "ccc"], 4)] + \
        [(name, 5) for name in harness.rotation(["a", "bb", "ccc"], 5)]
    assert harness.rotation(["a", "bb", "ccc"], 4) != harness.rotation(["a", "bb", "ccc"], 0)


def test_run_interleaved_times_the_forwards_inside_eager_calls_and_keeps_their_stats():
    """A call that runs one forward: the clock reads at the call's start, the forward's start and end, and the
    call's end, so the call lasts 3 ticks of which the forward is 1. The call's DecodeStats are kept in order."""
    pair = tiny_pair()
    ids = torch.tensor([pair.prompts[0]])
    stats = [specdec.generate(pair.target, ids, max_new_tokens=2).stats for _ in range(2)]

    def decode(batch, seed):
        with torch.no_grad():
            pair.target(ids)
        return harness.Decoded([[1]], (stats[seed],))

    tallies = harness.run_interleaved({"eager": harness.Method(decode)}, [[[1]], [[2]]], TickingClock(),
                                      timed_models=(pair.draft, pair.target))
    assert tallies["eager"].seconds == 6.0 and tallies["eager"].forward_seconds == 2.0
    assert tallies["eager"].overhead == pytest.approx(2 / 3)
    assert tallies["eager"].stats == stats


@pytest.mark.parametrize("check, text, message", [
    (harness.positive_int, "0", "expected an integer >= 1, got '0'"),
    (harness.positive_int, "2.5", "expected an integer >= 1, got '2.5'"),
    (harness.positive_ints, "1,,3", "expected an integer >= 1, got ''"),
    (harness.temperatures, "0,x", "expected comma-separated temperatures >= 0 (0 is greedy), got '0,x'"),
    (harness.temperatures, "nan", "expected comma-separated temperatures >= 0 (0 is greedy), got 'nan'"),
    (harness.single_temperature, "0.5,1", "expected a temperature >= 0 (0 is greedy), got '0.5,1'"),
    (harness.single_temperature, "-0.1", "expected a temperature >= 0 (0 is greedy), got '-0.1'"),
    (harness.fractions, "0.5,1.01", "expected comma-separated acceptances in [0, 1], got '0.5,1.01'"),
    (harness.names_from(["eager", "compiled"], "modes"), "eager,",
     "expected comma-separated modes from eager, compiled, got 'eager,'"),
])
def test_argument_checks_refuse_in_one_line_naming_the_value(check, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        check(text)
    assert str(refused.value) == message


def test_argument_checks_return_the_values_they_accept():
    assert harness.positive_ints("1, 8") == [1, 8]
    assert harness.temperatures("0,0.7") == [0.0, 0.7]
    assert harness.single_temperature("1") == 1.0
    assert harness.fractions("0,1") == [0.0, 1.0]
    assert harness.names_from(["eager", "compiled"], "modes")("compiled,eager") == ["compiled", "eager"]


def test_tree_bench_refuses_a_negative_temperature_before_loading(capsys):
    with pytest.raises(SystemExit):
        tree_bench.main(["--temperature", "-1"])
    assert "--temperature: expected a temperature >= 0 (0 is greedy), got '-1'" in capsys.readouterr().err


def test_cost_profile_is_in_seconds_and_the_tables_print_milliseconds():
    """A ticking clock makes every forward last one second."""
    costs = harness.cost_profile(tiny_pair(), torch.tensor([[3, 4, 5, 6]]), [1, 3], repeats=1, clock=TickingClock())
    assert costs == CostModel.at_batch_one(draft_step=1.0, target={1: 1.0, 3: 1.0})
    assert costs.cost_ratio() == 1.0 and costs.verify(2) == 1.0
    assert bench.cost_row(costs) == {"draft_forward_1_ms": 1000.0, "target_forward_1_ms": 1000.0,
                                     "target_forward_3_ms": 1000.0, "cost_ratio": 1.0}
    assert costs.milliseconds() == {"draft": 1000.0, "target_1": 1000.0, "target_3": 1000.0}


def test_measured_cost_prediction_is_unitless_and_is_leviathans_when_verifying_costs_one_step():
    seconds = CostModel.at_batch_one(draft_step=0.001, target={1: 0.010, 3: 0.012})
    milliseconds = CostModel.at_batch_one(draft_step=1.0, target={1: 10.0, 3: 12.0})
    # E = 1 + 0.5 + 0.25 tokens per step; a step costs 2 drafts and a verify of 3 tokens: 2 * 1 + 12 ms
    assert seconds.speedup(0.5, 2) == pytest.approx(1.75 * 10 / 14)
    assert milliseconds.speedup(0.5, 2) == pytest.approx(1.75 * 10 / 14)
    one_step = CostModel.at_batch_one(draft_step=0.002, target={1: 0.010, 3: 0.010})
    assert one_step.speedup(0.7, 2) == pytest.approx(specdec.predicted_speedup(0.7, 2, 0.2))


def test_predicted_table_sets_the_formula_beside_the_measured_costs():
    costs = CostModel.at_batch_one(draft_step=0.001, target={1: 0.010, 2: 0.011, 3: 0.012})
    rows = bench.predicted_table(costs, [1, 2])
    assert [(row["alpha"], row["verify cost"]) for row in rows] == [
        (alpha, kind) for alpha in (0.6, 0.7, 0.8) for kind in ("1 step (formula)", "measured")]
    assert rows[0]["k=2"] == round(specdec.predicted_speedup(0.6, 2, 0.1), 2)
    assert rows[1]["k=2"] == round(costs.speedup(0.6, 2), 2)


def test_random_prompts_are_the_same_for_the_same_seed():
    prompts = harness.random_prompts(3, 5, 50, seed=1)
    assert len(prompts) == 3 and all(len(p) == 5 and all(0 <= t < 50 for t in p) for p in prompts)
    assert prompts == harness.random_prompts(3, 5, 50, seed=1) != harness.random_prompts(3, 5, 50, seed=2)


def test_report_writes_its_sections_and_a_json_copy_beside_them(tmp_path, capsys):
    report = harness.Report()
    report.add("# title")
    report.table("## costs", [{"k": 1, "ms": 2.5}], note="a note", echo=False)
    report.write(tmp_path / "out" / "bench.md", {"sections": report.sections})
    text = (tmp_path / "out" / "bench.md").read_text()
    assert text == "# title\n\n## costs\n\n| k | ms |\n| --- | --- |\n| 1 | 2.5 |\n\na note\n"
    assert json.loads((tmp_path / "out" / "bench.json").read_text()) == {"sections": report.sections}
    assert capsys.readouterr().out == "# title\n"  # the table was added without echo


def test_transformers_configuration_says_how_each_named_method_ran():
    pair = tiny_pair()
    line = harness.transformers_configuration(pair.target, ["hf_generate", "hf_assisted"])
    assert "`hf_generate` is generate() with its defaults" in line
    assert "num_assistant_tokens=k, constant schedule, assistant_confidence_threshold=0" in line
    assert "hf_assisted_default" not in line
    bf16 = tiny_gpt2(0, layers=1).to(torch.bfloat16)
    bf16_line = harness.transformers_configuration(bf16, ["hf_generate"])
    assert "`hf_generate` is generate() with logits_to_keep=0" in bf16_line
