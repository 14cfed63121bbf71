"""Reading and writing NVML's ctypes structs in one ``struct`` call, shared with the fake NVML.

pynvml's structs override ``__getattribute__``/``__setattr__`` in Python (bytes -> str
conversion), so each field access costs about a microsecond. The sampler instead reads (and the
fake writes) the fields it needs in one ``struct.Struct`` call over the structure's buffer, with
the offsets taken from the ctypes class itself, so the layout can never drift from pynvml's.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

_INT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_GPM_HEADER = ("version", "numMetrics", "sample1", "sample2")


def _code(ctype: Any) -> str:
    t = getattr(ctype, "_type_", None)
    if isinstance(t, str) and t in "fd":
        return t
    code = _INT_CODES[ctypes.sizeof(ctype)]
    return code.lower() if isinstance(t, str) and t.islower() else code


def _layout(
    items: Sequence[tuple[int, Any]], total_size: int | None, origin: int = 0
) -> struct.Struct:
    """A standard-size, unaligned Struct over ``(offset, ctype)`` items in offset order.

    Gaps become pad bytes, which ``pack_into`` writes as zeros: a codec used for writing into a
    live structure must only have gaps that may be zeroed. ``total_size`` pads the end (for
    ``from_buffer_copy``); None stops at the last item (safe for ``pack_into``). ``origin`` is
    the offset the codec starts at (give it to ``pack_into``/``unpack_from``).
    """
    fmt, pos = ["="], origin
    for offset, ctype in sorted(items, key=lambda item: item[0]):
        if offset < pos:
            raise ValueError("overlapping fields")
        if offset > pos:
            fmt.append(f"{offset - pos}x")
        fmt.append(_code(ctype))
        pos = offset + ctypes.sizeof(ctype)
    if total_size is not None and total_size > pos:
        fmt.append(f"{total_size - pos}x")
    return struct.Struct("".join(fmt))


def struct_codec(ctype: Any, names: Sequence[str]) -> struct.Struct:
    """A Struct over the named fields of ctypes Structure ``ctype`` (give them in offset order).

    It spans the whole structure: ``unpack_from(obj)`` reads those fields of an instance,
    ``ctype.from_buffer_copy(codec.pack(...))`` builds one (unnamed fields zero).
    """
    types = dict((f[0], f[1]) for f in ctype._fields_)
    offsets = [getattr(ctype, n).offset for n in names]
    if offsets != sorted(offsets):
        raise ValueError(f"fields of {ctype.__name__} must be given in offset order")
    return _layout([(getattr(ctype, n).offset, types[n]) for n in names], ctypes.sizeof(ctype))


class GpmCodecs(NamedTuple):
    """Codecs over ``c_nvmlGpmMetricsGet_t`` for its first ``count`` metrics."""

    header: struct.Struct  # (version, numMetrics, sample1, sample2); safe for pack_into
    ids: struct.Struct  # metricId of each metric; read only
    results: struct.Struct  # (nvmlReturn, value) of each metric; read only
    fill: struct.Struct  # (metricId, nvmlReturn, value) of each, metricInfo zeroed; pack_into
    # at metrics_offset: the header before it is left as it is
    metrics_offset: int


def gpm_codecs(nv: Any, count: int) -> GpmCodecs:
    """The codecs of a GPM metrics request of ``count`` metrics, from module ``nv``'s structs."""
    outer, elem = nv.c_nvmlGpmMetricsGet_t, nv.c_nvmlGpmMetric_t
    types = dict((f[0], f[1]) for f in elem._fields_)
    base, size = outer.metrics.offset, ctypes.sizeof(elem)

    def per_metric(names: Sequence[str]) -> list[tuple[int, Any]]:
        return [
            (base + i * size + getattr(elem, n).offset, types[n])
            for i in range(count)
            for n in names
        ]

    outer_types = dict(outer._fields_)
    return GpmCodecs(
        header=_layout([(getattr(outer, n).offset, outer_types[n]) for n in _GPM_HEADER], None),
        ids=_layout(per_metric(("metricId",)), None),
        results=_layout(per_metric(("nvmlReturn", "value")), None),
        fill=_layout(per_metric(("metricId", "nvmlReturn", "value")), None, origin=base),
        metrics_offset=base,
    )
