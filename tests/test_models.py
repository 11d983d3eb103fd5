"""Model-pair loading: preset resolution, device/dtype rules, tokenizer checks, offline errors. Never hits the hub."""
import huggingface_hub.constants
import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

import specdec

from specdec.models import (EMBEDDED_DIR, PRESETS, ModelPair, ModelUnavailableError, load_pair, resolve_device,
                            resolve_dtype, resolve_pair_ids)


def save_tiny_pair_member(path, corpus: list[str], vocab_size: int = 300) -> None:
    """A 1-layer GPT-2 with its own freshly trained byte-level BPE tokenizer, saved to path."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, special_tokens=["<|endoftext|>"])
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tok.save_pretrained(path)
    config = GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(path)


@pytest.fixture(scope="module")
def embedded() -> ModelPair:
    return load_pair("embedded", device="cpu")


def test_hub_presets_map_to_gpt2_ids():
    assert (resolve_pair_ids("gpt2-xl").draft, resolve_pair_ids("gpt2-xl").target) == ("gpt2", "gpt2-xl")
    assert resolve_pair_ids("gpt2-large").target == "gpt2-large"
    spec = resolve_pair_ids("gpt2-medium")
    assert (spec.draft, spec.target, spec.draft_tokenizer, spec.name) == ("gpt2", "gpt2-medium", "gpt2", "gpt2-medium")


def test_embedded_preset_points_into_the_package():
    spec = resolve_pair_ids("embedded")
    assert spec.draft == str(EMBEDDED_DIR / "draft") and spec.target == str(EMBEDDED_DIR / "target")
    assert spec.draft_tokenizer == spec.target_tokenizer == str(EMBEDDED_DIR / "tokenizer")


def test_explicit_ids_override_the_preset():
    spec = resolve_pair_ids("gpt2-xl", draft="distilgpt2")
    assert (spec.draft, spec.target, spec.draft_tokenizer, spec.name) == ("distilgpt2", "gpt2-xl", "distilgpt2",
                                                                            "distilgpt2->gpt2-xl")
    spec = resolve_pair_ids(None, draft="a", target="b")
    assert (spec.draft, spec.target) == ("a", "b")


@pytest.mark.parametrize("preset, draft, target", [("gpt-5", None, None), (None, "gpt2", None)])
def test_bad_preset_arguments_name_the_presets(preset, draft, target):
    with pytest.raises(ValueError, match="gpt2-xl"):
        resolve_pair_ids(preset, draft, target)


def test_unknown_preset_fails_before_loading():
    with pytest.raises(ValueError, match="unknown preset 'tiny'.*embedded"):
        load_pair("tiny")
    assert "embedded" in PRESETS


def test_device_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda'.*not available"):
            resolve_device("cuda")


def test_dtype_resolution():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "mps") == torch.float16
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="'fp8'.*float32"):
        resolve_dtype("fp8", "cpu")


def test_tokenizer_mismatch_is_rejected(tmp_path):
    save_tiny_pair_member(tmp_path / "a", ["the cat sat on the mat"] * 20)
    save_tiny_pair_member(tmp_path / "b", ["zebras quickly jump over lazy foxes"] * 20)
    with pytest.raises(ValueError, match="tokenizers differ"):
        load_pair(None, draft=str(tmp_path / "a"), target=str(tmp_path / "b"), device="cpu")


def test_pair_with_same_tokenizer_loads_from_local_dirs(tmp_path):
    corpus = ["the cat sat on the mat"] * 20
    save_tiny_pair_member(tmp_path / "a", corpus)
    save_tiny_pair_member(tmp_path / "b", corpus)
    pair = load_pair(None, draft=str(tmp_path / "a"), target=str(tmp_path / "b"), device="cpu")
    assert pair.name == "a->b" and pair.tokenizer.padding_side == "left"


def test_unavailable_model_error_is_one_line_and_names_embedded(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable at import time, so set the constant it was read into as well
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for missing in ["specdec-test/no-such-model", str(tmp_path / "missing")]:
        with pytest.raises(ModelUnavailableError) as info:
            load_pair(None, draft=missing, target=missing, device="cpu")
        message = str(info.value)
        assert "\n" not in message and "embedded" in message and missing in message
        assert info.value.__cause__ is None and info.value.__suppress_context__


def test_embedded_pair_loads_in_fp32_with_eval_mode(embedded):
    draft, target, tokenizer = embedded
    assert embedded.name == "embedded"
    for model in (draft, target):
        assert model.dtype == torch.float32 and not model.training
        assert not any(p.requires_grad for p in model.parameters())
        assert model.config.vocab_size == 8192 and model.config.n_positions == 1024
    assert tokenizer.pad_token_id == tokenizer.eos_token_id and tokenizer.padding_side == "left"


def test_embedded_target_gives_finite_logits(embedded):
    ids = embedded.tokenizer(["The history of"], return_tensors="pt").input_ids
    with torch.no_grad():
        logits = embedded.target(ids).logits  # [1, T, V]
    assert logits.shape == (1, ids.shape[1], 8192) and torch.isfinite(logits).all()


def test_embedded_draft_and_target_share_the_tokenizer(embedded):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(EMBEDDED_DIR / "tokenizer")
    assert loaded.get_vocab() == embedded.tokenizer.get_vocab() and len(loaded) == 8192
    assert embedded.draft.config.eos_token_id == embedded.target.config.eos_token_id == loaded.eos_token_id
    assert embedded.draft.config.n_embd < embedded.target.config.n_embd


# --- the canonical pairs' shapes, offline ------------------------------------------------------------------------

# The hub's configurations of the four GPT-2 sizes (config.json of gpt2, gpt2-medium, gpt2-large, gpt2-xl).
HUB_GPT2 = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20), "gpt2-xl": (48, 1600, 25)}


@pytest.mark.parametrize("size", list(HUB_GPT2))
def test_shaped_configs_are_the_hub_configurations(size):
    from transformers import GPT2Config

    from specdec.models import GPT2_SHAPES

    config = GPT2Config(**GPT2_SHAPES[size])
    assert (config.n_layer, config.n_embd, config.n_head) == HUB_GPT2[size]
    assert (config.vocab_size, config.n_positions, config.activation_function, config.layer_norm_epsilon) == (
        50257, 1024, "gelu_new", 1e-5)
    assert config.n_inner is None and config.bos_token_id == config.eos_token_id == 50256


def test_gpt2_tokenizer_is_the_real_one_offline():
    from specdec.models import gpt2_tokenizer

    tokenizer = gpt2_tokenizer()
    assert tokenizer("Hello world").input_ids == [15496, 995]
    assert len(tokenizer) == 50257 and tokenizer.eos_token_id == 50256
    text = " The café's 3 \u00e9l\u00e8ves\n\ncost $4.50."
    assert tokenizer.decode(tokenizer(text).input_ids) == text


@pytest.mark.slow
def test_shaped_pair_loads_offline_with_the_presets_options():
    """The smallest preset built for real (the others differ only in the target's shape, checked above)."""
    pair = specdec.load_pair("gpt2-medium-shaped", device="cpu", dtype="bfloat16")
    assert (pair.draft.config.n_layer, pair.target.config.n_layer, pair.target.config.n_embd) == (12, 24, 1024)
    assert pair.draft.dtype == pair.target.dtype == torch.bfloat16 and not pair.target.training
    assert pair.tokenizer.padding_side == "left" and pair.tokenizer.pad_token_id == 50256
    ids = pair.tokenizer(["Hello world"], return_tensors="pt").input_ids
    out = specdec.generate(pair.target, ids, draft=pair.draft, strategy="synthetic", k=2, max_new_tokens=3)
    assert len(out.tokens[0]) == 3


def test_shaped_presets_take_no_model_ids():
    with pytest.raises(ValueError, match="preset 'gpt2-xl-shaped' builds random-weight models and takes no draft="):
        specdec.load_pair("gpt2-xl-shaped", draft="gpt2")
