"""The embedded pair's training script, which trains through specdec's one training loop: a stage interrupted and
rerun ends with the weights of an uninterrupted one (the target's, with dropout, and the draft's, with its teacher);
the loop's loss with a teacher is the distillation loss computed by hand; its learning rates are the schedule the
shipped pair was trained with; and the model card's measures (distinct 2-grams, the table) are computed as
documented. Tiny random data, no corpus download."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from experiments import train_pair
from specdec.train.data import SampledRows, StreamWindows
from specdec.train.loop import Family, Settings, learning_rate, progress, train
from specdec.train.losses import distillation_loss
from tests.conftest import tiny_gpt2


def training_args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(seed=0, batch_size=2, seq_len=8, checkpoint_dir=tmp_path, checkpoint_minutes=0.0,
                              kl_weight=0.8)


def stream() -> torch.Tensor:
    return torch.randint(0, 97, (400,), generator=torch.Generator().manual_seed(0))


def student() -> torch.nn.Module:
    return tiny_gpt2(seed=3).float().requires_grad_(True)  # GPT-2's dropout 0.1: the RNG state matters on resume


def trained(tmp_path, teacher: torch.nn.Module | None, interrupt_at: int | None = None) -> tuple[torch.nn.Module, dict]:
    """Six steps on a fixed random stream, checkpointed after each; with ``interrupt_at``, the batch of that step
    raises first."""
    model, args = student(), training_args(tmp_path)
    windows = StreamWindows(stream(), args.batch_size, args.seq_len, args.seed)
    drawn = {"batches": 0}

    def interrupted(step):
        if drawn["batches"] == interrupt_at:
            raise KeyboardInterrupt
        drawn["batches"] += 1
        return StreamWindows.draw(windows, step)

    windows.draw = interrupted
    run = train_pair.train_stage(model, teacher, windows, args, "m", steps=6, minutes=None, lr=1e-2)
    return model, run


@pytest.mark.parametrize("stage", ["target", "distillation"])
def test_an_interrupted_stage_continues_to_the_same_weights(tmp_path, stage):
    teacher = tiny_gpt2(seed=5).float() if stage == "distillation" else None
    uninterrupted, run = trained(tmp_path / "a", teacher)
    with pytest.raises(KeyboardInterrupt):
        trained(tmp_path / "b", teacher, interrupt_at=4)
    continued, continued_run = trained(tmp_path / "b", teacher)
    assert continued_run["steps"] == run["steps"] == 6
    assert not torch.equal(continued.lm_head.weight, student().lm_head.weight)  # it trained
    for (name, a), b in zip(uninterrupted.state_dict().items(), continued.state_dict().values()):
        assert torch.equal(a, b), name
    reloaded, reloaded_run = trained(tmp_path / "b", teacher, interrupt_at=0)  # finished: loaded, no batch drawn
    assert reloaded_run["steps"] == 6 and not reloaded.training
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), continued.state_dict().values()))


def test_the_loop_with_a_teacher_minimises_the_distillation_loss_computed_by_hand(tmp_path):
    """The first step's loss, as the loop logs it: w KL(p || q) + (1 - w) CE over every position of the first
    window, from the two models' float64 logits written out here (not through torch's losses)."""
    draft, teacher = student(), tiny_gpt2(seed=5, init=0.3).float()  # a peaky teacher: KL far from 0
    for module in draft.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # the loop trains in train mode: no dropout, so the forward is reproducible here
    tokens = StreamWindows(stream(), 2, 8, seed=0).draw(0).tokens  # [2, 9] what the loop's first step draws
    with torch.no_grad():
        q = torch.log_softmax(draft.double()(tokens[:, :-1]).logits, -1).flatten(0, 1)  # [16, V]
        p = torch.log_softmax(teacher.double()(tokens[:, :-1]).logits, -1).flatten(0, 1)
    draft.float(), teacher.float()
    labels = tokens[:, 1:].flatten()
    kl = sum(sum(math.exp(a) * (a - b) for a, b in zip(p_row.tolist(), q_row.tolist()))
             for p_row, q_row in zip(p, q)) / len(labels)
    ce = -sum(q[i, label].item() for i, label in enumerate(labels.tolist())) / len(labels)
    reverse = sum(sum(math.exp(b) * (b - a) for a, b in zip(p_row.tolist(), q_row.tolist()))
                  for p_row, q_row in zip(p, q)) / len(labels)
    settings = Settings(steps=1, batch_size=2, lr=1e-2, divergence="kl", checkpoint_every=1)
    family = Family("model", draft, lambda *a, **k: distillation_loss(*a, **k, kl_weight=0.7), ())
    train(settings, family, teacher, StreamWindows(stream(), 2, 8, seed=0), tmp_path)
    logged = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])["loss"]
    assert logged == pytest.approx(0.7 * kl + 0.3 * ce, rel=1e-5)
    assert logged != pytest.approx(0.7 * reverse + 0.3 * ce, rel=1e-2)  # the wrong direction is told apart
    assert logged != pytest.approx(0.3 * kl + 0.7 * ce, rel=1e-2)  # and the weights the wrong way round


def shipped_schedule(progress: float, peak: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """The schedule the shipped pair was trained with, as train_pair wrote it before it trained through the library
    (``cosine_lr``, verbatim): the reference the one schedule must equal to the last bit."""
    if progress < warmup:
        return peak * max(progress, 0.01) / warmup
    decay = (progress - warmup) / (1 - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(decay, 1.0))))


def test_the_loop_follows_the_schedule_the_shipped_pair_was_trained_with(tmp_path):
    """Each step's learning rate, as the loop logs it, is the one schedule at the step's progress, and equals the
    shipped pair's to the last bit (its warm-up's 1% floor included), so a step-based rerun reproduces it."""
    args = training_args(tmp_path)
    args.checkpoint_minutes = 5.0
    train_pair.train_stage(student(), None, StreamWindows(stream(), 2, 8, seed=0), args, "m", steps=30, minutes=None,
                           lr=3e-3)
    rates = [json.loads(line)["lr"] for line in (tmp_path / "m" / "log.jsonl").read_text().splitlines()]
    settings = Settings(steps=30, batch_size=2, lr=3e-3, divergence="ce", weight_decay=0.1)
    assert rates == [learning_rate(progress(step, 0.0, settings), settings) for step in range(30)]
    assert rates == [shipped_schedule(step / 30, 3e-3) for step in range(30)]
    assert rates[0] == 3e-3 * 0.01 / 0.05 and max(rates) < 3e-3 and rates[-1] > 3e-4


def test_a_stage_with_a_wall_time_follows_the_clock_and_reloads_when_finished(tmp_path):
    """With minutes the schedule follows the wall time: the stage runs past its (ignored) step count until the time
    is spent, its learning rate decaying as the clock goes; a rerun loads the finished stage without a step."""
    args = training_args(tmp_path)
    model = student()
    run = train_pair.train_stage(model, None, StreamWindows(stream(), 2, 8, seed=0), args, "m", steps=1,
                                 minutes=0.005, lr=1e-2)
    lines = [json.loads(line) for line in (tmp_path / "m" / "log.jsonl").read_text().splitlines()]
    assert run["steps"] == len(lines) > 1 and lines[-1]["seconds"] >= 0.3
    assert lines[-1]["lr"] < lines[len(lines) // 2]["lr"] <= 1e-2
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    rerun = train_pair.train_stage(model, None, StreamWindows(stream(), 2, 8, seed=0), args, "m", steps=1,
                                   minutes=0.005, lr=1e-2)
    assert rerun["steps"] == run["steps"]
    assert all(torch.equal(weights[name], tensor) for name, tensor in model.state_dict().items())


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
        model = student()
        train_pair.train_stage(model, None, SampledRows(lambda: (sequences, trained), 1, seed=0),
                               training_args(tmp_path / run), "m", steps=2, minutes=None, lr=1e-2)
        return model.lm_head.weight.detach()

    untouched = student().lm_head.weight
    masked = weights_after_training(rows, only_position_3, "a")
    assert not torch.equal(masked, untouched)
    assert torch.equal(masked, weights_after_training(changed, only_position_3, "b"))
    everywhere = torch.ones(1, 8, dtype=torch.bool)
    assert not torch.equal(weights_after_training(rows, everywhere, "c"), weights_after_training(changed, everywhere, "d"))


def test_a_finished_stage_never_builds_its_data(tmp_path):
    """The greedy set takes minutes to generate: built on the first draw, so a finished checkpoint skips it."""
    builds = []
    rows = torch.randint(1, 97, (4, 9), generator=torch.Generator().manual_seed(2))

    def build():
        builds.append(1)
        return rows, torch.ones(4, 8, dtype=torch.bool)

    model = student()
    run = train_pair.train_stage(model, None, SampledRows(build, 2, seed=0), training_args(tmp_path), "m", steps=3,
                                 minutes=None, lr=1e-2)
    assert run["steps"] == 3 and builds == [1]  # built once, for the first of three draws
    train_pair.train_stage(model, None, SampledRows(build, 2, seed=0), training_args(tmp_path), "m", steps=3,
                           minutes=None, lr=1e-2)
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
