"""The embedded store's reads: each GPU's newest sample, and series at any step served from the
coarsest level that answers them (docs/storage.md; the rollup rule in ``rollup_rule``).

A level's clean, rolled-up buckets come from ``rollups``; dirty, unrolled and partial buckets are
aggregated from the level below by the same rule, so a read is exact whichever level serves it.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuwatt.model import GpuSample
from gpuwatt.schema import FIELD_BY_ATTR
from gpuwatt.store import (
    LAST_VALUE_ATTRS,
    checked_fields,
    chunks,
    format,
    frames,
    raw,
    rollups,
    rounds,
    segments,
)
from gpuwatt.store.base import SeriesRead
from gpuwatt.store.codec import Rows, Span
from gpuwatt.store.rollup_rule import (
    NULL_TIME,
    ROLLED_FROM,
    combine,
    level_for,
    read_around,
    sample_seen_ns,
    samples_as_level,
)

NS_PER_S = 1_000_000_000
BLOCK_NS = chunks.BLOCK_NS


def floor_ns(t_ns: int, step_ns: int) -> int:
    return t_ns // step_ns * step_ns


def meta(con: sqlite3.Connection) -> dict[str, int]:
    return dict(con.execute("SELECT key, value FROM meta"))


def latest(con: sqlite3.Connection, since_ns: int | None) -> list[GpuSample]:
    """Each GPU's newest sample (since ``since_ns``): newer ones than the ``gpus`` table records
    are found in the head; a GPU silent since its block was compacted, in its chunk."""
    columns = format.read_columns(con)
    all_cols = tuple(range(len(columns.attrs)))
    (until,) = con.execute(
        "SELECT coalesce(max(value), ?) FROM meta WHERE key = 'last_times_until'",
        (NULL_TIME,),
    ).fetchone()
    rows = con.execute(
        "SELECT id, host, gpu_index, uuid, name, last_time_ns FROM gpus "
        "ORDER BY host, gpu_index, uuid"
    ).fetchall()
    newest: dict[int, int] = {}  # newer than the gpus table says: in the head
    for t, ids in con.execute(
        "SELECT time_ns, gpu_ids FROM head WHERE time_ns >= ? ORDER BY time_ns DESC",
        (until,),
    ):
        for g in np.frombuffer(ids, dtype="<i8").tolist():
            newest.setdefault(g, t)
        if len(newest) == len(rows):  # every GPU found (the newest round, mostly)
            break
    for g, t in segments.newest_times(con, until).items():
        if newest.get(g, t) <= t:
            newest[g] = t
    since = NULL_TIME if since_ns is None else since_ns
    gpus = []
    for gid, host, gpu_index, uuid, name, t in rows:
        t = max(newest.get(gid, NULL_TIME), NULL_TIME if t is None else t)
        if t != NULL_TIME and t >= since:
            gpus.append((gid, host, gpu_index, uuid, name, t))
    wanted = {g[0]: g[5] for g in gpus}
    found: dict[int, tuple[float, float, np.ndarray]] = {}  # lost, tail, values
    times = sorted(set(wanted.values()))
    for lo in range(0, len(times), 500):
        chunk = times[lo : lo + 500]
        for t, ncols, ids, vals in con.execute(
            "SELECT time_ns, ncols, gpu_ids, vals FROM head "
            f"WHERE time_ns IN ({', '.join('?' * len(chunk))})",
            chunk,
        ):
            vv = rounds.unpack_vals(vals, ncols + 2, len(ids) >> 3)
            for i, g in enumerate(np.frombuffer(ids, dtype="<i8").tolist()):
                if wanted.get(g) == t:
                    full = np.full(len(all_cols), np.nan)
                    full[:ncols] = vv[i, 1 : ncols + 1]
                    found[g] = (vv[i, 0], vv[i, ncols + 1], full)
    # The others: in the segments, or (silent since their block was compacted) in a chunk.
    hosts = {g[0]: g[1] for g in gpus}
    by_time: dict[int, list[int]] = {}
    for g, t in wanted.items():
        if g not in found:
            by_time.setdefault(t, []).append(g)
    seg_ids = segments.has_index(con)
    by_chunk: dict[tuple[int, str], list[int]] = {}
    for t, gids in sorted(by_time.items(), reverse=True):
        if seg_ids and len(by_time) <= 16:  # mostly one time: the newest round
            got = raw.read(con, t, t + 1, all_cols, np.array(gids))
            _pick(got, wanted, found)
        for g in gids:
            if g not in found:
                by_chunk.setdefault((floor_ns(t, BLOCK_NS), hosts[g]), []).append(g)
    for (block, host), gids in by_chunk.items():
        if seg_ids:
            got = raw.read(con, block, block + BLOCK_NS, all_cols, np.array(gids))
        else:
            got = chunks.read(con, Span(block, block + BLOCK_NS, all_cols, np.array(gids)), [host])
        _pick(got, wanted, found)
    tail_ids = sorted({int(v[1]) for v in found.values()})
    tails = {
        r[0]: r[1:]
        for r in con.execute(
            f"SELECT id, {', '.join(rounds.TAIL_COLUMNS)} FROM tails "
            "WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(tail_ids),),
        )
    }
    out = []
    for gid, host, gpu_index, uuid, name, t in gpus:
        got_row = found.get(gid)
        if got_row is None:  # its newest sample is past the raw retention
            continue
        lost, tail_id, values = got_row
        tail = tails.get(int(tail_id), (None,) * len(rounds.TAIL_COLUMNS))
        metrics = dict(zip(columns.attrs, values.tolist(), strict=True))
        out.append(frames.sample_from_row((t, host, gpu_index, uuid, name, lost), metrics, tail))
    return out


def _pick(
    got: Rows, wanted: dict[int, int], found: dict[int, tuple[float, float, np.ndarray]]
) -> None:
    """Record in ``found`` each GPU's row of ``got`` at the time ``wanted`` of it."""
    for i, (g, t) in enumerate(zip(got.gpu_id.tolist(), got.time_ns.tolist(), strict=True)):
        if wanted[g] == t:
            found[g] = (got.lost[i], got.tail[i], got.values[i])


