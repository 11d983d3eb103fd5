"""The embedded pair's training script: checkpoints continue an interrupted run exactly, and the model card's
measures (distinct 2-grams, the table) are computed as documented. Tiny random data, no corpus download."""

from __future__ import annotations

import argparse

import pytest
import torch

from experiments import train_pair
from tests.conftest import tiny_gpt2


def training_args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(seed=0, batch_size=2, seq_len=8, checkpoint_dir=tmp_path, checkpoint_minutes=0.0,
                              kl_weight=0.8)


def trained(tmp_path, interrupt_at: int | None = None) -> tuple[torch.nn.Module, dict]:
    """Six steps on a fixed random stream; with ``interrupt_at``, the batch of that step raises first."""
    model = tiny_gpt2(seed=3).float().requires_grad_(True)
    stream = torch.randint(0, 97, (400,), generator=torch.Generator().manual_seed(0))
    batches = {"drawn": 0}
    sample_batch = train_pair.sample_batch

    def interrupted(*args):
        if batches["drawn"] == interrupt_at:
            raise KeyboardInterrupt
        batches["drawn"] += 1
        return sample_batch(*args)

    train_pair.sample_batch = interrupted
    try:
        run = train_pair.train(model, stream, training_args(tmp_path), steps=6, minutes=None, lr=1e-2, name="m")
    finally:
        train_pair.sample_batch = sample_batch
    return model, run


def test_an_interrupted_run_continues_to_the_same_weights(tmp_path):
    uninterrupted, run = trained(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        trained(tmp_path / "b", interrupt_at=4)
    continued, continued_run = trained(tmp_path / "b")
    assert continued_run["steps"] == run["steps"] == 6
    for (name, a), b in zip(uninterrupted.state_dict().items(), continued.state_dict().values()):
        assert torch.equal(a, b), name
    reloaded, reloaded_run = trained(tmp_path / "b", interrupt_at=0)  # finished: loaded, no batch drawn
    assert reloaded_run == continued_run and not reloaded.training
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), continued.state_dict().values()))


def test_distinct_bigram_fraction():
    assert train_pair.distinct_bigram_fraction([[1, 2, 3, 4, 5]]) == 1.0
    assert train_pair.distinct_bigram_fraction([[7, 8, 7, 8, 7, 8, 7]]) == pytest.approx(2 / 6)
    assert train_pair.distinct_bigram_fraction([[1, 2, 3], [5, 5, 5]]) == pytest.approx((1 + 0.5) / 2)


def test_the_model_card_table_is_replaced_between_its_markers(tmp_path):
    card = tmp_path / "MODEL_CARD.md"
    card.write_text(f"# Card\n\nbefore\n{train_pair.TABLE_START}\nold table\n{train_pair.TABLE_END}\nafter\n")
    run = {"seconds": 600, "steps": 100, "tokens": 409600}
    metrics = {
        "target": {"heldout_ppl": 60.0, "decode_step_ms": 15.0, "train": run},
        "draft": {"heldout_ppl": 120.0, "decode_step_ms": 2.5, "train": run},
        "cost_ratio": 0.167,
        "distinct_bigrams": {"prompts": 50, "new_tokens": 64, "fraction": 0.41},
        "greedy_acceptance": {"k": 4, "rate": 0.55},
        "sampled_acceptance": {"k": 4, "rate": 0.45},
    }
    train_pair.write_model_card_table(card, train_pair.metrics_table(metrics))
    text = card.read_text()
    assert text.startswith("# Card\n\nbefore\n") and text.endswith(f"{train_pair.TABLE_END}\nafter\n")
    assert "old table" not in text
    assert "| target / draft perplexity | 0.50 |" in text and "| greedy acceptance, k = 4 | 0.550 |" in text
    card.write_text("no markers\n")
    with pytest.raises(ValueError, match="no metrics table markers"):
        train_pair.write_model_card_table(card, "table")
