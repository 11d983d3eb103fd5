"""Hydra entry point: one speculative-decoding run, or a sweep with -m. Configs live in ../configs.

    python experiments/run.py                                     # default run (embedded pair, CPU-sized)
    python experiments/run.py draft_length.k=8 sampling=t1        # override any key
    python experiments/run.py -m strategy=greedy,speculative draft_length.k=1,2,4,8
    python experiments/run.py -m experiment=embedded_sweep        # a preset sweep
    python experiments/run.py logger=wandb logger.mode=online     # mirror to W&B
    python experiments/run.py resume=true                         # continue the newest unfinished run

Results: outputs/<time>/ (or multirun/<time>/<job>/) holding config.yaml, rows.jsonl, summary.json.
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # so `experiments.*` (and this checkout's specdec) import without installing

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from experiments.checks import ConfigError  # noqa: E402
from experiments.runner import job_from_hydra, run  # noqa: E402


# ../configs relative to this script, made absolute so it also resolves when tests import this module.
@hydra.main(version_base="1.3", config_path=str(REPO / "configs"), config_name="run")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg, job_from_hydra())
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
