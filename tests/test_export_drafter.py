"""EAGLE heads out to the serving engines' formats and back (experiments/export_drafter.py): every parameter comes
back bit for bit and the imported head drafts what the exported one drafted; the files are laid out as EAGLE's and
vLLM's code reads them; what a format cannot hold is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from llama_dirs import save_tiny_llama
from safetensors.torch import load_file

import specdec
from experiments.export_drafter import export_head, import_head, main
from specdec.checkpoints import save_drafter
from specdec.heads import EagleHead
from specdec.models import load_pair


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return str(save_tiny_llama(tmp_path_factory.mktemp("target") / "TinyLlama-Instruct"))


@pytest.fixture(scope="module")
def target(target_dir):
    return load_pair(target=target_dir, device="cpu", dtype="float32").target


def trained_looking_head(target, **options) -> EagleHead:
    """A head whose every parameter (norms and biases included) is random, so a lost or swapped one shows."""
    head = EagleHead(target, **options)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3 + (parameter.dim() == 1))
    return head.eval()


def drafted(target, head: EagleHead) -> tuple[list[list[int]], list]:
    """Sampled speculative decoding of fixed prompts: the tokens and the accepted histogram depend on every draft."""
    decoder = specdec.Decoder(target, specdec.EagleDrafter(head, target), specdec.Speculative(),
                              specdec.FixedLength(3), specdec.SamplingConfig(temperature=1.0))
    prompts = torch.tensor([[7, 9, 11, 13, 20], [30, 31, 8, 40, 41]])
    out = decoder.generate(prompts, torch.ones_like(prompts), max_new_tokens=12, seed=5)
    return out.tokens, [(row.accepted, row.steps_by_accepted, row.position_accepts) for row in out.stats.rows]


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_export_then_import_gives_the_same_head_and_the_same_drafts(target, tmp_path, fmt):
    head = trained_looking_head(target)
    export_head(head, target, fmt, tmp_path / fmt, "TinyLlama-Instruct")
    back = import_head(tmp_path / fmt, target)
    own, theirs = head.state_dict(), back.state_dict()
    unused = ("body.lm_head", "body.model.embed_tokens")  # a one-token stand-in: the head reads the target's
    assert [name for name in own if not name.startswith(unused) and not torch.equal(own[name], theirs[name])] == []
    assert drafted(target, back) == drafted(target, head)
    with torch.no_grad():  # the comparison sees a head that differs: one bias moved
        back.fc.bias[0] += 1.0
    assert drafted(target, back) != drafted(target, head)


def test_the_files_are_laid_out_as_the_engines_read_them(target, tmp_path):
    head = trained_looking_head(target)
    width = head.fc.in_features // 2
    export_head(head, target, "eagle", tmp_path / "eagle", "TinyLlama-Instruct")
    export_head(head, target, "speculators", tmp_path / "spec", "TinyLlama-Instruct")
    eagle, spec = load_file(str(tmp_path / "eagle" / "model.safetensors")), load_file(
        str(tmp_path / "spec" / "model.safetensors"))
    # EAGLE concatenates (embedding, feature); specdec (feature, embedding): the columns swap halves.
    assert torch.equal(eagle["fc.weight"][:, :width], head.fc.weight[:, width:].detach())
    assert {"fc.bias", "norm.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.gate_proj.weight",
            "layers.0.input_layernorm.weight"} <= set(eagle)
    assert {"fusion_fc.weight", "fusion_fc.bias", "pre_lm_head_layernorm.weight",
            "transformer.self_attn.k_proj.weight"} <= set(spec)
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["vocab_size"], config["architectures"]) == (
        1, target.config.vocab_size, ["LlamaForCausalLM"])
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle" and config["fusion_bias"] is True
    assert config["speculators_config"]["verifier"]["name_or_path"] == "TinyLlama-Instruct"


@pytest.mark.parametrize("options, named", [({"feature_layers": (0, 1, -1)}, "fuses the target's layers"),
                                            ({"width": 16}, "narrower than its target"),
                                            ({"draft_ids": list(range(20))}, "reduced vocabulary of 20 tokens")])
def test_a_head_a_format_cannot_hold_is_refused(target, tmp_path, options, named):
    with pytest.raises(ValueError, match=named):
        export_head(EagleHead(target, **options), target, "eagle", tmp_path / "out", "t")


def test_an_eagle1_head_without_the_norms_it_runs_is_refused_naming_them(target, tmp_path):
    export_head(trained_looking_head(target), target, "eagle", tmp_path / "eagle", "t")
    tensors = load_file(str(tmp_path / "eagle" / "model.safetensors"))
    del tensors["layers.0.input_layernorm.weight"]  # EAGLE-1's cnets.py runs its one layer without this norm
    from safetensors.torch import save_file

    save_file(tensors, str(tmp_path / "eagle" / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks body.model.layers.0.input_layernorm.weight"):
        import_head(tmp_path / "eagle", target)


def test_the_command_exports_a_drafter_directory_and_imports_it_back(target_dir, target, tmp_path, capsys):
    head = trained_looking_head(target)
    save_drafter(tmp_path / "drafter", "eagle", head, head.options, target)
    assert main([str(tmp_path / "drafter"), "--target", target_dir, "--format", "speculators",
                 "--out", str(tmp_path / "spec")]) == 0
    assert main(["--import", str(tmp_path / "spec"), "--target", target_dir, "--out", str(tmp_path / "back")]) == 0
    back = specdec.EagleDrafter.from_pretrained(tmp_path / "back", target).head
    assert drafted(target, back) == drafted(target, head)
    assert json.loads((tmp_path / "back" / "drafter.json").read_text())["training"]["format"] == "speculators"
