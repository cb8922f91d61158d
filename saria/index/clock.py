"""Clocks injected into the index: wall clock at run time, virtual in the simulator."""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], float]


def wall_clock() -> float:
    """Seconds from an arbitrary origin; monotonic, so never goes backwards."""
    return time.monotonic()


class VirtualClock:
    """A clock the simulator advances by hand. Calling it returns the time."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    @property
    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        """Moves the clock to `t`; it never moves backwards."""
        if t < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {t}")
        self._now = float(t)

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError(f"cannot advance the virtual clock by a negative {dt}")
        self._now += float(dt)
