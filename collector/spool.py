"""The collector's durable on-disk spool: every sample is on disk before it is sent anywhere.

Samples are appended to segment files and fsync'd, so a collector killed with
SIGKILL loses at most the tick it was in the middle of. A flusher reads batches from a cursor, sends
them to the store and only then advances the cursor: delivery is at-least-once, in order, and the
stores are idempotent (same GPU and timestamp stores once), so a replay after a crash duplicates
nothing. The spool is bounded: past ``max_bytes`` the oldest segments are dropped, loudly, with a
counter of the lines lost.

A spool holds one of two forms, chosen by the store it feeds (``Spool(binary=...)``): line
protocol for a store across the network (replay sends the lines as they are), or binary frames
of samples for a store on this machine, which takes ``GpuSample`` objects without a text round
trip (``spool_frames``). Segments of the other form, left by an earlier run, are still read and
delivered in order.

Layout of the directory::

    0000000000000001.lp   text segments, one line-protocol point per line, oldest first
    0000000000000002.gws  binary segments, a header then one frame of samples per tick
    cursor.json           {"segment": N, "offset": BYTES}: everything before it was delivered
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gpuwatt.collector import spool_frames
from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample
from gpuwatt.private_files import private_dir
from gpuwatt.sample_rows import SampleRows

log = logging.getLogger(__name__)

TEXT, BINARY = ".lp", ".gws"  # segment suffixes
_CURSOR = "cursor.json"
_CURSOR_BYTES = 64  # the cursor's fixed width: JSON padded with spaces


@dataclass(frozen=True, slots=True)
class SpoolBatch:
    """Points read from the spool (lines from a text segment, or samples from a binary one, as
    ``GpuSample`` objects or, when asked for, as ``rows``), and the position to commit once they
    are delivered."""

    lines: list[str]
    segment: int
    end_offset: int
    samples: list[GpuSample] = field(default_factory=list)
    rows: SampleRows | None = None

    def __len__(self) -> int:
        return len(self.lines) + len(self.samples) + (0 if self.rows is None else len(self.rows))


class Spool:
    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        segment_bytes: int = 4 * 1024 * 1024,
        fsync: bool = True,
        binary: bool = False,
    ) -> None:
        """``binary``: append samples as binary frames (a store on this machine) rather than as
        line protocol (a store across the network)."""
        if segment_bytes <= 0 or max_bytes < 2 * segment_bytes:
            raise ValueError("spool max_bytes must be at least two segments")
        self.directory = private_dir(directory)  # samples name hosts, jobs and processes
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._fsync = fsync
        self._suffix_written = BINARY if binary else TEXT
        self._encoder = None if binary else LineEncoder()
        self._lock = threading.Lock()
        self.dropped_lines = 0  # lines lost to the size bound since this process started
        self._suffixes: dict[int, str] = self._scan()
        self._readers: dict[int, spool_frames.SegmentReader] = {}
        self._segments: list[int] = sorted(self._suffixes)
        self._cursor_segment, self._cursor_offset = self._read_cursor()
        self._reading: tuple[int, BinaryIO] | None = None  # the segment being read, open
        self._repair_tail()
        if not self._segments:
            self._new_segment(max(self._cursor_segment, 1), self._suffix_written)
        if self._cursor_segment not in self._segments:
            self._cursor_segment, self._cursor_offset = self._segments[0], 0
        self._cursor_fd = self._open_cursor()
        self._active = _open_private(self._path(self._segments[-1]))
        self._active_bytes = self._active.tell()  # the active segment's size

    # --- writing ---------------------------------------------------------------------------------
    @property
    def binary(self) -> bool:
        """Whether samples are appended as binary frames."""
        return self._suffix_written == BINARY

    def append_samples(self, samples: Sequence[GpuSample]) -> None:
        """Append samples durably (fsync) before returning, in the spool's form."""
        if not samples:
            return
        if self._encoder is None:
            self._write(spool_frames.encode_frame(samples), BINARY)
        else:
            self.append(self._encoder.encode_many(samples))

    def append(self, lines: Sequence[str]) -> None:
        """Append line-protocol points durably (fsync) before returning (a text spool)."""
        if not lines:
            return
        if self.binary:
            raise ValueError("a binary spool takes samples (append_samples), not lines")
        self._write(("\n".join(lines) + "\n").encode("utf-8"), TEXT)

    def _write(self, data: bytes, suffix: str) -> None:
        with self._lock:
            if self._suffixes[self._segments[-1]] != suffix:
                self._rotate()  # a segment of the other form, from an earlier run
            self._active.write(data)
            self._active.flush()
            if self._fsync:
                os.fsync(self._active.fileno())
            self._active_bytes = self._active.tell()
            if self._active_bytes >= self.segment_bytes:
                self._rotate()
                # checked as a segment fills: pending bytes stay within one segment of the bound
                self._enforce_bound()

    def _rotate(self) -> None:
        self._active.close()
        self._new_segment(self._segments[-1] + 1, self._suffix_written)
        self._active = _open_private(self._path(self._segments[-1]))
        self._active_bytes = self._active.tell()
        if self._fsync:
            _fsync_dir(self.directory)

    def _new_segment(self, seq: int, suffix: str) -> None:
        """Create segment ``seq`` (a binary one starts with its header)."""
        self._suffixes[seq] = suffix
        self._segments.append(seq)
        with _open_private(self._path(seq)) as f:
            if suffix == BINARY:
                f.write(spool_frames.segment_header())
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())

    def _enforce_bound(self) -> None:
        while self._pending_bytes_locked() > self.max_bytes and len(self._segments) > 1:
            oldest = self._segments.pop(0)
            path = self._path(oldest)
            start = self._cursor_offset if oldest == self._cursor_segment else 0
            lost = self._count(oldest, start)
            self._forget(oldest)
            path.unlink(missing_ok=True)
            self.dropped_lines += lost
            self._cursor_segment, self._cursor_offset = self._segments[0], 0
            self._write_cursor()
            log.error(
                "spool over its bound of %d bytes: dropped %d oldest samples (%d dropped since "
                "start); the store has been unreachable for too long",
                self.max_bytes,
                lost,
                self.dropped_lines,
            )

    # --- reading and committing ------------------------------------------------------------------
    def read_batch(
        self, max_lines: int = 2000, max_bytes: int = 1024 * 1024, *, as_rows: bool = False
    ) -> SpoolBatch:
        """The next undelivered points (possibly none), oldest first: at most ``max_lines``
        lines, or the samples of whole frames (at least one frame, whatever its size).
        ``as_rows``: a binary segment's samples come as ``SpoolBatch.rows``, not as objects."""
        with self._lock:
            while True:
                seg, offset = self._cursor_segment, self._cursor_offset
                path = self._path(seg)
                if seg == self._segments[-1] and offset >= self._active_bytes:
                    return SpoolBatch([], seg, offset)  # all delivered: nothing to open
                if seg == self._segments[-1]:  # no bigger a read than what is there
                    max_bytes = max(1, min(max_bytes, self._active_bytes - offset))
                f = self._open_for_reading(seg)
                if f is None:
                    chunk = b""
                elif self._suffixes[seg] == BINARY:
                    batch = self._read_frames(seg, f, offset, max_lines, max_bytes, as_rows)
                    if batch is not None:
                        return batch
                    chunk = b""
                else:
                    f.seek(offset)
                    chunk = f.read(max_bytes)
                end = chunk.rfind(b"\n")
                if end >= 0:
                    # only "\n" ends a line: str.splitlines() would also cut at a CR, U+2028 or
                    # U+0085 that a name may hold (names are stored percent-encoded for CR only)
                    lines = chunk[:end].decode("utf-8").split("\n")
                    if len(lines) > max_lines:
                        lines = lines[:max_lines]
                        end = len(("\n".join(lines) + "\n").encode("utf-8")) - 1
                    return SpoolBatch(lines, seg, offset + end + 1)
                if seg == self._segments[-1]:
                    return SpoolBatch([], seg, offset)
                # this segment is fully delivered: move on and delete it
                self._segments.remove(seg)
                self._forget(seg)
                path.unlink(missing_ok=True)
                self._cursor_segment, self._cursor_offset = self._segments[0], 0
                self._write_cursor()

    def _open_for_reading(self, seg: int) -> BinaryIO | None:
        """Segment ``seg`` open for reading (kept open while it is the one being read)."""
        if self._reading is not None:
            if self._reading[0] == seg:
                return self._reading[1]
            self._reading[1].close()
            self._reading = None
        try:
            f = open(self._path(seg), "rb")  # noqa: SIM115 (kept; closed by _forget or close)
        except FileNotFoundError:
            return None
        self._reading = (seg, f)
        return f

    def _forget(self, seg: int) -> None:
        """Drop what is kept about segment ``seg`` (it is being deleted)."""
        del self._suffixes[seg]
        self._readers.pop(seg, None)
        if self._reading is not None and self._reading[0] == seg:
            self._reading[1].close()
            self._reading = None

    def _read_frames(
        self, seg: int, f: BinaryIO, offset: int, max_samples: int, max_bytes: int, as_rows: bool
    ) -> SpoolBatch | None:
        """The samples of the next whole frames of binary segment ``seg`` (open as ``f``); None
        when there are none after ``offset``."""
        reader = self._reader(seg, f)
        offset = max(offset, reader.header_end)
        f.seek(offset)
        data = f.read(max_bytes)
        head = spool_frames.FRAME.size
        if len(data) >= head:  # a frame larger than max_bytes is read whole
            need = head + spool_frames.FRAME.unpack_from(data)[0]
            if need > len(data):
                data += f.read(need - len(data))
        samples: list[GpuSample] = []
        payloads: list[bytes] = []  # as_rows: the frames, decoded by the store
        n = end = 0
        for start, stop, count in spool_frames.frames(data, 0):
            if n and n + count > max_samples:
                break
            if as_rows:
                payloads.append(data[start:stop])
            else:
                samples += reader.samples(data[start:stop])
            n += count
            end = stop
        if end == 0:
            if data and seg != self._segments[-1]:
                log.error(
                    "spool: %s has %d unreadable bytes after offset %d; skipped",
                    self._path(seg).name,
                    len(data),
                    offset,
                )
            return None
        if as_rows:
            rows = SampleRows(payloads, reader.rows, reader.decoder, n)
            return SpoolBatch([], seg, offset + end, rows=rows)
        return SpoolBatch([], seg, offset + end, samples)

    def _reader(self, seg: int, f: BinaryIO) -> spool_frames.SegmentReader:
        reader = self._readers.get(seg)
        if reader is None:
            f.seek(0)
            reader = self._readers[seg] = spool_frames.SegmentReader(f.read(64 * 1024))
        return reader

    def commit(self, batch: SpoolBatch) -> None:
        """Record that ``batch`` reached the store."""
        if not len(batch):
            return
        with self._lock:
            if batch.segment != self._cursor_segment:
                return  # the segment was dropped by the size bound meanwhile
            self._cursor_offset = batch.end_offset
            self._write_cursor()

    def pending_bytes(self) -> int:
        with self._lock:
            return self._pending_bytes_locked()

    def pending_lines(self) -> int:
        """Undelivered lines (reads the files: for tests and status, not the hot path)."""
        with self._lock:
            total = 0
            for seg in self._segments:
                start = self._cursor_offset if seg == self._cursor_segment else 0
                total += self._count(seg, start)
            return total

    def _count(self, seg: int, start: int) -> int:
        """Points in segment ``seg`` after byte ``start``."""
        try:
            data = self._path(seg).read_bytes()
        except FileNotFoundError:
            return 0
        if self._suffixes[seg] == TEXT:
            return data.count(b"\n", start)
        if len(data) <= start:
            return 0
        start = max(start, spool_frames.SegmentReader(data).header_end)
        return sum(count for _s, _e, count in spool_frames.frames(data, start))

    def close(self) -> None:
        with self._lock:
            if not self._active.closed:
                self._active.flush()
                if self._fsync:
                    os.fsync(self._active.fileno())
                self._active.close()
                os.close(self._cursor_fd)
                if self._reading is not None:
                    self._reading[1].close()
                    self._reading = None

    # --- internals -------------------------------------------------------------------------------
    def _pending_bytes_locked(self) -> int:
        total = 0
        for seg in self._segments:
            try:
                size = self._path(seg).stat().st_size
            except FileNotFoundError:
                continue
            total += size - (self._cursor_offset if seg == self._cursor_segment else 0)
        return total

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:016d}{self._suffixes[seq]}"

    def _scan(self) -> dict[int, str]:
        """Segment number -> suffix, of the segments on disk."""
        found: dict[int, str] = {}
        for suffix in (TEXT, BINARY):
            for p in self.directory.glob(f"*{suffix}"):
                if p.stem.isdigit():
                    if int(p.stem) in found:
                        raise spool_frames.SpoolFormatError(f"two segments numbered {p.stem}")
                    found[int(p.stem)] = suffix
        return found

    def _read_cursor(self) -> tuple[int, int]:
        first = self._segments[0] if self._segments else 1
        try:
            data = json.loads((self.directory / _CURSOR).read_text())
            seg, offset = int(data["segment"]), int(data["offset"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return first, 0
        if seg not in self._segments:
            return first, 0
        return seg, offset

    def _open_cursor(self) -> int:
        """The cursor file, open for writing in place; written now only where it does not hold
        this spool's position already (another process reading the spool, ``gpuwatt spool
        status``, then leaves a running collector's cursor alone)."""
        path = self.directory / _CURSOR
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            # A whole record from the start (written aside, then renamed): never read empty.
            tmp = self.directory / (_CURSOR + ".tmp")
            self._cursor_fd = fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            self._write_cursor()
            os.replace(tmp, path)
            return fd
        self._cursor_fd = fd
        if self._read_cursor() != (self._cursor_segment, self._cursor_offset):
            self._write_cursor()
        return fd

    def _write_cursor(self) -> None:
        """Overwrite the cursor in place: one ``pwrite`` of a fixed-width record, not fsync'd.

        A cursor that lags after a crash or power loss (or one torn, which reads as "from the
        start") only makes the flusher send delivered points again, which the stores keep once
        (their writes are idempotent); it never skips a point, as it is written after delivery.
        """
        record = json.dumps({"segment": self._cursor_segment, "offset": self._cursor_offset})
        os.pwrite(self._cursor_fd, record.encode().ljust(_CURSOR_BYTES), 0)

    def _repair_tail(self) -> None:
        """Cut a half-written last line (the process died inside a write)."""
        if not self._segments:
            return
        seq = self._segments[-1]
        path = self._path(seq)
        data = path.read_bytes()
        if self._suffixes[seq] == TEXT:
            keep = data.rfind(b"\n") + 1
        else:
            keep = spool_frames.valid_end(data)
        if keep != len(data):
            log.warning("spool: discarding a partial point at the end of %s", path.name)
            with open(path, "r+b") as f:
                f.truncate(keep)
            if keep == 0 and self._suffixes[seq] == BINARY:  # its header was cut short
                path.unlink()
                del self._suffixes[seq]
                self._segments.pop()


def _open_private(path: Path) -> BinaryIO:
    """A segment for appending, created 0600 whatever the umask."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
