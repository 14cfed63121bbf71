"""Raw samples as rounds: one row per write and time, every GPU's values packed in two BLOBs.

A wide SQLite row per GPU and sample cost ~6 µs to bind and insert (48 parameters and a B-tree
cell each), which held the embedded store at ~100,000 GPU-samples/s on one core. A round stores
the GPU ids (little-endian int64) and their rows of values (little-endian float64, ``WIDTH`` per
GPU) of one time: one INSERT per collector round, and reads and rollups decode rounds with numpy
rather than aggregating row by row in SQL.

A row of values is ``lost`` (0/1), the metrics in ``METRIC_ATTRS`` order, then the sample's tail
id. NaN is "not measured". Integers and booleans are stored as float64, exact below 2**53 (9 PB of
memory, 285 years of joules at 1 kW). The tail is what a sample carries besides metrics (energy
and TFLOPS methods, XIDs, processes, job): it changes rarely, so it is kept once in ``tails`` and
rows refer to it by id.

Invariant kept by ``insert``: a (time, GPU) pair is in at most one round (writing it again
replaces it), so counts and aggregates never need deduplication.
"""

from __future__ import annotations

import math
import operator
import sqlite3
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuwatt.schema import FIELDS
from gpuwatt.store import packed

#: The metric attributes, in stored order.
METRIC_ATTRS: tuple[str, ...] = tuple(f.attr for f in FIELDS)
ROW_ATTRS: tuple[str, ...] = ("lost", *METRIC_ATTRS)
LOST = 0
TAIL = len(ROW_ATTRS)
WIDTH = TAIL + 1
COLUMN: dict[str, int] = {a: i for i, a in enumerate(ROW_ATTRS)}
TAIL_COLUMNS = ("energy_method", "tflops_method", "xid_last", "xid_count", "processes", "job_id")

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS raw_rounds (
  id INTEGER PRIMARY KEY,
  time_ns INTEGER NOT NULL,
  gpu_ids BLOB NOT NULL,
  vals BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS raw_rounds_time ON raw_rounds (time_ns);
CREATE TABLE IF NOT EXISTS tails (
  id INTEGER PRIMARY KEY,
  energy_method TEXT,
  tflops_method TEXT,
  xid_last INTEGER,
  xid_count INTEGER,
  processes TEXT,
  job_id TEXT,
  last_ns INTEGER NOT NULL
);
"""

_PACK = struct.Struct(f"<{WIDTH}d").pack
_NAN1 = (math.nan,)


def _picker(idx: Sequence[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The items at ``idx`` as a tuple (itemgetter returns a bare item for one index)."""
    if len(idx) == 1:
        i = idx[0]
        return lambda v: (v[i],)
    return operator.itemgetter(*idx)


class Masked:
    """How a GPU that leaves some values None has its rows packed: NaN in their place. The
    positions are checked on every row (they must still be None; see the encoder)."""

    __slots__ = ("masked", "nones", "pick")

    def __init__(self, masked: Sequence[int]) -> None:
        self.masked = _picker(masked)
        self.nones = (None,) * len(masked)
        gaps = set(masked)
        self.pick = operator.itemgetter(*(WIDTH if i in gaps else i for i in range(WIDTH)))

    def pack(self, row: tuple[Any, ...]) -> bytes:
        return _PACK(*self.pick(row + _NAN1))


def masked_for(row: tuple[Any, ...]) -> Masked | None:
    """The ``Masked`` plan of a row (None: every value is set)."""
    masked = [i for i, v in enumerate(row) if v is None]
    return Masked(masked) if masked else None


def _not_a_number(row: tuple[Any, ...]) -> Masked:
    """Called when a row does not pack: its plan if it has None values, else a clear error."""
    plan = masked_for(row)
    if plan is None:
        for name, v in zip((*ROW_ATTRS, "tail"), row, strict=True):
            if not isinstance(v, int | float):
                raise TypeError(f"{name}={v!r} is not a number")
    assert plan is not None
    return plan


def compile_encoder(key_attrs: Sequence[str]) -> Any:
    """The writer's per-sample loop, compiled with every attribute read spelled out.

    ``encode(samples, get_state, new_state, parts_append, gids_append, times_append)`` appends
    each sample's packed row, GPU id and time. ``get_state(uuid)`` returns the writer's state of
    a GPU (``gid``, ``key``, ``tail``, ``plan``) or None; ``new_state(key, time_ns)`` makes and
    records it for a GPU seen for the first time or whose key (``key_attrs``) changed.

    Plain ``s.attr`` reads in generated code are specialised by the interpreter into slot loads,
    ~40 % cheaper than the same reads through ``operator.attrgetter``.
    """
    key = ", ".join(f"s.{a}" for a in key_attrs)
    row = ", ".join(f"s.{a}" for a in ROW_ATTRS)
    source = (
        "def encode(samples, get_state, new_state, parts_append, gids_append, times_append):\n"
        "    for s in samples:\n"
        f"        key = ({key})\n"
        "        st = get_state(s.uuid)\n"
        "        if st is None or st.key != key:\n"
        "            st = new_state(key, s.time_ns)\n"
        f"        row = ({row}, st.tail)\n"
        "        plan = st.plan\n"
        "        if plan is not None and plan.masked(row) != plan.nones:\n"
        "            plan = st.plan = masked_for(row)  # it reports other metrics now\n"
        "        try:\n"
        "            parts_append(_PACK(*row) if plan is None else plan.pack(row))\n"
        "        except struct.error:  # None where the plan expects a value\n"
        "            plan = st.plan = _not_a_number(row)\n"
        "            parts_append(plan.pack(row))\n"
        "        gids_append(st.gid)\n"
        "        times_append(s.time_ns)\n"
    )
    namespace: dict[str, Any] = {
        "_PACK": _PACK,
        "masked_for": masked_for,
        "_not_a_number": _not_a_number,
        "struct": struct,
    }
    exec(compile(source, "<sqlite rounds encoder>", "exec"), namespace)
    return namespace["encode"]


def insert(con: sqlite3.Connection, time_ns: int, gpu_ids: Sequence[int], vals: bytes) -> None:
    """Store one round; a GPU already stored at ``time_ns`` is replaced (last write wins).

    ``gpu_ids`` must be distinct and ``vals`` their packed rows, in the same order.
    """
    ids = np.asarray(gpu_ids, dtype="<i8")
    for rid, old_ids, old_vals in con.execute(
        "SELECT id, gpu_ids, vals FROM raw_rounds WHERE time_ns = ?", (time_ns,)
    ).fetchall():
        old = np.frombuffer(old_ids, dtype="<i8")
        keep = ~np.isin(old, ids)
        if keep.all():
            continue
        if not keep.any():
            con.execute("DELETE FROM raw_rounds WHERE id = ?", (rid,))
            continue
        rows = np.frombuffer(old_vals, dtype="<f8").reshape(-1, WIDTH)[keep]
        con.execute(
            "UPDATE raw_rounds SET gpu_ids = ?, vals = ? WHERE id = ?",
            (old[keep].tobytes(), rows.tobytes(), rid),
        )
    con.execute(
        "INSERT INTO raw_rounds (time_ns, gpu_ids, vals) VALUES (?, ?, ?)",
        (time_ns, ids.tobytes(), vals),
    )


@dataclass(frozen=True)
class RawRange:
    """Raw samples in time order (GPUs in write order within a time): ``values[:, j]`` is the
    j-th of the columns that were read."""

    time_ns: np.ndarray
    gpu_id: np.ndarray
    values: np.ndarray


_CHUNK_ROUNDS = 256
_ALL_COLUMNS = list(range(WIDTH))


def read(
    con: sqlite3.Connection,
    start_ns: int,
    end_ns: int,
    columns: Sequence[int],
    gpu_ids: np.ndarray | None = None,
) -> RawRange:
    """The samples in ``[start_ns, end_ns)`` (only ``gpu_ids`` if given) with the value
    ``columns`` (indices into a row). Rounds are decoded a chunk at a time, so memory follows
    what is returned, not the width of what is stored."""
    cur = con.execute(
        "SELECT time_ns, gpu_ids, vals FROM raw_rounds WHERE time_ns >= ? AND time_ns < ? "
        "ORDER BY time_ns, id",
        (start_ns, end_ns),
    )
    cols = list(columns)
    times: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    while chunk := cur.fetchmany(_CHUNK_ROUNDS):
        t, g, v = zip(*chunk, strict=True)
        gid = np.frombuffer(b"".join(g), dtype="<i8")
        tt = np.repeat(np.array(t, dtype=np.int64), [len(x) >> 3 for x in g])
        vv = np.frombuffer(b"".join(v), dtype="<f8").reshape(-1, WIDTH)
        if gpu_ids is not None:
            keep = np.isin(gid, gpu_ids)
            gid, tt, vv = gid[keep], tt[keep], vv[keep]
        times.append(tt)
        ids.append(gid)
        values.append(vv if cols == _ALL_COLUMNS else vv[:, cols])
    if not times:
        return RawRange(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, len(cols))))
    if len(times) == 1:
        return RawRange(times[0], ids[0], values[0])
    return RawRange(np.concatenate(times), np.concatenate(ids), np.concatenate(values))


