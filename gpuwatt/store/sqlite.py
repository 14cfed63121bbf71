"""The embedded store: SQLite (stdlib), WAL mode, one writer and many readers across processes.

Tables:

- ``gpus``: one row per GPU (host, gpu_index, uuid; name) with the time of its newest sample,
  so ``latest()`` is one point lookup per GPU.
- ``samples``: one wide row per GPU and time, keyed by ``(time_ns, gpu_id)`` (WITHOUT ROWID, so
  rows are clustered by time: appends go to the end of one B-tree and a time range is one range
  scan). Model units and attribute names (bytes, not Telegraf's MiB).
- ``samples_1m``, ``samples_1h``: per-GPU buckets keyed by ``(time_ns, gpu_id)`` (bucket start):
  the mean of gauges and the last value of ``LAST_VALUE_ATTRS`` (counters, booleans), the sample
  count ``n``, the count of non-lost samples ``n_ok`` and the time of the last non-lost sample.

Rollups follow *data* time, never the wall clock. A 1-minute bucket is rolled once the newest data
time has passed its end by ``rollup_grace_s``; hours are rolled from minutes. A sample that
arrives for a bucket already rolled (a spool replaying an outage) marks the bucket dirty; dirty
buckets are recomputed once a later write has moved past them (a replay recomputes each bucket
once, not once per batch), or by ``flush_rollups()``. Reads never trust a dirty or not-yet-rolled
bucket: they aggregate those from the level below, so a read is always exact.

1-hour means are minute means weighted by the minute's count of non-lost samples: exact whenever
a metric is present in every non-lost sample (it is for a given GPU and driver).

Retention is by data time too: rows older than the newest data time minus the retention of their
table are deleted (checked once per minute of data time). A host whose clock runs far ahead moves
the newest data time with it; the collector stamps samples with a synchronised clock.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import operator
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwatt.model import METRIC_FIELDS, EnergyMethod, GpuSample, TflopsMethod, make_gpu_sample
from gpuwatt.schema import (
    FIELD_BY_ATTR,
    FIELDS,
    Kind,
    decode_line,
    format_processes,
    parse_processes,
)
from gpuwatt.store import LAST_VALUE_ATTRS, packed
from gpuwatt.store.base import SeriesRead

if TYPE_CHECKING:
    import pandas as pd

NS_PER_S = 1_000_000_000
MINUTE_NS = 60 * NS_PER_S
HOUR_NS = 3600 * NS_PER_S
DAY_S = 86_400

#: Every schema field, stored under its model attribute name.
METRIC_ATTRS: tuple[str, ...] = tuple(f.attr for f in FIELDS)
_SQL_TYPE = {Kind.INT: "INTEGER", Kind.FLOAT: "REAL", Kind.BOOL: "INTEGER", Kind.STR: "TEXT"}
_ROLLUP_TABLES = {MINUTE_NS: "samples_1m", HOUR_NS: "samples_1h"}
_LOWER_LEVEL = {MINUTE_NS: 0, HOUR_NS: MINUTE_NS}
_RETENTION_CHECK_NS = MINUTE_NS

# Binding cost decides the ingest rate. CPython's sqlite3 binds an exact int, float or str in
# ~30 ns, but sends anything else (None, bool, an enum member) through its adaptation protocol,
# ~450 ns each. So a row is built from exact types only: booleans, enum members and the tail are
# converted once per GPU while they do not change (``_GpuState``), a missing flag or tail value
# is bound as NaN (which SQLite stores as NULL), and a metric a GPU does not report is left out of
# the INSERT (its column defaults to NULL; see ``_Plan``).
#: Numeric metrics: bound as they are.
_VALUE_COLUMNS: tuple[str, ...] = ("time_ns", *(f.attr for f in FIELDS if f.kind is not Kind.BOOL))
#: Booleans and enums: mapped to 0/1, the enum's text, or NaN for None.
_FLAG_COLUMNS: tuple[str, ...] = (
    "lost",
    *(f.attr for f in FIELDS if f.kind is Kind.BOOL),
    "energy_method",
    "tflops_method",
)
#: The non-metric columns, in the order ``latest()`` reads them.
_EXTRA_COLUMNS = ("energy_method", "tflops_method", "xid_last", "xid_count", "processes", "job_id")
_TAIL_COLUMNS = ("gpu_id", "xid_last", "xid_count", "processes", "job_id")
_INSERT_COLUMNS: tuple[str, ...] = (*_VALUE_COLUMNS, *_FLAG_COLUMNS, *_TAIL_COLUMNS)
#: The GPU's identity, its flags and the fields that make the tail: they rarely change from one
#: sample of a GPU to the next, so the bound suffix (flags + tail) is kept per GPU and reused
#: while they are equal (one tuple comparison, mostly of identical objects).
_KEY_ATTRS: tuple[str, ...] = (
    "host",
    "gpu_index",
    "uuid",
    "name",
    *_FLAG_COLUMNS,
    "xid_errors",
    "processes",
    "job_id",
)
#: Binds as NULL at the cost of a float (sqlite3_bind_double stores a NaN as NULL).
_NULL = math.nan


def _schema_sql() -> str:
    metric_cols = ",\n  ".join(f"{f.attr} {_SQL_TYPE[f.kind]}" for f in FIELDS)
    rollup_cols = ",\n  ".join(f"{a} REAL" for a in METRIC_ATTRS)
    rollups = "\n".join(
        f"""CREATE TABLE IF NOT EXISTS {t} (
  time_ns INTEGER NOT NULL,
  gpu_id INTEGER NOT NULL,
  n INTEGER NOT NULL,
  n_ok INTEGER NOT NULL,
  t_last_ns INTEGER,
  {rollup_cols},
  PRIMARY KEY (time_ns, gpu_id)
) WITHOUT ROWID;"""
        for t in _ROLLUP_TABLES.values()
    )
    return f"""
