"""transformers as a system of the app, lossless or not in rows and reports, any swept axis in the report, task suites
with per-category results, and run identity covering every key that changes a result (issue 35)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import yaml
from conftest import tiny_overrides
from test_analysis import make_row, write_run
from test_experiments import compose_run, job_dirs, main, rows_of
from transformers import AutoModelForCausalLM

from analysis import ResultsError, load_runs, summarize_runs
from analysis.report import main as report_main
from analysis.summarize import plot_axes
from experiments.common import runner
from experiments.common.config_checks import ConfigError
from specdec.prompts import load_prompts, load_suite


# --- transformers as a system --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ours_against_hf_assisted_at_the_same_algorithm_is_a_report_table(tiny, tmp_path, monkeypatch):
    """`-m system=specdec,hf_assisted draft_length.k=2,4`: four runs on the same prompts; transformers' greedy tokens
    equal our baseline's, its rows name its settings, and the report compares the systems per k."""
    sweep_dir = tmp_path / "sweep"
    main(["-m", "system=specdec,hf_assisted", "draft_length.k=2,4",
          *tiny_overrides(tiny, num_prompts=3, max_new_tokens=8, warmup=1), f"hydra.sweep.dir={sweep_dir}"],
         monkeypatch)
    runs = {(rows[0]["system"], rows[0]["k"]): rows for rows in map(rows_of, job_dirs(sweep_dir))}
    assert set(runs) == {(system, k) for system in ("specdec", "hf_assisted") for k in (2, 4)}
    for (system, k), rows in runs.items():
        assert [row["prompt_id"] for row in rows] == ["p0", "p1", "p2"]
        assert all(row["identical_output"] is True and row["tokens"] == row["baseline_tokens"] for row in rows)
        assert all(row["emitted"] == len(row["tokens"]) and row["speedup"] > 0 for row in rows)
        assert all(row["mean_accepted_length"] == pytest.approx(row["emitted"] / row["target_calls"]) for row in rows)
        if system == "hf_assisted":
            assert all(row["drafted"] is None and row["per_position_acceptance"] == [] for row in rows)
            assert f"num_assistant_tokens={k}, num_assistant_tokens_schedule=constant" in rows[0]["system_settings"]
            assert rows[0]["strategy"] == "speculative" and rows[0]["lossless"] is True
        else:
            assert rows[0]["system_settings"] is None and all(row["drafted"] > 0 for row in rows)
    report = (sweep_dir / "report.md").read_text()
    table = report.split("## Ours against transformers")[1].split("\n## ")[0]
    assert "| k | specdec tok/s | specdec speedup |" in table and "| ours / hf_assisted |" in table
    assert table.count("\n| 2 |") == 1 and table.count("\n| 4 |") == 1


def test_hf_generate_decodes_the_targets_own_greedy_tokens_one_forward_each(tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=2, max_new_tokens=6, warmup=0), "system=hf_generate"],
                            run_dir))
    for row in rows_of(run_dir):
        assert (row["system"], row["drafter"], row["strategy"], row["lossless"]) == (
            "hf_generate", "none", "none", True)
        assert row["tokens"] == row["baseline_tokens"] and row["target_calls"] == row["emitted"]  # tau = 1


@pytest.mark.parametrize("overrides, named", [
    (["batch_size=2"], "system=hf_assisted decodes one prompt per call"),
    (["drafter=ngram"], "system=hf_assisted drafts with the pair's draft model: drafter must be model"),
    (["strategy=typical"], "strategy must be speculative (lenience 1) or greedy, got strategy=typical"),
    (["strategy.lenience=0.5"], "strategy must be speculative (lenience 1) or greedy, got strategy=speculative"),
    (["draft_length=heuristic"], "draft_length must be fixed, got draft_length=heuristic"),
])
def test_a_transformers_system_refuses_what_it_would_not_run_in_one_line(overrides, named, tiny, tmp_path, loads):
    cfg, job = compose_run([*tiny_overrides(tiny), "system=hf_assisted", *overrides], tmp_path / "run")
    with pytest.raises(ConfigError) as error:
        runner.run(cfg, job)
    assert named in str(error.value) and "\n" not in str(error.value) and loads["pair"] == 0


# --- lossless or not: what each run emitted ------------------------------------------------------------------------


def test_a_lossy_rule_s_rows_carry_both_outputs_and_the_target_s_log_likelihood_of_each(tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=2, max_new_tokens=6, warmup=0), "strategy=typical"],
                            run_dir))
    target = AutoModelForCausalLM.from_pretrained(tiny["target"], dtype=torch.float32).eval()
    prompts = {p.id: p for p in load_prompts(tiny["prompts"])}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny["target"])
    for row in rows_of(run_dir):
        assert row["lossless"] is False and isinstance(row["identical_output"], bool)
        prompt = tokenizer(prompts[row["prompt_id"]].text).input_ids
        for tokens, likelihood in ((row["tokens"], row["log_likelihood"]),
                                   (row["baseline_tokens"], row["baseline_log_likelihood"])):
            by_token = []  # one forward per token: the target's log-probability of each emitted token
            for i, token in enumerate(tokens):
                with torch.no_grad():
                    logits = target(torch.tensor([prompt + tokens[:i]])).logits[0, -1]
                by_token.append(torch.log_softmax(logits, -1)[token].item())
            assert likelihood == pytest.approx(sum(by_token) / len(by_token), abs=1e-4)


