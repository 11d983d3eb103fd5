"""The adversarial passes of tests/probes/ as tests: every probe must show the class it is registered with, and
none may be a traceback or silently wrong (a wrong output, a row lost or counted twice). Probes that start
subprocesses or read large inputs are slow."""

from __future__ import annotations

import pytest
import torch

from probes import (
    AREAS, CLASSES, CLEAR, CORRECT, FAILURES, ISSUES, NOT_RUN, PROBES, SILENTLY_ACCEPTED, SILENTLY_WRONG, TRACEBACK,
    Outcome, agreement, before_table, refusal, run_probe, table,
)


def as_param(probe):
    return pytest.param(probe, id=probe.name, marks=[pytest.mark.slow] if probe.slow else [])


@pytest.mark.parametrize("probe", [as_param(probe) for probe in PROBES])
def test_probe_shows_its_expected_class(probe):
    outcome = run_probe(probe)
    if outcome.kind == NOT_RUN:
        pytest.skip(outcome.detail)
    assert outcome.kind not in FAILURES, f"{probe.name}: {outcome.kind}: {outcome.detail}"
    assert outcome.kind == probe.expected, f"{probe.name}: {outcome.kind} (expected {probe.expected}): {outcome.detail}"


@pytest.mark.parametrize("issue", ISSUES)
def test_each_pass_tries_fifty_new_inputs_or_more_none_registered_to_fail(issue):
    names = [probe.name for probe in PROBES if probe.issue == issue]
    assert len(names) >= 50 and len(set(names)) == len(names)
    assert len({probe.name for probe in PROBES}) == len(PROBES)
    assert {probe.area for probe in PROBES if probe.issue == issue} == set(AREAS)
    assert not [probe.name for probe in PROBES if probe.expected in FAILURES or probe.expected not in CLASSES]
    assert not [probe.name for probe in PROBES if probe.before is not None and probe.before not in CLASSES]


def table_rows(text: str) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in text.splitlines()[2:]}


def test_the_table_counts_every_probe_once_and_leaves_out_probes_not_run():
    outcomes = {probe.name: Outcome(probe.expected, "") for probe in PROBES}
    outcomes[PROBES[0].name] = Outcome(NOT_RUN, "")
    rows = table_rows(table(outcomes))
    assert int(rows["all"][0]) == len(PROBES) - 1
    assert sum(int(rows[area][0]) for area in AREAS) == len(PROBES) - 1
    counted = [int(cell) if cell != "–" else 0 for cell in rows["all"][1:]]
    assert sum(counted) == len(PROBES) - 1
    per_pass = [int(table_rows(table(outcomes, issue))["all"][0]) for issue in ISSUES]
    assert sum(per_pass) == len(PROBES) - 1


def test_the_new_pass_fixed_every_failure_it_found():
    """Issue 35's pass: what its probes showed before its fixes included tracebacks; now none
    (test_probe_shows_its_expected_class runs them)."""
    assert table_rows(before_table(35))["all"][CLASSES.index(TRACEBACK) + 1] != "–"
    assert not [probe.name for probe in PROBES if probe.issue == 35 and probe.expected in FAILURES]


def test_the_classifier_tells_tracebacks_and_wrong_outputs_from_clear_refusals():
    assert refusal(lambda: torch.zeros(2)[5]).kind == TRACEBACK  # torch's error, not a check of ours
    assert refusal(lambda: None).kind == SILENTLY_ACCEPTED
    assert agreement(lambda: [1, 2], [1, 3]).kind == SILENTLY_WRONG
    assert agreement(lambda: [1, 2], [1, 2]).kind == CORRECT

    def bad_k():
        from specdec import FixedLength
        FixedLength(0)
    assert refusal(bad_k, "k", "0").kind == CLEAR
