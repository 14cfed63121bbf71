"""The embedded store: SQLite (stdlib), WAL mode, one writer and many readers across processes.

The file's format is versioned and self-describing (``format``; docs/storage.md). The raw
samples (format 3) are in segment files beside it (``segments``, ``sqlite_segments``): each round
appended once, a closed segment kept as the stored block. Tables:

- ``gpus``: one row per GPU (host, gpu_index, uuid; name) with the time of its newest sample
  (recorded when a block closes; ``latest()`` finds newer ones in the segments). ``tails``:
  what a sample carries besides metrics, referred to by id (``rounds``).
- ``segments``: the index of the segment files. ``head`` and ``chunks``: the raw samples of a
  file written in format 2 (``rounds``, ``chunks``), read as they are until the retention.
- ``rollups``: 1-minute, 5-minute and 1-hour buckets per GPU as column arrays (``rollups``),
  computed by the one rollup rule (``rollup_rule.combine``): from raw samples for minutes, from
  minutes for 5-minute buckets and hours. Every read that aggregates uses the same function.

Rollups follow *data* time, never the wall clock. A 1-minute bucket is rolled once the newest data
time has passed its end by ``rollup_grace_s``; 5-minute buckets and hours are rolled from
minutes. A sample that arrives for a bucket already rolled (a spool replaying an outage) marks the
bucket, and the 5-minute bucket and hour it is in, dirty; dirty buckets are recomputed once a
later write has moved past them (a replay recomputes each bucket once, not once per batch), or by
``flush_rollups()``. Reads never trust a dirty or not-yet-rolled
bucket: they aggregate those from the level below, so a read is always exact.

Retention is by data time too: data older than the newest data time minus the retention of its
level is deleted (checked once per minute of data time; raw segments go whole).
A host whose clock runs far ahead moves the newest data time with it; the collector stamps
samples with a synchronised clock.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import zstandard

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import decode_line
from gpuwatt.model import GpuSample
from gpuwatt.sample_rows import SampleRows
from gpuwatt.store import (
    StoreRejected,
    chunks,
    codec,
    format,
    frames,
    raw,
    rounds,
    segments,
    sqlite_reads,
    sqlite_rows,
    sqlite_schema,
)
from gpuwatt.store.base import SeriesRead
from gpuwatt.store.rollup_rule import (
    LEVELS,
    NULL_TIME,
)
from gpuwatt.store.sqlite_maintenance import Maintenance
from gpuwatt.store.sqlite_reads import NS_PER_S
from gpuwatt.store.sqlite_segments import SegmentAppender

if TYPE_CHECKING:
    import pandas as pd

F = TypeVar("F", bound=Callable[..., Any])

DAY_S = 86_400
#: How much of a file written before the 5-minute level gets 5-minute buckets when a gpuwatt
#: that has the level first opens it (rolled from its minutes in the transaction that opens it;
#: reads take older time from minutes): docs/storage.md.
LEVEL_BACKFILL_S = DAY_S


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
        except OSError as exc:  # a segment file (disk full, ...)
            raise StoreUnavailable(f"embedded store {self.path}: {exc}") from exc

    return wrapped  # type: ignore[return-value]


class SqliteStore(Maintenance):
    """SQLite store. Safe for one writer thread and many reader threads in one process, and for
    one writing process and many reading processes on one file (WAL)."""

    #: ``series_many`` reads in one transaction and aggregates the newest raw samples once for
    #: the reads that cover them: a caller gives it all of a view's reads in one call.
    reads_share_work = True

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
        self._states: dict[str, sqlite_rows.GpuState] = {}  # by UUID
        self._tail_ids: dict[tuple[Any, ...], int] = {}
        self._newest_ns = NULL_TIME  # the newest data time written (``_maintain``)
        self._fresh_ids = False  # ids inserted by the write under way (``_commit_ids``)
        self._last_times: dict[int, int] = {}  # GPU id -> newest sample not in ``gpus`` yet
        self._cctx = zstandard.ZstdCompressor(level=codec.ZSTD_LEVEL)
        self._closed = False
        self._writer = self._connect()
        with contextlib.suppress(sqlite3.OperationalError):
            # Another process may hold the file; WAL is persistent, so it is set by whoever
            # created it first. The page size only takes on a file not created yet.
            self._writer.execute(f"PRAGMA page_size={format.PAGE_SIZE}")
            self._writer.execute("PRAGMA journal_mode=WAL").close()
        try:
            self._columns = self._open_format()
        except BaseException:
            self.close()
            raise
        self._layout = rounds.Layout(self._columns.attrs)
        self._encode_rows = rounds.compile_encoder(sqlite_schema.KEY_ATTRS, self._layout)
        self._row_encoder = sqlite_rows.RowEncoder(sqlite_schema.KEY_ATTRS, self._layout)
        self._segments = SegmentAppender(self._writer, self._columns.attrs)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _open_format(self) -> format.Columns:
        """Check the file's format (a new file gets this one) and add the schema's new metric
        columns to it; set when the WAL is checkpointed (``format.WAL_CHECKPOINT_BYTES``)."""
        con = self._writer
        try:
            (page_size,) = con.execute("PRAGMA page_size").fetchone()
            pages = max(1, format.WAL_CHECKPOINT_BYTES // page_size)
            con.execute(f"PRAGMA wal_autocheckpoint={pages}").close()
            with self._transaction(con):
                if not format.check(con, self.path):
                    for statement in sqlite_schema.SCHEMA_SQL.split(";"):
                        if statement.strip():
                            con.execute(statement)
                    format.stamp(con)
                sqlite_schema.upgrade(con)
                self._columns = format.add_columns(con, format.read_columns(con))
                self._add_levels(con, LEVEL_BACKFILL_S * NS_PER_S)
                return self._columns
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
        # Deleted rows are zeroed where the page is written anyway, but a page that becomes free
        # is not written again (Debian builds SQLite with secure_delete on: every head page
        # that a compaction freed was written once more, a quarter of the store's writes;
        # bench/store_write.py). Nothing in the file is secret.
        con.execute("PRAGMA secure_delete=FAST")
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
            if hasattr(self, "_segments"):  # (not when the file was refused)
                self._segments.close_store(self._writer)
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
        with self._writing() as con:
            self._write(con, samples)

    @_store_errors
    def write_rows(self, rows: SampleRows) -> None:
        """``write_samples`` for samples decoded as rows (``sample_rows``: a spool replay): the
        same rows stored, with no ``GpuSample`` built per sample (``sqlite_rows``), in one
        transaction. Raises ``TypeError`` or ``ValueError`` for a value that is not a number
        (nothing written: ``write_samples`` of ``rows.samples()`` says which)."""
        if not len(rows):
            return
        with self._writing() as con, self._transaction(con):
            values, gids, times = self._row_encoder.encode(
                rows, self._states, functools.partial(self._new_state, con)
            )
            self._commit_ids(con)
            self._write_values(con, values, gids, times)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """The writer's connection, held for one write; what a write that fails (its
        transaction rolled back) had recorded of ids is forgotten."""
        with self._lock:
            if self._closed:
                raise RuntimeError("store is closed")
            try:
                yield self._writer
            except BaseException:
                self._forget_ids()  # ids inserted by the rolled-back transaction are gone
                self._segments.rolled_back()
                raise
            self._segments.committed()

    def _write_values(
        self, con: sqlite3.Connection, values: np.ndarray, gids: list[int], times: np.ndarray
    ) -> None:
        """Store packed rows (``values[i]`` of GPU ``gids[i]`` at ``times[i]``), a round per run
        of one time; the same GPU twice in a run: the last one is kept."""
        cuts = np.flatnonzero(times[1:] != times[:-1]) + 1
        bounds = [0, *cuts.tolist(), len(times)]
        t_list: list[int] = times.tolist()
        values = self._segments.rounded(values)
        gid_array = np.array(gids, dtype=np.int64)
        for a, b in itertools.pairwise(bounds):
            run = gids[a:b]
            if len(set(run)) == len(run):
                self._segments.append(con, t_list[a], gid_array[a:b], values[a:b])
            else:
                keep = {g: i for i, g in enumerate(run, a)}
                self._segments.append(con, t_list[a], list(keep), values[list(keep.values())])
        last = self._last_times
        newest = dict(zip(gids, t_list, strict=True))  # the last time of each GPU...
        if len(bounds) > 2 and not bool((times[1:] >= times[:-1]).all()):
            newest = {}  # ...is its newest only when the times never go back
            for g, t in zip(gids, t_list, strict=True):
                if newest.get(g, t) <= t:
                    newest[g] = t
        for g, t in newest.items():
            if last.get(g, t) <= t:
                last[g] = t
        self._maintain(con, t_list, t_list[0] if len(bounds) == 2 else min(t_list), max(t_list))

    def _commit_ids(self, con: sqlite3.Connection) -> None:
        """Commit the GPU and tail ids inserted for a write before its rounds go into the
        segment (which no rollback undoes): a round there never names an id rolled back."""
        if self._fresh_ids:
            con.execute("COMMIT")
            con.execute("BEGIN IMMEDIATE")
            self._fresh_ids = False

    def _forget_ids(self) -> None:
        self._fresh_ids = False
        self._row_encoder.forget()
        self._newest_ns = NULL_TIME
        self._last_times.clear()
        self._gpu_ids.clear()
        self._tail_ids.clear()
        self._states.clear()

    def _write(self, con: sqlite3.Connection, samples: Sequence[GpuSample]) -> None:
        ncols = len(self._columns.attrs)
        with self._transaction(con):
            parts, gids, times = self._encode(con, samples)
            self._commit_ids(con)
            t_min, t_max = min(times), max(times)
            values = np.frombuffer(b"".join(parts), "<f8").reshape(-1, ncols + 2)
            values = self._segments.rounded(values)
            if t_min == t_max and len(set(gids)) == len(gids):  # a round: one time, GPUs once
                self._segments.append(con, t_max, gids, values)
            else:
                by_time: dict[int, dict[int, int]] = {}
                for i, (g, t) in enumerate(zip(gids, times, strict=True)):
                    by_time.setdefault(t, {})[g] = i  # the same GPU and time twice: keep the last
                for t in sorted(by_time):
                    rows = by_time[t]
                    self._segments.append(con, t, list(rows), values[list(rows.values())])
            last = self._last_times
            if t_min == t_max:
                for g in gids:
                    last[g] = t_max if last.get(g, t_max) <= t_max else last[g]
            else:
                for g, t in zip(gids, times, strict=True):
                    if last.get(g, t) <= t:
                        last[g] = t
            self._maintain(con, times, t_min, t_max)

    def _gpu_id(self, con: sqlite3.Connection, key: tuple[str, int, str, str]) -> int:
        gid = self._gpu_ids.get(key)
        if gid is None:
            self._fresh_ids = True
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
        tail = sqlite_schema.tail_row(key)
        tid = self._tail_ids.get(tail)
        if tid is None:
            if len(self._tail_ids) >= 65536:
                self._tail_ids.clear()
            self._fresh_ids = True
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

    def _new_state(
        self, con: sqlite3.Connection, key: tuple[Any, ...], time_ns: int
    ) -> sqlite_rows.GpuState:
        """Make and record the state of a GPU first seen, or whose key changed."""
        states = self._states
        st = states.get(key[2])
        if st is not None and st.key[:4] == key[:4]:
            gid, plan = st.gid, st.plan
        else:  # a new GPU (or another GPU with the same UUID)
            if len(states) >= 65536:
                states.clear()
            gid, plan = self._gpu_id(con, key[:4]), None
        st = sqlite_rows.GpuState(gid, key, float(self._tail_id(con, key, time_ns)), plan)
        states[key[2]] = st
        self._row_encoder.forget()  # it keeps the states it saw
        return st

    def _encode(
        self, con: sqlite3.Connection, samples: Sequence[GpuSample]
    ) -> tuple[list[bytes], list[int], list[int]]:
        """Each sample's packed row (``rounds``), GPU id and time."""
        states = self._states
        new_state = functools.partial(self._new_state, con)
        parts: list[bytes] = []
        gids: list[int] = []
        times: list[int] = []
        self._encode_rows(samples, states.get, new_state, parts.append, gids.append, times.append)
        return parts, gids, times

    # --- rollups, compaction and retention (``sqlite_maintenance``) ---------------------------

    @_store_errors
    def compact(self) -> None:
        """Bring the raw samples to their stored form now, the open block included: the open
        segment is closed (fsync'd; the next write opens another), and what a format 2 file
        still has in its head moves into compressed chunks. For a store at rest
        (``bench/storage.py``)."""
        with self._lock, self._transaction(self._writer):
            self._compact(self._writer, 2**62)
            self._segments.close(self._writer)  # the open segment too: written once, at rest

    @_store_errors
    def flush_rollups(self) -> None:
        """Recompute every dirty bucket now (normally done once writes have moved past it)."""
        with self._lock, self._transaction(self._writer):
            for level in LEVELS:  # finest first: a coarser bucket waits for its minutes
                self._recompute_dirty(self._writer, level, 2**62)

    # --- reads --------------------------------------------------------------------------------

    @_store_errors
    def count_samples(self, start_ns: int, end_ns: int) -> int:
        with self._reader() as con:
            if segments.has_index(con) or raw.head_overlaps_chunks(con, start_ns, end_ns):
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
    def xid_events(
        self, start_ns: int, end_ns: int, *, hosts: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """``base.xid_events``: the raw samples in the range that carry XIDs."""
        with self._reader() as con:
            columns = sqlite_reads.xid_columns(con, start_ns, end_ns, hosts)
            gpus = con.execute("SELECT id, host, gpu_index, uuid, name FROM gpus").fetchall()
        return frames.frame(columns, ("xid_last", "xid_count"), gpus)

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
