"""Issue 43's pass, the trained drafters' side: EAGLE heads and Medusa heads handed to the library (dtypes, widths,
reduced vocabularies, tree shapes, feature layers), their checkpoints on disk as edits and damage leave them, the
run app's drafter options, and rows tampered with before a resume. None of these inputs was tried by an earlier
pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from probes.core import (
    CLEAR, CLI, CONFUSING, CORRECT, DURABILITY, LIBRARY, PROMPTS, SILENTLY_ACCEPTED, SILENTLY_WRONG, TRACEBACK,
    Outcome, agreement, batch, cli, command_refusal, decoded, holds, models, probe, refusal, rows_on_disk, run_app,
    scratch, validated,
)


def head(**options):
    from specdec.heads import EagleHead

    return EagleHead(models()[0], **options)


def medusa(target=None, num_heads: int = 2):
    from specdec.heads import MedusaHeads

    return MedusaHeads(target if target is not None else models()[0], num_heads)


def eagle(eagle_head, **options):
    from specdec.eagle import EagleDrafter

    return EagleDrafter(eagle_head, models()[0], **options)


def medusa_drafter(heads, **options):
    from specdec.medusa import MedusaDrafter

    return MedusaDrafter(heads, models()[0], **options)


def tokens_with(drafter, new: int = 10) -> list[list[int]]:
    """The tiny target's greedy tokens with ``drafter`` (k = 3)."""
    import specdec

    decoder = specdec.Decoder(models()[0], drafter, specdec.Greedy(), specdec.FixedLength(3),
                              specdec.SamplingConfig(temperature=0))
    return decoder.generate(*batch(PROMPTS), max_new_tokens=new).tokens


def plain_tokens(new: int = 10) -> list[list[int]]:
    """The tiny target's own greedy tokens (the baseline: no drafter)."""
    return tokens_with(None, new)


# --- Library: heads handed to the drafters ---------------------------------------------------------------------------

@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def eagle_head_in_half_precision() -> Outcome:
    """EagleDrafter(EagleHead(T).half(), T) with T in float64."""
    return refusal(lambda: eagle(head().half()), "float16", "float64")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def eagle_head_in_bfloat16() -> Outcome:
    """EagleDrafter(EagleHead(T).to(torch.bfloat16), T)."""
    return refusal(lambda: eagle(head().to(torch.bfloat16)), "bfloat16")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def medusa_heads_in_half_precision() -> Outcome:
    """MedusaDrafter(MedusaHeads(T, 2).half(), T)."""
    return refusal(lambda: medusa_drafter(medusa().half()), "float16")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def medusa_heads_for_another_width() -> Outcome:
    """Medusa heads built for a target 48 wide, handed with a target 32 wide."""
    from conftest import tiny_gpt2

    return refusal(lambda: medusa_drafter(medusa(tiny_gpt2(2, layers=1, width=48))), "48", "32")


@probe(LIBRARY, CLEAR, issue=43)
def eagle_head_for_another_width() -> Outcome:
    """An EAGLE head built for a target 64 wide, handed with a target 32 wide."""
    from conftest import tiny_gpt2
    from specdec.heads import EagleHead

    return refusal(lambda: eagle(EagleHead(tiny_gpt2(2, layers=1, width=64))), "64", "32")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def eagle_head_reading_a_layer_the_target_lacks() -> Outcome:
    """A head reading layer 3 of a 3-block target (built), handed a 1-block target of the same width."""
    from conftest import tiny_gpt2
    from specdec.eagle import EagleDrafter
    from specdec.heads import EagleHead

    def build():
        shallow = tiny_gpt2(5, layers=1)
        return EagleDrafter(EagleHead(models()[0], feature_layers=(3,)), shallow)
    return refusal(build, "layers [3]", "1 blocks")


@probe(LIBRARY, CLEAR, issue=43)
def medusa_heads_instead_of_an_eagle_head() -> Outcome:
    """EagleDrafter(MedusaHeads(T), T)."""
    return refusal(lambda: eagle(medusa()), "EagleHead", "MedusaHeads")


