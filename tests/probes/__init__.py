"""The adversarial probes (``probes.core`` says how they are classified), one module per part they try; importing
the package registers them all in ``PROBES``."""

from probes import cli, drafters, durability, library, trained  # noqa: F401 - each registers its probes
from probes.core import (  # noqa: F401 - what tests/test_adversarial.py and tests/adversarial.py use
    AREAS, CLASSES, CLEAR, CORRECT, FAILURES, ISSUES, NOT_RUN, PROBES, SILENTLY_ACCEPTED, SILENTLY_WRONG, TRACEBACK,
    Outcome, agreement, before_table, main, refusal, run_probe, table,
)
