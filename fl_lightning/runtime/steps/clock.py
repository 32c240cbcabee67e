"""The run's wall clock, which the loop's steps and the callbacks read."""

from __future__ import annotations

import time


class WallClock:
    """A run's wall time: what earlier processes ran (`offset`, from its last line) plus the
    time since this process began its rounds (`start`)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.started = time.perf_counter()

    def start(self) -> float:
        self.started = time.perf_counter()
        return self.started

    def wall(self, t: float) -> float:
        """The run's wall time at `time.perf_counter()` value `t`."""
        return self.offset + t - self.started
