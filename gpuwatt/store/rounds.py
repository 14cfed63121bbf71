"""The head: recent raw samples as rounds, one row per write and time, every GPU's values packed.

Format 2 (docs/storage.md): format 3 appends its rounds to segment files (``segments``) and
writes no head row; a file upgraded from format 2 keeps its head, read here, until it is
compacted and the retention deletes it. The writer's row layout (``Layout``, the encoder) is
format 3's raw row too.

A wide SQLite row per GPU and sample cost ~6 µs to bind and insert (48 parameters and a B-tree
cell each), which held the embedded store at ~100,000 GPU-samples/s on one core. A round stores
the GPU ids (little-endian int64) and their rows of values (little-endian float64) of one time:
one INSERT per collector round (bench/sqlite_ingest.py). Samples stay here, as written, until
their block of time closes and ``compact`` moves them into compressed chunks (``codec``).

A round's rows are stored zstd-compressed, a frame per column (``pack_vals``). A row of values
is ``lost`` (0/1), the file's metric columns in id order (``format.Columns``:
``ncols`` of them when the round was written; a column added since reads as NaN), then the
sample's tail id. NaN is "not measured". Integers and booleans are stored as float64, exact below
2**53. The tail is what a sample carries besides metrics (energy and TFLOPS methods, XIDs,
processes, job): it changes rarely, so it is kept once in ``tails`` and rows refer to it by id.

Invariant kept by ``insert``: one row per time, and a (time, GPU) pair in it at most once
(writing it again replaces it).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import sqlite3
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zstandard

from gpuwatt.model import GpuSample
from gpuwatt.store.codec import Rows, Span

LOST = 0
TAIL_COLUMNS = ("energy_method", "tflops_method", "xid_last", "xid_count", "processes", "job_id")

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS head (
  time_ns INTEGER PRIMARY KEY,
  ncols INTEGER NOT NULL,
  gpu_ids BLOB NOT NULL,
  vals BLOB NOT NULL
);
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

_MODEL_ATTRS = frozenset(f.name for f in dataclasses.fields(GpuSample))


class Layout:
    """How the writer packs a row for a file whose metric columns are ``attrs``."""

    def __init__(self, attrs: Sequence[str]) -> None:
        self.attrs = tuple(attrs)
        self.row_attrs = ("lost", *self.attrs)
        self.width = len(self.attrs) + 2
        self.tail = self.width - 1
        self.pack = struct.Struct(f"<{self.width}d").pack


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

    __slots__ = ("masked", "nones", "pack_row", "pick")

    def __init__(self, layout: Layout, masked: Sequence[int]) -> None:
        self.masked = _picker(masked)
        self.nones = (None,) * len(masked)
        gaps = set(masked)
        width = layout.width
        self.pick = operator.itemgetter(*(width if i in gaps else i for i in range(width)))
        self.pack_row = layout.pack

    def pack(self, row: tuple[Any, ...]) -> bytes:
        return self.pack_row(*self.pick(row + _NAN1))


def compile_encoder(key_attrs: Sequence[str], layout: Layout) -> Any:
    """The writer's per-sample loop, compiled with every attribute read spelled out.

    ``encode(samples, get_state, new_state, parts_append, gids_append, times_append)`` appends
    each sample's packed row, GPU id and time. ``get_state(uuid)`` returns the writer's state of
    a GPU (``gid``, ``key``, ``tail``, ``plan``) or None; ``new_state(key, time_ns)`` makes and
    records it for a GPU seen for the first time or whose key (``key_attrs``) changed. A column
    the file stores but ``GpuSample`` no longer has is written as not measured.

    Plain ``s.attr`` reads in generated code are specialised by the interpreter into slot loads,
    ~40 % cheaper than the same reads through ``operator.attrgetter``.
    """
    key = ", ".join(f"s.{a}" for a in key_attrs)
    row = ", ".join(f"s.{a}" if a in _MODEL_ATTRS else "None" for a in layout.row_attrs)
    row_names = (*layout.row_attrs, "tail")

    # A GPU's gaps change and change back (slow counters are read every 30th round or so):
    # the plans are kept by their gaps rather than made again each time.
    plans: dict[tuple[int, ...], Masked] = {}

    def masked_for(row: tuple[Any, ...]) -> Masked | None:
        """The ``Masked`` plan of a row (None: every value is set)."""
        masked = tuple([i for i, v in enumerate(row) if v is None])
        if not masked:
            return None
        plan = plans.get(masked)
        if plan is None:
            if len(plans) >= 4096:
                plans.clear()
            plan = plans[masked] = Masked(layout, masked)
        return plan

    def not_a_number(row: tuple[Any, ...]) -> Masked:
        """Called when a row does not pack: its plan if its only gaps are None values, else an
        error naming the value that is not a number."""
        plan = masked_for(row)
        if plan is not None:
            try:
                plan.pack(row)
                return plan
            except struct.error:
                pass
        for name, v in zip(row_names, row, strict=True):
            if v is not None and not isinstance(v, int | float):
                raise TypeError(f"{name}={v!r} is not a number")
        # every value is a number or None, yet the row did not pack
        raise TypeError(f"a row of numbers that does not pack as float64: {row!r}")

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
        "            plan = st.plan = not_a_number(row)\n"
        "            parts_append(plan.pack(row))\n"
        "        gids_append(st.gid)\n"
        "        times_append(s.time_ns)\n"
    )
    namespace: dict[str, Any] = {
        "_PACK": layout.pack,
        "masked_for": masked_for,
        "not_a_number": not_a_number,
        "struct": struct,
    }
    exec(compile(source, "<sqlite head encoder>", "exec"), namespace)
    return namespace["encode"]


#: The first byte of a round's ``vals``: one zstd frame per column of its rows (the column's
#: float64 words), after a table of where each frame ends. A read decompresses only the columns
#: it asks for, straight into its array (bench/read_regression.py: the raw tail of a dashboard
#: read; byte-shuffling the words saved ~6 % and cost 2.5x the decoding). A round of 32 GPUs is
#: ~11 kB raw and ~2.7 kB stored, one page: what each collector round costs in writes
#: (bench/store_write.py). Encoding 3 is encoding 2 where a column whose words are all the same
#: (a static fact, a metric not measured in this round: about 19 of a round's 43 columns in the
#: demo) is stored as that one word, 8 bytes, shorter than any zstd frame: no compression call
#: to write it, none to read it.
VALS_COLUMN_FRAMES_V2 = 2
VALS_COLUMN_FRAMES = 3
_READABLE = frozenset((VALS_COLUMN_FRAMES_V2, VALS_COLUMN_FRAMES))
_WORD = 8
_local = threading.local()


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """This thread's zstd contexts (a context is not safe to share between threads; making one
    per call costs more than decompressing a column)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = (
            # Level -1: the same size as level 1 for a round's columns (a few hundred bytes
            # each), and write_samples ~13 % cheaper (zstd sets up smaller tables per call).
            zstandard.ZstdCompressor(level=-1, write_content_size=True),
            zstandard.ZstdDecompressor(),
        )
    return ctx


