"""Training drafters against their target, as one package (docs/training.md):

- ``corpus``: documents from the registry or a file, split into training and held-out ones, and held-out prompts;
- ``data``: the target's continuations (the one producer), fixed text, the draft's samples, written as shards
  named by their content, and the target's hidden states over them;
- ``losses``: the divergences, each family's loss, simulated acceptance and the one acceptance walker;
- ``loop``: the families, the loop (one optimizer step, one schedule), checkpoints and ranks.

Nothing here imports Hydra or wandb: the app (``experiments/train_drafter.py``) builds the parts from its config and
hands the loop its logger.
"""
