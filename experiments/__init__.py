"""Hydra-configured experiment runs on top of the specdec library (entry point: experiments/run.py)."""
