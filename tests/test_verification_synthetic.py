"""``SyntheticDrafter``: the target drafting through a fixed random logit bias, the controlled-acceptance draft of
the verification study on the shaped pairs. With no bias every draft is kept; with one the rules stay lossless
on its drafts and keep fewer of them."""

from __future__ import annotations

import pytest
import torch

import specdec
from conftest import PROMPT
from specdec.testing import check_lossless


def kept_share(target, bias: float) -> float:
    """Acceptance rate of speculative sampling at temperature 1 with the synthetic drafter of ``bias``."""
    decoder = specdec.Decoder(target, specdec.SyntheticDrafter(target, bias), specdec.Speculative(),
                              specdec.FixedLength(4), specdec.SamplingConfig(temperature=1.0), time_phases=False)
    stats = decoder.generate(torch.tensor([PROMPT] * 4), max_new_tokens=24, seed=0).stats
    return sum(row.accepted for row in stats.rows) / sum(row.drafted for row in stats.rows)


def test_no_bias_is_the_target_itself_and_every_draft_is_kept(target):
    assert kept_share(target, 0.0) == 1.0


def test_a_larger_bias_keeps_fewer_drafts(target):
    shares = [kept_share(target, bias) for bias in (0.5, 2.0)]
    assert 1.0 > shares[0] > shares[1] > 0.0


@pytest.mark.parametrize("strategy", [specdec.Speculative(),
                                      pytest.param(specdec.BlockVerification(), marks=pytest.mark.slow)],
                         ids=["speculative", "block"])
def test_the_rules_stay_lossless_on_its_drafts(strategy):
    report = check_lossless(strategy, make_drafter=lambda draft, target: specdec.SyntheticDrafter(target, 1.0), k=3)
    assert report.lossless and 0.05 < report.acceptance_rate < 0.95


@pytest.mark.parametrize("bias, seed", [(-1.0, 0), (float("inf"), 0), (True, 0), (1.0, -1), (1.0, 0.5)])
def test_bad_bias_or_seed_is_refused_naming_it(target, bias, seed):
    with pytest.raises(ValueError, match="SyntheticDrafter's (bias|seed)"):
        specdec.SyntheticDrafter(target, bias, seed)
