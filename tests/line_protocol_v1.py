"""Line protocol as commit 8509a5f wrote and read it, kept verbatim as the oracle: the encoder with
code generated at run time per presence pattern, and the character-by-character parser.

``tests/test_line_protocol_v1.py`` checks that today's plain encoder writes exactly what this one
wrote and that today's parser reads what this one read; ``bench/encode.py`` times them side by side.
Not used by gpuwatt itself.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from functools import partial
from operator import attrgetter
from typing import Any

from gpuwatt.line_protocol import LineProtocolError, _escape_str, escape_tag, format_processes
from gpuwatt.model import EnergyMethod, GpuSample, TflopsMethod
from gpuwatt.schema import (
    FIELD_ENERGY_METHOD,
    FIELD_JOB_ID,
    FIELD_LOST,
    FIELD_PROCESS_COUNT,
    FIELD_PROCESSES,
    FIELD_TFLOPS_METHOD,
    FIELD_XID_COUNT,
    FIELD_XID_LAST,
    FIELDS,
    MEASUREMENT,
    TAG_HOST,
    TAG_INDEX,
    TAG_NAME,
    TAG_UUID,
    FieldSpec,
    Kind,
)


class GeneratedLineEncoder:
    """Encodes samples to InfluxDB line protocol, nanosecond precision.

    The tag prefix of each GPU is built once and cached; a field whose value is None is left out.
    Encoding sits on the collector's hot path (one call per GPU per tick): see ``_FieldEncoder``.
    """

    __slots__ = ("_encode_fields", "_prefix_cache")

    def __init__(self) -> None:
        self._prefix_cache: dict[tuple[str, int, str, str], str] = {}
        self._encode_fields = _FieldEncoder()

    def prefix(self, s: GpuSample) -> str:
        key = (s.host, s.gpu_index, s.uuid, s.name)
        p = self._prefix_cache.get(key)
        if p is None:
            parts = [MEASUREMENT]
            for tag, value in (
                (TAG_HOST, s.host),
                (TAG_INDEX, str(s.gpu_index)),
                (TAG_UUID, s.uuid),
                (TAG_NAME, s.name),
            ):
                if value:
                    parts.append(f"{tag}={escape_tag(value)}")
            p = ",".join(parts) + " "
            self._prefix_cache[key] = p
        return p

    def encode(self, s: GpuSample) -> str:
        p = self._prefix_cache.get((s.host, s.gpu_index, s.uuid, s.name)) or self.prefix(s)
        if s.lost:
            return f"{p}{FIELD_LOST}=true {s.time_ns}"
        return f"{p}{self._encode_fields(s)} {s.time_ns}"

    def encode_many(self, samples: Iterable[GpuSample]) -> list[str]:
        enc = self.encode
        return [enc(s) for s in samples]


class _FieldEncoder:
    """Formats the field set of a sample as one generated format per presence pattern.

    Floats are written with three decimals: a milli-unit (mJ, mW, 0.001 %) is below every
    sensor's resolution, and fixed-point formatting costs half of Python's shortest repr.
    Which metrics a GPU supports is stable, so the set of ``None`` fields repeats tick after tick.
    For each such pattern a straight-line f-string over the present fields is compiled once.
    The hot path tries the pattern of the previous sample first (``_compile_direct``: the sample's
    attributes read straight into one C-level ``%`` format, the absent fields checked to be None);
    a sample of another pattern falls back to one C-level attribute fetch, one mask and one dict
    lookup. Integer fields are whole numbers already (NVML returns integers); memory is floored to
    whole MiB.
    """

    __slots__ = ("_by_mask", "_direct", "_getter", "_last")

    def __init__(self) -> None:
        self._getter = attrgetter(*(spec.attr for spec in FIELDS))
        self._by_mask: dict[tuple[bool, ...], Callable[[tuple[Any, ...]], str]] = {}
        self._direct: dict[tuple[bool, ...], Callable[[GpuSample], str | None]] = {}
        self._last: Callable[[GpuSample], str | None] = _no_pattern

    def _numeric(self, s: GpuSample) -> str:
        """The numeric fields, through the mask of ``s`` (and its direct format kept for next)."""
        values = self._getter(s)
        mask = tuple(map(_is_none, values))
        fmt = self._by_mask.get(mask)
        if fmt is None:
            fmt = self._by_mask[mask] = _compile_numeric(mask)
            self._direct[mask] = _compile_direct(mask)
        self._last = self._direct[mask]
        try:
            body = fmt(values)
        except (ValueError, OverflowError):  # NaN or inf in an integer field
            return _numeric_fields_slow(values)
        # a float field's NaN or inf ("nan", "inf", "-inf"; no field name contains either)
        if "nan" in body or "inf" in body:
            return _numeric_fields_slow(values)
        return body

    def __call__(self, s: GpuSample) -> str:
        try:
            body = self._last(s)
        except (ValueError, OverflowError):  # NaN or inf in a field
            body = _numeric_fields_slow(self._getter(s))
        except TypeError:  # a present field is None (another pattern)
            body = self._numeric(s)
        else:
            if body is None:  # an absent field is set (another pattern)
                body = self._numeric(s)
        extra = []
        if s.energy_method is not None:
            extra.append(_ENERGY_METHOD_FIELD[s.energy_method])
        if s.tflops_method is not None:
            extra.append(_TFLOPS_METHOD_FIELD[s.tflops_method])
        if s.xid_errors:
            extra.append(f"{FIELD_XID_LAST}={s.xid_errors[-1]}i")
            extra.append(f"{FIELD_XID_COUNT}={len(s.xid_errors)}i")
        if s.processes is not None:
            extra.append(f"{FIELD_PROCESS_COUNT}={len(s.processes)}i")
            if s.processes:
                extra.append(f'{FIELD_PROCESSES}="{format_processes(s.processes)}"')
        if s.job_id is not None:
            extra.append(f'{FIELD_JOB_ID}="{_escape_str(s.job_id)}"')
        if extra:
            return body + "," + ",".join(extra)
        return body


def _no_pattern(_s: GpuSample) -> None:
    """The direct format before the first sample: matches no pattern."""
    return None


_is_none = partial(operator.is_, None)
_ENERGY_METHOD_FIELD = {m: f'{FIELD_ENERGY_METHOD}="{m.value}"' for m in EnergyMethod}
_TFLOPS_METHOD_FIELD = {m: f'{FIELD_TFLOPS_METHOD}="{m.value}"' for m in TflopsMethod}


def _field_piece(i: int, spec: FieldSpec, value: str = "") -> tuple[str, str]:
    """The %-format piece and the argument expression of one present field (its value:
    ``value``, by default ``v[i]``)."""
    value = value or f"v[{i}]"
    if spec.kind is Kind.INT:
        arg = value if spec.scale == 1.0 else f"{value} // {spec.scale!r}"
        return f"{spec.field}=%di", arg
    if spec.kind is Kind.FLOAT:
        return f"{spec.field}=%.3f", value
    return f"{spec.field}=%s", f"('true' if {value} else 'false')"


def _compile_numeric(mask: tuple[bool, ...]) -> Callable[[tuple[Any, ...]], str]:
    """One ``FORMAT % (args)``: a single C-level formatting call for all present fields."""
    pieces = [_field_piece(i, spec) for i, spec in enumerate(FIELDS) if not mask[i]]
    fmt = ",".join([f"{FIELD_LOST}=false"] + [p.replace("%", "%%", 0) for p, _ in pieces])
    args = "".join(f"{a}, " for _, a in pieces)
    source = f"def fmt(v):\n    return FORMAT % ({args})\n"
    namespace: dict[str, Any] = {"FORMAT": fmt}
    exec(compile(source, "<gpuwatt.schema field encoder>", "exec"), namespace)
    return namespace["fmt"]


def _compile_direct(mask: tuple[bool, ...]) -> Callable[[GpuSample], str | None]:
    """The format of ``_compile_numeric(mask)`` reading the sample's attributes itself.

    Returns None when a field absent from ``mask`` is set or a boolean field of it is None; an
    integer or float field of it that is None raises TypeError (from the sum of the floats or
    the ``%`` format); NaN or inf in a float field raises ValueError.
    """
    present = [(i, spec) for i, spec in enumerate(FIELDS) if not mask[i]]
    # Float fields are read into locals once: formatted, and summed for the finiteness check.
    local = {i: f"f{i}" for i, spec in present if spec.kind is Kind.FLOAT}
    pieces = [_field_piece(i, spec, local.get(i, f"s.{spec.attr}")) for i, spec in present]
    fmt = ",".join([f"{FIELD_LOST}=false"] + [p for p, _ in pieces])
    args = "".join(f"{a}, " for _, a in pieces)
    checks = [f"s.{spec.attr} is not None" for i, spec in enumerate(FIELDS) if mask[i]]
    checks += [f"s.{spec.attr} is None" for i, spec in present if spec.kind is Kind.BOOL]
    source = "def fmt(s):\n"
    if checks:
        source += f"    if {' or '.join(checks)}:\n        return None\n"
    if local:
        source += "".join(f"    {name} = s.{FIELDS[i].attr}\n" for i, name in local.items())
        # NaN or inf in any float field makes the sum NaN or inf, and x - x NaN (a finite sum
        # that overflows only sends this sample down the general path): line protocol has no
        # NaN, and one check is ~3x cheaper than searching the formatted text for "nan"/"inf".
        source += f"    x = {' + '.join(local.values())}\n"
        source += "    if x - x != 0.0:\n        raise ValueError('not finite')\n"
    source += f"    return FORMAT % ({args})\n"
    namespace: dict[str, Any] = {"FORMAT": fmt}
    exec(compile(source, "<gpuwatt.schema direct field encoder>", "exec"), namespace)
    return namespace["fmt"]


def _numeric_fields_slow(values: tuple[Any, ...]) -> str:
    """The general path: also drops non-finite floats (NaN, inf), which line protocol rejects."""
    parts = [f"{FIELD_LOST}=false"]
    for v, spec in zip(values, FIELDS, strict=True):
        if v is None:
            continue
        if spec.kind is Kind.INT:
            if math.isfinite(v):
                parts.append(f"{spec.field}={int(v // spec.scale)}i")
        elif spec.kind is Kind.FLOAT:
            if math.isfinite(v):
                parts.append(f"{spec.field}={v:.3f}")
        else:
            parts.append(f"{spec.field}={'true' if v else 'false'}")
    return ",".join(parts)


def _split_unescaped(text: str, sep: str, *, quotes: bool = True) -> list[str]:
    """Split on ``sep`` not preceded by a backslash (and, with ``quotes``, outside double
    quotes: only field values are quoted; in a measurement or tag a quote is a character)."""
    parts: list[str] = []
    buf: list[str] = []
    i, n, quoted = 0, len(text), False
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            buf.append(c)
            buf.append(text[i + 1])
            i += 2
            continue
        if c == '"' and quotes:
            quoted = not quoted
        elif c == sep and not quoted:
            parts.append("".join(buf))
            buf = []
            i += 1
            continue
        buf.append(c)
        i += 1
    parts.append("".join(buf))
    return parts


def _partition_unescaped(text: str, sep: str) -> tuple[str, str, str]:
    """``str.partition`` at the first ``sep`` not preceded by a backslash."""
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == sep:
            return text[:i], sep, text[i + 1 :]
        i += 1
    return text, "", ""


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _parse_value(raw: str) -> Any:
    if raw.startswith('"'):
        if not raw.endswith('"') or len(raw) < 2:
            raise LineProtocolError(f"unterminated string value {raw!r}")
        return _unescape(raw[1:-1])
    if raw in ("t", "T", "true", "True", "TRUE"):
        return True
    if raw in ("f", "F", "false", "False", "FALSE"):
        return False
    if raw.endswith(("i", "u")):
        return int(raw[:-1])
    return float(raw)


def parse_line_v1(line: str) -> tuple[str, dict[str, str], dict[str, Any], int]:
    """Parse one line of line protocol into (measurement, tags, fields, time_ns)."""
    head, _, rest = _partition_unescaped(line.strip(), " ")
    sections = [head, *_split_unescaped(rest, " ")]
    if len(sections) != 3:
        raise LineProtocolError(f"expected 'measurement,tags fields time', got {line[:80]!r}")
    head, field_text, ts = sections
    head_parts = _split_unescaped(head, ",", quotes=False)
    tags: dict[str, str] = {}
    for part in head_parts[1:]:
        k, sep, v = part.partition("=")
        if not sep:
            raise LineProtocolError(f"bad tag {part!r}")
        tags[_unescape(k)] = _unescape(v)
    fields_: dict[str, Any] = {}
    for part in _split_unescaped(field_text, ","):
        k, sep, v = part.partition("=")
        if not sep:
            raise LineProtocolError(f"bad field {part!r}")
        try:
            fields_[_unescape(k)] = _parse_value(v)
        except ValueError as exc:
            raise LineProtocolError(f"bad value for {k}: {v!r}") from exc
    try:
        time_ns = int(ts)
    except ValueError as exc:
        raise LineProtocolError(f"bad timestamp {ts!r}") from exc
    return _unescape(head_parts[0]), tags, fields_, time_ns