CREATE TABLE IF NOT EXISTS gpus (
  id INTEGER PRIMARY KEY,
  host TEXT NOT NULL,
  gpu_index INTEGER NOT NULL,
  uuid TEXT NOT NULL,
  name TEXT NOT NULL,
  last_time_ns INTEGER,
  UNIQUE (host, gpu_index, uuid)
);
CREATE TABLE IF NOT EXISTS samples (
  time_ns INTEGER NOT NULL,
  gpu_id INTEGER NOT NULL,
  lost INTEGER NOT NULL,
  {metric_cols},
  energy_method TEXT,
  tflops_method TEXT,
  xid_last INTEGER,
  xid_count INTEGER,
  processes TEXT,
  job_id TEXT,
  PRIMARY KEY (time_ns, gpu_id)
) WITHOUT ROWID;
{rollups}
CREATE TABLE IF NOT EXISTS rollup_dirty (
  level_ns INTEGER NOT NULL,
  bucket_ns INTEGER NOT NULL,
  PRIMARY KEY (level_ns, bucket_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER);
{packed.SCHEMA_SQL}"""


def _insert_sql(kept: Sequence[int] | None = None) -> str:
    """INSERT of the value columns at positions ``kept`` (all: None), then flags and tail."""
    values = _VALUE_COLUMNS if kept is None else tuple(_VALUE_COLUMNS[i] for i in kept)
    cols = (*values, *_FLAG_COLUMNS, *_TAIL_COLUMNS)
    return (
        f"INSERT OR REPLACE INTO samples ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    )


_INSERT_SQL = _insert_sql()


def _plain(v: Any) -> Any:
    """A flag value as an exact int or str, NaN (NULL) for None."""
    if v is None:
        return _NULL
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, enum.Enum):
        v = v.value
    return str(v) if isinstance(v, str) else v


def _picker(idx: Sequence[int]) -> Any:
    """A callable returning the items at ``idx`` as a tuple (itemgetter returns a bare item for
    one index)."""
    if not idx:
        return lambda v: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda v: (v[i],)
    return operator.itemgetter(*idx)


class _Plan:
    """How a GPU's rows are bound when it leaves some metrics None: the positions of those
    (checked on every row: they must still be None) and the positions and INSERT of the others.
    """

    __slots__ = ("kept", "masked", "nones", "sql")

    def __init__(self, masked: list[int], kept: list[int]) -> None:
        self.masked = _picker(masked)
        self.nones = (None,) * len(masked)
        self.kept = _picker(kept)
        self.sql = _insert_sql(kept)


def _plan(vals: tuple[Any, ...]) -> _Plan | None:
    """The plan for a row of values (None: every value is set, bind them all)."""
    masked = [i for i, v in enumerate(vals) if v is None]
    if not masked:
        return None
    return _Plan(masked, [i for i, v in enumerate(vals) if v is not None])


class _GpuState:
    """What the writer keeps per GPU: its id, the last ``_KEY_ATTRS`` values and their bound
    form (flags, then the tail), and its ``_Plan``."""

    __slots__ = ("gid", "key", "plan", "suffix")

    def __init__(self, gid: int, key: tuple[Any, ...], plan: _Plan | None) -> None:
        self.gid = gid
        self.key = key
        self.plan = plan
        flags = key[4 : 4 + len(_FLAG_COLUMNS)]
        xids, procs, job = key[4 + len(_FLAG_COLUMNS) :]
        self.suffix = (
            *map(_plain, flags),
            gid,
            xids[-1] if xids else _NULL,
            len(xids) if xids else _NULL,
            _NULL if procs is None else format_processes(procs),
            _NULL if job is None else job,
        )


def _compile_fill_rows() -> Any:
    """The writer's per-sample loop, compiled with every attribute read spelled out.

    ``fill(samples, get_state, new_state, full_append, by_sql, gids_append, times_append)``
    appends each sample's parameter tuple (to ``full_append`` when every value is bound, else to
    ``by_sql[plan.sql]``), GPU id and time. ``new_state(key, vals)`` makes and records the
    ``_GpuState`` of a GPU seen for the first time or whose key changed.

    Plain ``s.attr`` reads in generated code are specialised by the interpreter into slot loads;
    the same reads through ``operator.attrgetter`` take the generic attribute lookup, and building
    the key and the values with them was ~40 % of the writer's Python time per sample.
    """
    key = ", ".join(f"s.{a}" for a in _KEY_ATTRS)
    vals = ", ".join(f"s.{c}" for c in _VALUE_COLUMNS)
    source = (
        "def fill(samples, get_state, new_state, full_append, by_sql, gids_append, times_append):\n"
        "    for s in samples:\n"
        f"        key = ({key})\n"
        f"        vals = ({vals})\n"
        f"        st = get_state(key[{_KEY_ATTRS.index('uuid')}])\n"
        "        if st is None or st.key != key:\n"
        "            st = new_state(key, vals)\n"
        "        plan = st.plan\n"
        "        if plan is not None and plan.masked(vals) != plan.nones:\n"
        "            plan = st.plan = _plan(vals)  # the GPU reports other metrics than before\n"
        "        if plan is None:\n"
        "            full_append(vals + st.suffix)\n"
        "        else:\n"
        "            by_sql.setdefault(plan.sql, []).append(plan.kept(vals) + st.suffix)\n"
        "        gids_append(st.gid)\n"
        "        times_append(vals[0])\n"
    )
    namespace: dict[str, Any] = {"_plan": _plan}
    exec(compile(source, "<sqlite store rows>", "exec"), namespace)
    return namespace["fill"]


_fill_rows = _compile_fill_rows()


def _floor(t_ns: int, step_ns: int) -> int:
    return t_ns // step_ns * step_ns


def _agg_sql(step_ns: int, src: str, attrs: Sequence[str]) -> str:
    """Aggregate level rows (time_ns, gpu_id, n, n_ok, t_last_ns, attrs...) into step buckets.

    Gauges: means weighted by n_ok. Last-value attributes: the value in the row with the newest
    non-lost sample (SQLite's bare-column rule for a query with a single max()).
    """
    cols = []
    for a in attrs:
        if a in LAST_VALUE_ATTRS:
            cols.append(a)
        else:
            cols.append(
                f"sum({a} * n_ok) / CAST(sum(CASE WHEN {a} IS NOT NULL THEN n_ok END) AS REAL)"
            )
    return (
        f"SELECT time_ns / {step_ns} * {step_ns} AS time_ns, gpu_id, sum(n) AS n, "
        f"sum(n_ok) AS n_ok, max(t_last_ns) AS t_last_ns"
        + "".join(f", {c} AS {a}" for c, a in zip(cols, attrs, strict=True))
        + f" FROM ({src}) GROUP BY 1, gpu_id"
    )


def _raw_avg_columns(attrs: Sequence[str]) -> str:
    """The select-list of raw aggregates: means, or the bare value of a last-value attribute."""
    return "".join(f", {a}" if a in LAST_VALUE_ATTRS else f", avg({a}) AS {a}" for a in attrs)


def _raw_agg_sql(step_ns: int, attrs: Sequence[str], gpu_filter: str) -> str:
    """Aggregate raw samples in ``time_ns >= ? AND time_ns < ?`` into step buckets (level rows).

    The same result as ``_agg_sql`` over raw rows of weight 1, with plain avg() (lost samples
    have no metrics), which is cheaper.
    """
    cols = _raw_avg_columns(attrs)
    return (
        f"SELECT s.time_ns / {step_ns} * {step_ns} AS time_ns, gpu_id, count(*) AS n, "
        f"sum(1 - lost) AS n_ok, max(CASE WHEN lost = 0 THEN s.time_ns END) AS t_last_ns{cols} "
        f"FROM samples s WHERE s.time_ns >= ? AND s.time_ns < ?{gpu_filter} GROUP BY 1, gpu_id"
    )


def _raw_bucket_agg_sql(attrs: Sequence[str], gpu_filter: str) -> str:
    """``_raw_agg_sql`` for a range inside one bucket, given as the first parameter: grouped by
    GPU alone, SQLite's sorter keys on the GPU id instead of an expression, ~12 % cheaper."""
    cols = _raw_avg_columns(attrs)
    return (
        "SELECT ? AS time_ns, gpu_id, count(*) AS n, sum(1 - lost) AS n_ok, "
        f"max(CASE WHEN lost = 0 THEN time_ns END) AS t_last_ns{cols} "
        f"FROM samples WHERE time_ns >= ? AND time_ns < ?{gpu_filter} GROUP BY gpu_id"
    )


def _minute_roll_sql() -> str:
    """Roll the raw samples of the minute ``[?1, ?2)`` into ``samples_1m``.

    The same rows as ``_raw_agg_sql`` (one per GPU), without its sort of every wide row by GPU:
    GPUs are the outer loop, each seeking its samples at the minute's distinct times (found by
    a skip scan of the primary key), so groups come out in order and stream. ~30 % cheaper.
    """
    cols = "".join(f", s.{a}" if a in LAST_VALUE_ATTRS else f", avg(s.{a})" for a in METRIC_ATTRS)
    names = ", ".join(("time_ns", "gpu_id", "n", "n_ok", "t_last_ns", *METRIC_ATTRS))
    return (
        "WITH RECURSIVE t(x) AS ("
        "SELECT min(time_ns) FROM samples WHERE time_ns >= ?1 AND time_ns < ?2 UNION ALL "
        "SELECT (SELECT min(time_ns) FROM samples WHERE time_ns > x AND time_ns < ?2) "
        "FROM t WHERE x IS NOT NULL) "
        f"INSERT INTO samples_1m ({names}) "
        "SELECT ?1, g.id, count(*), sum(1 - s.lost), "
        f"max(CASE WHEN s.lost = 0 THEN s.time_ns END){cols} "
        "FROM gpus g CROSS JOIN t CROSS JOIN samples s ON s.time_ns = t.x AND s.gpu_id = g.id "
        "GROUP BY g.id"
    )


_MINUTE_ROLL_SQL = _minute_roll_sql()


class SqliteStore:
    """SQLite store. Safe for one writer thread and many reader threads in one process, and for
    one writing process and many reading processes on one file (WAL)."""

    def __init__(
        self,
        path: str | Path,
        *,
        retention_raw_s: int = 3 * DAY_S,
        retention_1m_s: int = 90 * DAY_S,
        retention_1h_s: int = 3 * 365 * DAY_S,
        retention_packed_1m_s: int = 8 * DAY_S,
        rollup_grace_s: int = 30,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.retention_raw_ns = int(retention_raw_s) * NS_PER_S
        self.retention_1m_ns = int(retention_1m_s) * NS_PER_S
        self.retention_1h_ns = int(retention_1h_s) * NS_PER_S
        # The packed copy of the minutes (~330 kB per minute at 1,024 GPUs) is kept only as long
        # as minute-resolution views need it; older minutes are read from samples_1m.
        self._packed_retention_ns = {
            MINUTE_NS: min(int(retention_packed_1m_s), int(retention_1m_s)) * NS_PER_S,
            HOUR_NS: self.retention_1h_ns,
        }
        self.rollup_grace_ns = int(rollup_grace_s) * NS_PER_S
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()  # guards the writer connection and the connection list
        self._connections: list[sqlite3.Connection] = []
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._gpu_ids: dict[tuple[str, int, str, str], int] = {}
        self._states: dict[str, _GpuState] = {}  # by UUID
        self._closed = False
        self._writer = self._connect()
        # Rows are wide (~330 B): 16 KiB pages halve the insert cost of the clustered table.
        # Only takes effect on a new, empty file.
        self._writer.execute("PRAGMA page_size=16384").close()
        with contextlib.suppress(sqlite3.OperationalError):
            # Another process may hold the file; WAL is persistent, so it is set by whoever
            # created it first.
            self._writer.execute("PRAGMA journal_mode=WAL").close()
        self._writer.executescript(f"BEGIN IMMEDIATE;\n{_schema_sql()}\nCOMMIT;")
        with self._transaction(self._writer):
            self._init_packed(self._writer)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _init_packed(self, con: sqlite3.Connection) -> None:
        """Record, per rollup level, from which bucket on the packed copy is complete: every
        bucket of a new database; only buckets rolled from now on in one written by a version
        without the packed copy (older buckets are read from the rollup table)."""
        meta = self._meta(con)
        for level, table in _ROLLUP_TABLES.items():
            key = _packed_key(level)
            if key in meta:
                continue
            (has_rows,) = con.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()
            rolled = meta.get(_rolled_key(level))
            self._set_meta(con, key, rolled if has_rows and rolled is not None else -(2**62))

    # --- connections --------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=256,
        )
        con.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA temp_store=MEMORY")
        con.execute("PRAGMA cache_size=-65536")
        with self._lock:
            self._connections.append(con)
        return con

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise RuntimeError("store is closed")
        try:
            con = self._readers.get_nowait()
        except queue.Empty:
            con = self._connect()
        try:
            # One read transaction: every query inside sees the same snapshot.
            with self._transaction(con, "BEGIN"):
                yield con
        finally:
            self._readers.put(con)

    @staticmethod
    @contextlib.contextmanager
    def _transaction(con: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
        con.execute(begin)
        try:
            yield
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections, self._connections = self._connections, []
        for con in connections:
            con.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writes -------------------------------------------------------------------------------

    def write_lines(self, lines: Sequence[str]) -> None:
        self.write_samples([decode_line(line) for line in lines if line.strip()])

    def write_samples(self, samples: Sequence[GpuSample]) -> None:
        if not samples:
            return
        with self._lock:
            if self._closed:
                raise RuntimeError("store is closed")
            con = self._writer
            try:
                self._write(con, samples)
            except BaseException:
                self._gpu_ids.clear()  # ids inserted by the rolled-back transaction are gone
                self._states.clear()
                raise

    def _write(self, con: sqlite3.Connection, samples: Sequence[GpuSample]) -> None:
        with self._transaction(con):
            by_sql, gids, times = self._rows(con, samples)
            mixed = sum(1 for rows in by_sql.values() if rows) > 1
            if mixed and len(set(zip(gids, times, strict=True))) < len(gids):
                # The same GPU and time twice, bound by different statements: keep the last, as
                # one statement in batch order would.
                last_of = {(g, t): s for g, t, s in zip(gids, times, samples, strict=True)}
                by_sql, gids, times = self._rows(con, list(last_of.values()))
            for sql, rows in by_sql.items():
                if rows:
                    con.executemany(sql, rows)
            t_min, t_max = min(times), max(times)
            if t_min == t_max:  # a collector round: one time
                by_time = {t_max: set(gids)}
            else:
                last: dict[int, int] = {}
                for g, t in zip(gids, times, strict=True):
                    if last.get(g, -1) < t:
                        last[g] = t
                by_time = {}
                for g, t in last.items():
                    by_time.setdefault(t, set()).add(g)
            for t, ids in by_time.items():
                lo, hi = min(ids), max(ids)
                if hi - lo + 1 == len(ids):  # a contiguous range of ids: no id list to parse
                    con.execute(
                        "UPDATE gpus SET last_time_ns = ?1 WHERE id BETWEEN ?2 AND ?3 "
                        "AND (last_time_ns IS NULL OR last_time_ns < ?1)",
                        (t, lo, hi),
                    )
                else:
                    con.execute(
                        "UPDATE gpus SET last_time_ns = ?1 "
                        "WHERE id IN (SELECT value FROM json_each(?2)) "
                        "AND (last_time_ns IS NULL OR last_time_ns < ?1)",
                        (t, json.dumps(sorted(ids))),
                    )
            self._maintain(con, times, t_min, t_max)

    def _gpu_id(self, con: sqlite3.Connection, key: tuple[str, int, str, str]) -> int:
        gid = self._gpu_ids.get(key)
        if gid is None:
            (gid,) = con.execute(
                "INSERT INTO gpus (host, gpu_index, uuid, name) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (host, gpu_index, uuid) DO UPDATE SET name = excluded.name "
                "RETURNING id",
                key,
            ).fetchone()
            self._gpu_ids[key] = gid
        return gid

    def _rows(
        self, con: sqlite3.Connection, samples: Sequence[GpuSample]
    ) -> tuple[dict[str, list[tuple[Any, ...]]], list[int], list[int]]:
        """Parameter tuples by INSERT statement (see ``_Plan``), and each sample's GPU id and
        time. Every parameter is an exact int, float or str (see ``_VALUE_COLUMNS``)."""
        states = self._states

        def new_state(key: tuple[Any, ...], vals: tuple[Any, ...]) -> _GpuState:
            st = states.get(key[2])
            if st is not None and st.key[:4] == key[:4]:
                st = _GpuState(st.gid, key, st.plan)
            else:  # a new GPU (or another GPU with the same UUID)
                if len(states) >= 65536:
                    states.clear()
                st = _GpuState(self._gpu_id(con, key[:4]), key, _plan(vals))
            states[key[2]] = st
            return st

        full: list[tuple[Any, ...]] = []
        by_sql: dict[str, list[tuple[Any, ...]]] = {_INSERT_SQL: full}
        gids: list[int] = []
        times: list[int] = []
        _fill_rows(samples, states.get, new_state, full.append, by_sql, gids.append, times.append)
        return by_sql, gids, times

    # --- rollups and retention ----------------------------------------------------------------

    @staticmethod
    def _meta(con: sqlite3.Connection) -> dict[str, int]:
        return dict(con.execute("SELECT key, value FROM meta").fetchall())

    @staticmethod
    def _set_meta(con: sqlite3.Connection, key: str, value: int) -> None:
        con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _maintain(
        self, con: sqlite3.Connection, times: Sequence[int], t_min: int, t_max: int
    ) -> None:
        meta = self._meta(con)
        newest = max(meta.get("max_time_ns", t_max), t_max)
        if newest != meta.get("max_time_ns"):
            self._set_meta(con, "max_time_ns", newest)
        up_m = meta.get("rolled_60")
        up_h = meta.get("rolled_3600")
        if up_m is None:
            up_m = _floor(t_min, MINUTE_NS)
            up_h = _floor(t_min, HOUR_NS)
            self._set_meta(con, "rolled_3600", up_h)
        assert up_h is not None
        # Late samples: buckets already rolled become dirty.
        if t_min < up_m:
            minutes = {_floor(t, MINUTE_NS) for t in times if t < up_m}
            con.executemany(
                "INSERT OR IGNORE INTO rollup_dirty VALUES (?, ?)",
                [(MINUTE_NS, b) for b in minutes],
            )
            hours = {_floor(b, HOUR_NS) for b in minutes if b < up_h}
            con.executemany(
                "INSERT OR IGNORE INTO rollup_dirty VALUES (?, ?)", [(HOUR_NS, b) for b in hours]
            )
        # Roll minutes the data has moved past.
        new_up_m = max(up_m, _floor(newest - self.rollup_grace_ns, MINUTE_NS))
        if new_up_m > up_m:
            self._roll(con, MINUTE_NS, up_m, new_up_m)
        if new_up_m != meta.get("rolled_60"):
            self._set_meta(con, "rolled_60", new_up_m)
        # Recompute dirty minutes this write has moved past, then hours.
        self._recompute_dirty(con, MINUTE_NS, t_min)
        new_up_h = max(up_h, _floor(new_up_m, HOUR_NS))
        if new_up_h > up_h:
            self._roll(con, HOUR_NS, up_h, new_up_h)
            self._set_meta(con, "rolled_3600", new_up_h)
            # Hours rolled over minutes that are still dirty must be recomputed later.
            con.execute(
                "INSERT OR IGNORE INTO rollup_dirty SELECT ?1, bucket_ns / ?1 * ?1 "
                "FROM rollup_dirty WHERE level_ns = ?2 AND bucket_ns >= ?3 AND bucket_ns < ?4",
                (HOUR_NS, MINUTE_NS, up_h, new_up_h),
            )
        self._recompute_dirty(con, HOUR_NS, t_min)
        last_ret = meta.get("retention_at_ns")
        if last_ret is None or newest - last_ret >= _RETENTION_CHECK_NS:
            self._apply_retention(con, newest)
            self._set_meta(con, "retention_at_ns", newest)

    def _roll(self, con: sqlite3.Connection, level_ns: int, start_ns: int, end_ns: int) -> None:
        """(Re)compute the ``level_ns`` buckets in ``[start_ns, end_ns)`` from the level below."""
        table = _ROLLUP_TABLES[level_ns]
        lower = _LOWER_LEVEL[level_ns]
        con.execute(f"DELETE FROM {table} WHERE time_ns >= ? AND time_ns < ?", (start_ns, end_ns))
        if lower == 0:
            # One minute at a time, skipping minutes without samples.
            bucket = start_ns
            while bucket < end_ns:
                (first,) = con.execute(
                    "SELECT min(time_ns) FROM samples WHERE time_ns >= ? AND time_ns < ?",
                    (bucket, end_ns),
                ).fetchone()
                if first is None:
                    break
                bucket = _floor(first, MINUTE_NS)
                con.execute(_MINUTE_ROLL_SQL, (bucket, bucket + MINUTE_NS))
                bucket += MINUTE_NS
        else:
            src = (
                f"SELECT time_ns, gpu_id, n, n_ok, t_last_ns, {', '.join(METRIC_ATTRS)} "
                f"FROM {_ROLLUP_TABLES[lower]} WHERE time_ns >= ? AND time_ns < ?"
            )
            select = _agg_sql(level_ns, src, METRIC_ATTRS)
            cols = ", ".join(("time_ns", "gpu_id", "n", "n_ok", "t_last_ns", *METRIC_ATTRS))
            con.execute(f"INSERT INTO {table} ({cols}) {select}", (start_ns, end_ns))
        packed.repack(con, level_ns, table, start_ns, end_ns, METRIC_ATTRS)

    def _recompute_dirty(self, con: sqlite3.Connection, level_ns: int, before_ns: int) -> None:
        """Recompute the dirty buckets that end at or before ``before_ns``."""
        rows = con.execute(
            "SELECT bucket_ns FROM rollup_dirty WHERE level_ns = ? AND bucket_ns + ? <= ?",
            (level_ns, level_ns, before_ns),
        ).fetchall()
        for (bucket,) in rows:
            if level_ns == HOUR_NS:
                pending = con.execute(
                    "SELECT 1 FROM rollup_dirty WHERE level_ns = ? AND bucket_ns >= ? "
                    "AND bucket_ns < ? LIMIT 1",
                    (MINUTE_NS, bucket, bucket + HOUR_NS),
                ).fetchone()
                if pending:
                    continue
            self._roll(con, level_ns, bucket, bucket + level_ns)
            con.execute(
                "DELETE FROM rollup_dirty WHERE level_ns = ? AND bucket_ns = ?", (level_ns, bucket)
            )

    def _apply_retention(self, con: sqlite3.Connection, newest_ns: int) -> None:
        raw_cut = newest_ns - self.retention_raw_ns
        con.execute("DELETE FROM samples WHERE time_ns < ?", (raw_cut,))
        # A dirty minute whose raw rows are gone cannot be recomputed; keep the rollup as is.
        con.execute(
            "DELETE FROM rollup_dirty WHERE level_ns = ? AND bucket_ns < ?", (MINUTE_NS, raw_cut)
        )
        con.execute("DELETE FROM samples_1m WHERE time_ns < ?", (newest_ns - self.retention_1m_ns,))
        packed.delete_before(con, MINUTE_NS, newest_ns - self._packed_retention_ns[MINUTE_NS])
        con.execute(
            "DELETE FROM rollup_dirty WHERE level_ns = ? AND bucket_ns < ?",
            (HOUR_NS, newest_ns - self.retention_1m_ns),
        )
        con.execute("DELETE FROM samples_1h WHERE time_ns < ?", (newest_ns - self.retention_1h_ns,))
        packed.delete_before(con, HOUR_NS, newest_ns - self.retention_1h_ns)

    def flush_rollups(self) -> None:
        """Recompute every dirty bucket now (normally done once writes have moved past it)."""
        with self._lock, self._transaction(self._writer):
            self._recompute_dirty(self._writer, MINUTE_NS, 2**62)
            self._recompute_dirty(self._writer, HOUR_NS, 2**62)

    # --- reads --------------------------------------------------------------------------------

    def count_samples(self, start_ns: int, end_ns: int) -> int:
        with self._reader() as con:
            (n,) = con.execute(
                "SELECT count(*) FROM samples WHERE time_ns >= ? AND time_ns < ?",
                (start_ns, end_ns),
            ).fetchone()
        return int(n)

    def latest(self, *, since_ns: int | None = None) -> list[GpuSample]:
        cols = ", ".join(f"s.{c}" for c in ("lost", *METRIC_ATTRS, *_EXTRA_COLUMNS))
        with self._reader() as con:
            rows = con.execute(
                f"SELECT s.time_ns, g.host, g.gpu_index, g.uuid, g.name, {cols} "
                "FROM gpus g JOIN samples s ON s.time_ns = g.last_time_ns AND s.gpu_id = g.id "
                "WHERE g.last_time_ns >= ? ORDER BY g.host, g.gpu_index, g.uuid",
                (-(2**63) if since_ns is None else since_ns,),
            ).fetchall()
        return [_sample_from_row(r) for r in rows]

    def series(
        self,
        start_ns: int,
        end_ns: int,
        fields: Sequence[str] | None = None,
        *,
        step_s: int | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        return self.series_many([SeriesRead(start_ns, end_ns, fields, step_s, hosts)])[0]

    def series_many(self, reads: Sequence[SeriesRead]) -> list[pd.DataFrame]:
        """Several ``series`` reads in one read transaction (they see the same data). The raw
        samples not rolled up yet, whose aggregation in SQL is most of the cost of a read that
        ends near now, are aggregated once for the reads that cover the same ones."""
        memo: dict[tuple[Any, ...], dict[str, Any]] = {}
        with self._reader() as con:
            columns = [self._series_columns(con, memo, r) for r in reads]
            gpus = con.execute("SELECT id, host, gpu_index, uuid, name FROM gpus").fetchall()
        return [_frame(c, attrs, gpus) for c, attrs in columns]

    def _series_columns(
        self, con: sqlite3.Connection, memo: dict[tuple[Any, ...], dict[str, Any]], read: SeriesRead
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        attrs = _check_fields(read.fields)
        start_ns, end_ns, step_s, hosts = read.start_ns, read.end_ns, read.step_s, read.hosts
        gpu_filter, filter_params = "", []
        if hosts is not None:
            marks = ", ".join("?" * len(hosts))
            gpu_filter = f" AND gpu_id IN (SELECT id FROM gpus WHERE host IN ({marks}))"
            filter_params = list(hosts)
        if step_s is None:
            sql = (
                "SELECT s.time_ns, s.gpu_id"
                + "".join(f", s.{a}" for a in attrs)
                + " FROM samples s WHERE s.time_ns >= ? AND s.time_ns < ?"
                + gpu_filter.replace("gpu_id", "s.gpu_id")
            )
            rows = con.execute(sql, (start_ns, end_ns, *filter_params)).fetchall()
            return _columns(rows, attrs), attrs
        step_ns = int(step_s) * NS_PER_S
        if step_ns <= 0:
            raise ValueError("step_s must be positive")
        level = _level_for(step_ns)
        meta = self._meta(con)
        if level > 0:
            columns = self._level_columns(
                con, meta, level, start_ns, end_ns, attrs, gpu_filter, filter_params, memo
            )
            if columns is not None:
                if step_ns != level:
                    columns = packed.rebucket(columns, step_ns, attrs, LAST_VALUE_ATTRS)
                return columns, attrs
        if level == 0:
            agg = _raw_agg_sql(step_ns, attrs, gpu_filter)
            params = [start_ns, end_ns, *filter_params]
        else:
            src, params = self._level_src(
                con, meta, level, start_ns, end_ns, attrs, gpu_filter, filter_params
            )
            # Level rows are already one per (bucket, GPU): re-aggregate only when the step
            # spans several buckets of the level.
            agg = src if step_ns == level else _agg_sql(step_ns, src, attrs)
        sql = "SELECT a.time_ns, a.gpu_id" + "".join(f", a.{a}" for a in attrs)
        return _columns(con.execute(f"{sql} FROM ({agg}) a", params).fetchall(), attrs), attrs

    def _level_columns(
        self,
        con: sqlite3.Connection,
        meta: dict[str, int],
        level_ns: int,
        start_ns: int,
        end_ns: int,
        attrs: Sequence[str],
        gpu_filter: str,
        filter_params: list[Any],
        memo: dict[tuple[Any, ...], dict[str, Any]],
    ) -> dict[str, Any] | None:
        """Level rows over ``[start_ns, end_ns)`` as columns (with ``n_ok`` and ``t_last_ns``):
        clean rolled-up buckets from the packed copy (see ``packed``), the rest aggregated from
        the level below (raw samples in SQL, minutes in numpy). None when part of the range
        predates the packed copy: the caller reads the rollup tables instead. Raw aggregates
        are kept in ``memo`` (one read transaction) for the next read of the same rows."""
        import numpy as np

        clean, dirty, below = self._level_plan(con, meta, level_ns, start_ns, end_ns)
        parts = []
        if clean is not None:
            since = meta.get(_packed_key(level_ns), 2**62)
            if "max_time_ns" in meta:  # rows before the packed retention are gone
                since = max(since, meta["max_time_ns"] - self._packed_retention_ns[level_ns])
            if clean[0] < since:
                return None
            gpu_ids = None
            if filter_params:
                marks = ", ".join("?" * len(filter_params))
                found = con.execute(f"SELECT id FROM gpus WHERE host IN ({marks})", filter_params)
                gpu_ids = np.array([i for (i,) in found], dtype=np.int64)
            part = packed.read(con, level_ns, *clean, attrs, exclude=dirty, gpu_ids=gpu_ids)
            if part is None:
                return None
            parts.append(part)
        lower = _LOWER_LEVEL[level_ns]
        for lo, hi in below:
            if lower == 0:
                key = (level_ns, lo, hi, tuple(attrs), gpu_filter, tuple(filter_params))
                if key not in memo:
                    memo[key] = _level_columns_of(
                        _raw_level_rows(con, level_ns, lo, hi, attrs, gpu_filter, filter_params),
                        attrs,
                    )
                parts.append(memo[key])
            else:
                sub = self._level_columns(
                    con, meta, lower, lo, hi, attrs, gpu_filter, filter_params, memo
                )
                if sub is None:
                    return None
                parts.append(packed.rebucket(sub, level_ns, attrs, LAST_VALUE_ATTRS))
        if not parts:
            return _level_columns_of([], attrs)
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _level_plan(
        self,
        con: sqlite3.Connection,
        meta: dict[str, int],
        level_ns: int,
        start_ns: int,
        end_ns: int,
    ) -> tuple[tuple[int, int] | None, list[int], list[tuple[int, int]]]:
        """How to read level rows over ``[start_ns, end_ns)``: the range whose buckets are rolled
        up (None: no such part), the dirty buckets in it (not to be trusted), and the ranges to
        aggregate from the level below instead (those buckets, and what is not rolled yet)."""
        up = meta.get(_rolled_key(level_ns))
        clean: tuple[int, int] | None = None
        dirty: list[int] = []
        below: list[tuple[int, int]] = []
        if up is not None and start_ns < min(end_ns, up):
            clean = (start_ns, min(end_ns, up))
            dirty = [
                b
                for (b,) in con.execute(
                    "SELECT bucket_ns FROM rollup_dirty WHERE level_ns = ? AND bucket_ns >= ? "
                    "AND bucket_ns < ?",
                    (level_ns, _floor(start_ns, level_ns), clean[1]),
                )
            ]
            below += [(max(b, start_ns), min(b + level_ns, end_ns)) for b in dirty]
        tail_start = start_ns if up is None else max(start_ns, up)
        if tail_start < end_ns:
            below.append((tail_start, end_ns))
        return clean, dirty, below

    def _below_src(
        self,
        con: sqlite3.Connection,
        meta: dict[str, int],
        level_ns: int,
        below: list[tuple[int, int]],
        attrs: Sequence[str],
        gpu_filter: str,
        filter_params: list[Any],
    ) -> tuple[str, list[Any]]:
        """SQL aggregating the ranges ``below`` from the level under ``level_ns``."""
        parts: list[str] = []
        params: list[Any] = []
        lower = _LOWER_LEVEL[level_ns]
        for lo, hi in below:
            if lower == 0:
                parts.append(_raw_agg_sql(level_ns, attrs, gpu_filter))
                params += [lo, hi, *filter_params]
            else:
                src, p = self._level_src(con, meta, lower, lo, hi, attrs, gpu_filter, filter_params)
                parts.append(_agg_sql(level_ns, src, attrs))
                params += p
        return " UNION ALL ".join(parts), params

    def _level_src(
        self,
        con: sqlite3.Connection,
        meta: dict[str, int],
        level_ns: int,
        start_ns: int,
        end_ns: int,
        attrs: Sequence[str],
        gpu_filter: str,
        filter_params: list[Any],
    ) -> tuple[str, list[Any]]:
        """SQL for level rows over ``[start_ns, end_ns)``: clean rolled-up buckets from the
        rollup table, everything else (not yet rolled, dirty) aggregated from the level below."""
        clean, dirty, below = self._level_plan(con, meta, level_ns, start_ns, end_ns)
        parts: list[str] = []
        params: list[Any] = []
        if clean is not None:
            not_dirty = f" AND time_ns NOT IN ({', '.join('?' * len(dirty))})" if dirty else ""
            parts.append(
                f"SELECT time_ns, gpu_id, n, n_ok, t_last_ns{''.join(f', {a}' for a in attrs)} "
                f"FROM {_ROLLUP_TABLES[level_ns]} WHERE time_ns >= ? AND time_ns < ?"
                f"{not_dirty}{gpu_filter}"
            )
            params += [*clean, *dirty, *filter_params]
        if below:
            src, p = self._below_src(con, meta, level_ns, below, attrs, gpu_filter, filter_params)
            parts.append(src)
            params += p
        if not parts:  # an empty range
            return _raw_agg_sql(level_ns, attrs, gpu_filter), [0, 0, *filter_params]
        return " UNION ALL ".join(parts), params


def _raw_level_rows(
    con: sqlite3.Connection,
    level_ns: int,
    lo: int,
    hi: int,
    attrs: Sequence[str],
    gpu_filter: str,
    filter_params: list[Any],
) -> list[tuple[Any, ...]]:
    """Raw samples in ``[lo, hi)`` aggregated into ``level_ns`` buckets (level rows). A range of
    a few buckets (the usual not-yet-rolled tail) is read bucket by bucket, grouped by GPU alone."""
    first = _floor(lo, level_ns)
    if hi - first > _FEW_BUCKETS * level_ns:
        sql = _raw_agg_sql(level_ns, attrs, gpu_filter)
        return con.execute(sql, (lo, hi, *filter_params)).fetchall()
    sql = _raw_bucket_agg_sql(attrs, gpu_filter)
    rows: list[tuple[Any, ...]] = []
    for b in range(first, hi, level_ns):
        rows += con.execute(sql, (b, max(lo, b), min(hi, b + level_ns), *filter_params))
    return rows


#: Up to this many buckets, raw samples are aggregated one bucket at a time (see above).
_FEW_BUCKETS = 4


def _rolled_key(level_ns: int) -> str:
    """The meta key of the end of the rolled-up buckets of a level."""
    return f"rolled_{level_ns // NS_PER_S}"


def _packed_key(level_ns: int) -> str:
    """The meta key of the first bucket of a level whose packed copy is complete."""
    return f"packed_{level_ns // NS_PER_S}"


def _level_for(step_ns: int) -> int:
    """The coarsest stored level whose buckets tile ``step_ns`` (0: raw samples)."""
    for level in (HOUR_NS, MINUTE_NS):
        if step_ns % level == 0:
            return level
    return 0


def _check_fields(fields: Sequence[str] | None) -> tuple[str, ...]:
    if fields is None:
        return METRIC_FIELDS
    unknown = [f for f in fields if f not in FIELD_BY_ATTR]
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; use GpuSample attribute names")
    return tuple(fields)


def _columns(rows: list[tuple[Any, ...]], attrs: Sequence[str]) -> dict[str, Any]:
    """Rows of (time_ns, gpu_id, attrs...) as numpy columns (None -> NaN)."""
    import numpy as np

    if not rows:
        empty = {"time_ns": np.zeros(0, np.int64), "gpu_id": np.zeros(0, np.int64)}
        return empty | {a: np.zeros(0) for a in attrs}
    columns = list(zip(*rows, strict=True))
    out = {
        "time_ns": np.array(columns[0], dtype=np.int64),
        "gpu_id": np.array(columns[1], dtype=np.int64),
    }
    for a, column in zip(attrs, columns[2:], strict=True):
        out[a] = np.array(column, dtype=np.float64)
    return out


def _level_columns_of(rows: list[tuple[Any, ...]], attrs: Sequence[str]) -> dict[str, Any]:
    """Level rows (time_ns, gpu_id, n, n_ok, t_last_ns, attrs...) as numpy columns."""
    import numpy as np

    out = _columns([(r[0], r[1], *r[5:]) for r in rows], attrs)
    out["n_ok"] = np.array([r[3] for r in rows], dtype=np.int64)
    out["t_last_ns"] = np.array(
        [packed.NULL_TIME if r[4] is None else r[4] for r in rows], dtype=np.int64
    )
    return out


def _frame(
    columns: dict[str, Any], attrs: Sequence[str], gpus: list[tuple[Any, ...]]
) -> pd.DataFrame:
    """Columns time_ns, gpu_id and attrs as the long frame, GPU identity joined in numpy.

    Joining and sorting on the small gpus table in numpy, rather than in SQL on every row, keeps
    an hour of 1,024 GPUs' rollups cheap: no per-row strings cross the sqlite3 boundary.
    """
    import numpy as np
    import pandas as pd

    ident = pd.DataFrame.from_records(gpus, columns=["gpu_id", "host", "gpu_index", "uuid", "name"])
    ident = ident.sort_values(["host", "gpu_index", "uuid"], kind="stable").reset_index(drop=True)
    rank = np.full(int(ident["gpu_id"].max()) + 1 if len(ident) else 1, -1, dtype=np.int64)
    rank[ident["gpu_id"].to_numpy(dtype=np.int64)] = np.arange(len(ident))
    gpu_rank = rank[columns["gpu_id"]]
    time_ns = columns["time_ns"]
    order = np.lexsort((gpu_rank, time_ns))
    gpu_rank = gpu_rank[order]
    out = pd.DataFrame(
        {
            "time_ns": time_ns[order],
            "host": ident["host"].to_numpy(dtype=object)[gpu_rank],
            "gpu_index": ident["gpu_index"].to_numpy(dtype=np.int64)[gpu_rank],
            "uuid": ident["uuid"].to_numpy(dtype=object)[gpu_rank],
            "name": ident["name"].to_numpy(dtype=object)[gpu_rank],
        }
    )
    for a in attrs:
        out[a] = columns[a][order]
    return out


#: (attribute, how to convert its stored value) per metric column, in METRIC_ATTRS order.
_METRIC_CONVERTERS: tuple[tuple[str, Callable[[Any], Any] | None], ...] = tuple(
    (a, {Kind.BOOL: bool, Kind.FLOAT: float}.get(FIELD_BY_ATTR[a].kind)) for a in METRIC_ATTRS
)


def _sample_from_row(row: Sequence[Any]) -> GpuSample:
    time_ns, host, gpu_index, uuid, name, lost = row[:6]
    kwargs: dict[str, Any] = {
        attr: v if convert is None else convert(v)
        for (attr, convert), v in zip(_METRIC_CONVERTERS, row[6:], strict=False)
        if v is not None
    }
    em, tm, xid_last, _xid_count, procs, job_id = row[6 + len(METRIC_ATTRS) :]
    if em is not None:
        kwargs["energy_method"] = EnergyMethod(em)
    if tm is not None:
        kwargs["tflops_method"] = TflopsMethod(tm)
    if xid_last is not None:
        kwargs["xid_errors"] = (int(xid_last),)
    if procs is not None:
        kwargs["processes"] = parse_processes(procs)
    if job_id is not None:
        kwargs["job_id"] = job_id
    # make_gpu_sample: the same GpuSample as the keyword constructor, ~10x cheaper (latest()
    # builds one per GPU on every dashboard refresh).
    return make_gpu_sample(
        time_ns=time_ns,
        host=host,
        gpu_index=gpu_index,
        uuid=uuid,
        name=name,
        lost=bool(lost),
        **kwargs,
    )
