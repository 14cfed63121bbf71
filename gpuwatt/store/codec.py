"""Compressed chunks of raw samples: the encoding of ``chunks.data`` (docs/storage.md).

A chunk holds the samples of some GPUs (the GPUs of one host) over one closed block of time, as
64-bit words, one *section* per column: the time, the lost flag, the tail id, then each metric
column that is set in at least one sample (an absent metric has no section and costs nothing).
Rows are ordered by GPU, then time; each GPU is a *run* of rows. Every section is transformed to
suit its values, within each run:

- times: delta of delta (``DOD``): a steady sampling interval becomes zeros;
- integers, and decimals with at most ``MAX_DECIMALS`` digits after the point (NVML's mW, mJ,
  MiB scaled to SI units): scaled to int64 and differenced (``DECIMAL_DELTA``), so counters and
  slow gauges become small numbers;
- the same with some values not measured (``DECIMAL_DELTA_GAPS``): 0 for a value not measured,
  otherwise 1 + the zigzagged difference from the run's previous measured value, so a metric
  that is sometimes absent keeps the integer transform;
- other floats: their IEEE-754 bits as they are (``FLOAT_BITS``); NaN (not measured) round-trips.

A column may have a stored precision (``encode``'s ``decimals``: docs/storage.md lists them):
its values are rounded to that many digits after the point before they are transformed, so
that full-precision ratios (NVML's GPM percentages) cost what their useful digits cost.

Signed differences are zigzag-encoded (small magnitudes have high bytes of zero), the sections
are byte-shuffled (byte k of every word together, as Blosc does), and the whole is compressed
with zstd. Decoding reverses each step exactly: what comes back is bit for bit what was encoded
(after the rounding to a column's stored precision, where it has one).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import zstandard

#: The first byte of an encoded chunk: how the rest is encoded.
CHUNK_ZSTD_V1 = 1

# Section transforms (one byte each in the chunk header).
FLOAT_BITS = 0
DECIMAL_DELTA = 1
DOD = 2
DELTA = 3
DECIMAL_DELTA_GAPS = 4

MAX_DECIMALS = 6
_POW10 = [10.0**k for k in range(MAX_DECIMALS + 1)]
_LIMIT = 2.0**53  # integers exact in float64

ZSTD_LEVEL = 7  # bench/storage.py: 0.3 B/sample less than level 3 (~1 %), at about the same speed
_HEADER = struct.Struct("<BIHH")  # encoding, rows, runs, metric sections
_RUN = struct.Struct("<qI")  # gpu id, rows
_SECTION = struct.Struct("<HBB")  # column id, transform, decimals


class Span(NamedTuple):
    """The raw samples a read asks for: times in ``[start_ns, end_ns)``, the metric columns
    ``col_ids``, only the GPUs ``gpu_ids`` (None: every GPU)."""

    start_ns: int
    end_ns: int
    col_ids: Sequence[int]
    gpu_ids: np.ndarray | None = None


@dataclass(frozen=True)
class Rows:
    """Raw samples as columns: ``values[:, j]`` is metric column ``col_ids[j]`` (NaN: not
    measured). Rows sorted by (gpu_id, time_ns) when encoded."""

    gpu_id: np.ndarray  # int64
    time_ns: np.ndarray  # int64
    lost: np.ndarray  # float64 0/1
    tail: np.ndarray  # float64 (a tail id)
    values: np.ndarray  # float64, rows x len(col_ids)
    col_ids: tuple[int, ...]


def _zigzag(d: np.ndarray) -> np.ndarray:
    return ((d << 1) ^ (d >> 63)).view(np.uint64)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    return ((z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))).view(np.int64)


def _delta(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Differences within runs; the first value of each run as it is."""
    d = np.empty_like(x)
    d[0:1] = x[0:1]
    np.subtract(x[1:], x[:-1], out=d[1:])
    d[starts] = x[starts]
    return d


