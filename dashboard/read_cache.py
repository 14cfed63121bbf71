"""The dashboard's read cache: stale-while-revalidate entries keyed by what was read, and the
one error a page shows when a read fails (``DataError``).

A fresh entry is served as is; past ``ttl_s`` an entry is served stale while one background
thread recomputes it, so auto-refresh never waits on the store; a missing or too old entry is
computed now, once per key however many callers wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger("gpuwatt.dashboard")

T = TypeVar("T")


class DataError(Exception):
    """Data for a view could not be obtained; ``message`` is shown on the page as is."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.unreachable = unreachable


def describe(exc: BaseException) -> str:
    """An exception's first line, at most 200 characters: what a log line and a page say."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


class ReadCache:
    """Stale-while-revalidate entries (thread-safe), the least recently used dropped past
    ``max_entries``."""

    def __init__(self, *, ttl_s: float, max_stale_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_stale_s = max_stale_s
        self.max_entries = max_entries
        self._refreshing: set[tuple[Any, ...]] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._entries: OrderedDict[tuple[Any, ...], tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[Any, ...], threading.Lock] = {}
        #: called with (key, value) after a background refresh has put a new value
        self.on_refreshed: Callable[[tuple[Any, ...], Any], None] | None = None

    def get(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        """A fresh entry; a stale one (refreshed in the background); else ``compute()`` now."""
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                age = now - hit[0]
                if age < self.ttl_s:
                    self._entries.move_to_end(key)
                    return hit[1]
                if age < self.max_stale_s:
                    if key not in self._refreshing:
                        self._refreshing.add(key)
                        self._pool().submit(self._refresh, key, compute)
                    return hit[1]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                    return hit[1]
            value = compute()
            self.put(key, value)
            return value

    def computing(self, key: tuple[Any, ...]) -> bool:
        """Whether ``key`` is being computed by a ``get`` now (another ``get`` waits for it)."""
        with self._lock:
            key_lock = self._key_locks.get(key)
        return key_lock is not None and key_lock.locked()

    def peek(self, key: tuple[Any, ...], max_age_s: float) -> Any | None:
        """The entry if it is at most ``max_age_s`` old, without computing or refreshing it."""
        with self._lock:
            hit = self._entries.get(key)
        if hit is None or time.monotonic() - hit[0] > max_age_s:
            return None
        return hit[1]

    def put(self, key: tuple[Any, ...], value: Any) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                old, _ = self._entries.popitem(last=False)
                self._key_locks.pop(old, None)

    @property
    def refreshing(self) -> bool:
        """Whether a background refresh is under way."""
        with self._lock:
            return bool(self._refreshing)

    def _refresh(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> None:
        try:
            value = compute()
            self.put(key, value)
        except DataError:
            return  # already logged as one line; the stale value stays until max_stale_s
        finally:
            with self._lock:
                self._refreshing.discard(key)
        if self.on_refreshed is not None:
            self.on_refreshed(key, value)  # its own failures are its own to log

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpuwatt-dashboard-cache")
        return self._executor

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