def read_attrs(
    con: sqlite3.Connection,
    start_ns: int,
    end_ns: int,
    attrs: Sequence[str],
    gpu_ids: np.ndarray | None = None,
    *,
    with_tail: bool = False,
) -> RawRange:
    """``read`` of the columns ``lost``, ``attrs``... (and the tail id last, if asked)."""
    cols = [LOST, *(COLUMN[a] for a in attrs)]
    return read(con, start_ns, end_ns, [*cols, TAIL] if with_tail else cols, gpu_ids)


def aggregate(
    raw: RawRange, step_ns: int, attrs: Sequence[str], last_value_attrs: frozenset[str]
) -> dict[str, np.ndarray]:
    """Raw samples read by ``read_attrs`` as level columns: one row per (``step_ns`` bucket,
    GPU), ordered by bucket and GPU id, with ``time_ns`` (bucket start), ``gpu_id``, ``n``
    (samples), ``n_ok`` (non-lost), ``t_last_ns`` (newest non-lost, ``packed.NULL_TIME`` if
    none) and per attribute the mean of the samples where it is set or, for
    ``last_value_attrs``, its value in the newest non-lost sample. The rollup tables hold
    exactly these."""
    n = len(raw.time_ns)
    if n == 0:
        empty = {k: np.zeros(0, np.int64) for k in ("time_ns", "gpu_id", "n", "n_ok", "t_last_ns")}
        return empty | {a: np.zeros(0) for a in attrs}
    last = [a in last_value_attrs for a in attrs]
    bucket = raw.time_ns // step_ns * step_ns
    # Samples are in time order, so each bucket is a run of rows.
    edges = np.flatnonzero(bucket[1:] != bucket[:-1]) + 1
    parts = [
        _bucket_as_rounds(raw, lo, hi, last) or _bucket_sorted(raw, lo, hi, last)
        for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), n], strict=True)
    ]
    out = {
        "time_ns": np.concatenate(
            [np.full(len(p[0]), b) for p, b in zip(parts, bucket[[0, *edges]], strict=True)]
        ),
    }
    for i, k in enumerate(("gpu_id", "n", "n_ok", "t_last_ns")):
        out[k] = np.concatenate([p[i] for p in parts])
    values = np.concatenate([p[4] for p in parts])
    for j, a in enumerate(attrs):
        out[a] = values[:, j]
    return out