def xid_columns(
    con: sqlite3.Connection, start_ns: int, end_ns: int, hosts: Sequence[str] | None
) -> dict[str, Any]:
    """The raw samples of ``[start_ns, end_ns)`` whose tail carries XIDs: ``time_ns``,
    ``gpu_id``, ``xid_last``, ``xid_count``. The tails table is looked at first: with no XID
    tail in use since ``start_ns`` (most ranges) no sample is read."""
    e = np.zeros(0, np.int64)
    empty = {"time_ns": e, "gpu_id": e, "xid_last": np.zeros(0), "xid_count": np.zeros(0)}
    found = con.execute(
        "SELECT id, xid_last, xid_count FROM tails WHERE xid_count > 0 AND last_ns >= ? "
        "ORDER BY id",
        (start_ns,),
    ).fetchall()
    if not found:
        return empty
    gpu_ids = None
    if hosts is not None:
        rows = con.execute(
            f"SELECT id FROM gpus WHERE host IN ({', '.join('?' * len(hosts))})", list(hosts)
        )
        gpu_ids = np.array([i for (i,) in rows], dtype=np.int64)
    samples = raw.read(con, start_ns, end_ns, (), gpu_ids)
    ids = np.array([r[0] for r in found], dtype=np.float64)
    keep = np.isin(samples.tail, ids)
    if not keep.any():
        return empty
    where = np.searchsorted(ids, samples.tail[keep])  # ids ascending
    last = np.array([float(r[1]) if r[1] is not None else np.nan for r in found])
    count = np.array([float(r[2]) for r in found])
    return {
        "time_ns": samples.time_ns[keep],
        "gpu_id": samples.gpu_id[keep],
        "xid_last": last[where],
        "xid_count": count[where],
    }


def series_columns(
    con: sqlite3.Connection, memo: dict[tuple[Any, ...], dict[str, Any]], read: SeriesRead
) -> tuple[dict[str, Any], tuple[str, ...]]:
    attrs = checked_fields(read.fields, FIELD_BY_ATTR)
    start_ns, end_ns, step_s, hosts = read.start_ns, read.end_ns, read.step_s, read.hosts
    gpu_ids = None
    if hosts is not None:
        found = con.execute(
            f"SELECT id FROM gpus WHERE host IN ({', '.join('?' * len(hosts))})", list(hosts)
        )
        gpu_ids = np.array([i for (i,) in found], dtype=np.int64)
    scope = _Scope(attrs, _column_ids(con, attrs), gpu_ids, memo)
    if step_s is None:
        # each sample with its seen time (rollup_rule.sample_seen_ns), as its minute has it
        samples = _read_around(con, start_ns, end_ns, scope.col_ids, gpu_ids)
        seen_ns = sample_seen_ns(samples.time_ns, samples.gpu_id, samples.lost)
        keep = (samples.time_ns >= start_ns) & (samples.time_ns < end_ns)
        columns = {
            "time_ns": samples.time_ns[keep],
            "gpu_id": samples.gpu_id[keep],
            "seen_ns": seen_ns[keep],
        }
        return columns | {a: samples.values[keep, j] for j, a in enumerate(attrs)}, attrs
    step_ns = int(step_s) * NS_PER_S
    if step_ns <= 0:
        raise ValueError("step_s must be positive")
    level = level_for(step_ns)
    if level == 0:
        return _raw_level(con, scope, step_ns, start_ns, end_ns), attrs
    columns = _level_columns(con, meta(con), level, start_ns, end_ns, scope)
    if step_ns != level:
        columns = combine(columns, step_ns, attrs, LAST_VALUE_ATTRS, level_ns=level)
    return columns, attrs


