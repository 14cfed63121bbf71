"""The embedded store: SQLite (stdlib), WAL mode, one writer and many readers across processes.

Tables:

- ``gpus``: one row per GPU (host, gpu_index, uuid; name) with the time of its newest sample,
  so ``latest()`` is one point lookup per GPU.
- ``raw_rounds`` and ``tails``: the raw samples, one row per write and time with every GPU's
  values packed (see ``rounds``: one INSERT per collector round, decoded with numpy). Model units
  and attribute names (bytes, not Telegraf's MiB).
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
import dataclasses
import functools
import json
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import decode_line, format_processes, parse_processes
from gpuwatt.model import METRIC_FIELDS, EnergyMethod, GpuSample, TflopsMethod, make_gpu_sample
from gpuwatt.schema import FIELD_BY_ATTR, Kind
from gpuwatt.store import LAST_VALUE_ATTRS, StoreRejected, legacy, packed, rounds
from gpuwatt.store.base import SeriesRead

if TYPE_CHECKING:
    import pandas as pd

F = TypeVar("F", bound=Callable[..., Any])

NS_PER_S = 1_000_000_000
MINUTE_NS = 60 * NS_PER_S
HOUR_NS = 3600 * NS_PER_S
DAY_S = 86_400

#: Every schema field, stored under its model attribute name.
METRIC_ATTRS: tuple[str, ...] = rounds.METRIC_ATTRS
_ROLLUP_TABLES = {MINUTE_NS: "samples_1m", HOUR_NS: "samples_1h"}
_LOWER_LEVEL = {MINUTE_NS: 0, HOUR_NS: MINUTE_NS}
_RETENTION_CHECK_NS = MINUTE_NS
#: The GPU's identity and the fields of its tail (``rounds``): while they are equal from one
#: sample of a GPU to the next (one tuple comparison, mostly of identical objects), its id and
#: tail id are reused.
_KEY_ATTRS: tuple[str, ...] = (
    "host",
    "gpu_index",
    "uuid",
    "name",
    "energy_method",
    "tflops_method",
    "xid_errors",
    "processes",
    "job_id",
)
_encode = rounds.compile_encoder(_KEY_ATTRS)


def _schema_sql() -> str:
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
{rounds.SCHEMA_SQL}
{rollups}
CREATE TABLE IF NOT EXISTS rollup_dirty (
  level_ns INTEGER NOT NULL,
  bucket_ns INTEGER NOT NULL,
  PRIMARY KEY (level_ns, bucket_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER);
{packed.SCHEMA_SQL}"""


def _tail_row(
    key: tuple[Any, ...],
) -> tuple[str | None, str | None, int | None, int | None, str | None, str | None]:
    """A key's tail (``_KEY_ATTRS[4:]``) as stored in ``tails``."""
    em, tm, xids, procs, job = key[4:]
    return (
        None if em is None else em.value,
        None if tm is None else tm.value,
        xids[-1] if xids else None,
        len(xids) if xids else None,
        None if procs is None else format_processes(procs),
        job,
    )


class _GpuState:
    """What the writer keeps per GPU: its id, its last ``_KEY_ATTRS`` values, the id of that
    tail (a float: it is packed with the values) and its ``rounds.Masked`` plan."""

    __slots__ = ("gid", "key", "plan", "tail")

    def __init__(
        self, gid: int, key: tuple[Any, ...], tail: float, plan: rounds.Masked | None
    ) -> None:
        self.gid = gid
        self.key = key
        self.tail = tail
        self.plan = plan


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


