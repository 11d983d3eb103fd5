"""The lean forward against transformers' own forward: same logits, from the model's own Parameters.

transformers runs the reference the way specdec/cache.py feeds it: a DynamicCache, a [B, S] attention mask whose
zeros are padding and holes, positions counted from the mask, and a 4D mask for a tree. The lean forward gets the
same tokens with their positions, one new slot each, and the same mask as a [B, n, S] ``attend``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (DynamicCache, GPT2Config, GPT2LMHeadModel, GPT2Model, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

import specdec
from conftest import VOCAB, hf_greedy, random_prompts, tiny_gpt2
from specdec.batching import left_pad
from specdec.lean import LeanForward, lean_forward, lean_support

RAGGED = [7, 3, 5]  # prompt lengths of a left-padded batch
TREE_ATTEND = torch.tensor([  # [n, n] node j sees its ancestors and itself: 0 -> {1, 2}, 1 -> 3, 2 -> 4
    [1, 0, 0, 0, 0],
    [1, 1, 0, 0, 0],
    [1, 0, 1, 0, 0],
    [1, 1, 0, 1, 0],
    [1, 0, 1, 0, 1],
], dtype=torch.bool)
TREE_DEPTHS = torch.tensor([0, 1, 1, 2, 2])


def randomized(model: torch.nn.Module, std: float = 0.2, seed: int = 0) -> torch.nn.Module:
    """Every Parameter redrawn (biases and norm weights included, which init leaves at 0 and 1), so each one
    counts in the logits."""
    torch.manual_seed(seed)
    for name, parameter in model.named_parameters():
        norm = "norm" in name or ".ln_" in name
        parameter.data.normal_(1.0 if norm and name.endswith("weight") else 0.0, 0.1 if norm else std)
    return model


def tiny_llama(dtype=torch.float32, **options) -> LlamaForCausalLM:
    """2 layers, 4 query heads over 2 key/value heads (grouped-query attention), an untied head."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=None, **options)
    return randomized(LlamaForCausalLM(config)).to(dtype).eval().requires_grad_(False)


def tiny_qwen2(dtype=torch.float32, **options) -> Qwen2ForCausalLM:
    """2 layers, grouped-query attention, q/k/v biases, a head tied to the embedding."""
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=None, **options)
    return randomized(Qwen2ForCausalLM(config)).to(dtype).eval().requires_grad_(False)


def tiny_gpt2_model(dtype=torch.float64) -> GPT2LMHeadModel:
    return randomized(tiny_gpt2(0)).to(dtype)


MODELS = {
    "gpt2-float64": lambda: tiny_gpt2_model(torch.float64),
    "gpt2-float32": lambda: tiny_gpt2_model(torch.float32),
    "llama": tiny_llama,
    "llama-biases-llama3-rope-wide-heads": lambda: tiny_llama(
        attention_bias=True, mlp_bias=True, head_dim=16, rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=16)),
    "qwen2": tiny_qwen2,
}


def tolerance(model: torch.nn.Module) -> float:
    return 1e-10 if model.dtype == torch.float64 else 1e-5


