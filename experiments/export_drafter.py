"""An EAGLE head trained here, written in the checkpoint formats serving engines read, and read back from them.

    python -m experiments.export_drafter DIR --target MODEL --format eagle --out OUT        # DIR: a drafter/ dir
    python -m experiments.export_drafter DIR --target MODEL --format speculators --out OUT
    python -m experiments.export_drafter --import SRC --target MODEL --out DIR              # back to a drafter/ dir

The formats, as their code reads them (2026-11-28):
- ``eagle``: SafeAILab/EAGLE's EAGLE-1 checkpoint (``eagle/model/cnets.py``, class ``Model``), as vLLM's
  ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``, speculative method ``eagle``) and
  SGLang's ``LlamaForCausalLMEagle`` load it: ``config.json`` is the one block's model config (the target's family
  and vocabulary, ``num_hidden_layers`` 1); ``model.safetensors`` holds ``fc.weight`` [D, 2D] over
  ``[embedding ; feature]`` (embedding first), ``fc.bias``, ``layers.0.*`` in the family's names, ``norm.weight``.
- ``speculators``: vllm-project/speculators' EAGLE speculator (``EagleSpeculatorConfig``, ``speculators_model_type``
  ``eagle``; ``src/speculators/models/eagle.py`` until March 2026, now ``convert/eagle/``): ``config.json`` holds
  ``speculators_config`` (algorithm, proposal method, verifier), ``transformer_layer_config``, ``layernorms``,
  ``fusion_bias``; the tensors are ``fusion_fc.*``, ``transformer.*`` (the block), ``pre_lm_head_layernorm.weight``,
  which vLLM's ``llama_eagle.py`` maps onto the same model (``SPECULATORS_WEIGHT_MAP``).

Both hold every parameter of a specdec head (for the Llama family: Llama, Qwen2, Mistral), so export then import
gives the head back bit for bit. What an engine computes from them is its own architecture: EAGLE-1's runs its
block without the input norm, and with no norm after it (speculators' ``layernorms: false``); vLLM's fusion layer
has no bias. A specdec head keeps all three (its block is one whole layer of the target's family, then the
family's final norm), so in those engines it drafts differently from here: still lossless there, its acceptance
not the one measured here. Files from elsewhere load here only where they hold those parameters (a head trained
with them); one without is refused in one line naming what it lacks. A head narrower than its target, one that
fuses several layers (EAGLE-3's) or one with a reduced vocabulary has no place in either format: refused in one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from experiments.refusal import ArgumentParser, refuse
from specdec.checkpoints import save_drafter
from specdec.eagle import SHIPPED, EagleDrafter
from specdec.heads import EagleHead, target_width
from specdec.models import load_pair

FORMATS = ("eagle", "speculators")
WEIGHTS = "model.safetensors"
BLOCK = "body.model.layers.0."  # a Llama-family head's block, in specdec's state dict
NORM = "body.model.norm.weight"  # its final norm


def exportable(head: EagleHead) -> None:
    """Refuse, in one line, a head neither format has a place for."""
    if head.options["feature_layers"] != [-1]:
        raise ValueError(f"the head fuses the target's layers {head.options['feature_layers']} (EAGLE-3); the eagle "
                         f"and speculators EAGLE formats read the last hidden state alone")
    if head.project is not None:
        raise ValueError(f"the head is {head.options['width']} wide, narrower than its target; the formats' fusion "
                         f"layer maps to the target's width")
    if head.reduced:
        raise ValueError(f"the head drafts over a reduced vocabulary of {head.draft_ids.numel()} tokens, which "
                         f"EAGLE-1's formats do not hold")
    if not any(name.startswith(BLOCK) for name in head.state_dict()):
        raise ValueError(f"the head's block is {type(head.body).__name__}'s; the formats hold the Llama family's "
                         f"(Llama, Qwen2, Mistral)")


def fc_to_engine(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """[w, 2D] over [feature ; embedding] (specdec's order) -> [w, 2D] over [embedding ; feature] (EAGLE's)."""
    return torch.cat([weight[:, dim:], weight[:, :dim]], 1)


def fc_from_engine(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of ``fc_to_engine``."""
    return torch.cat([weight[:, dim:], weight[:, :dim]], 1)


def names(fmt: str) -> tuple[str, str, str]:
    """The format's names of (the fusion layer, the block's prefix, the final norm)."""
    return ("fc", "layers.0.", "norm.weight") if fmt == "eagle" else \
        ("fusion_fc", "transformer.", "pre_lm_head_layernorm.weight")


def engine_tensors(head: EagleHead, fmt: str) -> dict[str, torch.Tensor]:
    """The head's parameters under the format's names."""
    fc, block, norm = names(fmt)
    dim = head.fc.in_features // 2
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in head.state_dict().items()}
    tensors = {f"{fc}.weight": fc_to_engine(state["fc.weight"], dim), f"{fc}.bias": state["fc.bias"],
               norm: state[NORM]}
    tensors.update({block + name.removeprefix(BLOCK): tensor for name, tensor in state.items()
                    if name.startswith(BLOCK)})
    return {name: tensor.clone() for name, tensor in tensors.items()}


