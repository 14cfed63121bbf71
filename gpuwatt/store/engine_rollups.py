"""1-minute, 5-minute and 1-hour rollups kept in an engine (InfluxDB 1.8/2.x/3.x, VictoriaMetrics).

Where they are computed: by whoever delivers the raw samples of a GPU, for that GPU, once the
bucket is closed in *data* time (``collector/rollup_writer.py``: each collector for its own
hosts, after its spool delivered a later minute). ``roll`` reads the bucket's raw samples (for
5 minutes or an hour: its minutes) back *from the engine*, aggregates them with
``rollup_rule.combine`` (the embedded store's rule) and writes one point per GPU. Computing
from what the engine holds, not from what one process saw, makes a rollup complete whatever
happened on the way: a collector restarted mid-minute, samples replayed from the spool after an
outage, late data. Re-rolling a bucket is always safe; engines need no server-side tasks
(InfluxDB 1.x continuous queries, 2.x tasks and 3.x processing engines all differ, and none
exists in VictoriaMetrics).

Points: measurement ``gpuwatt_rollup_1m`` / ``gpuwatt_rollup_5m`` / ``gpuwatt_rollup_1h``
(VictoriaMetrics names them ``gpuwatt_rollup_1m_<field>``), the raw samples' tags, integer
fields ``n``, ``n_ok``, ``t_last_ms`` (newest non-lost sample; absent when none) and ``seen_ns``
(the bucket's seen time, ``rollup_rule``; absent in points written before it, which read as not
known), and one float field per metric under its model attribute name, in model units (absent:
not measured). A point's timestamp is its bucket's start plus ``n`` milliseconds: a re-roll that
saw more samples writes a *newer* point in the same bucket, and readers keep the newest point of
each (bucket, GPU) (``newest_per_bucket``).
This works alike where a point with the same series and time overwrites (InfluxDB) and where it
does not (VictoriaMetrics keeps the largest value of duplicates, field by field).

Reads (``read_levels``) mirror the embedded store's: whole buckets of the coarsest level that
tiles the step from rollups, the parts a range starts or ends inside, and what is not rolled yet,
from the level below (5 minutes and hours from minutes, minutes from raw samples); then
``combine`` into the step asked for (``rollup_rule.level_for``: the 5-minute level serves
5-minute steps only, the dashboard's 2-6 h views; from minutes a 6 h view of 1,024 GPUs read
~7 M points). An engine written before it (no 5-minute points) is read from minutes. The
newest rollup bucket of a level is read from below too: collectors roll a bucket within seconds
of each other, and one that has not yet must not lose its GPUs from the view.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpuwatt.errors import GpuwattError
from gpuwatt.line_protocol import escape_tag
from gpuwatt.schema import FIELDS, TAG_HOST, TAG_INDEX, TAG_NAME, TAG_UUID, Kind
from gpuwatt.store import LAST_VALUE_ATTRS

if TYPE_CHECKING:
    import pandas as pd

from gpuwatt.store.rollup_rule import (
    COARSE_LEVELS,
    FIVE_MINUTES_NS,
    HOUR_NS,
    KEYS,
    LEVELS,
    MINUTE_NS,
    NULL_TIME,
    UNKNOWN_SEEN,
    LookAroundHint,
    combine,
    level_for,
    read_around,
    sample_seen_ns,
)

NS_PER_MS = 1_000_000
MEASUREMENTS: dict[int, str] = {
    MINUTE_NS: "gpuwatt_rollup_1m",
    FIVE_MINUTES_NS: "gpuwatt_rollup_5m",
    HOUR_NS: "gpuwatt_rollup_1h",
}
FIELD_N = "n"
FIELD_N_OK = "n_ok"
FIELD_T_LAST = "t_last_ms"
FIELD_SEEN = "seen_ns"
#: The metrics kept in rollups: every numeric field of the schema (as the embedded store's).
ROLLUP_ATTRS: tuple[str, ...] = tuple(f.attr for f in FIELDS if f.kind is not Kind.STR)

#: A GPU's identity as every store reports it: host, index, uuid, model name.
Ident = tuple[str, int, str, str]


#: How long a backfill waits for the minutes it wrote to be searchable before it rolls hours.
VISIBLE_TIMEOUT_S = 10.0


class RollupsUnsupported(GpuwattError):
    """The server answers, but not as the engine it was named (e.g. an ``influxdb://`` URL
    pointing at VictoriaMetrics, whose ``/query`` is not InfluxQL): it can keep no rollups."""


@dataclass
class GpuIds:
    """Small integer ids for GPU identities, shared by the parts of one read."""

    idents: list[Ident] = field(default_factory=list)
    _ids: dict[Ident, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, ident: Ident) -> int:
        gid = self._ids.get(ident)
        if gid is None:
            with self._lock:  # the parts of one read are fetched in parallel
                gid = self._ids.get(ident)
                if gid is None:
                    gid = self._ids[ident] = len(self.idents)
                    self.idents.append(ident)
        return gid


@dataclass(frozen=True)
class Scope:
    """What a read of an engine's raw samples or rollup points asks for: the attributes, the
    hosts (None: all) and the ids its GPUs get (shared by the parts of one read)."""

    attrs: tuple[str, ...]
    hosts: Sequence[str] | None
    ids: GpuIds = field(default_factory=GpuIds)


class RollupSource(Protocol):
    """What an engine offers to keep and read rollups (``influx_rollups``, ``promql_rollups``).

    Column dicts follow ``rollup_rule``: ``time_ns``, ``gpu_id`` (from ``ids``), ``n``, ``n_ok``,
    ``t_last_ns``, ``seen_ns`` (rollup points; ``UNKNOWN_SEEN`` where a point has none) and one
    float64 column per attribute (NaN: not measured)."""

    def raw_level(self, start_ns: int, end_ns: int, scope: Scope) -> dict[str, np.ndarray]:
        """Raw samples in ``[start_ns, end_ns)`` as level columns (``rollup_rule.as_level``)."""

    def raw_in(self, start_ns: int, end_ns: int) -> bool:
        """False only where the engine knows that no raw sample lies in ``[start_ns, end_ns)``
        (the context before the data: no read is sent)."""

    def rollup_points(
        self, level_ns: int, start_ns: int, end_ns: int, scope: Scope, *, lean: bool = False
    ) -> dict[str, np.ndarray]:
        """Every rollup point of ``level_ns`` timed in ``[start_ns, end_ns)`` (stale ones too),
        ``time_ns`` being the point's own time. ``lean``: rows that go to a frame as they are,
        never combined: ``n_ok`` and ``t_last_ns`` are not read (``n_ok`` is ``n``, ``t_last_ns``
        ``NULL_TIME``)."""

    def rollup_span(self, level_ns: int) -> tuple[int, int] | None:
        """The times of the oldest and the newest rollup point of a level; None: none."""

    def rollup_lines(
        self, level_ns: int, cols: dict[str, np.ndarray], idents: Sequence[Ident]
    ) -> list[str]:
        """Level rows as the engine keeps them (``rollup_lines``, or InfluxDB's packed form)."""

    def write_lines(self, lines: Sequence[str]) -> None: ...


class PassedSource:
    """A ``RollupSource`` that passes every call to ``source``: the base of the wrappers that
    change how some reads are answered (``shared_reads``, ``rollup_cache``)."""

    def __init__(self, source: RollupSource) -> None:
        self.source = source

    def raw_level(self, start_ns: int, end_ns: int, scope: Scope) -> dict[str, np.ndarray]:
        return self.source.raw_level(start_ns, end_ns, scope)

    def raw_in(self, start_ns: int, end_ns: int) -> bool:
        return self.source.raw_in(start_ns, end_ns)

    @property
    def look_around(self) -> LookAroundHint | None:
        """The source's own: it outlives the wrapper's reads (``rollup_rule.read_around``)."""
        hint: LookAroundHint | None = getattr(self.source, "look_around", None)
        return hint

    def rollup_points(
        self, level_ns: int, start_ns: int, end_ns: int, scope: Scope, *, lean: bool = False
    ) -> dict[str, np.ndarray]:
        return self.source.rollup_points(level_ns, start_ns, end_ns, scope, lean=lean)

    def rollup_span(self, level_ns: int) -> tuple[int, int] | None:
        return self.source.rollup_span(level_ns)

    def rollup_lines(
        self, level_ns: int, cols: dict[str, np.ndarray], idents: Sequence[Ident]
    ) -> list[str]:
        return self.source.rollup_lines(level_ns, cols, idents)

    def write_lines(self, lines: Sequence[str]) -> None:
        self.source.write_lines(lines)


# --- writing ------------------------------------------------------------------------------------


def rollup_lines(level_ns: int, cols: dict[str, np.ndarray], idents: Sequence[Ident]) -> list[str]:
    """Level rows (bucket start ``time_ns``) as line-protocol points of ``MEASUREMENTS[level]``."""
    measurement = MEASUREMENTS[level_ns]
    attrs = [a for a in cols if a not in KEYS]
    prefixes: dict[int, str] = {}
    values = {a: cols[a].tolist() for a in attrs}
    level_ms = level_ns // NS_PER_MS
    out = []
    seen = cols["seen_ns"].tolist() if "seen_ns" in cols else [UNKNOWN_SEEN] * len(cols["n"])
    for i, (t, gid, n, n_ok, t_last, seen_ns) in enumerate(
        zip(
            cols["time_ns"].tolist(),
            cols["gpu_id"].tolist(),
            cols["n"].tolist(),
            cols["n_ok"].tolist(),
            cols["t_last_ns"].tolist(),
            seen,
            strict=True,
        )
    ):
        prefix = prefixes.get(gid)
        if prefix is None:
            host, index, uuid, name = idents[gid]
            tags = [measurement]
            for tag, value in ((TAG_HOST, host), (TAG_INDEX, str(index)), (TAG_UUID, uuid),
                               (TAG_NAME, name)):  # fmt: skip
                if value:
                    tags.append(f"{tag}={escape_tag(value)}")
            prefix = prefixes[gid] = ",".join(tags) + " "
        fields = [f"{FIELD_N}={n}i", f"{FIELD_N_OK}={n_ok}i"]
        if t_last != NULL_TIME:
            fields.append(f"{FIELD_T_LAST}={t_last // NS_PER_MS}i")
        if seen_ns >= 0:
            fields.append(f"{FIELD_SEEN}={seen_ns}i")
        for a in attrs:
            v = values[a][i]
            if math.isfinite(v):
                fields.append(f"{a}={v!r}")
        point_ns = t + min(int(n), level_ms - 1) * NS_PER_MS
        out.append(f"{prefix}{','.join(fields)} {point_ns}")
    return out


def roll(
    source: RollupSource,
    level_ns: int,
    bucket_ns: int,
    hosts: Sequence[str] | None = None,
    attrs: Sequence[str] = ROLLUP_ATTRS,
) -> int:
    """(Re)compute the ``level_ns`` bucket starting at ``bucket_ns`` for ``hosts`` (None: every
    host) from what the engine holds, and write it; the number of GPU points written. A
    5-minute bucket or an hour is built from its minutes, which must have been rolled first."""
    scope = Scope(tuple(attrs), hosts)
    end_ns = bucket_ns + level_ns
    if level_ns == MINUTE_NS:
        rows = raw_with_seen(source, bucket_ns, end_ns, scope)
        below = 0
    else:
        rows = newest_per_bucket(
            source.rollup_points(MINUTE_NS, bucket_ns, end_ns, scope), MINUTE_NS
        )
        below = MINUTE_NS
    if not len(rows["time_ns"]):
        return 0
    out = combine(rows, level_ns, attrs, LAST_VALUE_ATTRS, level_ns=below)
    source.write_lines(source.rollup_lines(level_ns, out, scope.ids.idents))
    return len(out["time_ns"])


def raw_with_seen(
    source: RollupSource, start_ns: int, end_ns: int, scope: Scope, *, unlikely: bool = False
) -> dict[str, np.ndarray]:
    """The raw samples in ``[start_ns, end_ns)`` as level columns with their seen time: read
    with the samples around the range that decide their slots (``rollup_rule``).

    ``unlikely``: samples in the range would be rare (before the oldest rolled minute: written
    before the engine kept rollups); their times alone are read first, and the range with its
    metrics and surroundings only where there are any. Read at once, the samples around a
    range that ends where the data starts are every GPU's first: on 1,024 GPUs
    VictoriaMetrics spent ~0.2 s of CPU on the context of a young database's 24 h view for
    them, its times ~0.02 s (``bench/dashboard.py --store victoriametrics``)."""
    if not source.raw_in(start_ns, end_ns):  # samples around it alone decide no slot in it
        return empty_level(scope.attrs)
    # the samples around the range decide slots by their times alone: read without metrics
    times_only = Scope((), scope.hosts, scope.ids)
    if unlikely and not len(source.raw_level(start_ns, end_ns, times_only)["time_ns"]):
        return empty_level(scope.attrs)
    cols = read_around(
        lambda lo, hi: source.raw_level(lo, hi, scope),
        lambda c: (c["time_ns"], c["gpu_id"]),
        lambda parts: _concat_padded(parts, scope.attrs),
        start_ns,
        end_ns,
        read_outside=lambda lo, hi: source.raw_level(lo, hi, times_only),
        map_reads=_at_once,
        hint=getattr(source, "look_around", None),
    )
    t = cols["time_ns"]
    seen = sample_seen_ns(t, cols["gpu_id"], cols["n_ok"] == 0)
    keep = (t >= start_ns) & (t < end_ns)
    return {k: v[keep] for k, v in cols.items()} | {"seen_ns": seen[keep]}


def _concat_padded(
    parts: Sequence[dict[str, np.ndarray]], attrs: Sequence[str]
) -> dict[str, np.ndarray]:
    """Level columns of parts read with ``attrs`` or without metrics (NaN there), as one."""
    return {
        k: np.concatenate([p[k] if k in p else np.full(len(p["time_ns"]), np.nan) for p in parts])
        for k in (*KEYS, *attrs)
    }


def _at_once(
    fn: Callable[[tuple[int, int]], dict[str, np.ndarray]], spans: list[tuple[int, int]]
) -> list[dict[str, np.ndarray]]:
    """``fn`` of each span, sent to the engine at once where there are several."""
    if len(spans) < 2:
        return [fn(span) for span in spans]
    with ThreadPoolExecutor(max_workers=len(spans), thread_name_prefix="around") as pool:
        return list(pool.map(fn, spans))


def roll_range(
    source: RollupSource,
    start_ns: int,
    end_ns: int,
    hosts: Sequence[str] | None = None,
    attrs: Sequence[str] = ROLLUP_ATTRS,
) -> int:
    """Roll every minute, then every 5-minute bucket and hour, that ``[start_ns, end_ns)`` covers
    (a backfill of data written before rollups were kept, or loaded in bulk); the number of
    points written."""
    written, rolled_minutes = 0, []
    for bucket in range(_floor(start_ns, MINUTE_NS), end_ns, MINUTE_NS):
        if rolled := roll(source, MINUTE_NS, bucket, hosts, attrs):
            written += rolled
            rolled_minutes.append(bucket)
    # the newest minute, and the oldest: the first points of new series (a CI run on
    # VictoriaMetrics built a 5-minute bucket without its first minute, the later ones shown)
    for minute in dict.fromkeys(rolled_minutes[-1:] + rolled_minutes[:1]):
        await_visible(source, MINUTE_NS, minute, hosts)
    for level in COARSE_LEVELS:
        for bucket in range(_floor(start_ns, level), end_ns, level):
            written += roll(source, level, bucket, hosts, attrs)
    return written


def await_visible(
    source: RollupSource,
    level_ns: int,
    bucket_ns: int,
    hosts: Sequence[str] | None = None,
    *,
    timeout_s: float = VISIBLE_TIMEOUT_S,
) -> bool:
    """Wait until the engine answers reads with the ``level_ns`` bucket at ``bucket_ns`` just
    written (True), at most ``timeout_s``. An hour is built from its minutes read back: on
    VictoriaMetrics, whose new points become searchable a moment after they are taken, an hour
    rolled at once would miss the minutes written last (InfluxDB answers at the first ask)."""
    deadline = time.monotonic() + timeout_s
    scope = Scope((), hosts)
    while True:
        if len(
            source.rollup_points(level_ns, bucket_ns, bucket_ns + level_ns, scope, lean=True)["n"]
        ):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# --- reading ------------------------------------------------------------------------------------


def newest_per_bucket(cols: dict[str, np.ndarray], level_ns: int) -> dict[str, np.ndarray]:
    """Rollup points reduced to the newest point of each (bucket, GPU), keyed at the bucket's
    start: a bucket rolled again with more samples wrote a newer point."""
    t = cols["time_ns"]
    if not len(t):
        return cols
    bucket = t // level_ns * level_ns
    order = np.lexsort((t, cols["gpu_id"], bucket))
    b_s, g_s = bucket[order], cols["gpu_id"][order]
    last = np.r_[(b_s[1:] != b_s[:-1]) | (g_s[1:] != g_s[:-1]), True]
    keep = order[last]
    out = {k: v[keep] for k, v in cols.items()}
    out["time_ns"] = bucket[keep]
    return out


@dataclass
class _Read:
    source: RollupSource
    scope: Scope
    spans: dict[int, tuple[int, int] | None]
    #: the level whose rollup points go to the frame uncombined (the step is that level)
    lean_level: int = 0

    @property
    def attrs(self) -> tuple[str, ...]:
        return self.scope.attrs


def read_levels(
    source: RollupSource,
    start_ns: int,
    end_ns: int,
    step_ns: int,
    attrs: Sequence[str],
    hosts: Sequence[str] | None = None,
) -> tuple[dict[str, np.ndarray], list[Ident]] | None:
    """``step_ns`` buckets per GPU over ``[start_ns, end_ns)`` served from the engine's rollups
    (level columns and the identity of each ``gpu_id``); None when the step is finer than a
    minute or the engine keeps no minute rollups (the caller reads as it did without them)."""
    level = level_for(step_ns)
    if level == 0:
        return None
    # a coarse level's buckets that are not rolled yet are read from minutes (``_below``)
    spans = {lv: source.rollup_span(lv) for lv in LEVELS if lv in (MINUTE_NS, level)}
    if spans[MINUTE_NS] is None:
        return None
    read = _Read(source, Scope(tuple(attrs), hosts), spans, level if step_ns == level else 0)
    cols = _level(read, level, start_ns, end_ns)
    if step_ns != level:
        cols = combine(cols, step_ns, read.attrs, LAST_VALUE_ATTRS, level_ns=level)
    if len(cols["time_ns"]):  # a bucket cut by the range's start is keyed at the start
        cols["time_ns"] = np.maximum(cols["time_ns"], start_ns)
    return cols, read.scope.ids.idents


def _level(read: _Read, level_ns: int, start_ns: int, end_ns: int) -> dict[str, np.ndarray]:
    """Level rows over ``[start_ns, end_ns)``: whole rolled buckets from the engine's rollups,
    the rest aggregated from the level below."""
    span = read.spans.get(level_ns)
    tasks: list[Callable[[], dict[str, np.ndarray]]] = []
    below: list[tuple[int, int]] = [(start_ns, end_ns)]
    if span is not None:
        # rolled: from the oldest bucket to the newest, that one excluded (see the module doc)
        first = max(_ceil(start_ns, level_ns), _floor(span[0], level_ns))
        last = min(_floor(end_ns, level_ns), _floor(span[1], level_ns))
        if first < last:
            lean = level_ns == read.lean_level
            tasks.append(
                lambda: newest_per_bucket(
                    read.source.rollup_points(level_ns, first, last, read.scope, lean=lean),
                    level_ns,
                )
            )
            below = [(start_ns, first), (last, end_ns)]
    tasks += [functools.partial(_below, read, level_ns, lo, hi) for lo, hi in below if lo < hi]
    if len(tasks) == 1:
        parts = [tasks[0]()]
    else:  # the parts are independent reads: in parallel (the engine serves them at once)
        with ThreadPoolExecutor(max_workers=len(tasks), thread_name_prefix="rollups") as pool:
            parts = list(pool.map(lambda task: task(), tasks))
    return concat(parts, read.attrs)


def _below(read: _Read, level_ns: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """``[lo, hi)`` as ``level_ns`` rows aggregated from the level below."""
    if level_ns == MINUTE_NS:
        rolled = read.spans.get(MINUTE_NS)
        before_rolled = rolled is not None and hi <= _floor(rolled[0], MINUTE_NS)
        raw = raw_with_seen(read.source, lo, hi, read.scope, unlikely=before_rolled)
        return combine(raw, MINUTE_NS, read.attrs, LAST_VALUE_ATTRS, level_ns=0)
    return combine(_level(read, MINUTE_NS, lo, hi), level_ns, read.attrs, LAST_VALUE_ATTRS)


def concat(parts: Iterable[dict[str, np.ndarray]], attrs: Sequence[str]) -> dict[str, np.ndarray]:
    """Level columns of several parts as one (the empty columns when there are none)."""
    parts = [p for p in parts if len(p["time_ns"])]
    if not parts:
        return empty_level(attrs)
    return {k: np.concatenate([p[k] for p in parts]) for k in (*KEYS, *attrs)}


def within(cols: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    """The rows timed in ``[lo, hi)`` (the columns themselves where all are)."""
    t = cols["time_ns"]
    inside = (t >= lo) & (t < hi)
    if inside.all():
        return cols
    return {k: v[inside] for k, v in cols.items()}


def in_ids_of(cols: dict[str, np.ndarray], ids: GpuIds, scope: Scope) -> dict[str, np.ndarray]:
    """Rows read with ``ids`` as the read of ``scope`` has them: its attributes, its GPU ids."""
    gid = cols["gpu_id"]
    out = {k: cols[k] for k in KEYS if k in cols}
    if len(gid):
        known = np.unique(gid)
        own = np.zeros(int(known[-1]) + 1, dtype=np.int64)
        own[known] = [scope.ids.of(ids.idents[g]) for g in known.tolist()]
        out["gpu_id"] = own[gid]
    return out | {a: cols[a] for a in scope.attrs}


def empty_level(attrs: Sequence[str]) -> dict[str, np.ndarray]:
    return {k: np.zeros(0, np.int64) for k in KEYS} | {a: np.zeros(0) for a in attrs}


def frame(
    cols: dict[str, np.ndarray], idents: Sequence[Ident], attrs: Sequence[str]
) -> pd.DataFrame:
    """Level columns as the store's long frame (``KEY_COLUMNS`` + ``attrs``), sorted by time,
    then host, index and uuid."""
    import pandas as pd

    from gpuwatt.store.base import KEY_COLUMNS, SEEN_COLUMN

    if not len(cols["time_ns"]):
        # the columns and types of a read with rows
        seen_column = [SEEN_COLUMN] if "seen_ns" in cols else []
        dtypes: dict[str, Any] = {"time_ns": "int64", "gpu_index": "int64"}
        dtypes |= dict.fromkeys(("host", "uuid", "name"), str)
        dtypes |= dict.fromkeys([*attrs, *seen_column], "float64")
        return pd.DataFrame(columns=[*KEY_COLUMNS, *attrs, *seen_column]).astype(dtypes)
    order_ids = sorted(range(len(idents)), key=lambda g: idents[g][:3])
    rank = np.empty(len(idents), dtype=np.int64)
    rank[order_ids] = np.arange(len(idents))
    gpu_rank = rank[cols["gpu_id"]]
    order = np.lexsort((gpu_rank, cols["time_ns"]))
    by_rank = [idents[g] for g in order_ids]
    g = gpu_rank[order]
    out = pd.DataFrame(
        {
            "time_ns": cols["time_ns"][order].astype(np.int64),
            "host": np.array([i[0] for i in by_rank], dtype=object)[g],
            "gpu_index": np.array([i[1] for i in by_rank], dtype=np.int64)[g],
            "uuid": np.array([i[2] for i in by_rank], dtype=object)[g],
            "name": np.array([i[3] for i in by_rank], dtype=object)[g],
        }
    )
    for a in attrs:
        out[a] = cols[a][order]
    if "seen_ns" in cols:
        seen = cols["seen_ns"][order]
        out[SEEN_COLUMN] = np.where(seen >= 0, seen / 1e9, np.nan)
    return out


def _floor(t_ns: int, step_ns: int) -> int:
    return t_ns // step_ns * step_ns


def _ceil(t_ns: int, step_ns: int) -> int:
    return -(-t_ns // step_ns) * step_ns