@probe(LIBRARY, CLEAR, issue=43)
def zero_medusa_heads() -> Outcome:
    """MedusaHeads(T, num_heads=0)."""
    return refusal(lambda: medusa(num_heads=0), "num_heads", "0")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def empty_draft_ids() -> Outcome:
    """EagleHead(T, draft_ids=[]): an empty reduced vocabulary (it meant the whole one)."""
    return refusal(lambda: head(draft_ids=[]), "draft_ids", "empty")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def draft_ids_beyond_the_vocabulary() -> Outcome:
    """EagleHead(T, draft_ids=[1, 97]) with a 97-token vocabulary."""
    return refusal(lambda: head(draft_ids=[1, 97]), "97", "[0, 97)")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def negative_draft_ids() -> Outcome:
    """EagleHead(T, draft_ids=[-1, 4])."""
    return refusal(lambda: head(draft_ids=[-1, 4]), "-1")


@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=43)
def draft_ids_as_a_string() -> Outcome:
    """EagleHead(T, draft_ids="1,2,3")."""
    return refusal(lambda: head(draft_ids="1,2,3"), "draft_ids")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def draft_ids_of_floats() -> Outcome:
    """EagleHead(T, draft_ids=[1.5, 2.0])."""
    return refusal(lambda: head(draft_ids=[1.5, 2.0]), "draft_ids")


@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=43)
def draft_ids_damaged_after_construction() -> Outcome:
    """A head's draft_ids buffer holding 500 (as a damaged file would load it), handed to EagleDrafter."""
    def build():
        reduced = head(draft_ids=[1, 2, 3])
        reduced.draft_ids[1] = 500
        return eagle(reduced)
    return refusal(build, "500")


@probe(LIBRARY, CORRECT, issue=43)
def draft_ids_with_repeats_as_a_numpy_array() -> Outcome:
    """draft_ids=np.array([5, 5, 3, ...]) with repeats: a reduced vocabulary of the distinct ids; greedy tokens are
    the target's own."""
    return agreement(lambda: tokens_with(eagle(head(draft_ids=np.array([5, 5, 3, *range(10, 60)])))),
                     plain_tokens())


@probe(LIBRARY, CORRECT, issue=43)
def draft_ids_as_a_tensor() -> Outcome:
    """draft_ids=torch.arange(0, 97, 3): greedy tokens are the target's own."""
    return agreement(lambda: tokens_with(eagle(head(draft_ids=torch.arange(0, 97, 3)))), plain_tokens())


@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=43)
def eagle_tree_of_two_sizes() -> Outcome:
    """EagleDrafter(head, T, tree=(8, 3)): a size missing."""
    return refusal(lambda: eagle(head(), tree=(8, 3)), "tree", "node_budget, depth, top_k")


@probe(LIBRARY, CLEAR, before=CONFUSING, issue=43)
def eagle_tree_as_a_word() -> Outcome:
    """EagleDrafter(head, T, tree="big"): three characters."""
    return refusal(lambda: eagle(head(), tree="big"), "tree", "'big'")


@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=43)
def eagle_tree_of_four_sizes() -> Outcome:
    """EagleDrafter(head, T, tree=(8, 3, 2, 1))."""
    return refusal(lambda: eagle(head(), tree=(8, 3, 2, 1)), "tree", "(8, 3, 2, 1)")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def eagle_tree_wider_than_the_vocabulary() -> Outcome:
    """tree=(300, 2, 150) over a 97-token vocabulary."""
    return refusal(lambda: eagle(head(), tree=(300, 2, 150)), "top_k=150", "97")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def eagle_tree_wider_than_the_reduced_vocabulary() -> Outcome:
    """tree=(8, 2, 5) with a reduced vocabulary of 3 ids: two children would be tokens of probability 0."""
    return refusal(lambda: eagle(head(draft_ids=[1, 2, 3]), tree=(8, 2, 5)), "top_k=5", "3 tokens")


@probe(LIBRARY, CORRECT, issue=43)
def eagle_tree_as_a_list_of_numpy_integers() -> Outcome:
    """tree=[np.int64(6), 2, np.int32(3)]: the target's greedy tokens."""
    return agreement(lambda: tokens_with(eagle(head(), tree=[np.int64(6), 2, np.int32(3)])), plain_tokens())


