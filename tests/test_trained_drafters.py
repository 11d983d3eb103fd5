"""Drafters that read the target's hidden states: EAGLE heads (chains, EAGLE-2 dynamic trees, EAGLE-3 fusion, a
reduced draft vocabulary) and Medusa heads (chains, top-k trees, a reduced draft vocabulary). Exactness: greedy equality with transformers at
batch 1 and on ragged batches with EOS, on both drivers for chains; the joint distribution of the first tokens at
temperature 1 through the real loop (chi-square), with a lossy control failing it. The training passes equal the
head's own drafting, and a head is refused by a target it was not trained for."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import specdec
from conftest import SMALL_VOCAB, hf_greedy, left_pad, random_prompts, tiny_gpt2
from specdec.checkpoints import save_drafter
from specdec.train.losses import TrainingBatch, draft_matches, eagle_loss, eagle_passes, simulated_acceptance
from specdec.eagle import EagleDrafter
from specdec.heads import EagleHead, MedusaHeads, medusa_logits
from specdec.medusa import MedusaDrafter
from specdec.testing import check_lossless


def greedy_batch(target, prompts: list[list[int]], new_tokens: int) -> TrainingBatch:
    """The target's greedy continuations of ``prompts`` (equal lengths) and its hidden states, for training."""
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, ids, attention_mask=mask, max_new_tokens=new_tokens)
    tokens = torch.tensor([prompt + row for prompt, row in zip(prompts, out.tokens)])
    with torch.no_grad():
        hidden = target(tokens, output_hidden_states=True).hidden_states
    counts = torch.zeros_like(tokens, dtype=torch.bool)
    counts[:, len(prompts[0]) - 1 : -1] = True  # positions whose next token is the target's own
    return TrainingBatch(tokens, hidden[-1], counts, torch.stack(hidden, 2))


@pytest.fixture(scope="module")
def target():
    return tiny_gpt2(0, layers=3, init=0.1).float()


