"""What an engine's rollups span per level, asked once per few seconds (``SpanCache``): the
reads of one view ask it in parallel, and a read takes from each level only what it holds."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

#: How long a read trusts the newest rollup point of a level it learnt, and the oldest (which
#: moves only with retention).
NEWEST_TTL_S = 5.0
OLDEST_TTL_S = 600.0
#: A span older than ``NEWEST_TTL_S`` but not than this is served at once and asked again in
#: the background: a view after a pause does not wait for it (the engine's answer was on the
#: path of every cold view's reads; VictoriaMetrics at 1,024 GPUs: 20-85 ms on a busy 2-core
#: machine). Older, a read waits for the answer (it would read too much from the level below).
STALE_SERVED_S = 120.0
#: How far back from now an engine is asked for a level's newest point, the nearest first, then
#: over all time: collectors roll each minute as it closes, so on a live cluster it lies in the
#: last minutes, and asking for a day read every GPU's day of points (VictoriaMetrics at 1,024
#: GPUs: ~0.1-0.17 s, on the path of every cold view's reads).
NEWEST_LOOKBACKS_S = (900, 86_400)

log = logging.getLogger(__name__)


class SpanCache:
    """The span of an engine's rollups per level: the newest point kept ``NEWEST_TTL_S`` and
    served up to ``STALE_SERVED_S`` while it is asked again (a span some seconds old only ends
    earlier than the engine's: a read then takes a little more from the level below, never
    less), the oldest ``OLDEST_TTL_S``. ``oldest`` and ``newest`` ask the engine for the time
    of a level's oldest and newest point (None: none)."""

    def __init__(
        self, oldest: Callable[[int], int | None], newest: Callable[[int], int | None]
    ) -> None:
        self._ask_oldest, self._ask_newest = oldest, newest
        self._spans: dict[int, tuple[float, tuple[int, int]]] = {}
        self._oldest: dict[int, tuple[float, int]] = {}
        # the reads of one view run in parallel: one of them asks, the others wait for it
        self._lock = threading.Lock()
        self._refreshing: set[int] = set()  # levels asked again in the background

    def get(self, level_ns: int) -> tuple[int, int] | None:
        with self._lock:
            cached = self._spans.get(level_ns)
            age_s = math.inf if cached is None else time.monotonic() - cached[0]
            if cached is not None and age_s < NEWEST_TTL_S:
                return cached[1]
            if cached is not None and age_s < STALE_SERVED_S:
                if level_ns not in self._refreshing:
                    self._refreshing.add(level_ns)
                    threading.Thread(
                        target=self._refresh, args=(level_ns,), name="gpuwatt-span", daemon=True
                    ).start()
                return cached[1]
            span = self._span(level_ns)
            self._keep(level_ns, span)
            return span

    def _refresh(self, level_ns: int) -> None:
        """Ask for a level's span again, outside the lock (reads meanwhile take the one kept).
        A failure drops nothing: the next read past ``STALE_SERVED_S`` asks itself and meets it."""
        try:
            span = self._span(level_ns)
            with self._lock:
                self._keep(level_ns, span)
        except Exception as exc:  # a thread of its own: logged, not raised
            log.debug("rollup span not asked again: %s: %s", type(exc).__name__, exc)
        finally:
            with self._lock:
                self._refreshing.discard(level_ns)

    def _keep(self, level_ns: int, span: tuple[int, int] | None) -> None:
        if span is None:  # none any more (a database emptied): none served
            self._spans.pop(level_ns, None)
        else:
            self._spans[level_ns] = (time.monotonic(), span)

    def _span(self, level_ns: int) -> tuple[int, int] | None:
        cached = self._oldest.get(level_ns)
        if cached is None or time.monotonic() - cached[0] > OLDEST_TTL_S:
            oldest = self._ask_oldest(level_ns)
            if oldest is None:
                return None
            self._oldest[level_ns] = (time.monotonic(), oldest)
        else:
            oldest = cached[1]
        newest = self._ask_newest(level_ns)
        if newest is None:
            return None
        return min(oldest, newest), newest
