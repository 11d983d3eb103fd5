"""Wall-clock timing that is honest on accelerators: every read waits for the device's queued work first."""

from __future__ import annotations

import time

import torch


class Clock:
    """Wall clock that waits for queued device work first, so GPU phases are timed where they run."""

    def __init__(self, device: torch.device):
        self.device = device

    def phase(self, enabled: bool):
        """The clock for within-step phases: synchronised, or a constant 0 that costs no device sync."""
        return self.now if enabled else lambda: 0.0

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()
        return time.perf_counter()
