"""Segment files: the embedded store's raw samples in format 3, each byte written once.

The writer appends each collector round to the *open* segment, a file in a 0700 directory
beside the database (``gpuwatt.db-segments/0000000001.seg``, 0600), as a record
(``segment_codec``) compressed by one zstd stream that is flushed at the end of every round: a
reader decodes every round up to the last one whose bytes are complete. Nothing about a round
is written into SQLite, so a round costs the bytes it adds to the file (the kernel counts a
page of the page cache once each time it goes from clean to dirty), not a transaction's pages
written twice (WAL, then the file). Once data time has moved past the block of the segment's
first round (``chunks.BLOCK_NS``, 10 minutes), the segment is closed (its zstd frame ended, the
file fsync'd) and *is* the stored block: it is never written again, only deleted whole by the
raw retention. SQLite keeps the index (``segments``: id, time range, samples, whether closed),
the rollups and everything else.

A round whose time is earlier than the open segment's (late samples, a replay) is appended to
the open segment all the same: segments are in write order, their time ranges may overlap, and
of two copies of a sample (GPU, time) the one written later wins (a later record, a later
segment). Durability: a round whose ``write`` returned survives the writer's death (SIGKILL: it
is in the page cache); after a power loss, the rounds of the open segment not yet written back
by the kernel (~30 s) may be gone, and the file read up to its last whole record (CRC-checked).
A closed segment is fsync'd before the index records it closed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import zstandard

from gpuwatt.private_files import FILE_MODE, private_dir
from gpuwatt.store.codec import Rows, Span
from gpuwatt.store.segment_codec import FRAME, Decoder, Encoder, Record

MAGIC = b"GPWS"
VERSION = 1
HEADER = MAGIC + bytes((VERSION, 0, 0, 0))
#: zstd level of the stream: bench/store_write.py (demo: 19.6 B per GPU-sample at 3, 18.5 at 7)
ZSTD_LEVEL = 3
#: before each piece of the zstd stream (a round's, the frame's end): its length, so that a
#: reader feeds the decompressor whole pieces only (a torn or garbled piece ends the segment)
PIECE = struct.Struct("<I")
#: decoded rows a process keeps (segments are immutable once closed, the open one only grows)
CACHE_BYTES = 128 << 20

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS segments (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  t_min_ns INTEGER,
  t_max_ns INTEGER,
  n INTEGER NOT NULL DEFAULT 0,
  closed INTEGER NOT NULL DEFAULT 0
);
"""


def directory(db_path: str | Path) -> Path:
    return Path(f"{db_path}-segments")


def file_name(segment_id: int) -> str:
    """A segment's file name. Ids are never reused (``AUTOINCREMENT``), so a reader's decoded
    copy of a file (``_Cache``) can never stand for another file of the same name."""
    return f"{segment_id:010d}.seg"


