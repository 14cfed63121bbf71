"""Upgrade of an embedded store written before raw samples were stored as rounds (``rounds``).

Those versions kept one wide row per GPU and sample in a table ``samples`` (a column per metric,
then the tail's columns). The rollups, the packed copy and the metadata did not change, so only
the raw rows move: a minute of data time per transaction, which records how far the move went,
so an upgrade interrupted at any point resumes where it stopped and never holds a sample twice
or loses one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gpuwatt.store import rounds

log = logging.getLogger(__name__)

_MINUTE_NS = 60 * 1_000_000_000
_MOVED_KEY = "legacy_samples_moved_until"  # the move is done below this time
_COLUMNS = ("time_ns", "gpu_id", *rounds.ROW_ATTRS, *rounds.TAIL_COLUMNS)


def has_wide_samples(con: sqlite3.Connection) -> bool:
    found = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'samples'")
    return found.fetchone() is not None


def migrate_wide_samples(
    con: sqlite3.Connection,
    transaction: Callable[[], contextlib.AbstractContextManager[None]],
    path: object,
) -> int:
    """Move every row of ``samples`` into rounds, then drop the table; the samples moved.

    A minute of data per transaction, which also records in ``meta`` how far the move went
    (deleting the moved rows instead cost more than the move itself)."""
    (total,) = con.execute("SELECT count(*) FROM samples").fetchone()
    log.warning("%s: moving %d raw samples to the round layout (once)", path, total)
    tail_ids: dict[tuple[object, ...], int] = {}
    moved = reported = 0
    while True:
        with transaction():
            if not has_wide_samples(con):  # another process finished the move
                break
            done = con.execute("SELECT value FROM meta WHERE key = ?", (_MOVED_KEY,)).fetchone()
            (lo,) = con.execute(
                "SELECT min(time_ns) FROM samples WHERE time_ns >= ?",
                (-(2**63) if done is None else done[0],),
            ).fetchone()
            if lo is None:
                con.execute("DROP TABLE samples")
                con.execute("DELETE FROM meta WHERE key = ?", (_MOVED_KEY,))
                break
            hi = lo + _MINUTE_NS
            rows = con.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM samples WHERE time_ns >= ? AND time_ns < ? "
                "ORDER BY time_ns, gpu_id",
                (lo, hi),
            ).fetchall()
            moved += _store_rounds(con, rows, tail_ids, hi - 1)
            con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (_MOVED_KEY, hi))
        if moved >= reported + total // 10:
            reported = moved
            log.warning("%s: moved %d of %d raw samples", path, moved, total)
    log.warning("%s: moved %d raw samples", path, moved)
    return moved


def _store_rounds(
    con: sqlite3.Connection,
    rows: list[tuple[Any, ...]],
    tail_ids: dict[tuple[object, ...], int],
    last_ns: int,
) -> int:
    n_row = len(rounds.ROW_ATTRS)
    tails = [r[2 + n_row :] for r in rows]
    for tail in set(tails) - tail_ids.keys():
        (tail_ids[tail],) = con.execute(
            f"INSERT INTO tails ({', '.join(rounds.TAIL_COLUMNS)}, last_ns) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (*tail, last_ns),
        ).fetchone()
    used = sorted({tail_ids[t] for t in tails})
    con.execute(
        "UPDATE tails SET last_ns = max(last_ns, ?) WHERE id IN (SELECT value FROM json_each(?))",
        (last_ns, json.dumps(used)),
    )
    vals = np.array(
        [(*r[2 : 2 + n_row], tail_ids[t]) for r, t in zip(rows, tails, strict=True)],
        dtype="<f8",  # None -> NaN
    )
    times = [r[0] for r in rows]
    for lo, hi in _runs(times):
        gids = [r[1] for r in rows[lo:hi]]
        rounds.insert(con, times[lo], gids, vals[lo:hi].tobytes())
    return len(rows)


def _runs(times: list[object]) -> Iterator[tuple[int, int]]:
    """The index ranges of equal consecutive times."""
    lo = 0
    for i in range(1, len(times) + 1):
        if i == len(times) or times[i] != times[lo]:
            yield lo, i
            lo = i