def _store_errors(method: F) -> F:
    """SQLite's own errors as gpuwatt's: a locked, busy, full or unopenable database is an outage
    (``StoreUnavailable``: a writer's spool keeps the samples and retries, a reader says "not
    reachable"); a database SQLite cannot read is ``StoreRejected`` (retrying will not help).
    Nothing above the store sees ``sqlite3``."""

    @functools.wraps(method)
    def wrapped(self: SqliteStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"embedded store {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreRejected(f"embedded store {self.path} cannot be read: {exc}") from exc

    return wrapped  # type: ignore[return-value]


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
        self._tail_ids: dict[tuple[Any, ...], int] = {}
        self._closed = False
        self._writer = self._connect()
        # 16 KiB pages: a round (~330 B per GPU) spans fewer overflow pages, and the wide rollup
        # rows insert at half the cost of 4 KiB pages.
        # Only takes effect on a new, empty file.
        self._writer.execute("PRAGMA page_size=16384").close()
        with contextlib.suppress(sqlite3.OperationalError):
            # Another process may hold the file; WAL is persistent, so it is set by whoever
            # created it first.
            self._writer.execute("PRAGMA journal_mode=WAL").close()
        self._writer.executescript(f"BEGIN IMMEDIATE;\n{_schema_sql()}\nCOMMIT;")
        with self._transaction(self._writer):
            self._init_packed(self._writer)
        if legacy.has_wide_samples(self._writer):
            try:
                legacy.migrate_wide_samples(
                    self._writer, lambda: self._transaction(self._writer), self.path
                )
            except BaseException:
                self.close()  # the move resumes at the next open
                raise

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

    @_store_errors
    def write_lines(self, lines: Sequence[str]) -> None:
        self.write_samples([decode_line(line) for line in lines if line.strip()])

    @_store_errors
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
                self._forget_ids()  # ids inserted by the rolled-back transaction are gone
                raise

    def _forget_ids(self) -> None:
        self._gpu_ids.clear()
        self._tail_ids.clear()
        self._states.clear()

    def _write(self, con: sqlite3.Connection, samples: Sequence[GpuSample]) -> None:
        with self._transaction(con):
            parts, gids, times = self._encode(con, samples)
            t_min, t_max = min(times), max(times)
            if t_min == t_max and len(set(gids)) == len(gids):  # a round: one time, GPUs once
                rounds.insert(con, t_max, gids, b"".join(parts))
            else:
                by_time: dict[int, dict[int, int]] = {}
                for i, (g, t) in enumerate(zip(gids, times, strict=True)):
                    by_time.setdefault(t, {})[g] = i  # the same GPU and time twice: keep the last
                for t in sorted(by_time):
                    rows = by_time[t]
                    rounds.insert(con, t, list(rows), b"".join(parts[i] for i in rows.values()))
            self._update_last_times(con, gids, times, t_min, t_max)
            self._maintain(con, times, t_min, t_max)

    @staticmethod
    def _update_last_times(
        con: sqlite3.Connection, gids: list[int], times: list[int], t_min: int, t_max: int
    ) -> None:
        if t_min == t_max:
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

    def _tail_id(self, con: sqlite3.Connection, key: tuple[Any, ...], time_ns: int) -> int:
        """The id of a key's tail in ``tails``, inserted when not seen yet (by this writer)."""
        tail = _tail_row(key)
        tid = self._tail_ids.get(tail)
        if tid is None:
            if len(self._tail_ids) >= 65536:
                self._tail_ids.clear()
            (tid,) = con.execute(
                f"INSERT INTO tails ({', '.join(rounds.TAIL_COLUMNS)}, last_ns) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (*tail, time_ns),
            ).fetchone()
            self._tail_ids[tail] = tid
        else:  # in use again: not to be deleted before this sample is (``_apply_retention``)
            con.execute(
                "UPDATE tails SET last_ns = ?1 WHERE id = ?2 AND last_ns < ?1", (time_ns, tid)
            )
        return tid

    def _encode(
        self, con: sqlite3.Connection, samples: Sequence[GpuSample]
    ) -> tuple[list[bytes], list[int], list[int]]:
        """Each sample's packed row (``rounds``), GPU id and time."""
        states = self._states

        def new_state(key: tuple[Any, ...], time_ns: int) -> _GpuState:
            st = states.get(key[2])
            if st is not None and st.key[:4] == key[:4]:
                gid, plan = st.gid, st.plan
            else:  # a new GPU (or another GPU with the same UUID)
                if len(states) >= 65536:
                    states.clear()
                gid, plan = self._gpu_id(con, key[:4]), None
            st = _GpuState(gid, key, float(self._tail_id(con, key, time_ns)), plan)
            states[key[2]] = st
            return st

        parts: list[bytes] = []
        gids: list[int] = []
        times: list[int] = []
        _encode(samples, states.get, new_state, parts.append, gids.append, times.append)
        return parts, gids, times

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
                    "SELECT min(time_ns) FROM raw_rounds WHERE time_ns >= ? AND time_ns < ?",
                    (bucket, end_ns),
                ).fetchone()
                if first is None:
                    break
                bucket = _floor(first, MINUTE_NS)
                self._roll_minute(con, bucket)
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

    @staticmethod
    def _roll_minute(con: sqlite3.Connection, bucket_ns: int) -> None:
        """Roll the raw samples of one minute into ``samples_1m``, and note in ``tails`` that
        the tails they refer to are still in use (see ``_apply_retention``)."""
        raw = rounds.read_attrs(con, bucket_ns, bucket_ns + MINUTE_NS, METRIC_ATTRS, with_tail=True)
        cols = rounds.aggregate(raw, MINUTE_NS, METRIC_ATTRS, LAST_VALUE_ATTRS)
        t_last = [None if t == packed.NULL_TIME else t for t in cols["t_last_ns"].tolist()]
        rows = zip(
            cols["time_ns"].tolist(),
            cols["gpu_id"].tolist(),
            cols["n"].tolist(),
            cols["n_ok"].tolist(),
            t_last,
            *(cols[a].tolist() for a in METRIC_ATTRS),  # NaN binds as NULL
            strict=True,
        )
        names = ", ".join(("time_ns", "gpu_id", "n", "n_ok", "t_last_ns", *METRIC_ATTRS))
        con.executemany(
            f"INSERT INTO samples_1m ({names}) VALUES ({', '.join('?' * (5 + len(METRIC_ATTRS)))})",
            rows,
        )
        tails = np.unique(raw.values[:, -1]).astype(np.int64).tolist()
        con.execute(
            "UPDATE tails SET last_ns = ?1 WHERE id IN (SELECT value FROM json_each(?2)) "
            "AND last_ns < ?1",
            (bucket_ns + MINUTE_NS - 1, json.dumps(tails)),
        )

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
        con.execute("DELETE FROM raw_rounds WHERE time_ns < ?", (raw_cut,))
        # A tail's last_ns is the newest of: its first sample, a GPU taking it up again
        # (``_tail_id``), the last minute rolled with it (``_roll_minute``). Below the cut, no
        # raw sample kept refers to it, unless it is a GPU's current tail (samples written now,
        # after days without any): those stay.
        current = json.dumps(sorted({int(st.tail) for st in self._states.values()}))
        deleted = con.execute(
            "DELETE FROM tails WHERE last_ns < ? AND id NOT IN (SELECT value FROM json_each(?))",
            (raw_cut, current),
        ).rowcount
        if deleted:
            self._tail_ids.clear()
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

    @_store_errors
    def flush_rollups(self) -> None:
        """Recompute every dirty bucket now (normally done once writes have moved past it)."""
        with self._lock, self._transaction(self._writer):
            self._recompute_dirty(self._writer, MINUTE_NS, 2**62)
            self._recompute_dirty(self._writer, HOUR_NS, 2**62)

    # --- reads --------------------------------------------------------------------------------

    @_store_errors
    def count_samples(self, start_ns: int, end_ns: int) -> int:
        with self._reader() as con:
            (n_bytes,) = con.execute(
                "SELECT coalesce(sum(length(gpu_ids)), 0) FROM raw_rounds "
                "WHERE time_ns >= ? AND time_ns < ?",
                (start_ns, end_ns),
            ).fetchone()
        return int(n_bytes) // 8  # one int64 id per sample; no (time, GPU) twice (``rounds``)

    @_store_errors
    def latest(self, *, since_ns: int | None = None) -> list[GpuSample]:
        with self._reader() as con:
            gpus = con.execute(
                "SELECT id, host, gpu_index, uuid, name, last_time_ns FROM gpus "
                "WHERE last_time_ns >= ? ORDER BY host, gpu_index, uuid",
                (-(2**63) if since_ns is None else since_ns,),
            ).fetchall()
            wanted = {g[0]: g[5] for g in gpus}
            found: dict[int, list[float]] = {}
            times = sorted(set(wanted.values()))
            for lo in range(0, len(times), 500):
                chunk = times[lo : lo + 500]
                for t, ids, vals in con.execute(
                    "SELECT time_ns, gpu_ids, vals FROM raw_rounds "
                    f"WHERE time_ns IN ({', '.join('?' * len(chunk))})",
                    chunk,
                ):
                    rows = np.frombuffer(vals, dtype="<f8").reshape(-1, rounds.WIDTH)
                    for i, g in enumerate(np.frombuffer(ids, dtype="<i8").tolist()):
                        if wanted.get(g) == t:
                            found[g] = rows[i].tolist()
            tail_ids = sorted({int(v[rounds.TAIL]) for v in found.values()})
            tails = {
                r[0]: r[1:]
                for r in con.execute(
                    f"SELECT id, {', '.join(rounds.TAIL_COLUMNS)} FROM tails "
                    "WHERE id IN (SELECT value FROM json_each(?))",
                    (json.dumps(tail_ids),),
                )
            }
        out = []
        for gid, host, gpu_index, uuid, name, t in gpus:
            vals = found.get(gid)
            if vals is None:  # its newest sample is past the raw retention
                continue
            tail = tails.get(int(vals[rounds.TAIL]), (None,) * len(rounds.TAIL_COLUMNS))
            row = (t, host, gpu_index, uuid, name, *vals[: rounds.TAIL], *tail)
            out.append(_sample_from_row(row))
        return out

    @_store_errors
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

    @_store_errors
    def series_many(self, reads: Sequence[SeriesRead]) -> list[pd.DataFrame]:
        """Several ``series`` reads in one read transaction (they see the same data). The raw
        samples not rolled up yet, whose aggregation is most of the cost of a read that ends
        near now, are aggregated once for the reads that cover the same ones."""
        memo: dict[tuple[Any, ...], dict[str, Any]] = {}
        with self._reader() as con:
            columns = [self._series_columns(con, memo, r) for r in reads]
            gpus = con.execute("SELECT id, host, gpu_index, uuid, name FROM gpus").fetchall()
        return [
            _frame(_cut_first_bucket(c, r), attrs, gpus)
            for (c, attrs), r in zip(columns, reads, strict=True)
        ]

    def _series_columns(
        self, con: sqlite3.Connection, memo: dict[tuple[Any, ...], dict[str, Any]], read: SeriesRead
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        attrs = _check_fields(read.fields)
        start_ns, end_ns, step_s, hosts = read.start_ns, read.end_ns, read.step_s, read.hosts
        gpu_ids = None
        if hosts is not None:
            found = con.execute(
                f"SELECT id FROM gpus WHERE host IN ({', '.join('?' * len(hosts))})", list(hosts)
            )
            gpu_ids = np.array([i for (i,) in found], dtype=np.int64)
        if step_s is None:
            raw = rounds.read_attrs(con, start_ns, end_ns, attrs, gpu_ids)
            columns = {"time_ns": raw.time_ns, "gpu_id": raw.gpu_id}
            return columns | {a: raw.values[:, 1 + j] for j, a in enumerate(attrs)}, attrs
        step_ns = int(step_s) * NS_PER_S
        if step_ns <= 0:
            raise ValueError("step_s must be positive")
        level = _level_for(step_ns)
        if level == 0:
            return self._raw_level(con, memo, step_ns, start_ns, end_ns, attrs, gpu_ids), attrs
        scope = _Scope(attrs, gpu_ids, memo)
        columns = self._level_columns(con, self._meta(con), level, start_ns, end_ns, scope)
        if step_ns != level:
            columns = packed.rebucket(columns, step_ns, attrs, LAST_VALUE_ATTRS)
        return columns, attrs

    @staticmethod
    def _raw_level(
        con: sqlite3.Connection,
        memo: dict[tuple[Any, ...], dict[str, Any]],
        step_ns: int,
        start_ns: int,
        end_ns: int,
        attrs: tuple[str, ...],
        gpu_ids: np.ndarray | None,
    ) -> dict[str, Any]:
        """Raw samples in ``[start_ns, end_ns)`` as level columns of ``step_ns`` buckets; kept in
        ``memo`` (one read transaction) for the next read of the same samples."""
        ids = None if gpu_ids is None else tuple(gpu_ids.tolist())
        key = (step_ns, start_ns, end_ns, attrs, ids)
        if key not in memo:
            raw = rounds.read_attrs(con, start_ns, end_ns, attrs, gpu_ids)
            cols = rounds.aggregate(raw, step_ns, attrs, LAST_VALUE_ATTRS)
            memo[key] = {k: cols[k] for k in (*_LEVEL_KEYS, *attrs)}
        return memo[key]

    def _level_columns(
        self,
        con: sqlite3.Connection,
        meta: dict[str, int],
        level_ns: int,
        start_ns: int,
        end_ns: int,
        scope: _Scope,
    ) -> dict[str, Any]:
        """Level rows over ``[start_ns, end_ns)`` as columns (with ``n_ok`` and ``t_last_ns``):
        clean rolled-up buckets from the packed copy (see ``packed``) or, where it does not
        reach, the rollup table; the rest aggregated from the level below (raw samples, or
        minutes) in numpy."""
        clean, dirty, below = self._level_plan(con, meta, level_ns, start_ns, end_ns)
        parts = []
        if clean is not None:
            since = meta.get(_packed_key(level_ns), 2**62)
            if "max_time_ns" in meta:  # rows before the packed retention are gone
                since = max(since, meta["max_time_ns"] - self._packed_retention_ns[level_ns])
            part = None
            if clean[0] >= since:
                part = packed.read(
                    con, level_ns, *clean, scope.attrs, exclude=dirty, gpu_ids=scope.gpu_ids
                )
            if part is None:
                part = _rollup_table_columns(con, level_ns, clean, dirty, scope)
            parts.append(part)
        lower = _LOWER_LEVEL[level_ns]
        for lo, hi in below:
            if lower == 0:
                sub = self._raw_level(con, scope.memo, level_ns, lo, hi, scope.attrs, scope.gpu_ids)
                parts.append(sub)
            else:
                sub = self._level_columns(con, meta, lower, lo, hi, scope)
                parts.append(packed.rebucket(sub, level_ns, scope.attrs, LAST_VALUE_ATTRS))
        if not parts:
            return _level_columns_of([], scope.attrs)
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
        # Only whole buckets come from this level: a range that starts or ends inside a bucket
        # reads that part from the level below (docs/accounting.md, rule 4). A rolled bucket
        # read by ``time_ns >= start`` would drop the partial first bucket, and one read by
        # ``time_ns < end`` would count the partial last bucket whole.
        first = -(-start_ns // level_ns) * level_ns  # first bucket boundary at or after start
        rolled_end = end_ns if up is None else min(end_ns, up)
        last = _floor(rolled_end, level_ns)
        if up is not None and first < last:
            clean = (first, last)
            dirty = [
                b
                for (b,) in con.execute(
                    "SELECT bucket_ns FROM rollup_dirty WHERE level_ns = ? AND bucket_ns >= ? "
                    "AND bucket_ns < ?",
                    (level_ns, first, last),
                )
            ]
            if start_ns < first:
                below.append((start_ns, first))
            below += [(b, b + level_ns) for b in dirty]
            tail_start = last
        else:
            tail_start = start_ns
        if tail_start < end_ns:
            below.append((tail_start, end_ns))
        return clean, dirty, below


#: The columns of level rows besides the attributes (``_level_columns``).
_LEVEL_KEYS = ("time_ns", "gpu_id", "n_ok", "t_last_ns")


@dataclasses.dataclass(frozen=True)
class _Scope:
    """What one ``series`` read asks of every level it reads: the attributes, the GPUs (None:
    all) and the memo of raw aggregates of its read transaction."""

    attrs: tuple[str, ...]
    gpu_ids: np.ndarray | None
    memo: dict[tuple[Any, ...], dict[str, Any]]


def _rollup_table_columns(
    con: sqlite3.Connection,
    level_ns: int,
    clean: tuple[int, int],
    dirty: Sequence[int],
    scope: _Scope,
) -> dict[str, Any]:
    """The clean buckets of ``clean`` (not those in ``dirty``) read from the rollup table, for
    buckets the packed copy does not reach (older than it, or a database that predates it)."""
    sql = (
        f"SELECT time_ns, gpu_id, n, n_ok, t_last_ns{''.join(f', {a}' for a in scope.attrs)} "
        f"FROM {_ROLLUP_TABLES[level_ns]} WHERE time_ns >= ? AND time_ns < ?"
    )
    params: list[Any] = [*clean]
    if dirty:
        sql += " AND time_ns NOT IN (SELECT value FROM json_each(?))"
        params.append(json.dumps(list(dirty)))
    if scope.gpu_ids is not None:
        sql += " AND gpu_id IN (SELECT value FROM json_each(?))"
        params.append(json.dumps(scope.gpu_ids.tolist()))
    return _level_columns_of(con.execute(sql, params).fetchall(), scope.attrs)


def _cut_first_bucket(columns: dict[str, Any], read: SeriesRead) -> dict[str, Any]:
    """A bucket cut by the range's start is keyed at the start, so that every row lies in
    ``[start_ns, end_ns)`` (``Store.series``) and an analysis of the range keeps it."""
    import numpy as np

    if read.step_s is None or not len(columns["time_ns"]):
        return columns
    return {**columns, "time_ns": np.maximum(columns["time_ns"], read.start_ns)}


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


#: (attribute, how to convert its stored float) per metric, in METRIC_ATTRS order.
_METRIC_CONVERTERS: tuple[tuple[str, Callable[[float], Any]], ...] = tuple(
    (a, {Kind.BOOL: bool, Kind.FLOAT: float, Kind.INT: int}[FIELD_BY_ATTR[a].kind])
    for a in METRIC_ATTRS
)


def _sample_from_row(row: Sequence[Any]) -> GpuSample:
    """A sample from (time_ns, host, gpu_index, uuid, name, lost, metrics... (NaN: not
    measured), then the tail's columns)."""
    time_ns, host, gpu_index, uuid, name, lost = row[:6]
    kwargs: dict[str, Any] = {
        attr: convert(v)
        for (attr, convert), v in zip(_METRIC_CONVERTERS, row[6:], strict=False)
        if v == v  # not NaN
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