class SegmentWriter:
    """The open segment of a writer: rounds appended, one ``write`` each."""

    def __init__(self, folder: Path, segment_id: int) -> None:
        private_dir(folder)  # 0700 whatever the umask
        self.id = segment_id
        self.path = folder / file_name(segment_id)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(self.path, flags, FILE_MODE)
        self._cobj = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj()
        self._encoder = Encoder()
        self.t_min_ns: int | None = None
        self.t_max_ns: int | None = None
        self.n = 0
        self.size_b = 0
        #: a write failed (disk full...): the file is cut back to its last whole round and
        #: the segment takes no more (the coder's state went past what the file holds)
        self.failed = False
        self._write(HEADER)
        _CACHE.started(self.path)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            done = os.write(self._fd, view)
            view = view[done:]
        self.size_b += len(data)

    def append(self, time_ns: int, gpu_ids: np.ndarray, rows: np.ndarray) -> None:
        """Append one round (``gpu_ids`` distinct); in the file when this returns."""
        record = self._encoder.encode(time_ns, gpu_ids, rows)
        piece = self._cobj.compress(record) + self._cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        whole = self.size_b
        try:
            self._write(PIECE.pack(len(piece)) + piece)
        except OSError:
            self.failed = True
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, whole)
            self.size_b = whole
            raise
        self.t_min_ns = time_ns if self.t_min_ns is None else min(self.t_min_ns, time_ns)
        self.t_max_ns = time_ns if self.t_max_ns is None else max(self.t_max_ns, time_ns)
        self.n += len(gpu_ids)
        _CACHE.written(self.path, self.size_b, Record(time_ns, gpu_ids, rows))

    def close(self) -> None:
        """End the zstd frame and fsync the file and its folder: it is not written again."""
        if self._fd < 0:
            return
        try:
            if not self.failed:  # (a failed one stays without its frame's end: read as torn)
                end = self._cobj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
                self._write(PIECE.pack(len(end)) + end)
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # its name too
        finally:
            os.close(folder)
        _CACHE.written(self.path, self.size_b, None)

    def abandon(self) -> None:
        """Close the file without ending it (the store is closing; a new writer closes it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _Decoded:
    """A segment file's records decoded so far, and where in the file decoding stopped."""

    def __init__(self) -> None:
        self.offset = len(HEADER)  # file bytes consumed
        self.dobj = zstandard.ZstdDecompressor().decompressobj()
        self.pending = b""  # decompressed bytes of a record not complete yet
        self.decoder = Decoder()
        self.records: list[Record] = []
        self.nbytes = 0
        #: the newest time of the records dropped to keep memory bounded (``trim``): a read
        #: that reaches back to it decodes the file again
        self.dropped_max_ns: int | None = None
        self.broken = False  # a garbled record: nothing after it is read
        self.fed = False  # filled by this process's writer, not from the file

    def add(self, record: Record) -> None:
        self.records.append(record)
        self.nbytes += record.rows.nbytes

    def trim(self, nbytes: int) -> None:
        """Drop the oldest records until at most ``nbytes`` are kept (the decoder's state,
        each GPU's last values, stays: new records still decode)."""
        k = 0
        while self.nbytes > nbytes and k < len(self.records):
            r = self.records[k]
            self.nbytes -= r.rows.nbytes
            if self.dropped_max_ns is None or r.time_ns > self.dropped_max_ns:
                self.dropped_max_ns = r.time_ns
            k += 1
        del self.records[:k]

    def feed(self, data: bytes) -> int:
        """Decode the whole pieces at the start of ``data`` (the file from ``offset``); how many
        bytes they were (a torn last piece is read again once it is whole)."""
        pos = 0
        while not self.broken and len(data) - pos >= PIECE.size:
            (length,) = PIECE.unpack_from(data, pos)
            end = pos + PIECE.size + length
            if end > len(data):
                break
            self._records(data[pos + PIECE.size : end])
            pos = end
        return pos

    def _records(self, piece: bytes) -> None:
        try:
            out = self.dobj.decompress(piece)
        except zstandard.ZstdError:
            self.broken = True
            return
        buf = self.pending + out
        pos = 0
        while len(buf) - pos >= FRAME.size:
            length, crc = FRAME.unpack_from(buf, pos)
            end = pos + FRAME.size + length
            if end > len(buf):
                break
            body = buf[pos + FRAME.size : end]
            if zlib.crc32(body) != crc:
                self.broken = True
                break
            self.add(self.decoder.decode(body))
            pos = end
        self.pending = buf[pos:]


