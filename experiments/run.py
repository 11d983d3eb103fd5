"""Hydra entry point: one speculative-decoding run, or a sweep with -m. Configs live in ../configs.
Run it as a module from the repository root:

    python -m experiments.run                                     # default run (embedded pair, CPU-sized)
    python -m experiments.run draft_length.k=8 sampling=t1        # override any key
    python -m experiments.run -m strategy=greedy,speculative draft_length.k=1,2,4,8
    python -m experiments.run -m experiment=embedded_sweep        # a preset sweep
    python -m experiments.run logger=wandb logger.mode=online     # mirror to W&B
    python -m experiments.run resume=true                         # continue the newest unfinished run

Results: outputs/<time>/ (or multirun/<time>/<job>/) holding config.yaml, rows.jsonl, summary.json.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from experiments.checks import ConfigError
from experiments.runner import job_from_hydra, run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


# Absolute, so that it resolves however this module is started or imported (python -m, tests).
@hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name="run")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg, job_from_hydra())
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
