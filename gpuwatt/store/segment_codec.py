"""The records of a segment file (format 3): one collector round each, coded against the round
before it (docs/storage.md, "Segment files").

A record holds the raw rows of one time (``lost``, the metric columns, the tail id: the head's
rows, ``rounds``) of some GPUs. Each value is coded against the same GPU's previous value in the
segment (0.0 for its first), column by column, whichever of two transforms fits the round:

- ``DECIMAL_DELTA``: every value of the column in this round, and the previous ones, is finite
  and exact with ``k`` <= 6 digits after the point: the difference of the values times 10^k, as
  int64, zigzagged (a counter's increment, a gauge's step: small numbers);
- ``XOR``: the IEEE-754 bits XOR-ed with the previous value's (NaN, not measured, round-trips;
  a value that did not change is zero).

The words of the round are then byte-shuffled, column by column (byte 0 of every GPU's word,
then byte 1, ...), so that the zero high bytes of small differences lie together for zstd. A
record is decoded only after the records before it in its segment (the previous values), which
is why a segment is read from its start. Decoding gives back every value bit for bit.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

XOR = 0
DECIMAL_DELTA = 1
SAME_GPUS = 1  # flags: the record's GPUs are the previous record's, in the same order

MAX_DECIMALS = 6
_POW10 = np.array([10.0**k for k in range(MAX_DECIMALS + 1)])
_LIMIT = 2.0**53
#: length of the body, its CRC-32 (a torn or garbled record ends what is read)
FRAME = struct.Struct("<II")
_BODY = struct.Struct("<qIHB")  # time_ns, rows, width, flags


@dataclass(frozen=True)
class Record:
    """One round: ``rows[i]`` is GPU ``gpu_ids[i]``'s raw row (``width`` float64 words)."""

    time_ns: int
    gpu_ids: np.ndarray  # int64
    rows: np.ndarray  # float64, len(gpu_ids) x width


def _zigzag(d: np.ndarray) -> np.ndarray:
    return ((d << 1) ^ (d >> 63)).view(np.uint64)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    return ((z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))).view(np.int64)