class Twin:
    """Feeds the same tokens to transformers' forward and to the lean forward, and keeps both caches in step.
    ``committed`` [B, S] says which slots hold tokens a row's later tokens may attend (padding and holes do not)."""

    def __init__(self, model: torch.nn.Module, batch_size: int, capacity: int = 64):
        self.model = model
        self.forward = lean_forward(model)
        self.hf_cache = DynamicCache(config=model.config)
        self.keys, self.values = self.forward.new_buffers(batch_size, capacity)
        self.committed = torch.zeros(batch_size, 0, dtype=torch.bool)  # [B, S]

    def feed(self, input_ids: torch.Tensor, real: torch.Tensor):
        """A chain of [B, n] tokens (``real`` [B, n] False = padding): (transformers' logits, the lean logits)."""
        before, n = self.committed, input_ids.shape[1]
        positions = (before.sum(-1, keepdim=True) + real.cumsum(-1) - 1).clamp_min(0)  # [B, n]
        self.committed = torch.cat([before, real], dim=1)
        hf = self.model(input_ids=input_ids, attention_mask=self.committed.long(), position_ids=positions,
                        past_key_values=self.hf_cache, use_cache=True).logits
        slots = before.shape[1] + torch.arange(n)  # [n]
        causal = torch.arange(self.committed.shape[1]) <= slots[:, None]  # [n, S]
        attend = (self.committed.unsqueeze(1) & causal) | (torch.arange(self.committed.shape[1]) == slots[:, None])
        return hf, self.lean(input_ids, positions, slots.expand_as(input_ids), attend)

    def feed_tree(self, input_ids: torch.Tensor):
        """Tree nodes [B, n] below each row's last committed token, each seeing its ancestors (``TREE_ATTEND``):
        (transformers' logits through a 4D mask, the lean logits)."""
        before, n = self.committed, input_ids.shape[1]
        positions = before.sum(-1, keepdim=True) + TREE_DEPTHS  # [B, n]
        attend = torch.cat([before.unsqueeze(1).expand(-1, n, -1), TREE_ATTEND.expand(len(before), -1, -1)], -1)
        self.committed = torch.cat([before, torch.ones_like(input_ids, dtype=torch.bool)], dim=1)
        hf = self.model(input_ids=input_ids, attention_mask=attend.unsqueeze(1), position_ids=positions,
                        past_key_values=self.hf_cache, use_cache=True).logits
        slots = (before.shape[1] + torch.arange(n)).expand_as(input_ids)  # [B, n]
        return hf, self.lean(input_ids, positions, slots, attend)

    def lean(self, input_ids, positions, write_slots, attend, logit_columns=None) -> torch.Tensor:
        return self.forward(input_ids, positions, write_slots, attend, self.keys, self.values, logit_columns)

    def keep(self, kept: torch.Tensor) -> None:
        """Of the last ``kept.shape[1]`` slots keep those where ``kept`` [B, n]; the rest become holes."""
        self.committed[:, -kept.shape[1]:] &= kept


