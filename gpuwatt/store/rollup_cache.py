"""An engine's rollup points kept in memory by chunk, checked against the engine on every read.

A cold view on an engine spends most of its time on rollup points: the engine writing them out
and the dashboard parsing them (``bench/dashboard.py --store victoriametrics``, 1,024 GPUs, a
6 h view: ~45 MB of answers, ~1.2 s of the engine's and ~1 s of the dashboard's CPU). Most of
them the dashboard has read before: the warmer reads every preset each 30-120 s, and views
overlap. ``RollupCache`` wraps an engine's ``RollupSource`` for reads and keeps the points of
each level by chunk (``CHUNK_NS``: ten minutes of minutes, an hour of 5-minute buckets, a day
of hours), for the whole cluster.

Exact, not time-limited: the points of a bucket change only when a writer rolls it again (late
data, a spool replay, a collector restarted mid-minute: ``engine_rollups``), and such a re-roll
writes a *new* point when it saw more samples (its time is the bucket's start plus ``n`` ms),
so the number of points in the chunk changes with it; a bucket rolled for the first time, a new
GPU and points dropped by retention change it too. Each read asks the engine for the point count
of every chunk it covers (``point_counts``: one small aggregate query, VictoriaMetrics
``count_over_time``, InfluxDB ``count() GROUP BY time``) before anything else, and reads again
every chunk whose count is not the one it was read with: what it serves is what the engine
holds at that count. (A re-roll with the same ``n`` rolls the same samples: the same values.)

Chunks are filled by reads of the whole cluster (``hosts`` None) with every attribute the level
was read with so far; a read of some hosts is served from chunks kept, else passed through (a
node's page does not fill the cluster's). Memory is bounded (``budget_bytes``, least recently
used chunks dropped first; 0 turns the cache off).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpuwatt.store.engine_rollups import (
    GpuIds,
    PassedSource,
    RollupSource,
    Scope,
    empty_level,
    in_ids_of,
    within,
)
from gpuwatt.store.rollup_rule import (
    FIVE_MINUTES_NS,
    HOUR_NS,
    KEYS,
    MINUTE_NS,
    NULL_TIME,
)

Cols = dict[str, np.ndarray]

#: The chunk of each level: a few of them make a preset's range (1 h: 6-7, 6 h: 6-7, 7 d: 7-8).
CHUNK_NS: dict[int, int] = {
    MINUTE_NS: 10 * MINUTE_NS,
    FIVE_MINUTES_NS: HOUR_NS,
    HOUR_NS: 24 * HOUR_NS,
}
#: On 1,024 GPUs the chunks of every preset (7 d of hours, 24 h of 5-minute buckets, the newest
#: hours of minutes) take ~200 MB.
DEFAULT_BUDGET_BYTES = 384 * 2**20


class CountedSource(RollupSource, Protocol):
    def point_counts(
        self, level_ns: int, first_ns: int, last_ns: int, chunk_ns: int
    ) -> dict[int, int]:
        """The number of rollup points of ``level_ns`` in each chunk of ``[first_ns, last_ns)``
        (both multiples of ``chunk_ns``), keyed by the chunk's start; a chunk without is 0 or
        absent."""


@dataclass
class _Chunk:
    count: int
    attrs: frozenset[str]
    cols: Cols  # GPU ids of the cache's own ``GpuIds``
    nbytes: int


class RollupCache(PassedSource):
    """A ``RollupSource`` whose rollup points are kept by chunk and checked on every read."""

    source: CountedSource

    def __init__(self, source: CountedSource, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        super().__init__(source)
        self.budget_bytes = budget_bytes
        self._ids = GpuIds()
        self._chunks: OrderedDict[tuple[int, int], _Chunk] = OrderedDict()
        self._attrs: dict[int, frozenset[str]] = {}  # per level: the attributes read so far
        self._bytes = 0
        self._lock = threading.Lock()
        #: chunks served from memory, and read from the engine (a changed count included)
        self.hits = 0
        self.misses = 0

    # --- cached ---------------------------------------------------------------------------------

    def rollup_points(
        self, level_ns: int, start_ns: int, end_ns: int, scope: Scope, *, lean: bool = False
    ) -> Cols:
        chunk_ns = CHUNK_NS.get(level_ns)
        if chunk_ns is None or self.budget_bytes <= 0 or end_ns <= start_ns:
            return self.source.rollup_points(level_ns, start_ns, end_ns, scope, lean=lean)
        first = start_ns // chunk_ns * chunk_ns
        last = -(-end_ns // chunk_ns) * chunk_ns
        starts = range(first, last, chunk_ns)
        need = frozenset(scope.attrs)
        if scope.hosts is not None:
            with self._lock:
                kept = all((level_ns, c) in self._chunks for c in starts)
            if not kept:  # a few hosts do not fill the cluster's chunks
                return self.source.rollup_points(level_ns, start_ns, end_ns, scope, lean=lean)
        counts = self.source.point_counts(level_ns, first, last, chunk_ns)
        found: dict[int, _Chunk] = {}
        with self._lock:
            attrs = self._attrs.get(level_ns, frozenset()) | need
            self._attrs[level_ns] = attrs
            for c in starts:
                kept_chunk = self._chunks.get((level_ns, c))
                if (
                    kept_chunk is not None
                    and kept_chunk.count == counts.get(c, 0)
                    and need <= kept_chunk.attrs
                ):
                    found[c] = kept_chunk
                    self._chunks.move_to_end((level_ns, c))
            self.hits += len(found)
            self.misses += len(starts) - len(found)
        missing = [c for c in starts if c not in found]
        if missing and scope.hosts is not None:  # changed since: read as without the cache
            return self.source.rollup_points(level_ns, start_ns, end_ns, scope, lean=lean)
        for lo, hi in _runs(missing, chunk_ns):
            whole = Scope(tuple(sorted(attrs)), None, self._ids)
            read = self.source.rollup_points(level_ns, lo, hi, whole)
            for c in range(lo, hi, chunk_ns):
                cols = within(read, c, c + chunk_ns)
                found[c] = self._keep(level_ns, c, counts.get(c, 0), attrs, cols)
        parts = [within(found[c].cols, start_ns, end_ns) for c in starts]
        return _for_read(parts, self._ids, scope, lean)

    def _keep(self, level_ns: int, c: int, count: int, attrs: frozenset[str], cols: Cols) -> _Chunk:
        chunk = _Chunk(count, attrs, cols, sum(v.nbytes for v in cols.values()))
        with self._lock:
            old = self._chunks.pop((level_ns, c), None)
            self._bytes += chunk.nbytes - (old.nbytes if old else 0)
            self._chunks[(level_ns, c)] = chunk
            while self._bytes > self.budget_bytes and self._chunks:
                _, dropped = self._chunks.popitem(last=False)
                self._bytes -= dropped.nbytes
        return chunk

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes


def _runs(starts: Sequence[int], chunk_ns: int) -> list[tuple[int, int]]:
    """Consecutive chunks as ranges: one read each."""
    runs: list[tuple[int, int]] = []
    for c in starts:
        if runs and runs[-1][1] == c:
            runs[-1] = (runs[-1][0], c + chunk_ns)
        else:
            runs.append((c, c + chunk_ns))
    return runs


def _for_read(parts: Sequence[Cols], ids: GpuIds, scope: Scope, lean: bool) -> Cols:
    """Kept rows as the read of ``scope`` has them from the engine: its hosts, its attributes,
    its GPU ids, and a lean read's ``n_ok`` and ``t_last_ns``."""
    parts = [p for p in parts if len(p["time_ns"])]
    if not parts:
        return empty_level(scope.attrs)
    cols = {k: np.concatenate([p[k] for p in parts]) for k in (*KEYS, *scope.attrs)}
    if scope.hosts is not None:
        hosts = set(scope.hosts)
        mine = np.array([ident[0] in hosts for ident in ids.idents], dtype=bool)
        keep = mine[cols["gpu_id"]]
        cols = {k: v[keep] for k, v in cols.items()}
    cols = in_ids_of(cols, ids, scope)
    if lean:
        cols["n_ok"] = cols["n"].copy()
        cols["t_last_ns"] = np.full(len(cols["n"]), NULL_TIME, dtype=np.int64)
    return cols