#: How many bytes of decoded rounds a writing thread keeps (``_written``).
WRITTEN_CACHE_BYTES = 64 << 20


def _written() -> dict[bytes, np.ndarray]:
    """The rounds this thread packed lately, decoded, by their stored bytes. The writer reads
    each round back twice soon after writing it (its minute's rollup, its block's compaction):
    those reads take the rows from here instead of decompressing every column again. Keyed by
    the stored bytes, so a hit is the same round by construction; oldest dropped first past
    ``WRITTEN_CACHE_BYTES``. Threads that never write (readers) keep it empty."""
    cache: dict[bytes, np.ndarray] | None = getattr(_local, "written", None)
    if cache is None:
        cache = _local.written = {}
        _local.written_bytes = 0
    return cache


def _remember(packed: bytes, rows: np.ndarray) -> None:
    cache = _written()
    old = cache.pop(packed, None)  # the same round again (a round of lost GPUs, say)
    if old is not None:
        _local.written_bytes -= old.nbytes
    cache[packed] = rows
    _local.written_bytes += rows.nbytes
    while _local.written_bytes > WRITTEN_CACHE_BYTES and cache:
        _local.written_bytes -= cache.pop(next(iter(cache))).nbytes


def pack_vals(raw: bytes, width: int) -> bytes:
    """A round's rows (little-endian float64, ``width`` words each) as stored."""
    cctx = _zstd()[0]
    rows = np.frombuffer(raw, "<f8").reshape(-1, width)
    columns = rows.T.copy()
    words = columns.view(np.uint64)
    same = (words == words[:, :1]).all(axis=1).tolist()
    frames = [
        columns[j, :1].tobytes() if same[j] else cctx.compress(columns[j].tobytes())
        for j in range(width)
    ]
    ends = np.cumsum([len(f) for f in frames], dtype="<u4")
    packed = bytes((VALS_COLUMN_FRAMES,)) + ends.tobytes() + b"".join(frames)
    _remember(packed, columns.T)
    return packed


