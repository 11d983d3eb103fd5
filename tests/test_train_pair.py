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
    args = training_args(tmp_path)
    text_batches = train_pair.text_batches(stream, args)
    drawn = {"batches": 0}

    def interrupted(gen):
        if drawn["batches"] == interrupt_at:
            raise KeyboardInterrupt
        drawn["batches"] += 1
        return text_batches(gen)

    run = train_pair.train(model, interrupted, args, steps=6, minutes=None, lr=1e-2, name="m")
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


class DigitTokenizer:
    """Documents are space-separated token ids."""
    eos_token_id = 0

    def __call__(self, docs):
        return {"input_ids": [[int(t) for t in doc.split()] for doc in docs]}


def test_the_greedy_training_set_is_the_targets_own_continuation_of_document_openings():
    target = tiny_gpt2(seed=5)
    gen = torch.Generator().manual_seed(1)
    docs = [" ".join(map(str, torch.randint(1, 97, (n,), generator=gen).tolist())) for n in (70, 10, 65, 80, 61, 90)]
    rows, trained = train_pair.greedy_training_set(target, DigitTokenizer(), docs, n=4, new_tokens=5, seed=0,
                                                   batch_size=2)
    assert rows.shape == (4, 65) and trained.shape == (4, 64)
    openings = [doc for doc in DigitTokenizer()(docs)["input_ids"] if len(doc) >= 60]  # the 10-token one is skipped
    seen = set()
    for row, mask in zip(rows, trained):
        length = int(mask.nonzero()[0]) + 1  # the first trained label is the first continuation token
        assert mask.sum() == 5 and mask[length - 1:length + 4].all() and 20 <= length <= 60
        prompt = row[:length].tolist()
        source = next(i for i, doc in enumerate(openings) if doc[:length] == prompt)
        seen.add(source)
        expected = list(prompt)
        for _ in range(5):  # greedy decoding by full forwards, no cache: the reference
            expected.append(int(target(torch.tensor([expected])).logits[0, -1].argmax()))
        assert row[:length + 5].tolist() == expected
        assert (row[length + 5:] == 0).all()  # right padding is EOS, never trained
    assert seen == {0, 1, 2, 3}  # the first four openings, each once
    with pytest.raises(ValueError, match="only 5 training documents have 60 tokens, --greedy-prompts 6 wanted"):
        train_pair.greedy_training_set(target, DigitTokenizer(), docs, n=6, new_tokens=5, seed=0)


def test_only_the_marked_positions_are_trained(tmp_path):
    """Trained at label position 3 only, two sequences that differ from token 5 on train to the same weights
    (a causal model's output at 3 and the label rows[4] do not see them); trained everywhere, they do not."""
    rows = torch.randint(1, 97, (1, 9), generator=torch.Generator().manual_seed(2))  # [1, T+1]
    changed = rows.clone()
    changed[0, 5:] = 7
    only_position_3 = torch.zeros(1, 8, dtype=torch.bool)
    only_position_3[0, 3] = True

    def weights_after_training(sequences, trained, run):
        model = tiny_gpt2(seed=3).float().requires_grad_(True)
        train_pair.train(model, train_pair.sequence_batches(sequences, trained, 1), training_args(tmp_path / run),
                         steps=2, minutes=None, lr=1e-2, name="m")
        return model.lm_head.weight.detach()

    untouched = tiny_gpt2(seed=3).float().lm_head.weight
    masked = weights_after_training(rows, only_position_3, "a")
    assert not torch.equal(masked, untouched)
    assert torch.equal(masked, weights_after_training(changed, only_position_3, "b"))
    everywhere = torch.ones(1, 8, dtype=torch.bool)
    assert not torch.equal(weights_after_training(rows, everywhere, "c"), weights_after_training(changed, everywhere, "d"))


def test_a_finished_stage_never_builds_its_data(tmp_path):
    """The greedy set takes minutes to generate: built on the first draw, so a finished checkpoint skips it."""
    builds = []
    stream = torch.randint(0, 97, (400,), generator=torch.Generator().manual_seed(0))

    def build():
        builds.append(1)
        return train_pair.text_batches(stream, training_args(tmp_path))

    model = tiny_gpt2(seed=3).float().requires_grad_(True)
    run = train_pair.train(model, train_pair.built_on_first_draw(build), training_args(tmp_path), steps=3,
                           minutes=None, lr=1e-2, name="m")
    assert run["steps"] == 3 and builds == [1]  # built once, for the first of three draws
    train_pair.train(model, train_pair.built_on_first_draw(build), training_args(tmp_path), steps=3, minutes=None,
                     lr=1e-2, name="m")
    assert builds == [1]  # the finished checkpoint loaded: nothing drawn, nothing built


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
        "draft": {"heldout_ppl": 120.0, "decode_step_ms": 2.5, "train": run, "greedy_train": run},
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
