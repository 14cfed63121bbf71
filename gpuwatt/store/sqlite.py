"""The embedded store: SQLite (stdlib), WAL mode, one writer and many readers across processes.

The file's format is versioned and self-describing (``format``; docs/storage.md). Tables:

- ``gpus``: one row per GPU (host, gpu_index, uuid; name) with the time of its newest sample
  (recorded once a minute of data time; ``latest()`` finds newer ones in the head).
- ``head`` and ``tails``: the recent raw samples as written, one row per time with every GPU's
  values packed (``rounds``). Model units and attribute names.
- ``chunks``: closed 10-minute blocks of raw samples, one compressed chunk per block and host
  (``chunks``, ``codec``); a block is compacted once data time has passed its end by
  ``rollup_grace_s``.
- ``rollups``: 1-minute and 1-hour buckets per GPU as column arrays (``rollups``), computed by
  the one rollup rule (``rollup_rule.combine``): from raw samples for minutes, from minutes for
  hours. Every read that aggregates uses the same function.

Rollups follow *data* time, never the wall clock. A 1-minute bucket is rolled once the newest data
time has passed its end by ``rollup_grace_s``; hours are rolled from minutes. A sample that
arrives for a bucket already rolled (a spool replaying an outage) marks the bucket dirty; dirty
buckets are recomputed once a later write has moved past them (a replay recomputes each bucket
once, not once per batch), or by ``flush_rollups()``. Reads never trust a dirty or not-yet-rolled
bucket: they aggregate those from the level below, so a read is always exact.

Retention is by data time too: data older than the newest data time minus the retention of its
level is deleted (checked once per minute of data time; raw chunks go a whole block at a time).
A host whose clock runs far ahead moves the newest data time with it; the collector stamps
samples with a synchronised clock.
"""

from __future__ import annotations

import contextlib
import functools
import json
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import zstandard

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import decode_line, format_processes
from gpuwatt.model import GpuSample
from gpuwatt.store import (
    LAST_VALUE_ATTRS,
    StoreRejected,
    chunks,
    codec,
    format,
    frames,
    raw,
    rollups,
    rounds,
    sqlite_reads,
)
from gpuwatt.store.base import SeriesRead
from gpuwatt.store.rollup_rule import NULL_TIME, as_level, combine
from gpuwatt.store.sqlite_reads import BLOCK_NS, HOUR_NS, MINUTE_NS, NS_PER_S, floor_ns

if TYPE_CHECKING:
    import pandas as pd

F = TypeVar("F", bound=Callable[..., Any])

DAY_S = 86_400
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

_SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS gpus (
  id INTEGER PRIMARY KEY,
  host TEXT NOT NULL,
  gpu_index INTEGER NOT NULL,
  uuid TEXT NOT NULL,
  name TEXT NOT NULL,
  last_time_ns INTEGER,
  UNIQUE (host, gpu_index, uuid)
);
{format.COLUMNS_SQL}
{rounds.SCHEMA_SQL}
{chunks.SCHEMA_SQL}
{rollups.SCHEMA_SQL}
CREATE TABLE IF NOT EXISTS rollup_dirty (
  level_ns INTEGER NOT NULL,
  bucket_ns INTEGER NOT NULL,
  PRIMARY KEY (level_ns, bucket_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER);
"""


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
        rollup_grace_s: int = 30,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.retention_raw_ns = int(retention_raw_s) * NS_PER_S
        self.retention_1m_ns = int(retention_1m_s) * NS_PER_S
        self.retention_1h_ns = int(retention_1h_s) * NS_PER_S
        self.rollup_grace_ns = int(rollup_grace_s) * NS_PER_S
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()  # guards the writer connection and the connection list
        self._connections: list[sqlite3.Connection] = []
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._gpu_ids: dict[tuple[str, int, str, str], int] = {}
        self._states: dict[str, _GpuState] = {}  # by UUID
        self._tail_ids: dict[tuple[Any, ...], int] = {}
        self._newest_ns = NULL_TIME  # the newest data time written (``_maintain``)
        self._last_times: dict[int, int] = {}  # GPU id -> newest sample not in ``gpus`` yet
        self._cctx = zstandard.ZstdCompressor(level=codec.ZSTD_LEVEL)
        self._closed = False
        self._writer = self._connect()
        with contextlib.suppress(sqlite3.OperationalError):
            # Another process may hold the file; WAL is persistent, so it is set by whoever
            # created it first.
            self._writer.execute("PRAGMA journal_mode=WAL").close()
        try:
            self._columns = self._open_format()
        except BaseException:
            self.close()
            raise
        self._layout = rounds.Layout(self._columns.attrs)
        self._encode_rows = rounds.compile_encoder(_KEY_ATTRS, self._layout)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _open_format(self) -> format.Columns:
        """Check the file's format (a new file gets this one) and add the schema's new metric
        columns to it."""
        con = self._writer
        try:
            with self._transaction(con):
                if not format.check(con, self.path):
                    for statement in _SCHEMA_SQL.split(";"):
                        if statement.strip():
                            con.execute(statement)
                    format.stamp(con)
                return format.add_columns(con, format.read_columns(con))
        except format.FormatError as exc:
            raise StoreRejected(str(exc)) from exc
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"embedded store {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreRejected(f"embedded store {self.path} cannot be read: {exc}") from exc

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
        self._newest_ns = NULL_TIME
        self._last_times.clear()
        self._gpu_ids.clear()
        self._tail_ids.clear()
        self._states.clear()

    def _write(self, con: sqlite3.Connection, samples: Sequence[GpuSample]) -> None:
        ncols = len(self._columns.attrs)
        with self._transaction(con):
            parts, gids, times = self._encode(con, samples)
            t_min, t_max = min(times), max(times)
            if t_min == t_max and len(set(gids)) == len(gids):  # a round: one time, GPUs once
                rounds.insert(con, t_max, gids, b"".join(parts), ncols)
            else:
                by_time: dict[int, dict[int, int]] = {}
                for i, (g, t) in enumerate(zip(gids, times, strict=True)):
                    by_time.setdefault(t, {})[g] = i  # the same GPU and time twice: keep the last
                for t in sorted(by_time):
                    rows = by_time[t]
                    vals = b"".join(parts[i] for i in rows.values())
                    rounds.insert(con, t, list(rows), vals, ncols)
            last = self._last_times
            if t_min == t_max:
                for g in gids:
                    last[g] = t_max if last.get(g, t_max) <= t_max else last[g]
            else:
                for g, t in zip(gids, times, strict=True):
                    if last.get(g, t) <= t:
                        last[g] = t
            self._maintain(con, times, t_min, t_max)

    def _flush_last_times(self, con: sqlite3.Connection) -> None:
        """Record each GPU's newest sample in ``gpus`` (done once a minute of data time and
        before a compaction, not every round: a page less to write per round). ``latest()``
        finds what is newer in the head rows from ``last_times_until`` on."""
        by_time: dict[int, list[int]] = {}
        for g, t in self._last_times.items():
            by_time.setdefault(t, []).append(g)
        for t, ids in by_time.items():
            con.execute(
                "UPDATE gpus SET last_time_ns = ?1 WHERE id IN (SELECT value FROM json_each(?2)) "
                "AND (last_time_ns IS NULL OR last_time_ns < ?1)",
                (t, json.dumps(sorted(ids))),
            )
        self._last_times.clear()
        self._set_meta(con, "last_times_until", self._newest_ns)

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
        self._encode_rows(samples, states.get, new_state, parts.append, gids.append, times.append)
        return parts, gids, times

    # --- rollups, compaction and retention ----------------------------------------------------

    @staticmethod
    def _meta(con: sqlite3.Connection) -> dict[str, int]:
        return sqlite_reads.meta(con)

    @staticmethod
    def _set_meta(con: sqlite3.Connection, key: str, value: int) -> None:
        con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _maintain(
        self, con: sqlite3.Connection, times: Sequence[int], t_min: int, t_max: int
    ) -> None:
        meta = self._meta(con)
        newest = max(meta.get("max_time_ns", t_max), t_max, self._newest_ns)
        self._newest_ns = newest
        # Recorded once a minute of data time (a page less to write per round): what a new
        # writer needs of it is which minutes and blocks are over, and those are recorded.
        if newest >= meta.get("max_time_ns", NULL_TIME) + MINUTE_NS:
            self._set_meta(con, "max_time_ns", newest)
            self._flush_last_times(con)
        up_m = meta.get("rolled_60")
        up_h = meta.get("rolled_3600")
        if up_m is None:
            up_m = floor_ns(t_min, MINUTE_NS)
            up_h = floor_ns(t_min, HOUR_NS)
            self._set_meta(con, "rolled_3600", up_h)
        assert up_h is not None
        # Late samples: buckets already rolled become dirty.
        if t_min < up_m:
            minutes = {floor_ns(t, MINUTE_NS) for t in times if t < up_m}
            con.executemany(
                "INSERT OR IGNORE INTO rollup_dirty VALUES (?, ?)",
                [(MINUTE_NS, b) for b in minutes],
            )
            hours = {floor_ns(b, HOUR_NS) for b in minutes if b < up_h}
            con.executemany(
                "INSERT OR IGNORE INTO rollup_dirty VALUES (?, ?)", [(HOUR_NS, b) for b in hours]
            )
        # Roll minutes the data has moved past.
        new_up_m = max(up_m, floor_ns(newest - self.rollup_grace_ns, MINUTE_NS))
        if new_up_m > up_m:
            self._roll(con, MINUTE_NS, up_m, new_up_m)
        if new_up_m != meta.get("rolled_60"):
            self._set_meta(con, "rolled_60", new_up_m)
        # Recompute dirty minutes this write has moved past, then hours.
        self._recompute_dirty(con, MINUTE_NS, t_min)
        new_up_h = max(up_h, floor_ns(new_up_m, HOUR_NS))
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
        # Compact the blocks the data has moved past (and, once a minute of data time, samples
        # that arrived late for blocks compacted before).
        compacted = meta.get("compacted_until", floor_ns(t_min, BLOCK_NS))
        new_compacted = max(compacted, floor_ns(newest - self.rollup_grace_ns, BLOCK_NS))
        last_ret = meta.get("retention_at_ns")
        check = last_ret is None or newest - last_ret >= _RETENTION_CHECK_NS
        if new_compacted > compacted or (check and raw.head_has_before(con, compacted)):
            self._compact(con, new_compacted)
        if new_compacted != meta.get("compacted_until"):
            self._set_meta(con, "compacted_until", new_compacted)
        if check:
            self._apply_retention(con, newest)
            self._set_meta(con, "retention_at_ns", newest)

    def _compact(self, con: sqlite3.Connection, before_ns: int) -> None:
        self._flush_last_times(con)  # head rows after last_times_until must stay in the head
        host_of = dict(con.execute("SELECT id, host FROM gpus").fetchall())
        chunks.compact(con, before_ns, len(self._columns.attrs), host_of, self._cctx)

    @_store_errors
    def compact(self) -> None:
        """Move every raw sample of the head into compressed chunks now, the open block
        included (normally a block is compacted once data time has passed its end). For a
        store at rest (``bench/storage.py``); samples written later for the same block wait
        in the head and are merged into its chunk when the block closes."""
        with self._lock, self._transaction(self._writer):
            self._compact(self._writer, 2**62)

    def _roll(self, con: sqlite3.Connection, level_ns: int, start_ns: int, end_ns: int) -> None:
        """(Re)compute the ``level_ns`` buckets in ``[start_ns, end_ns)`` from the level below,
        by the rollup rule."""
        columns = self._columns
        col_ids = columns.index
        if level_ns == HOUR_NS:
            cols = rollups.read(con, MINUTE_NS, start_ns, end_ns, columns.attrs, col_ids)
            out = combine(cols, HOUR_NS, columns.attrs, LAST_VALUE_ATTRS, level_ns=MINUTE_NS)
            rollups.write(con, HOUR_NS, start_ns, end_ns, out, col_ids)
            return
        # Minutes from raw samples, a block at a time, skipping time without samples.
        lo = start_ns
        while lo < end_ns:
            first = raw.first_raw_time(con, lo, end_ns)
            if first is None:
                con.execute(
                    "DELETE FROM rollups WHERE level_ns = ? AND time_ns >= ? AND time_ns < ?",
                    (MINUTE_NS, lo, end_ns),
                )
                break
            hi = min(end_ns, floor_ns(first, MINUTE_NS) + BLOCK_NS)
            samples = raw.read(con, lo, hi, tuple(range(len(columns.attrs))))
            level = as_level(
                samples.time_ns,
                samples.gpu_id,
                samples.lost,
                {a: samples.values[:, i] for i, a in enumerate(columns.attrs)},
            )
            out = combine(level, MINUTE_NS, columns.attrs, LAST_VALUE_ATTRS, level_ns=0)
            rollups.write(con, MINUTE_NS, lo, hi, out, col_ids)
            # The tails these samples refer to are still in use (``_apply_retention``).
            tails = np.unique(samples.tail).astype(np.int64).tolist()
            con.execute(
                "UPDATE tails SET last_ns = ?1 WHERE id IN (SELECT value FROM json_each(?2)) "
                "AND last_ns < ?1",
                (hi - 1, json.dumps(tails)),
            )
            lo = hi

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
        con.execute("DELETE FROM head WHERE time_ns < ?", (raw_cut,))
        chunks.delete_before(con, raw_cut)
        # A tail's last_ns is the newest of: its first sample, a GPU taking it up again
        # (``_tail_id``), the last minute rolled with it (``_roll``). A block before the cut
        # is kept whole until it ends before the cut: its tails are kept a block longer.
        # Those a GPU uses now (samples written after days without any) stay.
        current = json.dumps(sorted({int(st.tail) for st in self._states.values()}))
        deleted = con.execute(
            "DELETE FROM tails WHERE last_ns < ? AND id NOT IN (SELECT value FROM json_each(?))",
            (raw_cut - BLOCK_NS, current),
        ).rowcount
        if deleted:
            self._tail_ids.clear()
        # A dirty minute whose raw rows are gone cannot be recomputed; keep the rollup as is.
        con.execute(
            "DELETE FROM rollup_dirty WHERE level_ns = ? AND bucket_ns < ?",
            (MINUTE_NS, raw_cut),
        )
        rollups.delete_before(con, MINUTE_NS, newest_ns - self.retention_1m_ns)
        con.execute(
            "DELETE FROM rollup_dirty WHERE level_ns = ? AND bucket_ns < ?",
            (HOUR_NS, newest_ns - self.retention_1m_ns),
        )
        rollups.delete_before(con, HOUR_NS, newest_ns - self.retention_1h_ns)

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
            if raw.head_overlaps_chunks(con, start_ns, end_ns):
                return len(raw.read(con, start_ns, end_ns, ()).time_ns)
            return rounds.count(con, start_ns, end_ns) + chunks.count(con, start_ns, end_ns)

    @_store_errors
    def latest(self, *, since_ns: int | None = None) -> list[GpuSample]:
        with self._reader() as con:
            return sqlite_reads.latest(con, since_ns)

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
    def series_many(
        self, reads: Sequence[SeriesRead], *, on_done: Callable[[], None] | None = None
    ) -> list[pd.DataFrame]:
        """Several ``series`` reads in one read transaction (they see the same data). The raw
        samples not rolled up yet, whose aggregation is most of the cost of a read that ends
        near now, are aggregated once for the reads that cover the same ones. ``on_done`` is
        called once per read as it is done."""
        memo: dict[tuple[Any, ...], dict[str, Any]] = {}
        columns = []
        with self._reader() as con:
            for r in reads:
                columns.append(sqlite_reads.series_columns(con, memo, r))
                if on_done is not None:
                    on_done()
            gpus = con.execute("SELECT id, host, gpu_index, uuid, name FROM gpus").fetchall()
        return [
            frames.frame(sqlite_reads.cut_first_bucket(c, r), attrs, gpus)
            for (c, attrs), r in zip(columns, reads, strict=True)
        ]
