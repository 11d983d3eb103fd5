"""The GPU suite's parts (``python -m experiments.gpu_suite`` is the app): ``plan`` (what it measures), ``schedule``
(the time-budget scheduler), ``models``, ``preflight`` and ``sections``."""
