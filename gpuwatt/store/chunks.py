"""Closed blocks of raw samples, compressed: one chunk per block of ``BLOCK_NS`` and host.

Format 2 (docs/storage.md): format 3 keeps its raw samples in segment files (``segments``) and
writes no chunk; a file upgraded from format 2 keeps its chunks, read here, and what its head
still held is compacted into them, until the retention deletes them.

Samples arrive in the head (``rounds``) and stay there, as written, while their block of time is
open. Once data time has moved past a block (``compact``), its samples move into one chunk per
host (the GPUs of a node move together and look alike, which zstd exploits), encoded by
``codec``. A sample that arrives later for a block already compacted waits in the head and is
merged into the block's chunk at the next compaction (writing the same GPU and time again
replaces it); until then, reads take the head's copy (``dedupe``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

import numpy as np
import zstandard

from gpuwatt.store import codec, rounds
from gpuwatt.store.codec import Rows, Span

BLOCK_NS = 600 * 1_000_000_000

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS chunks (
  id INTEGER PRIMARY KEY,
  start_ns INTEGER NOT NULL,
  host TEXT NOT NULL,
  t_min_ns INTEGER NOT NULL,
  t_max_ns INTEGER NOT NULL,
  n INTEGER NOT NULL,
  data BLOB NOT NULL,
  UNIQUE (start_ns, host)
);
"""


def empty(col_ids: Sequence[int]) -> Rows:
    e = np.zeros(0, np.int64)
    return Rows(e, e, np.zeros(0), np.zeros(0), np.zeros((0, len(col_ids))), tuple(col_ids))


def select(rows: Rows, col_ids: Sequence[int]) -> Rows:
    """``rows`` with the metric columns ``col_ids`` (NaN for a column it does not hold)."""
    if tuple(col_ids) == rows.col_ids:
        return rows
    where = {c: j for j, c in enumerate(rows.col_ids)}
    values = np.full((len(rows.time_ns), len(col_ids)), np.nan)
    for k, c in enumerate(col_ids):
        j = where.get(c)
        if j is not None:
            values[:, k] = rows.values[:, j]
    return Rows(rows.gpu_id, rows.time_ns, rows.lost, rows.tail, values, tuple(col_ids))


def take(rows: Rows, index: np.ndarray) -> Rows:
    return Rows(
        rows.gpu_id[index],
        rows.time_ns[index],
        rows.lost[index],
        rows.tail[index],
        rows.values[index],
        rows.col_ids,
    )


def concat(parts: Sequence[Rows], col_ids: Sequence[int]) -> Rows:
    parts = [p for p in parts if len(p.time_ns)]
    if not parts:
        return empty(col_ids)
    if len(parts) == 1:
        return parts[0]
    return Rows(
        np.concatenate([p.gpu_id for p in parts]),
        np.concatenate([p.time_ns for p in parts]),
        np.concatenate([p.lost for p in parts]),
        np.concatenate([p.tail for p in parts]),
        np.concatenate([p.values for p in parts]),
        tuple(col_ids),
    )


def dedupe(rows: Rows) -> Rows:
    """One row per (GPU, time), the last one given; sorted by GPU, then time."""
    m = len(rows.time_ns)
    order = np.lexsort((np.arange(m), rows.time_ns, rows.gpu_id))
    g, t = rows.gpu_id[order], rows.time_ns[order]
    last = np.r_[(g[1:] != g[:-1]) | (t[1:] != t[:-1]), True] if m else np.zeros(0, bool)
    return take(rows, order[last])


def read(con: sqlite3.Connection, span: Span, hosts: Sequence[str] | None = None) -> Rows:
    """The chunks' samples of ``span`` (only the chunks of ``hosts`` if given)."""
    start_ns, end_ns, col_ids, gpu_ids = span
    sql = "SELECT data FROM chunks WHERE start_ns > ? AND start_ns < ? AND t_max_ns >= ?"
    params: list[object] = [start_ns - BLOCK_NS, end_ns, start_ns]
    if hosts is not None:
        sql += f" AND host IN ({', '.join('?' * len(hosts))})"
        params += list(hosts)
    dctx = zstandard.ZstdDecompressor()
    parts = []
    for (data,) in con.execute(sql + " ORDER BY start_ns, host", params):
        rows = codec.decode(data, dctx)
        keep = (rows.time_ns >= start_ns) & (rows.time_ns < end_ns)
        if gpu_ids is not None:
            keep &= np.isin(rows.gpu_id, gpu_ids)
        if not keep.all():
            rows = take(rows, np.flatnonzero(keep))
        parts.append(select(rows, col_ids))
    return concat(parts, col_ids)


def count(con: sqlite3.Connection, start_ns: int, end_ns: int) -> int:
    """How many samples the chunks hold in ``[start_ns, end_ns)``."""
    total = 0
    for t_min, t_max, n, data in con.execute(
        "SELECT t_min_ns, t_max_ns, n, data FROM chunks WHERE start_ns > ? AND start_ns < ? "
        "AND t_max_ns >= ?",
        (start_ns - BLOCK_NS, end_ns, start_ns),
    ):
        if start_ns <= t_min and t_max < end_ns:
            total += n
        else:
            t = codec.decode(data).time_ns
            total += int(((t >= start_ns) & (t < end_ns)).sum())
    return total


def compact(
    con: sqlite3.Connection,
    before_ns: int,
    ncols: int,
    host_of: Mapping[int, str],
    cctx: zstandard.ZstdCompressor,
    decimals: Mapping[int, int] | None = None,
) -> int:
    """Move the head's samples older than ``before_ns`` into chunks (merged with a block's
    chunk where it has one); the number of samples moved. ``decimals``: the columns' stored
    precision (``format.stored_decimals``)."""
    moved = 0
    all_cols = tuple(range(ncols))
    while True:
        (first,) = con.execute(
            "SELECT min(time_ns) FROM head WHERE time_ns < ?", (before_ns,)
        ).fetchone()
        if first is None:
            return moved
        block = first // BLOCK_NS * BLOCK_NS
        hi = min(block + BLOCK_NS, before_ns)
        rows = rounds.read(con, Span(block, hi, all_cols))
        hosts = np.array([host_of[g] for g in rows.gpu_id.tolist()], dtype=object)
        for host in sorted(set(hosts.tolist())):
            new = take(rows, np.flatnonzero(hosts == host))
            old = con.execute(
                "SELECT data FROM chunks WHERE start_ns = ? AND host = ?", (block, host)
            ).fetchone()
            if old is not None:
                new = concat([select(codec.decode(old[0]), all_cols), new], all_cols)
            new = dedupe(new)
            con.execute(
                "INSERT OR REPLACE INTO chunks (start_ns, host, t_min_ns, t_max_ns, n, data) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    block,
                    host,
                    int(new.time_ns.min()),
                    int(new.time_ns.max()),
                    len(new.time_ns),
                    codec.encode(new, cctx, decimals),
                ),
            )
        con.execute("DELETE FROM head WHERE time_ns >= ? AND time_ns < ?", (block, hi))
        moved += len(rows.time_ns)


def delete_before(con: sqlite3.Connection, cut_ns: int) -> None:
    """Delete the chunks whose block ends at or before ``cut_ns``."""
    con.execute("DELETE FROM chunks WHERE start_ns <= ?", (cut_ns - BLOCK_NS,))
