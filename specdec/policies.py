"""Draft-length policies: how many tokens the drafter proposes at each step.

A policy answers ``next_k()`` before each step and learns from ``observe(outcome)`` after it. The loop still
shrinks ``k`` near ``max_new_tokens`` and the context limit, so a policy never needs to know about either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from specdec.decode import StepOutcome


class DraftLengthPolicy(Protocol):
    max_k: int  # the largest k the policy will ever ask for (sizes per-position statistics)

    def start(self) -> None: ...

    def next_k(self) -> int: ...

    def observe(self, outcome: StepOutcome) -> None: ...


def check_draft_length(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class FixedLength:
    """Always propose ``k`` tokens."""

    name = "fixed"

    def __init__(self, k: int = 4):
        self.k = check_draft_length("k", k)

    @property
    def max_k(self) -> int:
        return self.k

    def start(self) -> None:
        """Nothing to reset: the length never changes."""

    def next_k(self) -> int:
        return self.k

    def observe(self, outcome: StepOutcome) -> None:
        """A fixed length learns nothing."""