@pytest.fixture(scope="module")
def trained_eagle(target):
    """An EAGLE head trained for a few seconds on the target's greedy continuations: it drafts well but not
    perfectly, so steps both accept and reject."""
    torch.manual_seed(0)
    batch = greedy_batch(target, random_prompts([6] * 24, seed=1), 24)
    batch.hidden = batch.hidden[:, :, -1:]
    head = EagleHead(target, init_from_last_layer=True).train().requires_grad_(True)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    for _ in range(40):
        loss = eagle_loss(head, target, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval().requires_grad_(False)


def drafters(target, eagle_head) -> dict:
    return {
        "eagle-chain": lambda: EagleDrafter(eagle_head, target),
        "eagle-2-tree": lambda: EagleDrafter(eagle_head, target, tree=(8, 3, 2)),
        "eagle-3-fusion": lambda: EagleDrafter(EagleHead(target, feature_layers=(1, 2, 3)), target),
        "eagle-reduced-vocab": lambda: EagleDrafter(EagleHead(target, draft_ids=list(range(0, 97, 2))), target),
        "medusa-chain": lambda: MedusaDrafter(MedusaHeads(target, 3), target),
        "medusa-tree": lambda: MedusaDrafter(MedusaHeads(target, 3), target, tree=(2, 2, 1)),
        "medusa-reduced-vocab": lambda: MedusaDrafter(MedusaHeads(target, 3, draft_ids=list(range(0, 97, 2))), target),
    }


NAMES = ["eagle-chain", "eagle-2-tree", "eagle-3-fusion", "eagle-reduced-vocab", "medusa-chain", "medusa-tree",
         "medusa-reduced-vocab"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lengths,eos", [([9], None), ([3, 11, 6, 1], 5)], ids=["batch-1", "ragged-eos"])
def test_greedy_output_equals_transformers(target, trained_eagle, name, lengths, eos):
    prompts = random_prompts(lengths, seed=8)
    ids, mask = left_pad(prompts)
    reference = [hf_greedy(target, prompt, 24, eos_token_id=eos) for prompt in prompts]
    steps = ["host"] if "tree" in name else ["host", "device"]
    for step in steps:
        drafter = drafters(target, trained_eagle)[name]()
        out = specdec.Decoder(target, drafter, specdec.Greedy(), specdec.FixedLength(3), step=step).generate(
            ids, mask, max_new_tokens=24, eos_token_id=eos)
        assert out.tokens == reference, (name, step)
        if name == "eagle-chain":
            assert 0 < out.stats.acceptance_rate < 1, out.stats.acceptance_rate


@pytest.fixture(scope="module")
def small_target():
    return tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB)


SAMPLED = {
    "eagle-chain": lambda t: EagleDrafter(EagleHead(t), t),
    "eagle-2-tree": lambda t: EagleDrafter(EagleHead(t), t, tree=(5, 2, 3)),
    "eagle-3-fusion": lambda t: EagleDrafter(EagleHead(t, feature_layers=(0, 1, 2)), t),
    "eagle-reduced-vocab": lambda t: EagleDrafter(EagleHead(t, draft_ids=[0, 2, 3, 5, 7]), t),
    "medusa-chain": lambda t: MedusaDrafter(MedusaHeads(t, 2), t),
    "medusa-tree": lambda t: MedusaDrafter(MedusaHeads(t, 2), t, tree=(2, 2)),
    "medusa-reduced-vocab": lambda t: MedusaDrafter(MedusaHeads(t, 2, draft_ids=[0, 2, 3, 5, 7]), t),
}


def randomised(drafter):
    """Heads at random weights (as built they predict little): draws differ from the target's often enough."""
    torch.manual_seed(5)
    module = drafter.head if isinstance(drafter, EagleDrafter) else drafter.heads
    for parameter in module.parameters():
        parameter.data.normal_(0, 0.3)
    return drafter


@pytest.mark.parametrize("name", NAMES)
def test_speculative_sampling_with_trained_drafters_is_exact(small_target, name):
    """Temperature 1: the joint distribution of three tokens through the loop matches the target's."""
    report = check_lossless(specdec.Speculative(), make_drafter=lambda d, t: randomised(SAMPLED[name](t)), k=2,
                            target=small_target)
    assert 0 < report.acceptance_rate < 1 and report.lossless, report


@pytest.mark.parametrize("name", ["eagle-chain", "medusa-tree"])
def test_a_lossy_rule_fails_the_same_test(small_target, name):
    report = check_lossless(specdec.Speculative(lenience=0.4), make_drafter=lambda d, t: randomised(SAMPLED[name](t)),
                            k=2, target=small_target)
    assert not report.lossless, report


def test_the_device_driver_samples_exactly_with_an_eagle_head(small_target):
    report = check_lossless(specdec.Speculative(), make_drafter=lambda d, t: randomised(SAMPLED["eagle-chain"](t)),
                            k=2, target=small_target, step="device")
    assert report.lossless, report


def test_training_passes_are_the_heads_own_drafting(target, trained_eagle):
    """Pass j at position t (training-time test) gives the logits the head gives while drafting: real pairs up to
    t - j fed at once, then j drafts each fed with the feature the head predicted before it."""
    batch = greedy_batch(target, random_prompts([5] * 2, seed=4), 10)
    batch.hidden = batch.hidden[:, :, -1:]
    passes = eagle_passes(trained_eagle, target, batch, 3)
    forward = trained_eagle.lean(target)
    tokens, features = batch.tokens, batch.last
    for t, j in [(6, 0), (6, 1), (9, 2), (4, 2)]:
        keys, values = forward.new_buffers(2, 32)
        prefix = t - j + 1  # real pairs at positions 0..t-j
        positions = torch.arange(prefix).expand(2, -1)
        attend = torch.ones(prefix, 32, dtype=torch.bool).tril()[None].expand(2, -1, -1)
        logits, hidden = forward(tokens[:, 1 : prefix + 1], positions, positions, attend, keys, values, None, (1,),
                                 features[:, :prefix])
        for step in range(1, j + 1):
            position = torch.full((2, 1), t - j + step)
            attend = (torch.arange(32) <= position[0, 0]).expand(2, 1, -1)
            logits, hidden = forward(tokens[:, t - j + step + 1 : t - j + step + 2], position, position, attend, keys,
                                     values, None, (1,), hidden[:, -1:, 0])
        torch.testing.assert_close(logits[:, -1], passes[j][0][:, t], rtol=1e-4, atol=1e-4)


def test_simulated_acceptance_counts_runs_of_matches():
    matches = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    rates, tau = simulated_acceptance(matches, torch.tensor([True, True, True, True]))
    assert rates == pytest.approx([3 / 4, 2 / 3, 1 / 2]) and tau == pytest.approx(1 + (3 + 2 + 1) / 4)


def test_a_trained_head_drafts_what_its_simulation_predicts(target, trained_eagle):
    """Held-out prompts: the loop's tau at k = 3 within 15% of the tau simulated on the target's continuations
    (this tiny target repeats itself; the shipped head's 10% is measured in docs/training.md)."""
    prompts = random_prompts([6] * 16, seed=11)
    matches, counted = draft_matches(trained_eagle, target, greedy_batch(target, prompts, 32), 3)
    _, simulated = simulated_acceptance(matches, counted)
    ids, mask = left_pad(prompts)
    out = specdec.Decoder(target, EagleDrafter(trained_eagle, target), specdec.Greedy(),
                          specdec.FixedLength(3)).generate(ids, mask, max_new_tokens=32)
    assert simulated > 1.5 and abs(out.stats.mean_accepted_length - simulated) / simulated < 0.15


def test_a_head_is_refused_by_a_target_it_was_not_trained_for(tmp_path, target):
    heads = MedusaHeads(target, 2)
    save_drafter(tmp_path / "medusa", "medusa", heads, heads.options, target)
    loaded = MedusaDrafter.from_pretrained(tmp_path / "medusa", target)
    assert torch.equal(loaded.heads.blocks[0].weight, heads.blocks[0].weight)
    other = tiny_gpt2(3, layers=3, init=0.1).float()
    with pytest.raises(ValueError, match=r"was trained for GPT2LMHeadModel \(0\.\d+ M parameters, weights \w{12}\); "
                                         r"this target is GPT2LMHeadModel"):
        MedusaDrafter.from_pretrained(tmp_path / "medusa", other)
    with pytest.raises(ValueError, match="holds a 'medusa' drafter, not a 'eagle' one"):
        EagleDrafter.from_pretrained(tmp_path / "medusa", target)


def test_reduced_medusa_heads_draft_target_ids_the_full_heads_rank_first_among_them(target):
    """Heads over draft ids D: at temperature 0 head i drafts argmax over D of the same full heads' logits (as a
    target id), at temperature 1 its q_i is their softmax renormalised over D and 0 elsewhere."""
    torch.manual_seed(3)
    full = MedusaHeads(target, 3)
    for parameter in full.parameters():
        parameter.data.normal_(0, 0.3)
    ids = torch.tensor([1, 4, 9, 16, 25, 36, 49, 64, 81])
    reduced = MedusaHeads(target, 3, draft_ids=ids.tolist())
    reduced.load_state_dict({**full.state_dict(), "draft_ids": ids})
    state = torch.randn(2, target.config.n_embd)  # [B, D] the target's last hidden state
    expected = medusa_logits(full, target, state)[..., ids]  # [B, K, |D|]
    drafter = MedusaDrafter(reduced, target)
    drafter.start(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long))
    drafter.state = state
    greedy = drafter.propose(3, specdec.sampling.SamplingConfig(), torch.Generator().manual_seed(0))
    assert torch.equal(greedy.tokens, ids[expected.argmax(-1)])
    sampled = drafter.propose(3, specdec.sampling.SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool).index_fill(0, ids, False)
    assert torch.isin(sampled.tokens, ids).all() and (sampled.probs[..., outside] == 0).all()
    torch.testing.assert_close(sampled.probs[..., ids], expected.softmax(-1))