def _read_around(
    con: sqlite3.Connection,
    start_ns: int,
    end_ns: int,
    col_ids: Sequence[int],
    gpu_ids: np.ndarray | None,
) -> Rows:
    """The raw samples in ``[start_ns, end_ns)`` and those around it that decide their slots
    (``rollup_rule.read_around``)."""
    return read_around(
        lambda lo, hi: raw.read(con, lo, hi, col_ids, gpu_ids),
        lambda rows: (rows.time_ns, rows.gpu_id),
        lambda parts: chunks.concat(parts, col_ids),
        start_ns,
        end_ns,
    )


def raw_buckets(
    con: sqlite3.Connection,
    start_ns: int,
    end_ns: int,
    col_ids: Sequence[int],
    attrs: Sequence[str],
    step_ns: int,
    gpu_ids: np.ndarray | None = None,
) -> tuple[dict[str, Any], Rows]:
    """The raw samples in ``[start_ns, end_ns)`` (columns ``col_ids``, named ``attrs``) as level
    columns of ``step_ns`` buckets by the rollup rule, and the samples read: those around the
    range too, whose times end the slots of the samples in it (``rollup_rule.sample_seen_ns``).
    The minute roll and the reads of unrolled time both use it."""
    samples = _read_around(con, start_ns, end_ns, col_ids, gpu_ids)
    level = samples_as_level(
        samples.time_ns,
        samples.gpu_id,
        samples.lost,
        {a: samples.values[:, j] for j, a in enumerate(attrs)},
        start_ns=start_ns,
        end_ns=end_ns,
    )
    return combine(level, step_ns, attrs, LAST_VALUE_ATTRS, level_ns=0), samples


def _raw_level(
    con: sqlite3.Connection, scope: _Scope, step_ns: int, start_ns: int, end_ns: int
) -> dict[str, Any]:
    """Raw samples in ``[start_ns, end_ns)`` as level columns of ``step_ns`` buckets, by
    the rollup rule; kept in the memo (one read transaction) for the next read of the same
    samples."""
    ids = None if scope.gpu_ids is None else tuple(scope.gpu_ids.tolist())
    key = (step_ns, start_ns, end_ns, scope.attrs, ids)
    if key not in scope.memo:
        scope.memo[key], _ = raw_buckets(
            con, start_ns, end_ns, scope.col_ids, scope.attrs, step_ns, scope.gpu_ids
        )
    return scope.memo[key]