@probe(LIBRARY, CORRECT, issue=43)
def eagle_tree_as_wide_as_the_reduced_vocabulary() -> Outcome:
    """tree=(6, 2, 3) with a reduced vocabulary of exactly 3 ids: the target's greedy tokens."""
    return agreement(lambda: tokens_with(eagle(head(draft_ids=[4, 8, 15]), tree=(6, 2, 3))), plain_tokens())


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def medusa_tree_wider_than_the_vocabulary() -> Outcome:
    """MedusaDrafter(heads, T, tree=(150, 1))."""
    return refusal(lambda: medusa_drafter(medusa(), tree=(150, 1)), "150", "97")


@probe(LIBRARY, CLEAR, issue=43)
def medusa_tree_deeper_than_its_heads() -> Outcome:
    """tree=(2, 2, 2) with 2 heads."""
    return refusal(lambda: medusa_drafter(medusa(), tree=(2, 2, 2)), "3 levels", "2")


@probe(LIBRARY, CLEAR, issue=43)
def medusa_tree_as_a_word() -> Outcome:
    """MedusaDrafter(heads, T, tree="big")."""
    return refusal(lambda: medusa_drafter(medusa(), tree="big"), "branching", "'big'")


@probe(LIBRARY, CORRECT, issue=43)
def medusa_tree_as_wide_as_the_vocabulary() -> Outcome:
    """tree=(97,) over a 97-token vocabulary: the target's greedy tokens."""
    return agreement(lambda: tokens_with(medusa_drafter(medusa(), tree=(97,))), plain_tokens())


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def eagle_feature_layer_beyond_the_target() -> Outcome:
    """EagleHead(T, feature_layers=(99,)) for a 3-block target."""
    return refusal(lambda: head(feature_layers=(99,)), "[99]", "3 blocks")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def eagle_feature_layers_repeated() -> Outcome:
    """EagleHead(T, feature_layers=(1, 1, 2)): a layer fused twice."""
    return refusal(lambda: head(feature_layers=(1, 1, 2)), "distinct")


@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=43)
def eagle_head_of_negative_width() -> Outcome:
    """EagleHead(T, width=-32)."""
    return refusal(lambda: head(width=-32), "width", "-32")


# --- Durability: checkpoints as edits and damage leave them --------------------------------------------------------

def saved_head(name: str, **options) -> Path:
    """An EAGLE head for the tiny target, saved in a fresh directory."""
    from specdec.checkpoints import save_drafter

    eagle_head = head(**options)
    return save_drafter(scratch(name), "eagle", eagle_head, eagle_head.options, models()[0])


def edited_config(directory: Path, edit) -> Path:
    path = directory / "drafter.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return directory


def loaded(directory: Path):
    from specdec.eagle import EagleDrafter

    return EagleDrafter.from_pretrained(directory, models()[0])


@probe(DURABILITY, CORRECT, issue=43)
def saved_head_decodes_the_targets_tokens() -> Outcome:
    """An EAGLE-3 head (3 fused layers, a reduced vocabulary) saved and loaded: the target's greedy tokens."""
    directory = saved_head("eagle3", feature_layers=(0, 1, 3), draft_ids=list(range(0, 97, 2)))
    return agreement(lambda: tokens_with(loaded(directory)), plain_tokens())