_Bucket = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _bucket_as_rounds(raw: RawRange, lo: int, hi: int, last: list[bool]) -> _Bucket | None:
    """The rows ``[lo, hi)`` of one bucket aggregated per GPU when they are whole rounds of
    the same GPUs in the same order (a collector's steady state: no sort, no gather); None
    otherwise."""
    t = raw.time_ns[lo:hi]
    width = int(np.searchsorted(t, t[0], side="right"))
    if (hi - lo) % width:
        return None
    gid = raw.gpu_id[lo:hi].reshape(-1, width)
    if not (gid == gid[0]).all():
        return None
    vals = raw.values[lo:hi, : 1 + len(last)].reshape(-1, width, 1 + len(last))
    ok = vals[:, :, LOST] == 0  # rounds x GPUs
    rounds_n = len(vals)
    present = ~np.isnan(vals[:, :, 1:])
    counts = present.sum(axis=0)
    sums = np.where(present, vals[:, :, 1:], 0.0).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(counts > 0, sums / counts, np.nan)
    if any(last):
        any_ok = ok.any(axis=0)
        newest = rounds_n - 1 - np.argmax(ok[::-1], axis=0)  # per GPU: its newest non-lost round
        at_newest = vals[newest, np.arange(width), 1:]
        cols = np.flatnonzero(last)
        values[:, cols] = np.where(any_ok[:, None], at_newest[:, cols], np.nan)
    t_last = np.where(ok, t.reshape(-1, width), packed.NULL_TIME).max(axis=0)
    order = np.argsort(gid[0], kind="stable")
    return (
        gid[0][order],
        np.full(width, rounds_n, dtype=np.int64),
        ok.sum(axis=0)[order],
        t_last[order],
        values[order],
    )


def _bucket_sorted(raw: RawRange, lo: int, hi: int, last: list[bool]) -> _Bucket:
    """The rows ``[lo, hi)`` of one bucket aggregated per GPU, whatever their order."""
    gid = raw.gpu_id[lo:hi]
    order = np.argsort(gid, kind="stable")  # stable: each GPU's samples stay in time order
    g = gid[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    vals = raw.values[lo:hi, : 1 + len(last)][order]
    ok = vals[:, LOST] == 0
    time_ns = raw.time_ns[lo:hi][order]
    m = len(order)
    newest_ok = np.maximum.reduceat(np.where(ok, np.arange(m), -1), starts)
    metrics = vals[:, 1:]
    present = ~np.isnan(metrics)
    sums = np.add.reduceat(np.where(present, metrics, 0.0), starts, axis=0)
    counts = np.add.reduceat(present.astype(np.float64), starts, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(counts > 0, sums / counts, np.nan)
    if any(last):
        cols = np.flatnonzero(last)
        at_newest = metrics[np.where(newest_ok >= 0, newest_ok, 0)][:, cols]
        values[:, cols] = np.where(newest_ok[:, None] >= 0, at_newest, np.nan)
    return (
        g[starts],
        np.diff(np.r_[starts, m]),
        np.add.reduceat(ok.astype(np.int64), starts),
        np.maximum.reduceat(np.where(ok, time_ns, packed.NULL_TIME), starts),
        values,
    )
