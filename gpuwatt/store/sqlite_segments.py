"""The embedded store writer's open segment (format 3, ``segments``): rounds appended to it, a
new one once data time leaves its block, deleted segments' files removed after the commit.

Values are rounded to their stored precision (``format.STORED_DECIMALS``) as they are appended:
the segment is the stored block, written once, so what a reader sees of a sample (``latest()``
included) is what the block keeps.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpuwatt.store import format, segments
from gpuwatt.store.chunks import BLOCK_NS

#: a segment holds at most this many samples (a replay of days of one huge cluster still gets
#: files of bounded size): 2**24 x 48 words is what 1,024 GPUs write in ~4.5 hours
MAX_SEGMENT_SAMPLES = 1 << 24


class SegmentAppender:
    """The writer's open segment of one store file."""

    def __init__(self, con: sqlite3.Connection, attrs: tuple[str, ...]) -> None:
        # the folder as readers find it (``segments.folder_of``): the same paths, so that this
        # process's reads take the rounds its writer appended from memory
        self.folder = segments.folder_of(con)
        #: digits -> positions in a raw row of the columns with that stored precision
        self._rounded: dict[int, list[int]] = {}
        for c, k in format.stored_decimals(attrs).items():
            self._rounded.setdefault(k, []).append(1 + c)
        self._open: segments.SegmentWriter | None = None
        self._block_end_ns = 0
        self._unlink: list[Path] = []

    def rounded(self, values: np.ndarray) -> np.ndarray:
        """Raw rows with the columns that have a stored precision rounded to it (a copy)."""
        if not self._rounded:
            return values
        values = values.copy()
        for k, cols in self._rounded.items():
            p = 10.0**k  # what numpy.round does, bit for bit
            values[:, cols] = np.rint(values[:, cols] * p) / p
        return values

    def append(
        self,
        con: sqlite3.Connection,
        time_ns: int,
        gpu_ids: Sequence[int] | np.ndarray,
        rows: np.ndarray,
    ) -> None:
        """Append one round (``rows``: the raw rows of ``gpu_ids``, distinct, ``rounded``),
        inside the writer's transaction."""
        seg = self._open
        if seg is not None and (
            seg.failed or time_ns >= self._block_end_ns or seg.n >= MAX_SEGMENT_SAMPLES
        ):
            segments.close(con, seg)
            seg = self._open = None
        if seg is None:
            segments.recover(con, self.folder)  # segments a writer before this one left open
            seg = self._open = segments.open_new(con, self.folder)
            # in the index before any round is in it (the rest of the write may roll back)
            con.execute("COMMIT")
            con.execute("BEGIN IMMEDIATE")
            self._block_end_ns = time_ns // BLOCK_NS * BLOCK_NS + BLOCK_NS
        seg.append(time_ns, np.asarray(gpu_ids, dtype=np.int64), rows)

    def delete_before(self, con: sqlite3.Connection, cut_ns: int) -> None:
        """Segments past the raw retention: out of the index now, their files after the commit."""
        self._unlink += segments.delete_before(con, cut_ns)

    def committed(self) -> None:
        """The writer's transaction committed: what it deleted can go."""
        for path in self._unlink:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._unlink.clear()

    def rolled_back(self) -> None:
        """The writer's transaction rolled back: its deletions did not happen, and a segment
        it closed may still be open in the index (the next one opened closes it: ``recover``)."""
        self._unlink.clear()

    def close(self, con: sqlite3.Connection) -> None:
        """End the open segment (inside a transaction): a store at rest, or closing."""
        if self._open is not None:
            segments.close(con, self._open)
            self._open = None

    def close_store(self, con: sqlite3.Connection) -> None:
        """End the open segment as the store closes, in a transaction of its own (if SQLite is
        busy, it is left open in the index: the next writer closes it). A store that wrote
        nothing takes no write lock."""
        if self._open is None:
            return
        try:
            con.execute("BEGIN IMMEDIATE")
            self.close(con)
            con.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
            self.abandon()

    def abandon(self) -> None:
        if self._open is not None:
            self._open.abandon()
            self._open = None
