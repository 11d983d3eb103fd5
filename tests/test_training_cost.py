"""python -m experiments.training_cost at tiny sizes: every family runs the train loop's own step (its parameters
move, its loss is finite, the reduced families score their draft vocabulary only), each is timed the asked number of
times, and the table's medians and ratios are those of the measured seconds. No timing is asserted."""

from __future__ import annotations

import statistics

import pytest
import torch

from experiments import training_cost
from experiments.training_cost import RECOMPUTE

TINY = ["--layers", "2", "--width", "32", "--heads", "4", "--kv-heads", "2", "--intermediate", "64",
        "--vocabs", "300,700", "--draft-vocab", "40", "--seq-len", "12", "--batch-size", "2", "--warmup", "1",
        "--steps", "2", "--threads", "1", "--medusa-heads", "2"]


def test_every_family_runs_the_real_training_step_and_the_ratios_are_of_the_measured_medians(monkeypatch, tmp_path):
    ran = []
    real_step = training_cost.training_step

    def recorded(step, done, family, target, batch, optimizer, settings, ranks, mean):
        before = [p.detach().clone() for p in family.module.parameters() if p.requires_grad]
        loss = real_step(step, done, family, target, batch, optimizer, settings, ranks, mean)
        after = [p for p in family.module.parameters() if p.requires_grad]
        moved = any(not torch.equal(a, b) for a, b in zip(after, before))
        reduced = getattr(family.module, "reduced", False)
        ran.append((family.kind, reduced, family.module.draft_ids.numel() if reduced else None, moved, loss))
        return loss

    monkeypatch.setattr(training_cost, "training_step", recorded)
    results = training_cost.main([*TINY, "--out", str(tmp_path / "cost")])
    steps_per_family = 3 * 2  # (1 warm-up + 2 timed) x 2 vocabularies
    for kind, reduced in [("eagle", False), ("eagle", True), ("medusa", False), ("medusa", True), ("model", False)]:
        mine = [entry for entry in ran if entry[:2] == (kind, reduced)]
        assert len(mine) == steps_per_family, (kind, reduced)
        assert all(moved for *_, moved, _ in mine) and all(loss == loss for *_, loss in mine)
        assert all(size == (40 if reduced else None) for _, _, size, _, _ in mine)
    for row in results["rows"]:
        seconds = results["seconds"][row["vocabulary"]]
        median = statistics.median(seconds[row["family"]])
        assert row["timed steps"] == 2 and row["s / step (median)"] == f"{median:.3f}"
        assert row["x eagle"] == f"{median / statistics.median(seconds['eagle']):.2f}"
        if row["family"].endswith("_reduced"):
            full = statistics.median(seconds[row["family"].removesuffix("_reduced")])
            assert row["x full-vocabulary same family"] == f"{median / full:.2f}"
    assert {row["family"] for row in results["rows"]} == {*training_cost.FAMILIES, RECOMPUTE}
    assert (tmp_path / "cost.md").read_text().count("| 700 | medusa_reduced |") == 1


@pytest.mark.parametrize("extra, named", [
    (["--draft-vocab", "5000"], "--draft-vocab 5000 is larger than the vocabulary 300"),
    (["--families", "eagle,lstm"], "expected comma-separated families from eagle, eagle_reduced"),
    (["--heads", "5"], "--width 32, --heads 5, --kv-heads 2: the width must be a multiple of the heads"),
    (["--steps", "0"], "expected an integer >= 1, got '0'"),
])
def test_bad_sizes_are_refused_in_one_line_before_any_model_is_built(capsys, extra, named):
    with pytest.raises(SystemExit) as stopped:
        training_cost.parse_args([*TINY, *extra])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1 and named in error