def block_config(head: EagleHead, target: torch.nn.Module) -> dict:
    """The one block's model config, with the target's vocabulary (the engines build embedding and head from it)."""
    config = head.body.config.to_diff_dict()
    config.update(vocab_size=target.config.vocab_size, num_hidden_layers=1,
                  architectures=[type(target).__name__], pad_token_id=target.config.pad_token_id)
    return config


def engine_config(head: EagleHead, target: torch.nn.Module, fmt: str, target_name: str) -> dict:
    config = block_config(head, target)
    if fmt == "eagle":
        return {**config, "bias": True}
    return {"architectures": ["EagleSpeculator"], "speculators_model_type": "eagle", "layernorms": False,
            "fusion_bias": True, "transformer_layer_config": config,
            "speculators_config": {"algorithm": "eagle", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                                   "verifier": {"name_or_path": target_name,
                                                "architectures": [type(target).__name__]}}}


def export_head(head: EagleHead, target: torch.nn.Module, fmt: str, out: Path, target_name: str) -> Path:
    """Write ``head`` in ``fmt`` to ``out`` (config.json and model.safetensors)."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    exportable(head)
    out.mkdir(parents=True, exist_ok=True)
    save_file(engine_tensors(head, fmt), str(out / WEIGHTS), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(engine_config(head, target, fmt, target_name), indent=2) + "\n")
    return out


def format_of(directory: Path) -> str:
    config = json.loads((directory / "config.json").read_text())
    return "speculators" if config.get("speculators_model_type") else "eagle"


def import_head(directory: Path, target: torch.nn.Module) -> EagleHead:
    """An exported head (either format) as a specdec ``EagleHead`` for ``target``; a file lacking a parameter the
    head runs (a block input norm, a final norm, a fusion bias: an EAGLE-1 head trained elsewhere) is refused."""
    if not (directory / "config.json").is_file() or not (directory / WEIGHTS).is_file():
        raise ValueError(f"{directory} holds no exported head: config.json and {WEIGHTS} are both needed")
    fmt = format_of(directory)
    fc, block, norm = names(fmt)
    tensors = load_file(str(directory / WEIGHTS))
    dim = target_width(target)
    head = EagleHead(target)
    own = head.state_dict()
    state = {"fc.weight": fc_from_engine(tensors.get(f"{fc}.weight", torch.empty(0, 2 * dim)), dim),
             "fc.bias": tensors.get(f"{fc}.bias"), NORM: tensors.get(norm)}
    state.update({BLOCK + name.removeprefix(block): tensor for name, tensor in tensors.items()
                  if name.startswith(block)})
    missing = sorted(name for name in own if name not in state or state[name] is None)
    missing = [name for name in missing if not name.startswith(("body.lm_head", "body.model.embed_tokens",
                                                                "draft_ids"))]
    if missing:
        raise ValueError(f"{directory} ({fmt} format) lacks {', '.join(missing[:3])}, which specdec's EAGLE head "
                         f"runs (its block keeps its input norm, then a final norm): it cannot be run here as trained")
    wrong = [name for name in state if name in own and tuple(state[name].shape) != tuple(own[name].shape)]
    if wrong:
        raise ValueError(f"{directory}'s {wrong[0]} is {tuple(state[wrong[0]].shape)}; a head for this target "
                         f"has {tuple(own[wrong[0]].shape)}: it was made for another target")
    head.load_state_dict({**own, **{name: tensor.to(own[name].dtype) for name, tensor in state.items()
                                    if name in own}})
    return head.eval().requires_grad_(False)


def parse_args(argv: list[str]):
    parser = ArgumentParser(prog="python -m experiments.export_drafter", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", help="a train_drafter drafter/ directory (an EAGLE head), or embedded")
    parser.add_argument("--format", choices=FORMATS, help="the format to write")
    parser.add_argument("--import", dest="source", help="an exported head (eagle or speculators format) to read")
    parser.add_argument("--target", required=True, help="the target model: a model directory or hub id")
    parser.add_argument("--out", required=True, help="the directory to write")
    args = parser.parse_args(argv)
    if (args.directory is None) == (args.source is None):
        parser.error("give a drafter directory to export (with --format) or --import SRC, not both")
    if args.directory is not None and args.format is None:
        parser.error("--format is required to export: one of " + ", ".join(FORMATS))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    pair = load_pair(target=args.target, device="cpu", dtype="float32")
    try:
        if args.source is not None:
            head = import_head(Path(args.source), pair.target)
            save_drafter(args.out, "eagle", head, head.options, pair.target,
                         training={"imported_from": str(args.source), "format": format_of(Path(args.source))})
        else:
            drafter = EagleDrafter.from_pretrained(SHIPPED.get(args.directory, args.directory), pair.target)
            export_head(drafter.head, pair.target, args.format, Path(args.out), pair.name)
    except (ValueError, FileNotFoundError) as err:
        refuse(f"python -m experiments.export_drafter: error: {err}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