def test_a_lossless_rule_s_rows_are_identical_at_temperature_0_and_carry_no_likelihood(tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run(tiny_overrides(tiny, num_prompts=3, max_new_tokens=8, warmup=0), run_dir))
    for row in rows_of(run_dir):
        assert row["lossless"] is True and row["identical_output"] is True and row["tokens"] == row["baseline_tokens"]
        assert row["log_likelihood"] is None and len(row["tokens"]) == row["emitted"]


def test_sampling_rows_say_nothing_of_identity(tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=6, warmup=0), "sampling=t1"], run_dir))
    [row] = rows_of(run_dir)
    assert row["identical_output"] is None and row["sampling"] == "T=1"


# --- any swept axis -------------------------------------------------------------------------------------------------


def test_an_overridden_sampling_preset_is_labelled_by_its_values(tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0), "sampling=greedy",
                             "sampling.temperature=0.7", "sampling.top_p=0.9"], run_dir))
    assert rows_of(run_dir)[0]["sampling"] == "T=0.7, top_p=0.9"


@pytest.mark.slow
def test_a_temperature_sweep_s_report_has_temperature_on_its_axis(tiny, tmp_path, monkeypatch):
    sweep_dir = tmp_path / "sweep"
    main(["-m", "sampling=t1", "sampling.temperature=0.5,1.0", *tiny_overrides(tiny, num_prompts=3, max_new_tokens=6,
                                                                               warmup=0),
          f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    summary = summarize_runs(load_runs(sweep_dir))
    assert sorted(summary["sampling"]) == ["T=0.5", "T=1"] and plot_axes(summary) == ("temperature", [])
    report = (sweep_dir / "report.md").read_text()
    assert "rows: temperature, lossless." in report and "| temperature | lossless | speedup |" in report
    assert "sampling: greedy" not in report and "sampling: T=0.5; T=1" in report


def axis_sweep(root):
    """Hand-made runs over k x temperature, for the axis overrides."""
    for index, (k, temperature) in enumerate((k, t) for k in (2, 4) for t in (0.5, 1.0)):
        rows = [make_row(f"run{index}", f"p{i}", k=k, temperature=temperature, sampling=f"T={temperature:g}",
                         speedup=1 + k / 10 + temperature / 10 + i / 100) for i in range(3)]
        write_run(root / str(index), rows, config={"job": index})
    return root


def test_x_and_hue_override_the_axes(tmp_path, capsys):
    sweep = axis_sweep(tmp_path / "sweep")
    summary = summarize_runs(load_runs(sweep))
    assert plot_axes(summary) == ("k", ["sampling"])
    assert plot_axes(summary, x="temperature") == ("temperature", ["k"])
    assert report_main([str(sweep), "--x", "temperature", "--hue", "k"]) == 0
    report = (sweep / "report.md").read_text()
    assert "rows: k, lossless; columns: temperature." in report
    assert "| k | lossless | temperature=0.5 | temperature=1 |" in report
    assert report_main([str(sweep), "--x", "lenience"]) == 2
    assert capsys.readouterr().err.strip().endswith("error: --x lenience: no such setting in these runs; settings that "
                                                   "vary: k, sampling")


# --- task suites ----------------------------------------------------------------------------------------------------


def test_a_suite_chains_its_sets_keeps_their_categories_and_names_the_rest(tmp_path):
    mt = load_suite("suite", ["mt_bench", "embedded_heldout"], {"embedded_heldout": "prose"}, per_set=12)
    assert [p.category for p in mt] == ["writing"] * 10 + ["roleplay"] * 2 + ["prose"] * 12
    assert mt[0].id == "mt_bench-81" and mt[12].id == "heldout-000"
    assert len(load_suite("suite", ["humaneval"])) == 164 and len(load_suite("suite", ["mt_bench"], limit=5)) == 5
    with pytest.raises(ValueError, match="categories names 'prose', which is not one of the sets"):
        load_suite("suite", ["mt_bench"], {"prose": "prose"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "hi", "category": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: 'category' must be a non-empty string, got 3"):
        load_prompts(str(bad))


def test_a_suite_run_reports_acceptance_tau_and_speedup_per_category(tiny, tmp_path, monkeypatch):
    sets = {"chat": ["what is it that you", "she was not there", "they will have one more"],
            "code": ["in the new time we", "it was the only one of them", "the first time he said"]}
    paths = []
    for name, texts in sets.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{name}{i}", "category": name, "text": text}) + "\n"
                                for i, text in enumerate(texts)))
        paths.append(str(path))
    run_dir = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny, num_prompts=None, max_new_tokens=6, warmup=0)
                 if not o.startswith("data")]
    main([*overrides, "data=task_suite", f"data.sets=[{','.join(paths)}]", "data.categories=null",
          f"hydra.run.dir={run_dir}"], monkeypatch)
    rows = rows_of(run_dir)
    assert [row["category"] for row in rows] == ["chat"] * 3 + ["code"] * 3 and rows[0]["data"] == "task_suite"
    assert report_main([str(run_dir)]) == 0
    report = (run_dir / "report.md").read_text()
    section = report.split("## Per category")[1].split("\n## ")[0]
    assert "| setting | chat | code | overall |" in section
    for heading in ("### Speedup (pooled)", "### τ, tokens per target call (pooled)", "### Acceptance rate (pooled)"):
        assert heading in section
    assert (run_dir / "categories.csv").read_text().startswith("setting,category,prompts,")


