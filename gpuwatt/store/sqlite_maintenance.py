"""The embedded store's upkeep by data time: rollups, compaction and retention.

Mixed into ``SqliteStore`` (``sqlite``), whose writer calls ``_maintain`` inside each write's
transaction: a 1-minute bucket is rolled once the newest data time has passed its end by the
grace, 5-minute buckets and hours from minutes, late samples make their buckets dirty
(recomputed once writes have moved past them), closed 10-minute blocks are compacted into
chunks, and data older than its level's retention is deleted once a minute of data time.
docs/storage.md describes the tables.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np
import zstandard

from gpuwatt.store import LAST_VALUE_ATTRS, chunks, format, raw, rollups, sqlite_reads
from gpuwatt.store.rollup_rule import (
    COARSE_LEVELS,
    FIVE_MINUTES_NS,
    HOUR_NS,
    MINUTE_NS,
    NULL_TIME,
    ROLLED_FROM,
    SLOT_LOOKAHEAD_NS,
    SLOT_LOOKBEHIND_NS,
    combine,
)
from gpuwatt.store.sqlite_reads import (
    BLOCK_NS,
    floor_ns,
    rolled_from_key,
    rolled_key,
)
from gpuwatt.store.sqlite_segments import SegmentAppender

_RETENTION_CHECK_NS = MINUTE_NS


class Maintenance:
    """Rollups, compaction and retention of one store file (a mixin of ``SqliteStore``, which
    provides the attributes declared here)."""

    retention_raw_ns: int
    retention_1m_ns: int
    retention_1h_ns: int
    rollup_grace_ns: int
    _columns: format.Columns
    _cctx: zstandard.ZstdCompressor
    _newest_ns: int
    _states: dict[str, Any]  # by UUID: the writer's per-GPU state (its ``tail`` id in use)
    _tail_ids: dict[tuple[Any, ...], int]
    _last_times: dict[int, int]  # GPU id -> newest sample not in ``gpus`` yet
    _segments: SegmentAppender

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
        up_m = meta.get("rolled_60")
        # Recorded once a minute of data time (a page less to write per round): what a new
        # writer needs of it is which minutes and blocks are over, and those are recorded. In
        # the transaction that rolls a minute: one commit a minute, not two or three (its
        # pages are written twice, WAL and file: bench/store_write.py). The GPUs' newest
        # sample times are recorded when a block closes (``_compact``); ``latest()`` finds
        # newer ones in the segments.
        rolls = up_m is not None and floor_ns(newest - self.rollup_grace_ns, MINUTE_NS) > up_m
        if rolls or newest >= meta.get("max_time_ns", NULL_TIME) + MINUTE_NS:
            self._set_meta(con, "max_time_ns", newest)
        coarse = {level: meta.get(rolled_key(level)) for level in COARSE_LEVELS}
        if up_m is None:
            up_m = floor_ns(t_min, MINUTE_NS)
            for level in COARSE_LEVELS:
                coarse[level] = floor_ns(t_min, level)
                self._set_meta(con, rolled_key(level), floor_ns(t_min, level))
        # Late samples: buckets already rolled become dirty.
        if t_min < up_m:
            # a sample's neighbours' slots change with it (rollup_rule.sample_seen_ns)
            reach = range(-SLOT_LOOKAHEAD_NS, SLOT_LOOKBEHIND_NS + MINUTE_NS, MINUTE_NS)
            minutes = {
                b
                for t in times
                if t - SLOT_LOOKAHEAD_NS < up_m
                for b in (floor_ns(t + d, MINUTE_NS) for d in reach)
                if b < up_m
            }
            con.executemany(
                "INSERT OR IGNORE INTO rollup_dirty VALUES (?, ?)",
                [(MINUTE_NS, b) for b in minutes],
            )
            for level, up in coarse.items():
                if up is None:  # (a file opened by ``_add_levels``'s caller has them all)
                    continue
                buckets = {floor_ns(b, level) for b in minutes if b < up}
                con.executemany(
                    "INSERT OR IGNORE INTO rollup_dirty VALUES (?, ?)",
                    [(level, b) for b in buckets],
                )
        # Roll minutes the data has moved past.
        new_up_m = max(up_m, floor_ns(newest - self.rollup_grace_ns, MINUTE_NS))
        if new_up_m > up_m:
            self._roll(con, MINUTE_NS, up_m, new_up_m)
        if new_up_m != meta.get("rolled_60"):
            self._set_meta(con, "rolled_60", new_up_m)
        # Recompute dirty minutes this write has moved past, then the levels rolled from them.
        self._recompute_dirty(con, MINUTE_NS, t_min)
        for level, up in coarse.items():
            if up is None:
                continue
            self._roll_coarse(con, level, up, floor_ns(new_up_m, level))
            self._recompute_dirty(con, level, t_min)
        # Compact the blocks the data has moved past (and, once a minute of data time, samples
        # that arrived late for blocks compacted before).
        compacted = meta.get("compacted_until", floor_ns(t_min, BLOCK_NS))
        new_compacted = max(compacted, floor_ns(newest - self.rollup_grace_ns, BLOCK_NS))
        last_ret = meta.get("retention_at_ns")
        check = last_ret is None or rolls or newest - last_ret >= _RETENTION_CHECK_NS
        if new_compacted > compacted or (check and raw.head_has_before(con, compacted)):
            self._compact(con, new_compacted)
        if new_compacted != meta.get("compacted_until"):
            self._set_meta(con, "compacted_until", new_compacted)
        if check:
            self._apply_retention(con, newest)
            self._set_meta(con, "retention_at_ns", newest)

    def _roll_coarse(self, con: sqlite3.Connection, level_ns: int, up_ns: int, to_ns: int) -> None:
        """Roll the buckets of a level rolled from minutes in ``[up_ns, to_ns)`` (its rolled end
        ``up_ns``), and record its new end; those rolled over minutes that are still dirty are
        dirty too (recomputed once the minutes are)."""
        if to_ns <= up_ns:
            return
        self._roll(con, level_ns, up_ns, to_ns)
        self._set_meta(con, rolled_key(level_ns), to_ns)
        con.execute(
            "INSERT OR IGNORE INTO rollup_dirty SELECT ?1, bucket_ns / ?1 * ?1 "
            "FROM rollup_dirty WHERE level_ns = ?2 AND bucket_ns >= ?3 AND bucket_ns < ?4",
            (level_ns, MINUTE_NS, up_ns, to_ns),
        )

    def _add_levels(self, con: sqlite3.Connection, backfill_ns: int) -> None:
        """Give a file written before a level rolled from minutes existed (no ``rolled_<s>``
        meta, minutes rolled) that level: its buckets are rolled from minutes over the last
        ``backfill_ns`` of rolled minutes, recorded as the level's start
        (``rolled_<s>_from``); reads take the time before that from minutes.

        A level whose rolled end is behind the minutes' was not kept up: a gpuwatt from before
        it has written the file since, and it marks none of the level's buckets dirty for late
        samples. Its buckets are then dropped and the level added again."""
        meta = self._meta(con)
        up_m = meta.get("rolled_60")
        if up_m is None:  # a new file, or one without data: ``_maintain`` starts every level
            return
        for level in COARSE_LEVELS:
            end = floor_ns(up_m, level)
            up = meta.get(rolled_key(level))
            if up is not None and up >= end:
                continue
            if up is not None:
                rollups.delete_before(con, level, 2**62)
                con.execute("DELETE FROM rollup_dirty WHERE level_ns = ?", (level,))
            first = rollups.first_time(con, MINUTE_NS, end)
            start = end if first is None else max(floor_ns(first, level), end - backfill_ns)
            start = floor_ns(start, level)
            self._set_meta(con, rolled_key(level), start)
            self._set_meta(con, rolled_from_key(level), start)
            self._roll_coarse(con, level, start, end)

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

    def _compact(self, con: sqlite3.Connection, before_ns: int) -> None:
        self._flush_last_times(con)  # head rows after last_times_until must stay in the head
        host_of = dict(con.execute("SELECT id, host FROM gpus").fetchall())
        attrs = self._columns.attrs
        decimals = format.stored_decimals(attrs)
        chunks.compact(con, before_ns, len(attrs), host_of, self._cctx, decimals)

    def _roll(self, con: sqlite3.Connection, level_ns: int, start_ns: int, end_ns: int) -> None:
        """(Re)compute the ``level_ns`` buckets in ``[start_ns, end_ns)`` from the level below,
        by the rollup rule."""
        columns = self._columns
        col_ids = columns.index
        lower = ROLLED_FROM[level_ns]
        if lower:
            cols = rollups.read(con, lower, start_ns, end_ns, columns.attrs, col_ids)
            out = combine(cols, level_ns, columns.attrs, LAST_VALUE_ATTRS, level_ns=lower)
            rollups.write(con, level_ns, start_ns, end_ns, out, col_ids)
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
            # A sample's slot depends on its GPU's neighbours: read a little around the block.
            all_cols = tuple(range(len(columns.attrs)))
            out, samples = sqlite_reads.raw_buckets(con, lo, hi, all_cols, columns.attrs, MINUTE_NS)
            rollups.write(con, MINUTE_NS, lo, hi, out, col_ids)
            # The tails these samples refer to are still in use (``_apply_retention``).
            # (the samples read around the block are not this block's)
            inside = (samples.time_ns >= lo) & (samples.time_ns < hi)
            tails = np.unique(samples.tail[inside]).astype(np.int64).tolist()
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
            lower = ROLLED_FROM[level_ns]
            if lower:
                pending = con.execute(
                    "SELECT 1 FROM rollup_dirty WHERE level_ns = ? AND bucket_ns >= ? "
                    "AND bucket_ns < ? LIMIT 1",
                    (lower, bucket, bucket + level_ns),
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
        self._segments.delete_before(con, raw_cut)
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
        minutes_cut = newest_ns - self.retention_1m_ns
        rollups.delete_before(con, MINUTE_NS, minutes_cut)
        # Dirty buckets of the levels rolled from minutes cannot be recomputed once their
        # minutes are gone; 5-minute buckets are kept as long as the minutes.
        con.execute(
            "DELETE FROM rollup_dirty WHERE level_ns <> ? AND bucket_ns < ?",
            (MINUTE_NS, minutes_cut),
        )
        rollups.delete_before(con, FIVE_MINUTES_NS, minutes_cut)
        rollups.delete_before(con, HOUR_NS, newest_ns - self.retention_1h_ns)
