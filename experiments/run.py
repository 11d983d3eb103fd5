"""Hydra entry point: one speculative-decoding run, or a sweep with -m. Configs live in ../configs.
Run it as a module from the repository root:

    python -m experiments.run                                     # default run (embedded pair, CPU-sized)
    python -m experiments.run draft_length.k=8 sampling=t1        # override any key
    python -m experiments.run -m strategy=greedy,speculative draft_length.k=1,2,4,8
    python -m experiments.run -m experiment=embedded_sweep        # a preset sweep
    python -m experiments.run -m hydra/launcher=slurm experiment=gpt2_xl_study   # each job a SLURM job
    python -m experiments.run logger=wandb logger.mode=online     # mirror to W&B
    python -m experiments.run resume=true                         # continue the newest unfinished run

Results: outputs/<time>/ (or multirun/<time>/<job>/) holding config.yaml, rows.jsonl, summary.json; a sweep ends
with report.md in its directory.
"""

import sys
import traceback

import hydra
from omegaconf import DictConfig

from experiments.common import rundir
from experiments.common.config_checks import CONFIGS, ConfigError, one_line
from experiments.common.refusal import refuse_unknown_group_options
from experiments.common.runner import Job, job_from_hydra, run


# Absolute, so that it resolves however this module is started or imported (python -m, tests).
@hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name="run")
def main(cfg: DictConfig) -> None:
    job = job_from_hydra()
    rundir.clear_failure(job.run_dir)
    try:
        run(cfg, job)
    except ConfigError as err:
        end_with_error(job, 2, f"config error: {err}")
    except Exception as err:
        if not job.in_sweep:
            raise
        traceback.print_exc()
        end_with_error(job, 1, f"{type(err).__name__}: {one_line(err)}")


def end_with_error(job: Job, exit_code: int, message: str) -> None:
    """Print the one-line error. A single run exits with ``exit_code``. A sweep job records it in its directory and
    returns, so that the launcher goes on with the other jobs and the sweep's report names this one; the sweep then
    exits with it (experiments.common.callbacks.WriteSweepReport)."""
    print(message, file=sys.stderr)
    if not job.in_sweep:
        sys.exit(exit_code)
    rundir.record_failure(job.run_dir, exit_code, message)


if __name__ == "__main__":
    refuse_unknown_group_options(sys.argv[1:], CONFIGS)  # Hydra would compose first, and refuse in 11 lines
    main()
