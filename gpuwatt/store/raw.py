"""The embedded store's raw samples, read as one: the segments (format 3, ``segments``) and what
a file upgraded from format 2 still has of its head (``rounds``, as written) and chunks (closed
blocks, compressed). Of two copies of a sample, the one written later wins: chunks, then the
head, then the segments in write order."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np

from gpuwatt.store import chunks, rounds, segments
from gpuwatt.store.chunks import BLOCK_NS
from gpuwatt.store.codec import Rows, Span


def read(
    con: sqlite3.Connection,
    start_ns: int,
    end_ns: int,
    col_ids: Sequence[int],
    gpu_ids: np.ndarray | None = None,
) -> Rows:
    """The raw samples in ``[start_ns, end_ns)``, from the chunks, the head and the segments
    (the copy written last of a sample wins)."""
    span = Span(start_ns, end_ns, col_ids, gpu_ids)
    old = chunks.read(con, span)
    new = rounds.read(con, span)
    seg, again = segments.read(con, span)
    parts = [old, new, seg]
    if again or (len(seg.time_ns) and (len(old.time_ns) or len(new.time_ns))):
        return chunks.dedupe(chunks.concat(parts, col_ids))
    if len(old.time_ns) and len(new.time_ns) and head_overlaps_chunks(con, start_ns, end_ns):
        return chunks.dedupe(chunks.concat(parts, col_ids))
    return chunks.concat(parts, col_ids)


def head_overlaps_chunks(con: sqlite3.Connection, start_ns: int, end_ns: int) -> bool:
    """Whether the head holds samples of ``[start_ns, end_ns)`` in a block that has chunks
    (samples that arrived late, not merged yet)."""
    found = con.execute(
        "SELECT 1 FROM head AS h WHERE h.time_ns >= ?1 AND h.time_ns < ?2 AND EXISTS ("
        "SELECT 1 FROM chunks AS c WHERE c.start_ns = h.time_ns / ?3 * ?3) LIMIT 1",
        (start_ns, end_ns, BLOCK_NS),
    )
    return found.fetchone() is not None


def head_has_before(con: sqlite3.Connection, time_ns: int) -> bool:
    found = con.execute("SELECT 1 FROM head WHERE time_ns < ? LIMIT 1", (time_ns,))
    return found.fetchone() is not None


def first_raw_time(con: sqlite3.Connection, start_ns: int, end_ns: int) -> int | None:
    """The time of the first raw sample in ``[start_ns, end_ns)`` (to within a block for the
    chunks); None when there is none."""
    (head,) = con.execute(
        "SELECT min(time_ns) FROM head WHERE time_ns >= ? AND time_ns < ?", (start_ns, end_ns)
    ).fetchone()
    (chunk,) = con.execute(
        "SELECT min(max(t_min_ns, ?1)) FROM chunks WHERE start_ns > ?1 - ?3 AND start_ns < ?2 "
        "AND t_max_ns >= ?1",
        (start_ns, end_ns, BLOCK_NS),
    ).fetchone()
    seg = segments.first_time(con, start_ns, end_ns)
    found = [t for t in (head, chunk, seg) if t is not None]
    return min(found) if found else None
