"""The adversarial passes as a command: ``python tests/adversarial.py`` (from the repository root) runs every probe of
tests/probes/ and prints one table per pass, those of docs/reliability.md's "Adversarial passes"; ``--issue 35`` runs
one pass; ``-v`` lists every probe. tests/probes/core.py says how a probe's outcome is classified."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # specdec, experiments and analysis: the repository's

from probes import main  # noqa: E402 - after the path is set

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
