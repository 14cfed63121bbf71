"""Time is injected: every component takes a ``Clock`` so tests advance time instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol

NS_PER_S = 1_000_000_000


class Clock(Protocol):
    def now_ns(self) -> int: ...


class SystemClock:
    """Wall-clock time (UTC epoch nanoseconds)."""

    def now_ns(self) -> int:
        return time.time_ns()


class ManualClock:
    """A clock that only moves when told to (tests, simulated backfills)."""

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    def set_ns(self, t_ns: int) -> None:
        self._now_ns = t_ns

    def advance_s(self, seconds: float) -> int:
        self._now_ns += round(seconds * NS_PER_S)
        return self._now_ns
