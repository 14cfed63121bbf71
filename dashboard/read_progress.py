"""How far the store reads of a view being computed have come, for the page to say so.

A long range of a large cluster on an engine takes seconds to read; the page then shows "reading
the store: 3 of 8 reads done" above its loading indicator instead of a spinner alone. Reads are
counted per view (``view_key``: a live range by its span, an absolute one by its ends), as the
cache keys them, so two visitors of one view see one count and the warmer's background reads of
another view never show on this one.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuwatt.dashboard.timerange import TimeRange


def view_key(tr: TimeRange) -> Hashable:
    """The key of a view's reads: the span of a live range (its end moves with the clock), the
    ends of an absolute one; with the bucket size."""
    if tr.live:
        return ("live", tr.end_ns - tr.start_ns, tr.step_s)
    return ("fixed", tr.start_ns, tr.end_ns, tr.step_s)


@dataclass(eq=False)
class Count:
    """The reads of one computation of a view: how many were asked for and are done."""

    total: int = 0
    done: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def expect(self, n: int) -> None:
        with self._lock:
            self.total += n

    def restart(self, n: int) -> None:
        """The reads asked for again, as ``n`` other reads (a whole range read in parts)."""
        with self._lock:
            self.total, self.done = n, 0

    def one_done(self) -> None:
        with self._lock:
            self.done += 1


class ReadProgress:
    """The counts of the views being computed now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Hashable, list[Count]] = {}

    @contextmanager
    def tracking(self, key: Hashable) -> Iterator[Count]:
        """A count for one computation of the view ``key``, shown while the block runs."""
        count = Count()
        with self._lock:
            self._counts.setdefault(key, []).append(count)
        try:
            yield count
        finally:
            with self._lock:
                counts = self._counts.get(key, [])
                if count in counts:
                    counts.remove(count)
                if not counts:
                    self._counts.pop(key, None)

    def of(self, key: Hashable) -> tuple[int, int] | None:
        """(done, total) of the view's oldest computation in flight; None when none is."""
        with self._lock:
            counts = self._counts.get(key)
            if not counts:
                return None
            c = counts[0]
            with c._lock:
                return c.done, c.total

    def text(self, key: Hashable) -> str:
        """What the page says: "" when no read of the view is in flight."""
        got = self.of(key)
        if got is None or got[1] == 0:
            return ""
        done, total = got
        return f"reading the store: {done} of {total} reads done"
