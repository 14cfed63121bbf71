"""Rollup buckets (1 minute, 5 minutes, 1 hour) as column arrays: the one stored form of the
rollups.

Each bucket of a level is stored as a few BLOBs keyed ``(level_ns, time_ns, col)``: the key
columns ``gpu_id``, ``n``, ``n_ok``, ``t_last_ns`` and ``seen_ns`` (int64, negative ``col``;
``seen_ns`` is absent from buckets written before it existed and reads as unknown) and one
float64 array per metric column (``format.Columns`` id) that is set for at least one GPU; a metric
without a BLOB reads as NaN. The values are what ``rollup_rule.combine`` computed; reading a
bucket is ``numpy.frombuffer`` of a few hundred BLOBs rather than a Python object per value
(an hour of 1,024 GPUs' minutes row by row through ``sqlite3`` cost 0.45 s of CPU against
0.07 s for SQLite's own scan).

A BLOB starts with its encoding byte: ``RAW`` (little-endian words as they are) or
``SHUFFLED_ZSTD`` (the words byte-shuffled, then zstd), whichever is smaller by at least
``_MIN_SAVING``; constant columns (memory total, power limit, ...) and the key columns shrink to
a few bytes, while means with noisy mantissas stay raw and cost nothing to decode.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence

import numpy as np
import zstandard

from gpuwatt.store import rollup_rule

NULL_TIME = rollup_rule.NULL_TIME
#: The key columns' ``col`` numbers (metric columns are their ``format.Columns`` id, >= 0).
KEY_COLS = {"gpu_id": -1, "n": -2, "n_ok": -3, "t_last_ns": -4, "seen_ns": -5}
#: Key columns a bucket may lack: written before they existed, read as this value.
OPTIONAL_KEYS = {"seen_ns": rollup_rule.UNKNOWN_SEEN}
RAW = 0
SHUFFLED_ZSTD = 1
_MIN_SAVING = 0.25  # compress a BLOB only where it saves a quarter: decoding stays cheap

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS rollups (
  level_ns INTEGER NOT NULL,
  time_ns INTEGER NOT NULL,
  col INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (level_ns, time_ns, col)
);
"""

_cctx = zstandard.ZstdCompressor(level=3)  # used by the writer only, under the store's lock
_local = threading.local()


def _dctx() -> zstandard.ZstdDecompressor:
    """This thread's decompressor (not safe to share; one per BLOB costs more than the BLOB)."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def _encode(words: np.ndarray) -> bytes:
    raw = words.astype("<f8" if words.dtype.kind == "f" else "<i8", copy=False).tobytes()
    shuffled = np.frombuffer(raw, np.uint8).reshape(-1, 8).T.tobytes()
    packed = _cctx.compress(shuffled)
    if len(packed) <= len(raw) * (1 - _MIN_SAVING):
        return bytes((SHUFFLED_ZSTD,)) + packed
    return bytes((RAW,)) + raw


def _decode(data: bytes, dtype: str) -> np.ndarray:
    if data[0] == RAW:
        return np.frombuffer(data, dtype=dtype, offset=1)
    if data[0] == SHUFFLED_ZSTD:
        raw = _dctx().decompress(data[1:])
        return np.frombuffer(raw, np.uint8).reshape(8, -1).T.copy().view(dtype).ravel()
    raise ValueError(f"unknown rollup encoding {data[0]}")


def write(
    con: sqlite3.Connection,
    level_ns: int,
    start_ns: int,
    end_ns: int,
    cols: dict[str, np.ndarray],
    col_ids: dict[str, int],
) -> None:
    """Replace the buckets in ``[start_ns, end_ns)`` by ``cols`` (``combine``'s output: ordered
    by bucket and GPU id); ``col_ids`` maps each metric attribute in ``cols`` to its column."""
    con.execute(
        "DELETE FROM rollups WHERE level_ns = ? AND time_ns >= ? AND time_ns < ?",
        (level_ns, start_ns, end_ns),
    )
    times = cols["time_ns"]
    if not len(times):
        return
    starts = np.flatnonzero(np.r_[True, times[1:] != times[:-1]])
    bounds = list(zip(starts.tolist(), [*starts[1:].tolist(), len(times)], strict=True))
    bucket_ns = times[starts].tolist()
    out: list[tuple[int, int, int, bytes]] = []
    for name, col in KEY_COLS.items():
        if name not in cols:
            continue
        for t, (lo, hi) in zip(bucket_ns, bounds, strict=True):
            out.append((level_ns, t, col, _encode(cols[name][lo:hi])))
    for attr, col in col_ids.items():
        values = cols[attr]
        present = ~np.isnan(values)
        if not present.any():
            continue
        for t, (lo, hi) in zip(bucket_ns, bounds, strict=True):
            if present[lo:hi].any():
                out.append((level_ns, t, col, _encode(values[lo:hi])))
    con.executemany("INSERT INTO rollups VALUES (?, ?, ?, ?)", out)


def delete_before(con: sqlite3.Connection, level_ns: int, cut_ns: int) -> None:
    con.execute("DELETE FROM rollups WHERE level_ns = ? AND time_ns < ?", (level_ns, cut_ns))


def first_time(con: sqlite3.Connection, level_ns: int, before_ns: int) -> int | None:
    """The start of a level's first bucket before ``before_ns`` (None: there is none)."""
    (t,) = con.execute(
        "SELECT min(time_ns) FROM rollups WHERE level_ns = ? AND time_ns < ?",
        (level_ns, before_ns),
    ).fetchone()
    return None if t is None else int(t)