def unpack_columns(data: bytes, width: int, cols: Sequence[int], n_rows: int) -> np.ndarray:
    """The columns ``cols`` (positions in a row) of a round of ``n_rows`` GPUs stored by
    ``pack_vals``, as an array of rows."""
    if not data or data[0] not in _READABLE:
        raise ValueError(f"unknown head encoding {data[:1]!r}")
    written = getattr(_local, "written", None)
    if written:
        rows = written.get(data)
        # the bytes and the row count make the round: rounds whose columns are each one word
        # (every GPU lost, say) are the same bytes for any number of GPUs
        if rows is not None and len(rows) == n_rows:
            return rows[:, list(cols)]
    dctx = _zstd()[1]
    base = 1 + 4 * width
    ends = np.frombuffer(data, dtype="<u4", count=width, offset=1).tolist()
    view = memoryview(data)
    out = np.empty((len(cols), n_rows))
    for k, j in enumerate(cols):
        frame = view[base + (ends[j - 1] if j else 0) : base + ends[j]]
        if len(frame) == _WORD:  # one word for every row
            out[k] = np.frombuffer(frame, "<f8")[0]
        else:
            out[k] = np.frombuffer(dctx.decompress(frame), "<f8")
    return out.T


def unpack_vals(data: bytes, width: int, n_rows: int) -> np.ndarray:
    """A round's rows as stored by ``pack_vals``."""
    return unpack_columns(data, width, range(width), n_rows)


def insert(
    con: sqlite3.Connection, time_ns: int, gpu_ids: Sequence[int], vals: bytes, ncols: int
) -> None:
    """Store one round; a GPU already stored at ``time_ns`` is replaced (last write wins), and
    the others stored at that time are kept in the same row (one row per time: the time is the
    row's key, so a round costs no index page).

    ``gpu_ids`` must be distinct and ``vals`` their rows (``ncols`` metric columns, as the
    encoder packs them), in the same order.
    """
    ids = np.asarray(gpu_ids, dtype="<i8")
    old = con.execute(
        "SELECT gpu_ids, vals, ncols FROM head WHERE time_ns = ?", (time_ns,)
    ).fetchone()
    if old is not None:
        old_ids = np.frombuffer(old[0], dtype="<i8")
        keep = ~np.isin(old_ids, ids)
        if keep.any():
            rows = widen(unpack_vals(old[1], old[2] + 2, len(old_ids))[keep], ncols)
            new = np.frombuffer(vals, dtype="<f8").reshape(-1, ncols + 2)
            ids = np.concatenate([old_ids[keep], ids])
            vals = np.concatenate([rows, new]).tobytes()
    con.execute(
        "INSERT OR REPLACE INTO head (time_ns, ncols, gpu_ids, vals) VALUES (?, ?, ?, ?)",
        (time_ns, ncols, ids.tobytes(), pack_vals(vals, ncols + 2)),
    )