def _exact(both: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per column of ``both``: whether every value is finite and exact with ``k`` digits after
    the point (k >= 0)."""
    p = _POW10[np.maximum(k, 0)]
    with np.errstate(invalid="ignore"):
        scaled = both * p
        return (
            (k >= 0)
            & (np.abs(scaled) < _LIMIT).all(axis=0)
            & (np.rint(scaled) / p == both).all(axis=0)
        )


def _decimals(both: np.ndarray, todo: np.ndarray | None = None) -> np.ndarray:
    """Per column of ``both`` (this round's values over the previous ones), the fewest digits
    after the point that hold every value exactly; -1 where none does (or a value is NaN).
    ``todo``: only these columns are looked at (the others: -1)."""
    width = both.shape[1]
    k = np.full(width, -1, dtype=np.int64)
    if not len(both):
        return k
    finite = np.isfinite(both).all(axis=0)
    todo = finite if todo is None else todo & finite
    big = np.abs(np.where(np.isfinite(both), both, 0.0)).max(axis=0)
    for d in range(MAX_DECIMALS + 1):
        if not todo.any():
            break
        p = _POW10[d]
        cols = np.flatnonzero(todo)
        sub = both[:, cols]
        ok = (np.rint(sub * p) / p == sub).all(axis=0) & (big[cols] * p < _LIMIT)
        k[cols[ok]] = d
        todo[cols[ok]] = False
        todo &= big * _POW10[min(d + 1, MAX_DECIMALS)] < _LIMIT
    return k


class _Previous:
    """Each GPU's previous row in the segment (what the next record is coded against)."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        self.rows = np.zeros((0, 0))
        self.last_ids: np.ndarray | None = None
        self.last_at: np.ndarray | None = None

    def positions(self, gpu_ids: np.ndarray, width: int) -> tuple[np.ndarray, bool]:
        """Where each GPU's previous row is (new GPUs get a row of zeros); whether the GPUs are
        the previous record's, in order."""
        same = self.last_ids is not None and np.array_equal(self.last_ids, gpu_ids)
        if same and self.last_at is not None and self.rows.shape[1] == width:
            return self.last_at, True
        if self.rows.shape[1] != width:  # a new segment, or rows of another width
            self.index.clear()
            self.rows = np.zeros((0, width))
        index = self.index
        at = []
        grow = 0
        for g in gpu_ids.tolist():
            i = index.get(g)
            if i is None:
                i = index[g] = len(self.rows) + grow
                grow += 1
            at.append(i)
        if grow:
            self.rows = np.concatenate([self.rows, np.zeros((grow, width))])
        self.last_ids = gpu_ids
        self.last_at = np.array(at, dtype=np.int64)
        return self.last_at, same


class Encoder:
    """Codes the rounds of one segment, in the order they are written."""

    def __init__(self) -> None:
        self._prev = _Previous()
        self._k: np.ndarray | None = None  # the digits each column took last (-1: XOR)
        self._rounds = 0

    def _digits(self, both: np.ndarray) -> np.ndarray:
        """``_decimals`` of the round, searched again only for the columns whose digits of the
        round before do not hold it (and every column every 64th round: digits that could be
        fewer again)."""
        k = self._k
        self._rounds += 1
        if k is None or len(k) != both.shape[1] or self._rounds % 64 == 0:
            k = _decimals(both)
        else:
            ok = _exact(both, k)
            if not ok.all():
                k = np.where(ok, k, _decimals(both, ~ok))
        self._k = k
        return k

    def encode(self, time_ns: int, gpu_ids: np.ndarray, rows: np.ndarray) -> bytes:
        """The record of a round (``gpu_ids`` distinct), framed: length, CRC-32, body."""
        n, width = rows.shape
        at, same = self._prev.positions(gpu_ids, width)
        prev = self._prev.rows[at]
        k = self._digits(np.concatenate([rows, prev]))
        words = rows.view(np.uint64) ^ prev.view(np.uint64)
        for d in np.unique(k[k >= 0]).tolist():
            cols = np.flatnonzero(k == d)
            p = _POW10[d]
            diff = np.rint(rows[:, cols] * p).astype(np.int64)
            diff -= np.rint(prev[:, cols] * p).astype(np.int64)
            words[:, cols] = _zigzag(diff)
        self._prev.rows[at] = rows
        transforms = np.where(k >= 0, DECIMAL_DELTA, XOR).astype(np.uint8)
        table = np.column_stack([transforms, np.maximum(k, 0).astype(np.uint8)]).tobytes()
        planes = np.ascontiguousarray(words.T).view(np.uint8).reshape(width, n, 8)
        body = b"".join(
            (
                _BODY.pack(time_ns, n, width, SAME_GPUS if same else 0),
                b"" if same else gpu_ids.astype("<i8").tobytes(),
                table,
                planes.transpose(0, 2, 1).tobytes(),
            )
        )
        return FRAME.pack(len(body), zlib.crc32(body)) + body


class Decoder:
    """Decodes the records of one segment, in order (``Encoder`` reversed). It works on the
    words column by column, as they are stored (each position's words of every GPU together):
    a record's rows come out as a column-major array."""

    def __init__(self) -> None:
        self._prev = _Previous()  # which position each GPU's previous values are at
        self._state = np.zeros((0, 0))  # width x GPUs: each GPU's previous values
        self._where: tuple[np.ndarray, slice | np.ndarray] | None = None

    def _positions(self, gpu_ids: np.ndarray, width: int) -> slice | np.ndarray:
        """Where the GPUs' previous values are in ``_state``: a slice when they lie in order."""
        at, _ = self._prev.positions(gpu_ids, width)
        if self._where is not None and self._where[0] is at:
            return self._where[1]
        if self._state.shape[0] != width:
            self._state = np.zeros((width, 0))
        if len(self._prev.rows) > self._state.shape[1]:
            grow = len(self._prev.rows) - self._state.shape[1]
            self._state = np.concatenate([self._state, np.zeros((width, grow))], axis=1)
        n = len(at)
        where: slice | np.ndarray = at
        if n and int(at[-1]) - int(at[0]) == n - 1 and bool((np.diff(at) == 1).all()):
            where = slice(int(at[0]), int(at[0]) + n)
        self._where = (at, where)
        return where

    def decode(self, body: bytes) -> Record:
        time_ns, n, width, flags = _BODY.unpack_from(body)
        pos = _BODY.size
        if flags & SAME_GPUS:
            if self._prev.last_ids is None:
                raise ValueError("a record refers to the GPUs of a record before the first")
            gpu_ids = self._prev.last_ids
        else:
            gpu_ids = np.frombuffer(body, "<i8", n, pos).astype(np.int64)
            pos += 8 * n
        table = np.frombuffer(body, np.uint8, 2 * width, pos).reshape(width, 2)
        pos += 2 * width
        planes = np.frombuffer(body, np.uint8, 8 * n * width, pos).reshape(width, 8, n)
        unshuffled = np.empty((width, n, 8), np.uint8)
        for b in range(8):  # a plane at a time: ~35 % less than one transposed copy
            unshuffled[:, :, b] = planes[:, b, :]
        words = unshuffled.view(np.uint64)[:, :, 0]
        where = self._positions(gpu_ids, width)
        prev = self._state[:, where]  # width x n
        decimal = table[:, 0] == DECIMAL_DELTA
        parts = []
        for d in np.unique(table[decimal, 1]).tolist():
            cols = np.flatnonzero(decimal & (table[:, 1] == d))
            p = _POW10[d]
            ints = np.rint(prev[cols] * p).astype(np.int64) + _unzigzag(words[cols])
            parts.append((cols, ints / p))
        np.bitwise_xor(words, prev.view(np.uint64), out=words)
        columns = words.view(np.float64)
        for cols, values in parts:
            columns[cols] = values
        self._state[:, where] = columns
        return Record(time_ns, gpu_ids, columns.T)
