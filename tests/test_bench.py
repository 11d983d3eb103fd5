"""The benchmark's measuring parts on a tiny pair: what it counts, and that its comparisons compare like with like.
(Speed itself is never asserted: the script reports it.)"""

from __future__ import annotations

import pytest
import torch
from conftest import TickingClock, random_prompts, tiny_gpt2

import specdec
from experiments import bench
from specdec.batching import left_pad
from specdec.cache import KVCache
from specdec.profile import time_forwards


def tiny_pair() -> bench.Pair:
    target, draft = tiny_gpt2(0, layers=2), tiny_gpt2(1, layers=1)
    return bench.Pair("tiny", draft, target, random_prompts([5, 7, 6], seed=3), None, True)


def test_forward_timer_counts_a_body_call_inside_its_model_once():
    model = tiny_gpt2(0, layers=1)
    timer = bench.ForwardTimer(TickingClock(), model)
    cache = KVCache(model, 1, torch.device("cpu"), "target")
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        cache.prefill(ids, torch.ones_like(ids))  # the body alone: one timed call
        cache.forward(ids[:, :1], torch.ones_like(ids[:, :1]))  # the model, whose body runs inside: one timed call
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
    times = time_forwards(model, prompt, [1, 3], repeats=2, warmup=1, cache_layout=layout, clock=TickingClock())
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
    assert bench.markdown([{"k": 1, "tok_s": 1234.5, "note": "n/a (sampled)"}]) == (
        "| k | tok_s | note |\n| --- | --- | --- |\n| 1 | 1234.5 | n/a (sampled) |")


def test_comparison_runs_every_method_and_finds_identical_greedy_tokens(monkeypatch):
    """Ours, generate(), assisted generation at the same algorithm and at transformers' defaults: identical greedy
    tokens. The same-algorithm run drafts a constant k with the confidence cut-off off; the default run leaves
    transformers' own settings."""
    pair = tiny_pair()
    seen = []
    original = bench.transformers_generate

    def recording(pair, k, *args, **kwargs):
        out = original(pair, k, *args, **kwargs)
        config = pair.draft.generation_config
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

    def counting(pair, k, temperature, max_new_tokens, batch, seed, stop_at_eos=True, stats=None):
        calls.append((k, len(batch), stop_at_eos))
        return original(pair, k, temperature, max_new_tokens, batch, seed, stop_at_eos, stats)

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
    shapes_md.write_text("# title\n\n## Speculative speedup\n\n" + bench.markdown(rows) + "\n\n| other | table |\n|---|---|\n| 1 | 2 |\n")
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
    assert bench.transformers_best_options(pair.target) == {}  # float64: its defaults
    bf16 = bench.Pair("tiny-bf16", pair.draft.to(torch.bfloat16), pair.target.to(torch.bfloat16), pair.prompts, None,
                      True)
    assert bench.transformers_best_options(bf16.target) == {"logits_to_keep": 0}
    ids = torch.tensor([bf16.prompts[0]])
    default = bf16.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                   pad_token_id=0)
    for k in (None, 3):
        assert bench.transformers_generate(bf16, k, 0.0, 8, [bf16.prompts[0]], 0) == [default[0, ids.shape[1]:].tolist()]


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
            return [doubled(torch.tensor(batch[0])).tolist()]
        return decode

    prompts = [[p] for p in pair.prompts] * 2  # widths 5, 7, 6, twice
    tallies = bench.run_interleaved(pair, {name: method(name) for name in calls}, prompts, 4, TickingClock())
    assert calls["ours_compiled"][:3] == [5, 7, 6] and calls["ours"][:1] == [5]
    assert len(calls["ours_compiled"]) == 3 + 6 and len(calls["ours"]) == 1 + 6
    assert tallies["ours_compiled"].compilations_while_timed == 0
    assert tallies["ours_compiled"].warmup_seconds == 1  # one clock tick around its three warm-up calls


def test_a_compilation_in_the_timed_calls_is_counted():
    torch._dynamo.reset()
    doubled = torch.compile(lambda x: x * 2)
    widths = iter([3, 3, 4])  # the warm-up sees width 3; a timed call meets width 4

    def decode(batch, seed):
        return [doubled(torch.ones(next(widths))).tolist()]

    tallies = bench.run_interleaved(tiny_pair(), {"ours_compiled": decode}, [[[1]], [[1]]], 4, TickingClock())
    assert tallies["ours_compiled"].compilations_while_timed == 1
