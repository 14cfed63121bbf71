"""The collector's durable on-disk spool: every sample is on disk before it is sent anywhere.

Samples are appended as line protocol to segment files and fsync'd, so a collector killed with
SIGKILL loses at most the tick it was in the middle of. A flusher reads batches from a cursor, sends
them to the store and only then advances the cursor: delivery is at-least-once, in order, and the
stores are idempotent (same GPU and timestamp stores once), so a replay after a crash duplicates
nothing. The spool is bounded: past ``max_bytes`` the oldest segments are dropped, loudly, with a
counter of the lines lost.

Layout of the directory::

    0000000000000001.lp   segments, one line-protocol point per line, oldest first
    cursor.json           {"segment": N, "offset": BYTES}: everything before it was delivered
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpuwatt.private_files import private_dir

log = logging.getLogger(__name__)

_SUFFIX = ".lp"
_CURSOR = "cursor.json"


@dataclass(frozen=True, slots=True)
class SpoolBatch:
    """Lines read from the spool, and the position to commit once they are delivered."""

    lines: list[str]
    segment: int
    end_offset: int


class Spool:
    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        segment_bytes: int = 4 * 1024 * 1024,
        fsync: bool = True,
    ) -> None:
        if segment_bytes <= 0 or max_bytes < 2 * segment_bytes:
            raise ValueError("spool max_bytes must be at least two segments")
        self.directory = private_dir(directory)  # samples name hosts, jobs and processes
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._fsync = fsync
        self._lock = threading.Lock()
        self.dropped_lines = 0  # lines lost to the size bound since this process started
        self._segments: list[int] = self._scan()
        self._cursor_segment, self._cursor_offset = self._read_cursor()
        self._repair_tail()
        if not self._segments:
            self._segments.append(1)
        self._active = _open_private(self._path(self._segments[-1]))

    # --- writing ---------------------------------------------------------------------------------
    def append(self, lines: Sequence[str]) -> None:
        """Append points durably (fsync) before returning."""
        if not lines:
            return
        data = ("\n".join(lines) + "\n").encode("utf-8")
        with self._lock:
            self._active.write(data)
            self._active.flush()
            if self._fsync:
                os.fsync(self._active.fileno())
            if self._active.tell() >= self.segment_bytes:
                self._rotate()
            self._enforce_bound()

    def _rotate(self) -> None:
        self._active.close()
        seq = self._segments[-1] + 1
        self._segments.append(seq)
        self._active = _open_private(self._path(seq))
        if self._fsync:
            _fsync_dir(self.directory)

    def _enforce_bound(self) -> None:
        while self._pending_bytes_locked() > self.max_bytes and len(self._segments) > 1:
            oldest = self._segments.pop(0)
            path = self._path(oldest)
            start = self._cursor_offset if oldest == self._cursor_segment else 0
            with open(path, "rb") as f:
                f.seek(start)
                lost = f.read().count(b"\n")
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
    def read_batch(self, max_lines: int = 2000, max_bytes: int = 1024 * 1024) -> SpoolBatch:
        """The next undelivered lines (possibly none), oldest first."""
        with self._lock:
            while True:
                seg, offset = self._cursor_segment, self._cursor_offset
                path = self._path(seg)
                try:
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read(max_bytes)
                except FileNotFoundError:
                    chunk = b""
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
                path.unlink(missing_ok=True)
                self._cursor_segment, self._cursor_offset = self._segments[0], 0
                self._write_cursor()

    def commit(self, batch: SpoolBatch) -> None:
        """Record that ``batch`` reached the store."""
        if not batch.lines:
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
                try:
                    with open(self._path(seg), "rb") as f:
                        f.seek(start)
                        total += f.read().count(b"\n")
                except FileNotFoundError:
                    continue
            return total

    def close(self) -> None:
        with self._lock:
            if not self._active.closed:
                self._active.flush()
                if self._fsync:
                    os.fsync(self._active.fileno())
                self._active.close()

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
        return self.directory / f"{seq:016d}{_SUFFIX}"

    def _scan(self) -> list[int]:
        return sorted(int(p.stem) for p in self.directory.glob(f"*{_SUFFIX}") if p.stem.isdigit())

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

    def _write_cursor(self) -> None:
        tmp = self.directory / (_CURSOR + ".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({"segment": self._cursor_segment, "offset": self._cursor_offset}, f)
            f.flush()
            if self._fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / _CURSOR)

    def _repair_tail(self) -> None:
        """Cut a half-written last line (the process died inside a write)."""
        if not self._segments:
            return
        path = self._path(self._segments[-1])
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            log.warning("spool: discarding a partial line at the end of %s", path.name)
            with open(path, "r+b") as f:
                f.truncate(keep)


def _open_private(path: Path) -> BinaryIO:
    """A segment for appending, created 0600 whatever the umask."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