def _level_columns(
    con: sqlite3.Connection,
    meta: dict[str, int],
    level_ns: int,
    start_ns: int,
    end_ns: int,
    scope: _Scope,
) -> dict[str, Any]:
    """Level rows over ``[start_ns, end_ns)`` as columns: clean rolled-up buckets from the
    rollups, the rest aggregated from the level below (raw samples, or minutes) by the
    same rule."""
    clean, dirty, below = _level_plan(con, meta, level_ns, start_ns, end_ns)
    parts = []
    if clean is not None:
        parts.append(
            rollups.read(
                con,
                level_ns,
                *clean,
                scope.attrs,
                scope.col_index,
                exclude=dirty,
                gpu_ids=scope.gpu_ids,
            )
        )
    lower = ROLLED_FROM[level_ns]
    for lo, hi in below:
        if lower == 0:
            parts.append(_raw_level(con, scope, level_ns, lo, hi))
        else:
            sub = _level_columns(con, meta, lower, lo, hi, scope)
            parts.append(combine(sub, level_ns, scope.attrs, LAST_VALUE_ATTRS, level_ns=lower))
    if not parts:
        return combine(_no_rows(scope.attrs), level_ns, scope.attrs, LAST_VALUE_ATTRS)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _level_plan(
    con: sqlite3.Connection,
    meta: dict[str, int],
    level_ns: int,
    start_ns: int,
    end_ns: int,
) -> tuple[tuple[int, int] | None, list[int], list[tuple[int, int]]]:
    """How to read level rows over ``[start_ns, end_ns)``: the range whose buckets are rolled
    up (None: no such part), the dirty buckets in it (not to be trusted), and the ranges to
    aggregate from the level below instead (those buckets, and what is not rolled yet)."""
    up = meta.get(rolled_key(level_ns))
    lower_up = meta.get(rolled_key(ROLLED_FROM[level_ns])) if ROLLED_FROM[level_ns] else None
    if up is not None and lower_up is not None and up < floor_ns(lower_up, level_ns):
        # Rolled with the level below, in the same transaction: behind it, the level was not
        # kept up (a gpuwatt from before it writes the file, and marks none of its buckets
        # dirty): none of it is trusted.
        up = None
    # A level added to a file that had data before it is rolled from ``rolled_<s>_from`` on
    # (``Maintenance._add_levels``): before that, read from the level below.
    since = meta.get(rolled_from_key(level_ns), NULL_TIME)
    clean: tuple[int, int] | None = None
    dirty: list[int] = []
    below: list[tuple[int, int]] = []
    # Only whole buckets come from this level: a range that starts or ends inside a bucket
    # reads that part from the level below (docs/accounting.md, rule 4). A rolled bucket
    # read by ``time_ns >= start`` would drop the partial first bucket, and one read by
    # ``time_ns < end`` would count the partial last bucket whole.
    first = -(-max(start_ns, since) // level_ns) * level_ns  # first boundary at or after both
    rolled_end = end_ns if up is None else min(end_ns, up)
    last = floor_ns(rolled_end, level_ns)
    if up is not None and first < last:
        clean = (first, last)
        dirty = [
            b
            for (b,) in con.execute(
                "SELECT bucket_ns FROM rollup_dirty WHERE level_ns = ? AND bucket_ns >= ? "
                "AND bucket_ns < ?",
                (level_ns, first, last),
            )
        ]
        if start_ns < first:
            below.append((start_ns, first))
        below += [(b, b + level_ns) for b in dirty]
        tail_start = last
    else:
        tail_start = start_ns
    if tail_start < end_ns:
        below.append((tail_start, end_ns))
    return clean, dirty, below


#: The column id of an attribute the file does not store (reads as NaN everywhere).
_ABSENT = 1 << 30


@dataclasses.dataclass(frozen=True)
class _Scope:
    """What one ``series`` read asks of every level it reads: the attributes and their column
    ids in the file, the GPUs (None: all) and the memo of raw aggregates of its read
    transaction."""

    attrs: tuple[str, ...]
    col_ids: tuple[int, ...]
    gpu_ids: np.ndarray | None
    memo: dict[tuple[Any, ...], dict[str, Any]]

    @property
    def col_index(self) -> dict[str, int]:
        return {a: c for a, c in zip(self.attrs, self.col_ids, strict=True) if c != _ABSENT}


def _column_ids(con: sqlite3.Connection, attrs: Sequence[str]) -> tuple[int, ...]:
    index = format.read_columns(con).index
    return tuple(index.get(a, _ABSENT) for a in attrs)


def _no_rows(attrs: Sequence[str]) -> dict[str, np.ndarray]:
    e = np.zeros(0, np.int64)
    return {"time_ns": e, "gpu_id": e, "n": e, "n_ok": e, "t_last_ns": e, "seen_ns": e} | {
        a: np.zeros(0) for a in attrs
    }


def cut_first_bucket(columns: dict[str, Any], read: SeriesRead) -> dict[str, Any]:
    """A bucket cut by the range's start is keyed at the start, so that every row lies in
    ``[start_ns, end_ns)`` (``Store.series``) and an analysis of the range keeps it."""
    if read.step_s is None or not len(columns["time_ns"]):
        return columns
    return {**columns, "time_ns": np.maximum(columns["time_ns"], read.start_ns)}


def rolled_key(level_ns: int) -> str:
    """The meta key of the end of the rolled-up buckets of a level."""
    return f"rolled_{level_ns // NS_PER_S}"


def rolled_from_key(level_ns: int) -> str:
    """The meta key of the start of the rolled-up buckets of a level added to a file that had
    data before it (absent: rolled from the file's first data on)."""
    return f"rolled_{level_ns // NS_PER_S}_from"