def _undelta(d: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    c = np.cumsum(d)
    offsets = c[starts] - d[starts]
    return c - np.repeat(offsets, lengths)


def _decimals(v: np.ndarray) -> int | None:
    """The fewest digits after the point that hold every value of ``v`` exactly (None: none
    up to ``MAX_DECIMALS``, or a NaN/inf among them)."""
    if not np.isfinite(v).all():
        return None
    big = np.abs(v).max(initial=0.0)
    for k, p in enumerate(_POW10):
        if big * p >= _LIMIT:
            return None
        scaled = np.rint(v * p)
        if np.array_equal(scaled / p, v):
            return k
    return None


def _fill_gaps(ints: np.ndarray, gaps: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``ints`` with each gap holding the run's previous value (0 before the run's first)."""
    at = np.arange(len(ints))
    keep = ~gaps
    keep[starts] = True
    src = np.maximum.accumulate(np.where(keep, at, 0))
    return np.where(gaps, 0, ints)[src]


def encode(
    rows: Rows,
    cctx: zstandard.ZstdCompressor | None = None,
    decimals: Mapping[int, int] | None = None,
) -> bytes:
    """The chunk of ``rows`` (sorted by GPU, then time). ``decimals``: the stored precision of
    some columns (column id -> digits after the point, at most ``MAX_DECIMALS``): their values
    are rounded to it."""
    m = len(rows.time_ns)
    gid = rows.gpu_id
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    lengths = np.diff(np.r_[starts, m])
    words = [
        _zigzag(_delta(_delta(rows.time_ns, starts), _second_starts(starts, m))),
        rows.lost.astype(np.uint64),
        _zigzag(_delta(rows.tail.astype(np.int64), starts)),
    ]
    sections = []
    for j, col in enumerate(rows.col_ids):
        v = rows.values[:, j]
        gaps = np.isnan(v)
        if gaps.all():
            continue  # absent: no section
        cap = None if decimals is None else decimals.get(col)
        if cap is not None:
            v = np.round(v, cap)
        has_gaps = bool(gaps.any())
        k = _decimals(v[~gaps] if has_gaps else v)
        if k is None:
            words.append(np.ascontiguousarray(v).view(np.uint64))
            sections.append((col, FLOAT_BITS, 0))
        elif has_gaps:
            ints = np.rint(np.where(gaps, 0.0, v) * _POW10[k]).astype(np.int64)
            z = _zigzag(_delta(_fill_gaps(ints, gaps, starts), starts)) + np.uint64(1)
            words.append(np.where(gaps, np.uint64(0), z))
            sections.append((col, DECIMAL_DELTA_GAPS, k))
        else:
            ints = np.rint(v * _POW10[k]).astype(np.int64)
            words.append(_zigzag(_delta(ints, starts)))
            sections.append((col, DECIMAL_DELTA, k))
    head = _HEADER.pack(CHUNK_ZSTD_V1, m, len(starts), len(sections))
    head += b"".join(_RUN.pack(int(gid[s]), int(n)) for s, n in zip(starts, lengths, strict=True))
    head += b"".join(_SECTION.pack(*s) for s in sections)
    body = np.stack(words).view(np.uint8).reshape(len(words), m, 8).transpose(0, 2, 1)
    return head[:1] + (cctx or zstandard.ZstdCompressor(level=ZSTD_LEVEL)).compress(
        head[1:] + body.tobytes()
    )


def decode(data: bytes, dctx: zstandard.ZstdDecompressor | None = None) -> Rows:
    """The rows of a chunk; metric columns in the order of its sections."""
    if not data or data[0] != CHUNK_ZSTD_V1:
        raise ValueError(f"unknown chunk encoding {data[:1]!r}")
    raw = (dctx or zstandard.ZstdDecompressor()).decompress(data[1:])
    _, m, n_runs, n_sections = _HEADER.unpack_from(b"\x00" + raw[: _HEADER.size - 1])
    pos = _HEADER.size - 1
    runs = [_RUN.unpack_from(raw, pos + i * _RUN.size) for i in range(n_runs)]
    pos += n_runs * _RUN.size
    sections = [_SECTION.unpack_from(raw, pos + i * _SECTION.size) for i in range(n_sections)]
    pos += n_sections * _SECTION.size
    k = 3 + n_sections
    words = (
        np.frombuffer(raw, dtype=np.uint8, offset=pos, count=k * m * 8)
        .reshape(k, 8, m)
        .transpose(0, 2, 1)
        .copy()
        .view(np.uint64)
        .reshape(k, m)
    )
    lengths = np.array([n for _, n in runs], dtype=np.int64)
    starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64) if runs else lengths
    gpu_id = np.repeat(np.array([g for g, _ in runs], dtype=np.int64), lengths)
    second = _second_starts(starts, m)
    deltas = _undelta(_unzigzag(words[0]), second, _run_lengths(second, m))
    time_ns = _undelta(deltas, starts, lengths)
    lost = words[1].astype(np.float64)
    tail = _undelta(_unzigzag(words[2]), starts, lengths).astype(np.float64)
    cols = np.empty((n_sections, m))  # a row per section, returned transposed
    for j, (_col, transform, decimals) in enumerate(sections):
        w = words[3 + j]
        if transform == FLOAT_BITS:
            cols[j] = w.view(np.float64)
        elif transform == DECIMAL_DELTA:
            np.divide(_undelta(_unzigzag(w), starts, lengths), _POW10[decimals], out=cols[j])
        elif transform == DECIMAL_DELTA_GAPS:
            gaps = w == 0
            w -= np.uint64(1)  # 1 + the zigzagged difference (0, not measured, wraps: unused)
            d = _unzigzag(w)
            d[gaps] = 0
            np.divide(_undelta(d, starts, lengths), _POW10[decimals], out=cols[j])
            cols[j][gaps] = np.nan
        else:
            raise ValueError(f"unknown section transform {transform}")
    values = cols.T
    return Rows(gpu_id, time_ns, lost, tail, values, tuple(c for c, _, _ in sections))


def _second_starts(starts: np.ndarray, m: int) -> np.ndarray:
    """The runs' first and second rows: where a run's time deltas start (delta of delta)."""
    both = np.union1d(starts, starts + 1)
    return both[both < m]


def _run_lengths(starts: np.ndarray, m: int) -> np.ndarray:
    """The lengths of the runs that begin at ``starts`` within ``m`` rows."""
    return np.diff(np.r_[starts, m])