def test_reduced_medusa_heads_round_trip_through_their_checkpoint_and_a_misfit_size_is_refused(tmp_path, target):
    import json

    torch.manual_seed(4)
    heads = MedusaHeads(target, 2, draft_ids=[3, 1, 8, 40])
    for parameter in heads.parameters():
        parameter.data.normal_(0, 0.3)
    save_drafter(tmp_path / "medusa", "medusa", heads, heads.options, target)
    loaded = MedusaDrafter.from_pretrained(tmp_path / "medusa", target).heads
    assert loaded.draft_ids.tolist() == [1, 3, 8, 40] and loaded.options == {"num_heads": 2, "draft_vocab": 4}
    state = torch.randn(3, target.config.n_embd)
    assert torch.equal(medusa_logits(loaded, target, state), medusa_logits(heads, target, state))
    config = json.loads((tmp_path / "medusa" / "drafter.json").read_text())
    config["options"]["draft_vocab"] = target.config.vocab_size + 5
    (tmp_path / "medusa" / "drafter.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as refused:
        MedusaDrafter.from_pretrained(tmp_path / "medusa", target)
    assert "\n" not in str(refused.value)
    assert (f"the drafter in {tmp_path / 'medusa'} drafts from a reduced vocabulary of {target.config.vocab_size + 5} "
            f"tokens; this target's vocabulary holds {target.config.vocab_size}") in str(refused.value)


def test_medusa_heads_saved_before_reduced_vocabularies_still_load(tmp_path, target):
    """A checkpoint without the draft-ids buffer and without draft_vocab in its options (saved before heads had a
    reduced vocabulary) loads as heads over the whole vocabulary, with its weights."""
    heads = MedusaHeads(target, 2)
    torch.nn.init.normal_(heads.blocks[0].weight, std=0.5)
    save_drafter(tmp_path / "old", "medusa", heads, heads.options, target)
    weights = tmp_path / "old" / "weights.safetensors"
    save_file({name: tensor for name, tensor in load_file(str(weights)).items() if name != "draft_ids"}, str(weights))
    config = json.loads((tmp_path / "old" / "drafter.json").read_text())
    config["options"].pop("draft_vocab", None)
    (tmp_path / "old" / "drafter.json").write_text(json.dumps(config))
    loaded = MedusaDrafter.from_pretrained(tmp_path / "old", target)
    assert not loaded.heads.reduced
    for name, tensor in heads.state_dict().items():
        assert torch.equal(loaded.heads.state_dict()[name], tensor), name
