"""The spool's binary form for a store on this machine: samples as MessagePack frames.

A local store takes ``GpuSample`` objects (``Store.write_samples``); spooling them as line
protocol and parsing the text back cost ~190 us per sample, most of the collector's CPU. A frame
holds one tick's samples, each a MessagePack array of its attributes; a segment file starts with
a header naming those attributes, so a spool written before a metric was added is read back by
name (the new metric not measured), and a segment written by a newer collector with attributes
this one does not know is still delivered, without them (logged).

Segment layout (``*.gws``)::

    b"GWSPOOL" version(u8=1) header_len(u32 LE) header(MessagePack {"fields": [attr, ...]})
    frame*: payload_len(u32 LE) count(u32 LE) crc32(u32 LE) payload(MessagePack [[value, ...], ...])

A frame cut short by a crash, or whose CRC does not match, ends the segment (``valid_end``).
"""

from __future__ import annotations

import logging
import numbers
import struct
import zlib
from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Any

import msgpack

from gpuwatt.model import GpuSample, ProcessSample
from gpuwatt.sample_rows import ATTRS, DEFAULTS, RowDecoder

log = logging.getLogger(__name__)

MAGIC = b"GWSPOOL"
VERSION = 1
_PREAMBLE = struct.Struct("<7sBI")  # magic, version, header length
FRAME = struct.Struct("<III")  # payload length, sample count, crc32 of the payload

_ROW = attrgetter(*ATTRS)  # a frame stores ``sample_rows.ATTRS``, in order


class SpoolFormatError(ValueError):
    """A segment that is not a spool segment this collector can read."""


def segment_header() -> bytes:
    header = msgpack.packb({"fields": list(ATTRS)})
    return _PREAMBLE.pack(MAGIC, VERSION, len(header)) + header


_BIG_INT = 1  # MessagePack extension type: an integer beyond 64 bits, as its decimal digits


def _default(obj: object) -> object:
    if isinstance(obj, ProcessSample):
        # (pid, bytes) as before users were kept, so that older frames read the same way
        if obj.user is None:
            return (obj.pid, obj.used_memory_bytes)
        return (obj.pid, obj.used_memory_bytes, obj.user)
    if isinstance(obj, int):  # kept exactly; the store then decides what to make of it
        return msgpack.ExtType(_BIG_INT, str(obj).encode())
    if isinstance(obj, numbers.Integral):  # numpy's integers, say
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    raise TypeError(f"cannot spool a {type(obj).__name__}")


def _ext(code: int, data: bytes) -> object:
    if code == _BIG_INT:
        return int(data)
    raise SpoolFormatError(f"unknown extension type {code} in a spool frame")


def encode_frame(samples: Sequence[GpuSample]) -> bytes:
    """One frame holding ``samples``."""
    payload = msgpack.packb([_ROW(s) for s in samples], default=_default)
    return FRAME.pack(len(payload), len(samples), zlib.crc32(payload)) + payload


class SegmentReader:
    """Decodes the frames of one segment, by the attribute names its header gives."""

    def __init__(self, head: bytes) -> None:
        """``head``: the segment's first bytes (at least ``header_end``'s worth)."""
        if len(head) < _PREAMBLE.size:
            raise SpoolFormatError("segment header cut short")
        magic, version, size = _PREAMBLE.unpack_from(head)
        if magic != MAGIC:
            raise SpoolFormatError("not a gpuwatt spool segment")
        if version != VERSION:
            raise SpoolFormatError(
                f"spool segment format {version} is newer than this collector's ({VERSION})"
            )
        if len(head) < _PREAMBLE.size + size:
            raise SpoolFormatError("segment header cut short")
        header = msgpack.unpackb(head[_PREAMBLE.size : _PREAMBLE.size + size])
        self.header_end = _PREAMBLE.size + size
        names = tuple(header["fields"])
        self._same = names == ATTRS
        known = set(ATTRS)
        self._names = names
        self.decoder = RowDecoder()
        unknown = [n for n in names if n not in known]
        if unknown:
            log.warning("spool segment has attributes this collector drops: %s", unknown)

    def rows(self, payload: bytes) -> Sequence[tuple[Any, ...]]:
        """A frame's samples as rows of values in ``ATTRS`` order (``sample_rows``)."""
        rows: tuple[tuple[Any, ...], ...] = msgpack.unpackb(payload, use_list=False, ext_hook=_ext)
        if self._same:
            return rows
        known = set(ATTRS)
        out = []
        for row in rows:
            values = {k: v for k, v in zip(self._names, row, strict=True) if k in known}
            out.append(tuple([values.get(a, DEFAULTS[a]) for a in ATTRS]))
        return out

    def samples(self, payload: bytes) -> list[GpuSample]:
        sample = self.decoder.sample
        return [sample(row) for row in self.rows(payload)]


def frames(data: bytes, offset: int) -> Iterator[tuple[int, int, int]]:
    """(payload start, payload end, count) of each whole, intact frame of ``data`` from ``offset``
    (``data[offset:]`` starts at a frame boundary); stops at the first incomplete or bad one."""
    n = len(data)
    while offset + FRAME.size <= n:
        size, count, crc = FRAME.unpack_from(data, offset)
        start, end = offset + FRAME.size, offset + FRAME.size + size
        if end > n or zlib.crc32(data[start:end]) != crc:
            return
        yield start, end, count
        offset = end


def valid_end(data: bytes) -> int:
    """Where the intact part of a whole segment's bytes ends (0: its header was cut short).
    Raises ``SpoolFormatError`` for a segment this collector cannot read (a newer format)."""
    if len(data) < _PREAMBLE.size or len(data) < _PREAMBLE.size + _PREAMBLE.unpack_from(data)[2]:
        return 0
    offset = SegmentReader(data).header_end
    for _start, end, _count in frames(data, offset):
        offset = end
    return offset
