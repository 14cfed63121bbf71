"""Data access for the pages: one store read and one ``analyze`` per time window, cached.

Every page of one time range shares the same ``WindowData``: the store's rollups for the range
(never raw samples: the buckets come from ``TimeRange.step_s``, at most a few hundred per GPU) and
the analytics engine's summary of them. Entries are keyed by the range and expire after
``ttl_s``, so an auto-refresh re-reads the store while several callbacks of one page load, and
several users looking at the same range, cost one read.

Store failures become ``DataError`` with a message meant for the page ("store not reachable:
..."); they are logged as one line, never as a traceback.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd

from dashboard.timerange import NS_PER_S, TimeRange
from gpuwatt.analytics import ANALYSIS_FIELDS, AnalysisSummary, Tariff, analyze
from gpuwatt.errors import StoreUnavailable
from gpuwatt.model import GpuSample
from gpuwatt.store.base import Store

log = logging.getLogger("gpuwatt.dashboard")

T = TypeVar("T")
DAY_NS = 86_400 * NS_PER_S
#: A GPU whose newest sample is older than this is "silent" (its collector or node is down).
SILENT_AFTER_S = 180.0


class DataError(Exception):
    """Data for a view could not be obtained; ``message`` is shown on the page as is."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.unreachable = unreachable


@dataclass(frozen=True)
class GpuCounts:
    total: int
    up: int
    lost: int
    silent: int
    idle: int


@dataclass(frozen=True)
class WindowData:
    range: TimeRange
    frame: pd.DataFrame  # the store's rollups, long form
    summary: AnalysisSummary
    latest: list[GpuSample]
    jobs: dict[str, str]  # uuid -> job id (from each GPU's newest sample)

    @property
    def empty(self) -> bool:
        return self.frame.empty

    def counts(self, now_ns: int) -> GpuCounts:
        lost = sum(1 for s in self.latest if s.lost)
        silent = sum(
            1
            for s in self.latest
            if not s.lost and (now_ns - s.time_ns) / NS_PER_S > SILENT_AFTER_S
        )
        total = len(self.latest)
        return GpuCounts(total, total - lost - silent, lost, silent, len(self.summary.idle))


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


class DashboardData:
    """Cached, server-side aggregated reads for the dashboard (thread-safe)."""

    def __init__(
        self,
        store: Store,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        tariff: Tariff | None = None,
        ttl_s: float = 10.0,
        max_entries: int = 16,
    ) -> None:
        self.store = store
        self.clock_ns = clock_ns
        self.tariff = tariff or Tariff()
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[Any, ...], threading.Lock] = {}

    # --- cache ------------------------------------------------------------------------------

    def _cached(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                self._cache.move_to_end(key)
                return hit[1]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # one computation per key; concurrent callers wait for it
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                    return hit[1]
            value = compute()
            with self._lock:
                self._cache[key] = (time.monotonic(), value)
                self._cache.move_to_end(key)
                while len(self._cache) > self.max_entries:
                    old, _ = self._cache.popitem(last=False)
                    self._key_locks.pop(old, None)
            return value

    def _read(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (StoreUnavailable, ConnectionError, OSError, sqlite3.OperationalError) as exc:
            log.warning("store not reachable while reading %s: %s", what, _describe(exc))
            raise DataError(f"store not reachable: {_describe(exc)}", unreachable=True) from None
        except Exception as exc:
            log.error("reading %s failed: %s: %s", what, type(exc).__name__, _describe(exc))
            log.debug("reading %s failed", what, exc_info=True)
            raise DataError(f"could not read {what}: {_describe(exc)}") from None

    # --- reads ------------------------------------------------------------------------------

    def now_ns(self) -> int:
        return self.clock_ns()

    def latest(self) -> list[GpuSample]:
        return self._cached(("latest",), lambda: self._read("latest samples", self.store.latest))

    def window(self, tr: TimeRange) -> WindowData:
        """Rollups and the analytics summary for one range."""
        return self._cached(("window", tr.start_ns, tr.end_ns, tr.step_s), lambda: self._window(tr))

    def _window(self, tr: TimeRange) -> WindowData:
        latest = self.latest()
        jobs = {s.uuid: s.job_id for s in latest if s.job_id}
        frame = self._read(
            "samples",
            lambda: self.store.series(tr.start_ns, tr.end_ns, ANALYSIS_FIELDS, step_s=tr.step_s),
        )
        summary = self._analyze(frame, tr.end_ns, tr.start_ns, tr.step_s, jobs)
        return WindowData(tr, frame, summary, latest, jobs)

    def _analyze(
        self, frame: pd.DataFrame, end_ns: int, start_ns: int, step_s: int, jobs: dict[str, str]
    ) -> AnalysisSummary:
        t = self.tariff
        try:
            return analyze(
                frame,
                now_ns=end_ns,
                start_ns=start_ns,
                window_s=float(step_s),
                jobs=jobs,
                price_per_kwh=t.price_per_kwh,
                carbon_g_per_kwh=t.carbon_g_per_kwh,
                currency=t.currency,
            )
        except Exception as exc:
            log.error("analysis failed: %s: %s", type(exc).__name__, _describe(exc))
            log.debug("analysis failed", exc_info=True)
            raise DataError(f"the analysis of this range failed: {_describe(exc)}") from None

    def energy_today(self, now_ns: int) -> AnalysisSummary:
        """The analytics summary of energy since midnight UTC (5-minute buckets)."""
        start = (now_ns // DAY_NS) * DAY_NS
        end = now_ns - now_ns % (60 * NS_PER_S) + 60 * NS_PER_S  # include the current minute
        fields = ("energy_j", "power_w", "utilization_gpu_pct")

        def compute() -> AnalysisSummary:
            frame = self._read(
                "today's energy", lambda: self.store.series(start, end, fields, step_s=300)
            )
            return self._analyze(frame, end, start, 300, {})

        return self._cached(("today", start, end), compute)

    def host_series(self, tr: TimeRange, host: str, fields: Sequence[str]) -> pd.DataFrame:
        """Rollups of one node's GPUs (drill-down)."""
        return self._cached(
            ("host", host, tuple(fields), tr.start_ns, tr.end_ns, tr.step_s),
            lambda: self._read(
                f"the samples of {host}",
                lambda: self.store.series(
                    tr.start_ns, tr.end_ns, fields, step_s=tr.step_s, hosts=[host]
                ),
            ),
        )