def tokens(batch: int, n: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(1, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


def check_chain(model: torch.nn.Module, lengths: list[int], widths=(1, 5, 1, 3), vocab: int = VOCAB) -> None:
    """A left-padded prefill, then steps of ``widths`` tokens (k + 1 verified drafts, or one), each row rejecting
    a different number of each step's tokens: lean logits equal transformers' at every real token."""
    input_ids, mask = left_pad(random_prompts(lengths, seed=1, vocab=vocab))
    twin = Twin(model, len(lengths))
    real = mask.bool()
    hf, lean = twin.feed(input_ids, real)
    torch.testing.assert_close(lean[real], hf[real], atol=tolerance(model), rtol=0)
    for step, width in enumerate(widths):
        step_ids = tokens(len(lengths), width, seed=step, vocab=vocab)
        hf, lean = twin.feed(step_ids, torch.ones_like(step_ids, dtype=torch.bool))
        torch.testing.assert_close(lean, hf, atol=tolerance(model), rtol=0)
        kept = torch.arange(width) < torch.arange(len(lengths)).remainder(width + 1)[:, None]  # [B, width]
        twin.keep(kept)  # each row keeps a different number of them: rejected drafts become holes


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("lengths", [[6], RAGGED], ids=["batch1", "ragged"])
def test_chain_logits_equal_transformers(name, lengths):
    check_chain(MODELS[name](), lengths)


def lean_greedy(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of left-padded prompts through the lean forward, one token per step: slot t holds token t
    of the padded row, and padding is never attended."""
    forward = lean_forward(model)
    input_ids, mask = left_pad(prompts)
    batch, width = input_ids.shape
    keys, values = forward.new_buffers(batch, width + max_new_tokens)
    real = mask.bool()  # [B, W]
    positions = (real.cumsum(-1) - 1).clamp_min(0)  # [B, W]
    slots = torch.arange(width).expand(batch, width)  # [B, W]
    causal = torch.ones(width, width, dtype=torch.bool).tril()  # [W, W]
    attend = (real.unsqueeze(1) & causal) | torch.eye(width, dtype=torch.bool)  # [B, W, W] padding sees itself
    logits = forward(input_ids, positions, slots, attend, keys, values, torch.tensor([width - 1]))  # [B, 1, V]
    emitted = []
    for step in range(max_new_tokens):
        emitted.append(logits[:, -1].argmax(-1))  # [B]
        slot = width + step
        real = torch.cat([real, torch.ones(batch, 1, dtype=torch.bool)], dim=1)  # [B, slot + 1]
        positions = positions[:, -1:] + 1  # [B, 1]
        logits = forward(emitted[-1].unsqueeze(1), positions, torch.full((batch, 1), slot), real.unsqueeze(1),
                         keys, values)
    return torch.stack(emitted, dim=1).tolist()


@pytest.mark.parametrize("name", ["gpt2-float64", "gpt2-float32", "llama", "qwen2"])
@pytest.mark.parametrize("lengths", [[6], RAGGED], ids=["batch1", "ragged"])
def test_greedy_tokens_equal_transformers_generate(name, lengths):
    """Each row's greedy continuation equals transformers' ``generate`` on that prompt alone."""
    model = MODELS[name]()
    prompts = random_prompts(lengths, seed=15)
    expected = [hf_greedy(model, prompt, max_new_tokens=12) for prompt in prompts]
    assert lean_greedy(model, prompts, max_new_tokens=12) == expected


@pytest.mark.parametrize("name", MODELS)
def test_tree_logits_equal_transformers(name):
    """Tree nodes see their ancestors only; after the tree one path stays and a token follows it."""
    model = MODELS[name]()
    input_ids, mask = left_pad(random_prompts(RAGGED, seed=2))
    twin = Twin(model, len(RAGGED))
    twin.feed(input_ids, mask.bool())
    hf, lean = twin.feed_tree(tokens(len(RAGGED), 5, seed=3))
    torch.testing.assert_close(lean, hf, atol=tolerance(model), rtol=0)
    twin.keep(torch.tensor([True, False, True, False, True]).expand(len(RAGGED), -1))  # the path 0 -> 2 -> 4
    next_ids = tokens(len(RAGGED), 1, seed=4)
    hf, lean = twin.feed(next_ids, torch.ones_like(next_ids, dtype=torch.bool))
    torch.testing.assert_close(lean, hf, atol=tolerance(model), rtol=0)


@pytest.mark.parametrize("name", ["gpt2-float32", "qwen2"])
def test_logit_columns_select_columns(name):
    model = MODELS[name]()
    input_ids, mask = left_pad(random_prompts(RAGGED, seed=5))
    twin = Twin(model, len(RAGGED))
    twin.feed(input_ids, mask.bool())
    step_ids = tokens(len(RAGGED), 4, seed=6)
    every = twin.lean(step_ids, *step_inputs(twin, 4))  # [B, 4, V]
    for columns in ([3], [0, 2], []):
        selected = twin.lean(step_ids, *step_inputs(twin, 4), logit_columns=torch.tensor(columns, dtype=torch.long))
        assert selected.shape == (len(RAGGED), len(columns), model.config.vocab_size)
        torch.testing.assert_close(selected, every[:, columns], atol=1e-6, rtol=0)


def step_inputs(twin: Twin, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions, write slots and attend of a chain of n tokens after every committed slot (not committing it)."""
    batch, width = twin.committed.shape
    positions = twin.committed.sum(-1, keepdim=True) + torch.arange(n)  # [B, n]
    slots = (width + torch.arange(n)).expand(batch, n)  # [B, n]
    chain = torch.ones(n, n, dtype=torch.bool).tril()
    attend = torch.cat([twin.committed.unsqueeze(1).expand(-1, n, -1), chain.expand(batch, -1, -1)], -1)
    return positions, slots, attend


@pytest.mark.parametrize("name", ["gpt2-float32", "llama"])
def test_writes_only_its_slots(name):
    """Each row's keys and values land at its own write slots in every layer; every other slot keeps its bytes."""
    forward = lean_forward(MODELS[name]())
    keys, values = forward.new_buffers(2, 16)
    for buffer in keys + values:
        buffer.fill_(7.0)
    slots = torch.tensor([[3, 9], [0, 15]])  # [B, n]
    attend = torch.zeros(2, 2, 16, dtype=torch.bool)
    attend[torch.arange(2)[:, None], torch.arange(2), slots] = True  # each token sees its own slot
    forward(tokens(2, 2, seed=7), torch.tensor([[0, 1], [4, 5]]), slots, attend, keys, values)
    written = torch.zeros(2, 16, dtype=torch.bool)
    written[torch.arange(2)[:, None], slots] = True
    for buffer in keys + values:
        untouched = (buffer == 7.0).all(-1).all(1)  # [B, capacity]
        assert torch.equal(untouched, ~written)


@pytest.mark.parametrize("name", ["gpt2-float32", "llama"])
def test_junk_row_leaves_other_rows_alone(name):
    """A finished row feeding slots and positions out of range changes nothing in the others, and stays finite."""
    model = MODELS[name]()
    input_ids, mask = left_pad(random_prompts(RAGGED, seed=8))
    twin = Twin(model, len(RAGGED))
    twin.feed(input_ids, mask.bool())
    step_ids = tokens(len(RAGGED), 2, seed=9)
    positions, slots, attend = step_inputs(twin, 2)
    clean = twin.lean(step_ids, positions, slots, attend)
    junk_positions, junk_slots = positions.clone(), slots.clone()
    junk_positions[1] = torch.tensor([10**6, -5])
    junk_slots[1] = torch.tensor([10**4, -3])
    junky = twin.lean(step_ids, junk_positions, junk_slots, attend)
    assert torch.isfinite(junky).all()
    torch.testing.assert_close(junky[[0, 2]], clean[[0, 2]], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("build", [tiny_gpt2_model, tiny_llama, tiny_qwen2], ids=["gpt2", "llama", "qwen2"])
def test_half_precision_close_to_transformers(build, dtype):
    """In 16-bit floats the same computation, rounded differently in places: close, not equal."""
    model = build(dtype)
    input_ids, mask = left_pad(random_prompts(RAGGED, seed=10))
    twin = Twin(model, len(RAGGED))
    real = mask.bool()
    hf, lean = twin.feed(input_ids, real)
    assert lean.dtype == dtype
    torch.testing.assert_close(lean[real].float(), hf[real].float(), atol=0.1, rtol=0.05)
    step_ids = tokens(len(RAGGED), 3, seed=11)
    hf, lean = twin.feed(step_ids, torch.ones_like(step_ids, dtype=torch.bool))
    torch.testing.assert_close(lean.float(), hf.float(), atol=0.1, rtol=0.05)


def held_parameters(forward: LeanForward) -> list[torch.Tensor]:
    """Every tensor the lean forward holds: its attributes and the fields of its per-layer records."""
    held = []
    for value in vars(forward).values():
        if isinstance(value, torch.Tensor):
            held.append(value)
        elif isinstance(value, list):
            held.extend(field for layer in value for field in layer if field is not None)
    return held


@pytest.mark.parametrize("name", ["gpt2-float32", "llama", "qwen2"])
def test_holds_the_models_own_parameters(name):
    """No copies: the forward holds exactly the model's Parameter objects, each of them."""
    model = MODELS[name]()
    held = held_parameters(lean_forward(model))
    assert all(isinstance(tensor, torch.nn.Parameter) for tensor in held)
    assert {id(tensor) for tensor in held} == {id(parameter) for parameter in model.parameters()}


def test_follows_the_model_through_to():
    """A forward built before ``model.to(float64)`` runs the converted weights (the Parameters are the same)."""
    model = tiny_llama(torch.float32)
    forward = lean_forward(model)
    model.to(torch.float64)
    assert forward.dtype == torch.float64 and forward.new_buffers(1, 4)[0][0].dtype == torch.float64
    check_chain(model, [4, 6], widths=(2,))


def test_attributes():
    forward = lean_forward(tiny_llama())
    assert (forward.num_layers, forward.num_kv_heads, forward.head_dim, forward.vocab_size) == (2, 2, 8, VOCAB)
    assert (forward.context_limit, forward.dtype, forward.device) == (128, torch.float32, torch.device("cpu"))
    keys, values = forward.new_buffers(3, 10)
    assert len(keys) == len(values) == 2 and keys[0].shape == (3, 2, 10, 8) and not keys[1].any()
    assert lean_forward(tiny_gpt2_model()).context_limit == 128


def test_rejects_an_attend_wider_than_the_buffers():
    forward = lean_forward(tiny_gpt2_model(torch.float32))
    keys, values = forward.new_buffers(1, 4)
    ids = torch.ones(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="capacity 4"):
        forward(ids, ids, ids, torch.ones(1, 1, 5, dtype=torch.bool), keys, values)


def gpt2_with(**options) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=1, n_head=2, **options)
    return GPT2LMHeadModel(config).eval()


UNSUPPORTED = {  # a model lean_forward refuses -> words its reason must contain
    "training-mode": (lambda: tiny_gpt2_model().train(), "training mode"),
    "gpt2-body": (lambda: GPT2Model(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)), "GPT2Model"),
    "scale_attn_by_inverse_layer_idx": (lambda: gpt2_with(scale_attn_by_inverse_layer_idx=True),
                                        "scale_attn_by_inverse_layer_idx"),
    "reorder_and_upcast_attn": (lambda: gpt2_with(reorder_and_upcast_attn=True), "reorder_and_upcast_attn"),
    "add_cross_attention": (lambda: gpt2_with(add_cross_attention=True), "add_cross_attention"),
    "qwen2-sliding-window": (lambda: tiny_qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=1),
                             "use_sliding_window"),
    "llama-sliding-layer-types": (lambda: tiny_llama(layer_types=["full_attention", "sliding_attention"]),
                                  "sliding_attention"),
    "dynamic-rope": (lambda: tiny_llama(rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
                     "'dynamic'"),
    "longrope": (lambda: tiny_llama(rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                                         short_factor=[1.0] * 4, long_factor=[2.0] * 4,
                                                         original_max_position_embeddings=64)), "'longrope'"),
    "partial-rotary": (lambda: tiny_llama(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0,
                                                               partial_rotary_factor=0.5)), "partial rotary"),
}


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_models_get_a_reason_and_no_forward(name):
    build, words = UNSUPPORTED[name]
    model = build()
    reason = lean_support(model)
    assert reason is not None and words in reason
    assert lean_forward(model) is None