def widen(rows: np.ndarray, ncols: int) -> np.ndarray:
    """Raw rows of fewer metric columns as rows of ``ncols`` (the columns added since: NaN)."""
    missing = ncols + 2 - rows.shape[1]
    if missing <= 0:
        return rows
    pad = np.full((len(rows), missing), np.nan)
    return np.concatenate([rows[:, :-1], pad, rows[:, -1:]], axis=1)


_CHUNK_ROUNDS = 256


def read(con: sqlite3.Connection, span: Span) -> Rows:
    """The head's samples of ``span``, in time order. Rounds are decoded a chunk at a time, so
    memory follows what is returned, not the width of what is stored."""
    start_ns, end_ns, col_ids, gpu_ids = span
    cur = con.execute(
        "SELECT time_ns, ncols, gpu_ids, vals FROM head WHERE time_ns >= ? AND time_ns < ? "
        "ORDER BY time_ns",
        (start_ns, end_ns),
    )
    cols = list(col_ids)
    parts: list[tuple[np.ndarray, ...]] = []
    while chunk := cur.fetchmany(_CHUNK_ROUNDS):
        t, nc, g, v = zip(*chunk, strict=True)
        if len(set(nc)) > 1:  # rounds written before and after a column was added
            for row in chunk:
                parts.append(_decode_rounds([row[0]], row[1], [row[2]], [row[3]], cols, gpu_ids))
            continue
        parts.append(_decode_rounds(t, nc[0], g, v, cols, gpu_ids))
    if not parts:
        e = np.zeros(0, np.int64)
        return Rows(e, e, np.zeros(0), np.zeros(0), np.zeros((0, len(cols))), tuple(cols))
    if len(parts) == 1:
        t_, g_, lost, tail, vals = parts[0]
    else:
        t_, g_, lost, tail, vals = (np.concatenate(x) for x in zip(*parts, strict=True))
    return Rows(g_, t_, lost, tail, vals, tuple(cols))


def _decode_rounds(
    times: Sequence[int],
    ncols: int,
    gpu_ids: Sequence[bytes],
    vals: Sequence[bytes],
    cols: list[int],
    only: np.ndarray | None,
) -> tuple[np.ndarray, ...]:
    gid = np.frombuffer(b"".join(gpu_ids), dtype="<i8")
    tt = np.repeat(np.array(times, dtype=np.int64), [len(x) >> 3 for x in gpu_ids])
    stored = [c for c in cols if c < ncols]  # a column added after these rounds: not measured
    wanted = [LOST, *(1 + c for c in stored), ncols + 1]
    vv = np.concatenate(
        [
            unpack_columns(v, ncols + 2, wanted, len(g) >> 3)
            for v, g in zip(vals, gpu_ids, strict=True)
        ]
    )
    if only is not None:
        keep = np.isin(gid, only)
        gid, tt, vv = gid[keep], tt[keep], vv[keep]
    if len(stored) == len(cols):
        values = vv[:, 1:-1]
    else:
        values = np.full((len(gid), len(cols)), np.nan)
        k = 1
        for j, c in enumerate(cols):
            if c < ncols:
                values[:, j] = vv[:, k]
                k += 1
    return tt, gid, vv[:, 0].copy(), vv[:, -1].copy(), values


def count(con: sqlite3.Connection, start_ns: int, end_ns: int) -> int:
    (n_bytes,) = con.execute(
        "SELECT coalesce(sum(length(gpu_ids)), 0) FROM head WHERE time_ns >= ? AND time_ns < ?",
        (start_ns, end_ns),
    ).fetchone()
    return int(n_bytes) // 8  # one int64 id per sample
