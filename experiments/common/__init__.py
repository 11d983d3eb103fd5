"""The experiments' shared infrastructure: run directories, the runner, configuration checks, refusals, loggers,
Hydra callbacks, concurrency and provenance. Nothing here imports an app (tests/test_architecture.py)."""