@pytest.mark.parametrize("name", MODELS)
def test_supported_models_have_no_reason(name):
    assert lean_support(MODELS[name]()) is None


@pytest.mark.parametrize("role", ["draft", "target"])
def test_embedded_pair_equals_transformers(role):
    pair = specdec.load_pair("embedded", device="cpu", dtype="float32")
    model = getattr(pair, role)
    check_chain(model, RAGGED, vocab=model.config.vocab_size)


@pytest.mark.slow
def test_gpt2_xl_shaped_target_equals_transformers():
    """1.5B parameters: one prefill and two steps of a short prompt."""
    model = specdec.load_pair("gpt2-xl-shaped", device="cpu", dtype="float32").target
    check_chain(model, [6], widths=(1, 3), vocab=model.config.vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2-float32", "llama"])
def test_compiled_equals_eager(name):
    """The call traces as one graph (no host reads, no breaks) and computes what eager does, buffers included."""
    torch._dynamo.reset()  # earlier tests' lean graphs count toward dynamo's recompile limit of this code object
    model = MODELS[name]()
    forward = lean_forward(model)
    compiled = torch.compile(forward, fullgraph=True, dynamic=False)
    input_ids, mask = left_pad(random_prompts(RAGGED, seed=12))
    twin = Twin(model, len(RAGGED))
    twin.feed(input_ids, mask.bool())
    eager_keys, eager_values = [k.clone() for k in twin.keys], [v.clone() for v in twin.values]
    for seed in (13, 14):  # the second call replays the compiled graph
        step_ids = tokens(len(RAGGED), 3, seed=seed)
        inputs = (step_ids, *step_inputs(twin, 3))
        columns = torch.tensor([0, 2])
        expected = forward(*inputs, eager_keys, eager_values, columns)
        torch.testing.assert_close(compiled(*inputs, twin.keys, twin.values, columns), expected, atol=1e-5, rtol=0)
        for ours, theirs in zip(twin.keys + twin.values, eager_keys + eager_values):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