@probe(DURABILITY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def feature_layers_edited_in_the_config() -> Outcome:
    """drafter.json's feature_layers [0, 1, 3] edited to [1, 2, 3]: the shapes still match."""
    directory = edited_config(saved_head("edited_layers", feature_layers=(0, 1, 3)),
                              lambda config: {**config, "options": {**config["options"], "feature_layers": [1, 2, 3]}})
    return refusal(lambda: loaded(directory), "feature_layers", "drafter.json")


@probe(DURABILITY, CLEAR, before=SILENTLY_ACCEPTED, issue=43)
def single_feature_layer_edited_in_the_config() -> Outcome:
    """drafter.json's feature_layers [-1] edited to [1]: one layer, the same shapes."""
    directory = edited_config(saved_head("edited_layer"),
                              lambda config: {**config, "options": {**config["options"], "feature_layers": [1]}})
    return refusal(lambda: loaded(directory), "feature_layers")


@probe(DURABILITY, CLEAR, before=CONFUSING, issue=43)
def width_edited_in_the_config() -> Outcome:
    """drafter.json's width 32 edited to 64: the weights are 32 wide."""
    directory = edited_config(saved_head("edited_width"),
                              lambda config: {**config, "options": {**config["options"], "width": 64}})
    return refusal(lambda: loaded(directory), "64")


@probe(DURABILITY, CLEAR, before=TRACEBACK, issue=43)
def config_that_is_a_list() -> Outcome:
    """drafter.json holding [] (a JSON list)."""
    directory = edited_config(saved_head("config_list"), lambda config: [])
    return refusal(lambda: loaded(directory), "drafter.json", "list")


@probe(DURABILITY, CLEAR, before=TRACEBACK, issue=43)
def config_without_options() -> Outcome:
    """drafter.json without its "options"."""
    directory = edited_config(saved_head("config_no_options"),
                              lambda config: {key: value for key, value in config.items() if key != "options"})
    return refusal(lambda: loaded(directory), "'options'")


@probe(DURABILITY, CLEAR, before=TRACEBACK, issue=43)
def config_without_target() -> Outcome:
    """drafter.json without its "target"."""
    directory = edited_config(saved_head("config_no_target"),
                              lambda config: {key: value for key, value in config.items() if key != "target"})
    return refusal(lambda: loaded(directory), "'target'")


@probe(DURABILITY, CLEAR, before=TRACEBACK, issue=43)
def config_target_without_fingerprint() -> Outcome:
    """drafter.json's target without its fingerprint."""
    directory = edited_config(saved_head("config_no_fingerprint"), lambda config: {
        **config, "target": {key: value for key, value in config["target"].items() if key != "fingerprint"}})
    return refusal(lambda: loaded(directory), "fingerprint")


@probe(DURABILITY, CLEAR, before=TRACEBACK, issue=43)
def weights_truncated() -> Outcome:
    """weights.safetensors cut to its first 100 bytes."""
    directory = saved_head("weights_truncated")
    weights = directory / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return refusal(lambda: loaded(directory), "weights.safetensors")


@probe(DURABILITY, CLEAR, before=TRACEBACK, issue=43)
def weights_missing() -> Outcome:
    """weights.safetensors deleted, drafter.json left."""
    directory = saved_head("weights_missing")
    (directory / "weights.safetensors").unlink()
    return refusal(lambda: loaded(directory), "weights.safetensors")


@probe(DURABILITY, CLEAR, issue=43)
def checkpoint_of_another_kind() -> Outcome:
    """Medusa heads' checkpoint loaded as an EAGLE head."""
    from specdec.checkpoints import save_drafter

    heads = medusa()
    directory = save_drafter(scratch("medusa_as_eagle"), "medusa", heads, heads.options, models()[0])
    return refusal(lambda: loaded(directory), "'medusa'", "'eagle'")


def tampered_run(name: str, edit) -> Path:
    """A run of 4 prompts killed after 2 rows, whose first row ``edit`` changed."""
    run_dir = scratch(name)
    run_app(run_dir)
    first, second = (run_dir / "rows.jsonl").read_text().splitlines()[:2]
    (run_dir / "rows.jsonl").write_text(json.dumps(edit(json.loads(first))) + "\n" + second + "\n")
    (run_dir / "summary.json").unlink()
    return run_dir


def resumed_with_the_first_row_redone(run_dir: Path) -> str | None:
    """What is wrong after resuming (None: every prompt once, and the tampered prompt decoded again)."""
    before = {row["prompt_hash"]: row for row in rows_on_disk(run_dir)}
    wrong = decoded(run_dir)
    if wrong:
        return wrong
    after = {row["prompt_hash"]: row for row in rows_on_disk(run_dir)}
    redone = [digest for digest, row in before.items() if row != after[digest]]
    return None if len(redone) == 1 else f"{len(redone)} rows differ from before the resume (1 expected)"


@probe(DURABILITY, CORRECT, before=SILENTLY_WRONG, issue=43)
def resumed_row_with_another_prompts_id() -> Outcome:
    """A kept row's prompt_id changed to another prompt's (its prompt_hash left)."""
    run_dir = tampered_run("tampered_id", lambda row: {**row, "prompt_id": "p3"})
    return holds(lambda: resumed_with_the_first_row_redone(run_dir))


@probe(DURABILITY, CORRECT, before=SILENTLY_WRONG, issue=43)
def resumed_row_with_a_token_added() -> Outcome:
    """A kept row's tokens one longer than its emitted count."""
    run_dir = tampered_run("tampered_tokens", lambda row: {**row, "tokens": [*row["tokens"], 1]})
    return holds(lambda: resumed_with_the_first_row_redone(run_dir))


@probe(DURABILITY, CORRECT, before=SILENTLY_WRONG, issue=43)
def resumed_row_with_tokens_changed() -> Outcome:
    """A kept greedy row's tokens changed, their count kept (identical_output now disagrees)."""
    run_dir = tampered_run("tampered_values", lambda row: {**row, "tokens": [t + 1 for t in row["tokens"]]})
    return holds(lambda: resumed_with_the_first_row_redone(run_dir))


@probe(DURABILITY, CORRECT, before=SILENTLY_WRONG, issue=43)
def resumed_row_with_tokens_as_text() -> Outcome:
    """A kept row's tokens written as strings ("12")."""
    run_dir = tampered_run("tampered_text", lambda row: {**row, "tokens": [str(t) for t in row["tokens"]]})
    return holds(lambda: resumed_with_the_first_row_redone(run_dir))


# --- CLI: the run app's drafter options ------------------------------------------------------------------------------

@probe(CLI, CLEAR, before=TRACEBACK, slow=True, issue=43)
def eagle_checkpoint_that_does_not_exist() -> Outcome:
    """drafter=eagle drafter.checkpoint=/no/such/dir."""
    return command_refusal(cli("drafter=eagle", "drafter.checkpoint=/no/such/dir"), "/no/such/dir")


@probe(CLI, CLEAR, before=TRACEBACK, slow=True, issue=43)
def medusa_checkpoint_that_does_not_exist() -> Outcome:
    """drafter=medusa drafter.checkpoint=/no/such/dir."""
    return command_refusal(cli("drafter=medusa", "drafter.checkpoint=/no/such/dir"), "/no/such/dir")


@probe(CLI, CLEAR, before=TRACEBACK, slow=True, issue=43)
def model_checkpoint_that_does_not_exist() -> Outcome:
    """drafter=model +drafter.checkpoint=/no/such/dir."""
    return command_refusal(cli("+drafter.checkpoint=/no/such/dir"), "/no/such/dir")


@probe(CLI, CLEAR, before=CONFUSING, issue=43)
def eagle_tree_given_as_a_word() -> Outcome:
    """drafter=eagle drafter.tree=big."""
    return refusal(lambda: validated("drafter=eagle", "drafter.tree=big"), "tree", "'big'")


@probe(CLI, CLEAR, issue=43)
def eagle_tree_given_two_sizes() -> Outcome:
    """drafter=eagle drafter.tree=[8,3]."""
    return refusal(lambda: validated("drafter=eagle", "drafter.tree=[8,3]"), "tree", "node_budget, depth, top_k")


@probe(CLI, CLEAR, issue=43)
def medusa_tree_given_as_a_word() -> Outcome:
    """drafter=medusa drafter.tree=big."""
    return refusal(lambda: validated("drafter=medusa", "drafter.tree=big"), "branching", "'big'")


@probe(CLI, CLEAR, issue=43)
def eagle_checkpoint_holding_medusa_heads() -> Outcome:
    """drafter=eagle drafter.checkpoint=<the shipped Medusa heads>."""
    from specdec.medusa import SHIPPED

    return refusal(lambda: validated("drafter=eagle", f"drafter.checkpoint={SHIPPED['embedded']}"), "'medusa'")


@probe(CLI, CLEAR, before=TRACEBACK, issue=43)
def eagle_checkpoint_with_a_damaged_config() -> Outcome:
    """drafter=eagle drafter.checkpoint=<a directory whose drafter.json is a list>."""
    directory = scratch("cli_damaged_config")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "drafter.json").write_text("[1, 2]")
    return refusal(lambda: validated("drafter=eagle", f"drafter.checkpoint={directory}"), "drafter.json")