class _Cache:
    """Decoded segments of this process, by path, least recently used dropped first past
    ``CACHE_BYTES``. A file is read from where its decoding stopped: the open segment of
    another process costs only its new rounds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Path, _Decoded] = OrderedDict()

    def started(self, path: Path) -> None:
        """This process's writer created ``path``: the rounds it appends are kept as given."""
        with self._lock:
            entry = self._entries[path] = _Decoded()
            entry.fed = True

    def written(self, path: Path, size_b: int, record: Record | None) -> None:
        """This process appended ``record`` to ``path`` (None: closed it), now ``size_b``."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is None or not entry.fed:
                return  # dropped (or read from the file): read from the file when asked
            if record is not None:
                entry.add(record)
            entry.offset = size_b
            self._shrink()

    def records(self, path: Path, start_ns: int = -(2**63)) -> list[Record]:
        """The whole records of a segment file (its new bytes decoded first); those older than
        ``start_ns`` may be left out."""
        with self._lock:
            entry = self._entries.pop(path, None) or _Decoded()
            self._entries[path] = entry  # most recently used
            if not entry.fed and not entry.broken:
                try:
                    with open(path, "rb") as f:
                        if entry.offset == len(HEADER) and f.read(len(HEADER)) != HEADER:
                            raise ValueError(f"{path} is not a gpuwatt segment file")
                        f.seek(entry.offset)
                        data = f.read()
                except FileNotFoundError:  # deleted by retention since the index was read
                    del self._entries[path]
                    return []
                entry.offset += entry.feed(data)
            records = list(entry.records)
            dropped = entry.dropped_max_ns is not None and entry.dropped_max_ns >= start_ns
            self._shrink()
        if dropped:  # this read reaches records dropped from memory: decode the file again
            return _decode_file(path).records
        return records

    def _shrink(self) -> None:
        """Past ``CACHE_BYTES``: segments least recently used dropped first, the newest one's
        oldest records last (a writer's minute rollups read its last minutes)."""
        total = sum(e.nbytes for e in self._entries.values())
        while total > CACHE_BYTES and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            total -= dropped.nbytes
        if total > CACHE_BYTES:
            for entry in self._entries.values():
                entry.trim(CACHE_BYTES // 2)

    def forget(self, path: Path) -> None:
        with self._lock:
            self._entries.pop(path, None)


_CACHE = _Cache()


def has_index(con: sqlite3.Connection) -> bool:
    found = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'segments'")
    return found.fetchone() is not None


def folder_of(con: sqlite3.Connection) -> Path:
    """The segment directory of the database ``con`` has open."""
    for _, name, file in con.execute("PRAGMA database_list"):
        if name == "main":
            return directory(file)
    raise ValueError("no main database")


def _wanted(con: sqlite3.Connection, start_ns: int, end_ns: int) -> list[int]:
    """The ids of the segments that may hold samples of ``[start_ns, end_ns)``, oldest first
    (an open segment's range is not in the index: it is always read)."""
    if not has_index(con):
        return []
    rows = con.execute(
        "SELECT id FROM segments WHERE closed = 0 OR (t_max_ns >= ? AND t_min_ns < ?) ORDER BY id",
        (start_ns, end_ns),
    )
    return [i for (i,) in rows]


def _records(con: sqlite3.Connection, start_ns: int, end_ns: int) -> Iterator[list[Record]]:
    ids = _wanted(con, start_ns, end_ns)
    if ids:
        folder = folder_of(con)
        for i in ids:
            yield _CACHE.records(folder / file_name(i), start_ns)


def read(con: sqlite3.Connection, span: Span) -> tuple[Rows, bool]:
    """The segments' samples of ``span``, in write order, and whether a (GPU, time) may be in
    them twice (a round written again, a segment that overlaps another: ``chunks.dedupe``)."""
    start_ns, end_ns, col_ids, gpu_ids = span
    cols = list(col_ids)
    times: list[int] = []
    counts: list[int] = []
    gids: list[np.ndarray] = []
    parts: list[np.ndarray] = []  # per record: lost, the columns asked for, tail (x its GPUs)
    picks: dict[int, list[int] | None] = {}  # by width: the positions to take
    for records in _records(con, start_ns, end_ns):
        for r in records:
            if not start_ns <= r.time_ns < end_ns:
                continue
            g = r.gpu_ids
            columns = r.rows.T  # the decoder's column-major array
            if gpu_ids is not None:
                keep = np.isin(g, gpu_ids)
                if not keep.any():
                    continue
                g, columns = g[keep], columns[:, keep]
            width = columns.shape[0]
            if width not in picks:
                ncols = width - 2
                ok = all(c < ncols for c in cols)
                picks[width] = [0, *(1 + c for c in cols), width - 1] if ok else None
            pick = picks[width]
            times.append(r.time_ns)
            counts.append(len(g))
            gids.append(g)
            parts.append(columns[pick] if pick is not None else _widened(columns, cols))
    if not times:
        e = np.zeros(0, np.int64)
        return Rows(e, e, np.zeros(0), np.zeros(0), np.zeros((0, len(cols))), tuple(cols)), False
    # of two copies of a (GPU, time) both are in the same round's time
    again = len(set(times)) < len(times)
    table = np.concatenate(parts, axis=1)
    rows_out = Rows(
        np.concatenate(gids),
        np.repeat(np.array(times, dtype=np.int64), counts),
        table[0],
        table[-1],
        table[1:-1].T,
        tuple(cols),
    )
    return rows_out, again


def _widened(columns: np.ndarray, cols: Sequence[int]) -> np.ndarray:
    """Lost, the metric columns ``cols`` and the tail of column-major raw rows, a column added
    after the rows were written as NaN."""
    width, n = columns.shape
    out = np.full((len(cols) + 2, n), np.nan)
    out[0], out[-1] = columns[0], columns[width - 1]
    for j, c in enumerate(cols):
        if c < width - 2:
            out[1 + j] = columns[1 + c]
    return out


def newest_times(con: sqlite3.Connection, since_ns: int) -> dict[int, int]:
    """Each GPU's newest sample time at or after ``since_ns`` in the segments."""
    gids: list[np.ndarray] = []
    times: list[int] = []
    counts: list[int] = []
    for records in _records(con, since_ns, 2**62):
        for r in records:
            if r.time_ns >= since_ns:
                gids.append(r.gpu_ids)
                times.append(r.time_ns)
                counts.append(len(r.gpu_ids))
    if not gids:
        return {}
    g = np.concatenate(gids)
    t = np.repeat(np.array(times, dtype=np.int64), counts)
    order = np.lexsort((t, g))
    g, t = g[order], t[order]
    last = np.r_[g[1:] != g[:-1], True]  # each GPU's newest
    return dict(zip(g[last].tolist(), t[last].tolist(), strict=True))


def first_time(con: sqlite3.Connection, start_ns: int, end_ns: int) -> int | None:
    """The time of the first sample in ``[start_ns, end_ns)`` in the segments."""
    if not has_index(con):
        return None
    (closed,) = con.execute(
        "SELECT min(max(t_min_ns, ?1)) FROM segments WHERE closed = 1 AND t_max_ns >= ?1 "
        "AND t_min_ns < ?2",
        (start_ns, end_ns),
    ).fetchone()
    found = [] if closed is None else [closed]
    open_ids = [i for (i,) in con.execute("SELECT id FROM segments WHERE closed = 0")]
    if open_ids:
        folder = folder_of(con)
        for i in open_ids:
            times = [r.time_ns for r in _CACHE.records(folder / file_name(i), start_ns)]
            found += [t for t in times if start_ns <= t < end_ns]
    return min(found) if found else None


def count(con: sqlite3.Connection, start_ns: int, end_ns: int) -> int:
    rows, _ = read(con, Span(start_ns, end_ns, ()))
    return len(rows.time_ns)


def _decode_file(path: Path) -> _Decoded:
    """A segment file decoded whole, outside the cache (empty if it is gone or not one)."""
    entry = _Decoded()
    with contextlib.suppress(FileNotFoundError):
        data = path.read_bytes()
        if data[: len(HEADER)] == HEADER:
            entry.feed(data[len(HEADER) :])
    return entry


def scan(path: Path) -> tuple[int | None, int | None, int]:
    """(t_min_ns, t_max_ns, samples) of a segment file written by a writer that died
    (``recover``): its whole records."""
    records = _decode_file(path).records
    times = [r.time_ns for r in records]
    n = sum(len(r.gpu_ids) for r in records)
    return (min(times) if times else None), (max(times) if times else None), n


def recover(con: sqlite3.Connection, folder: Path) -> None:
    """Close the segments a writer left open (it died, or closed the store): their time range
    and count recorded, the file fsync'd. What a torn last record held is not read."""
    for (i,) in con.execute("SELECT id FROM segments WHERE closed = 0").fetchall():
        path = folder / file_name(i)
        t_min, t_max, n = scan(path)
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _CACHE.forget(path)
        con.execute(
            "UPDATE segments SET t_min_ns = ?, t_max_ns = ?, n = ?, closed = 1 WHERE id = ?",
            (t_min, t_max, n, i),
        )


def open_new(con: sqlite3.Connection, folder: Path) -> SegmentWriter:
    """A new open segment, recorded in the index (inside the writer's transaction)."""
    (i,) = con.execute("INSERT INTO segments (closed) VALUES (0) RETURNING id").fetchone()
    return SegmentWriter(folder, i)


def close(con: sqlite3.Connection, writer: SegmentWriter) -> None:
    """Close the open segment and record it closed (inside the writer's transaction)."""
    writer.close()
    con.execute(
        "UPDATE segments SET t_min_ns = ?, t_max_ns = ?, n = ?, closed = 1 WHERE id = ?",
        (writer.t_min_ns, writer.t_max_ns, writer.n, writer.id),
    )


def delete_before(con: sqlite3.Connection, cut_ns: int) -> list[Path]:
    """Drop the closed segments whose samples are all before ``cut_ns`` from the index; the
    files to delete once the transaction has committed."""
    if not has_index(con):
        return []
    ids = [
        i
        for (i,) in con.execute(
            "DELETE FROM segments WHERE closed = 1 AND (t_max_ns IS NULL OR t_max_ns < ?) "
            "RETURNING id",
            (cut_ns,),
        )
    ]
    folder = folder_of(con)
    return [folder / file_name(i) for i in ids]