# --- run identity (issue 35) ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_over_the_forward_is_two_settings_in_the_report(tiny, tmp_path, monkeypatch):
    """`-m drafter=dynamic_tree forward=lean,transformers`: rows record the forward, so the report tells the two runs
    apart instead of merging them into one "strategy=speculative, k=4"."""
    sweep_dir = tmp_path / "sweep"
    main(["-m", "drafter=dynamic_tree", "forward=lean,transformers",
          *tiny_overrides(tiny, num_prompts=3, max_new_tokens=6, warmup=0), f"hydra.sweep.dir={sweep_dir}"],
         monkeypatch)
    assert sorted(rows_of(job)[0]["forward"] for job in job_dirs(sweep_dir)) == ["lean", "transformers"]
    report = (sweep_dir / "report.md").read_text()
    assert "A single setting was run" not in report and "rows: forward" in report
    assert "| forward | lossless | speedup |" in report and "| lean |" in report and "| transformers |" in report


def test_rows_record_every_run_key_that_changes_a_result_or_a_time(tiny, tmp_path):
    run_dir = tmp_path / "run"
    runner.run(*compose_run([*tiny_overrides(tiny, num_prompts=1, max_new_tokens=4, warmup=0), "stop_at_eos=false"],
                            run_dir))
    [row] = rows_of(run_dir)
    assert {key: row[key] for key in ("forward", "stop_at_eos", "threads", "warmup", "compile", "system")} == {
        "forward": "auto", "stop_at_eos": False, "threads": 1, "warmup": 0, "compile": False, "system": "specdec"}


def test_runs_whose_rows_agree_but_whose_configs_differ_are_refused_naming_the_key(tmp_path):
    """Rows written before they recorded a key (here `step`, which rows do not record) cannot tell two runs apart;
    their configs can: the report refuses to merge them, in one line naming the key."""
    config = yaml.safe_load("{seed: 0, step: host, group: a, logger: {mode: offline}}")
    write_run(tmp_path / "sweep" / "0", [make_row("a", f"p{i}") for i in range(3)], config=config)
    write_run(tmp_path / "sweep" / "1", [make_row("b", f"p{i}") for i in range(3)],
              config=config | {"step": "device", "group": "b", "logger": {"mode": "online"}})
    with pytest.raises(ResultsError) as error:
        load_runs(tmp_path / "sweep")
    assert "step: 'host' -> 'device'" in str(error.value) and "\n" not in str(error.value)
    assert report_main([str(tmp_path / "sweep")]) == 2
    # Repeats of one config (group and logger aside, which change no result) load as two runs.
    write_run(tmp_path / "repeats" / "0", [make_row("a", "p0")], config=config)
    write_run(tmp_path / "repeats" / "1", [make_row("b", "p0")], config=config | {"group": "b"})
    assert load_runs(tmp_path / "repeats")["run_id"].nunique() == 2


def test_a_policy_sweep_keeps_the_policy_beside_k_and_x_takes_the_swept_key_as_typed():
    """Policies that each hold their own k come one-to-one with k; the labels still name the policy. ``--x`` takes
    the key as swept on the command line (draft_length.k, strategy.lenience) as well as its column."""
    summary = pd.DataFrame({"strategy": ["speculative"] * 3, "draft_length": ["fixed", "confidence", "cost_optimal"],
                            "k": [4, 8, 6], "strategy_lenience": [1.0, 0.5, 0.8]})
    assert plot_axes(summary) == ("k", ["draft_length"])
    assert plot_axes(summary, x="draft_length.k") == plot_axes(summary, x="k")
    assert plot_axes(summary, x="strategy.lenience")[0] == "strategy_lenience"
    with pytest.raises(ResultsError, match="--x draft_length.nope: no such setting"):
        plot_axes(summary, x="draft_length.nope")
