"""Hydra-configured experiment runs on top of the specdec library (entry point: python -m experiments.run, from the
repository root)."""