def read(
    con: sqlite3.Connection,
    level_ns: int,
    start_ns: int,
    end_ns: int,
    attrs: Sequence[str],
    col_ids: dict[str, int],
    *,
    exclude: Sequence[int] = (),
    gpu_ids: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The buckets in ``[start_ns, end_ns)`` (but not those in ``exclude``) as level columns
    (``rollup_rule``): ``time_ns``, ``gpu_id``, ``n``, ``n_ok``, ``t_last_ns``, ``seen_ns`` and
    one float64 array per attribute (NaN where not stored); only ``gpu_ids`` if given."""
    wanted = {col_ids[a]: a for a in attrs if a in col_ids}
    cols = [*KEY_COLS.values(), *wanted]
    rows = con.execute(
        "SELECT time_ns, col, data FROM rollups WHERE level_ns = ? AND time_ns >= ? "
        f"AND time_ns < ? AND col IN ({', '.join('?' * len(cols))}) ORDER BY time_ns",
        (level_ns, start_ns, end_ns, *cols),
    ).fetchall()
    skip = set(exclude)
    buckets: dict[int, dict[int, bytes]] = {}
    for t, col, data in rows:
        if t not in skip:
            buckets.setdefault(t, {})[col] = data
    names = {v: k for k, v in KEY_COLS.items()}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in (*rollup_rule.KEYS, *attrs)}
    for t, blobs in buckets.items():
        gid = _decode(blobs[KEY_COLS["gpu_id"]], "<i8")
        keep = None if gpu_ids is None else np.isin(gid, gpu_ids)
        n = len(gid) if keep is None else int(keep.sum())
        parts["time_ns"].append(np.full(n, t, dtype=np.int64))
        for col, name in names.items():
            if col not in blobs and name in OPTIONAL_KEYS:
                parts[name].append(np.full(n, OPTIONAL_KEYS[name], dtype=np.int64))
                continue
            v = _decode(blobs[col], "<i8")
            parts[name].append(v if keep is None else v[keep])
        for a in attrs:
            data = blobs.get(col_ids.get(a, -99))
            if data is None:
                parts[a].append(np.full(n, np.nan))
            else:
                v = _decode(data, "<f8")
                parts[a].append(v if keep is None else v[keep])
    out = {k: _concat(parts[k], np.int64) for k in rollup_rule.KEYS}
    return out | {a: _concat(parts[a], np.float64) for a in attrs}


def _concat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)
