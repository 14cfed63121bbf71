"""InfluxDB line protocol for GPU samples: the encoder the collector writes with, and the parser
that reads spools and Telegraf-format lines back (names in ``gpuwatt.schema``)."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from itertools import compress
from operator import attrgetter
from typing import Any
from urllib.parse import quote, unquote

from gpuwatt.model import (
    EnergyMethod,
    GpuSample,
    ProcessSample,
    TflopsMethod,
    gpu_sample_from_fields,
)
from gpuwatt.schema import (
    FIELD_COMPUTE_INSTANCE_ID,
    FIELD_ENERGY_METHOD,
    FIELD_GPU_INSTANCE_ID,
    FIELD_JOB_ID,
    FIELD_LOST,
    FIELD_PARENT_UUID,
    FIELD_PCI_DEVICE_ID,
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
    Kind,
)
from gpuwatt.telegraf import telegraf_attrs, yes_no

_TAG_ESCAPES = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ "})
STR_ESCAPES = str.maketrans({'"': r"\"", "\\": "\\\\"})

# Line protocol cannot carry a newline in a tag value, and its backslash escaping is ambiguous at
# the end of a value (a host named ``node\`` escapes the separator after it). Names are therefore
# stored with these characters percent-encoded (``%``, newline, carriage return, backslash, and
# NUL, which ends an InfluxQL query), in tags and in string fields alike; every reader decodes
# them (``decode_name``). Names without them, which is nearly all, are stored exactly as they are.
_NAME_ENCODE = str.maketrans({"%": "%25", "\n": "%0A", "\r": "%0D", "\\": "%5C", "\x00": "%00"})
_NAME_CODE = re.compile("%(25|0A|0D|5C|00)")


def encode_name(value: str) -> str:
    """A host, job or GPU name as stored: ``%``, CR, LF, backslash and NUL percent-encoded."""
    if "%" in value or "\n" in value or "\r" in value or "\\" in value or "\x00" in value:
        return value.translate(_NAME_ENCODE)
    return value


def decode_name(value: str) -> str:
    """The name ``encode_name`` stored."""
    if "%" not in value:
        return value
    return _NAME_CODE.sub(lambda m: chr(int(m.group(1), 16)), value)


def escape_tag(value: str) -> str:
    return encode_name(value).translate(_TAG_ESCAPES)


def _escape_str(value: str) -> str:
    """A string field's value escaped (translate is ~20x the cost of the checks that skip it)."""
    value = encode_name(value)
    if '"' in value:
        return value.translate(STR_ESCAPES)
    return value


def _format_process(p: ProcessSample) -> str:
    text = f"{p.pid}:{'' if p.used_memory_bytes is None else p.used_memory_bytes}"
    # "pid:bytes[:user]", the user percent-encoded so that ':' and ';' in it stay unambiguous
    return text if p.user is None else f"{text}:{quote(p.user, safe='')}"


def format_processes(processes: Iterable[ProcessSample]) -> str:
    if type(processes) is tuple and len(processes) == 1:  # the usual case: one per GPU
        return _format_process(processes[0])
    return ";".join(_format_process(p) for p in processes)


def parse_processes(text: str) -> tuple[ProcessSample, ...]:
    """Reads "pid:bytes;..." as written before users were kept, and "pid:bytes:user;..."."""
    out = []
    for item in filter(None, text.split(";")):
        pid, _, rest = item.partition(":")
        mem, sep, user = rest.partition(":")
        out.append(
            ProcessSample(int(pid), int(mem) if mem else None, unquote(user) if sep else None)
        )
    return tuple(out)


class LineEncoder:
    """Encodes samples to InfluxDB line protocol, nanosecond precision.

    The tag prefix of each GPU is built once and cached; a field whose value is None is left out.
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


@dataclass(frozen=True, slots=True)
class _Pattern:
    """How to write the numeric fields of samples with one set of present fields (the fields a
    GPU supports are the same tick after tick, so a handful of patterns serve a whole run)."""

    format: str  # one %-format over the present fields, in FIELDS order
    present: tuple[bool, ...]  # selector (itertools.compress) of the present fields
    floats: tuple[bool, ...]  # selector of the present float fields (the finiteness check)
    scaled: tuple[tuple[int, float], ...]  # (position among the present, scale) of scaled ints
    bools: tuple[int, ...]  # positions among the present of the boolean fields
    n_absent: int


def _pattern(absent: tuple[bool, ...]) -> _Pattern:
    pieces, scaled, bools = [f"{FIELD_LOST}=false"], [], []
    for spec, missing in zip(FIELDS, absent, strict=True):
        if missing:
            continue
        j = len(pieces) - 1
        if spec.kind is Kind.INT:
            pieces.append(f"{spec.field}=%di")
            if spec.scale != 1.0:
                scaled.append((j, spec.scale))
        elif spec.kind is Kind.FLOAT:
            pieces.append(f"{spec.field}=%.3f")
        else:
            pieces.append(f"{spec.field}=%s")
            bools.append(j)
    return _Pattern(
        ",".join(pieces),
        tuple(not a for a in absent),
        tuple(not a and spec.kind is Kind.FLOAT for spec, a in zip(FIELDS, absent, strict=True)),
        tuple(scaled),
        tuple(bools),
        sum(absent),
    )


class _FieldEncoder:
    """Formats the field set of a sample: one C-level ``%`` format per presence pattern.

    Floats are written with three decimals: a milli-unit (mJ, mW, 0.001 %) is below every
    sensor's resolution, and fixed-point formatting costs half of Python's shortest repr.
    Integer fields are whole numbers already (NVML returns integers); memory is floored to whole
    MiB. Line protocol has no NaN or infinity: a sample holding one takes the general path, which
    leaves such a field out.
    """

    __slots__ = ("_getter", "_last", "_patterns")

    def __init__(self) -> None:
        self._getter = attrgetter(*(spec.attr for spec in FIELDS))
        self._patterns: dict[tuple[bool, ...], _Pattern] = {}
        self._last = _pattern(tuple(True for _ in FIELDS))

    def __call__(self, s: GpuSample) -> str:
        values = self._getter(s)
        pattern = self._last  # the previous sample's: the same as this one's, nearly always
        if values.count(None) != pattern.n_absent:
            pattern = self._pattern_of(values)
        try:
            body = _numeric_fields(pattern, values)
        except TypeError:  # a field present in that pattern is None here: another pattern
            body = _numeric_fields(self._pattern_of(values), values)
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
        if s.parent_uuid is not None:  # a MIG device
            extra.append(f'{FIELD_PARENT_UUID}="{_escape_str(s.parent_uuid)}"')
            if s.gpu_instance_id is not None:
                extra.append(f"{FIELD_GPU_INSTANCE_ID}={s.gpu_instance_id}i")
            if s.compute_instance_id is not None:
                extra.append(f"{FIELD_COMPUTE_INSTANCE_ID}={s.compute_instance_id}i")
        if s.pci_device_id is not None:
            extra.append(f"{FIELD_PCI_DEVICE_ID}={s.pci_device_id}i")
        if extra:
            return body + "," + ",".join(extra)
        return body

    def _pattern_of(self, values: tuple[Any, ...]) -> _Pattern:
        absent = tuple(map(_is_none, values))
        pattern = self._patterns.get(absent)
        if pattern is None:
            pattern = self._patterns[absent] = _pattern(absent)
        self._last = pattern
        return pattern


def _numeric_fields(pattern: _Pattern, values: tuple[Any, ...]) -> str:
    """The numeric fields of ``values`` written by ``pattern``. Raises TypeError when a field
    present in the pattern is None (the values have another pattern: as many Nones elsewhere)."""
    args = list(compress(values, pattern.present))
    for j, scale in pattern.scaled:
        args[j] //= scale
    for j in pattern.bools:
        if args[j] is None:
            raise TypeError("a boolean field is None")
        args[j] = "true" if args[j] else "false"
    # NaN or inf in any float field makes the sum NaN or inf, and x - x NaN (a finite sum that
    # overflows only sends the sample down the general path, which keeps it whole).
    x = sum(compress(values, pattern.floats))
    if x - x != 0.0:
        return _numeric_fields_slow(values)
    try:
        return pattern.format % tuple(args)
    except (ValueError, OverflowError):  # NaN or inf in an integer field
        return _numeric_fields_slow(values)


_is_none = partial(operator.is_, None)
_ENERGY_METHOD_FIELD = {m: f'{FIELD_ENERGY_METHOD}="{m.value}"' for m in EnergyMethod}
_TFLOPS_METHOD_FIELD = {m: f'{FIELD_TFLOPS_METHOD}="{m.value}"' for m in TflopsMethod}


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


class LineProtocolError(ValueError):
    pass


# The parser: one compiled expression splits a line into measurement, tags, fields and time
# (possessive quantifiers: a malformed line fails in linear time); tags and fields are then split
# with ``str.split`` where no backslash or quote makes that ambiguous, else with the expressions
# below. Escaping rules: a backslash escapes the character after it, in the measurement, tag keys
# and values, field keys and string values; only field values are quoted (in a measurement or tag
# a quote is a character).
_LINE = re.compile(
    r"((?:[^ ,\\]++|\\.)++)"  # measurement
    r"((?:,(?:[^ ,\\]++|\\.)*+)*+)"  # ,tag=value pairs
    r" ((?:[^ \"\\]++|\\.|\"(?:[^\"\\]++|\\.)*+\")++)"  # fields: quoted strings may hold spaces
    r" ([^ ]++)",  # timestamp
    re.DOTALL,
)
_TAG = re.compile(r",((?:[^,=\\]++|\\.)*+)(=?)((?:[^,\\]++|\\.)*+)", re.DOTALL)
_FIELD = re.compile(
    r"((?:[^,=\"\\]++|\\.)++)=(\"(?:[^\"\\]++|\\.)*+\"|(?:[^,\"\\]++|\\.)*+)(?:,|$)", re.DOTALL
)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)
_BOOLS = {
    "t": True,
    "T": True,
    "true": True,
    "True": True,
    "TRUE": True,
    "f": False,
    "F": False,
    "false": False,
    "False": False,
    "FALSE": False,
}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return _ESCAPED.sub(r"\1", text)


def _parse_value(raw: str) -> Any:
    last = raw[-1:]
    if last == "i" or last == "u":
        return int(raw[:-1])
    if last == '"':
        if not raw.startswith('"') or len(raw) < 2:
            raise LineProtocolError(f"unterminated string value {raw!r}")
        return _unescape(raw[1:-1])
    b = _BOOLS.get(raw)
    if b is not None:
        return b
    if raw.startswith('"'):
        raise LineProtocolError(f"unterminated string value {raw!r}")
    return float(raw)


def _field_pairs(text: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of a line's field section, values still raw."""
    if "\\" not in text:
        if '"' not in text:
            items = text.split(",")
        else:  # a comma inside a quoted value is not a separator
            pieces = text.split('"')
            if len(pieces) % 2 == 0:
                raise LineProtocolError(f"unterminated string value in {text[:80]!r}")
            items, head = [], ""
            for k, piece in enumerate(pieces):
                if k % 2:
                    head += f'"{piece}"'
                    continue
                parts = piece.split(",")
                parts[0] = head + parts[0]
                items.extend(parts[:-1])
                head = parts[-1]
            items.append(head)
        pairs = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise LineProtocolError(f"bad field {item!r}")
            pairs.append((key, value))
        return pairs
    pairs, pos, n = [], 0, len(text)
    while pos < n:
        m = _FIELD.match(text, pos)
        if m is None or m.end() == pos:
            raise LineProtocolError(f"bad field at {text[pos : pos + 40]!r}")
        pairs.append((_unescape(m[1]), m[2]))
        pos = m.end()
    if text.endswith(","):
        raise LineProtocolError(f"bad field section {text[:80]!r}")
    return pairs


def parse_line(line: str) -> tuple[str, dict[str, str], dict[str, Any], int]:
    """Parse one line of line protocol into (measurement, tags, fields, time_ns)."""
    m = _LINE.fullmatch(line.strip())
    if m is None:
        raise LineProtocolError(f"expected 'measurement,tags fields time', got {line[:80]!r}")
    measurement, tag_text, field_text, ts = m.groups()
    tags: dict[str, str] = {}
    if tag_text:
        if "\\" not in tag_text:
            for part in tag_text[1:].split(","):
                k, sep, v = part.partition("=")
                if not sep:
                    raise LineProtocolError(f"bad tag {part!r}")
                tags[k] = v
        else:
            for k, sep, v in _TAG.findall(tag_text):
                if not sep:
                    raise LineProtocolError(f"bad tag {k!r}")
                tags[_unescape(k)] = _unescape(v)
    fields_: dict[str, Any] = {}
    for k, v in _field_pairs(field_text):
        try:
            fields_[k] = _parse_value(v)
        except LineProtocolError:
            raise
        except ValueError as exc:
            raise LineProtocolError(f"bad value for {k}: {v!r}") from exc
    try:
        time_ns = int(ts)
    except ValueError as exc:
        raise LineProtocolError(f"bad timestamp {ts!r}") from exc
    return _unescape(measurement), tags, fields_, time_ns


_BY_FIELD: dict[str, tuple[str, Kind, float]] = {
    spec.field: (spec.attr, spec.kind, spec.scale) for spec in FIELDS
}
_ENERGY_METHODS = {m.value: m for m in EnergyMethod}
_TFLOPS_METHODS = {m.value: m for m in TflopsMethod}


def sample_from_fields(time_ns: int, tags: dict[str, str], values: dict[str, Any]) -> GpuSample:
    """Build a sample from stored tags and fields (line protocol, InfluxQL rows)."""
    kwargs: dict[str, Any] = {
        "time_ns": int(time_ns),
        "host": decode_name(tags.get(TAG_HOST, "")),
        "gpu_index": int(tags.get(TAG_INDEX, -1)),
        "uuid": decode_name(tags.get(TAG_UUID, "")),
        "name": decode_name(tags.get(TAG_NAME, "")),
        "lost": bool(values.get(FIELD_LOST, False)),
    }
    for name, v in values.items():
        spec = _BY_FIELD.get(name)
        if spec is None or v is None:
            continue
        attr, kind, scale = spec
        if kind is Kind.FLOAT:
            kwargs[attr] = float(v) * scale
        elif kind is Kind.INT:
            kwargs[attr] = round(v * scale)
        elif (flag := yes_no(v)) is not None:  # Telegraf writes some flags as "Yes"/"No"
            kwargs[attr] = flag
    for attr, v in telegraf_attrs(values).items():  # Telegraf's own names for a few metrics
        kwargs.setdefault(attr, v)
    if (m := values.get(FIELD_ENERGY_METHOD)) is not None:
        kwargs["energy_method"] = _ENERGY_METHODS.get(m) or EnergyMethod(m)
    if (m := values.get(FIELD_TFLOPS_METHOD)) is not None:
        kwargs["tflops_method"] = _TFLOPS_METHODS.get(m) or TflopsMethod(m)
    if (x := values.get(FIELD_XID_LAST)) is not None:
        kwargs["xid_errors"] = (int(x),)
    if values.get(FIELD_PROCESS_COUNT) is not None:
        kwargs["processes"] = parse_processes(values.get(FIELD_PROCESSES) or "")
    if (job := values.get(FIELD_JOB_ID)) is not None:
        kwargs["job_id"] = decode_name(str(job))
    if (parent := values.get(FIELD_PARENT_UUID)) is not None:
        kwargs["parent_uuid"] = decode_name(str(parent))
    for name in (FIELD_GPU_INSTANCE_ID, FIELD_COMPUTE_INSTANCE_ID):
        if (instance := values.get(name)) is not None:
            kwargs[name] = int(instance)
    if (pci := values.get(FIELD_PCI_DEVICE_ID)) is not None:
        kwargs["pci_device_id"] = int(pci)
    return gpu_sample_from_fields(kwargs)


#: The string fields a Prometheus-compatible engine is given as labels (``with_info_line``).
LABEL_FIELDS: tuple[str, ...] = (
    FIELD_JOB_ID,
    FIELD_ENERGY_METHOD,
    FIELD_TFLOPS_METHOD,
    FIELD_PARENT_UUID,
)
#: The field of the info line (``with_info_line``): VictoriaMetrics names its series
#: ``nvidia_smi_info``.
FIELD_INFO = "info"


def with_info_line(line: str) -> list[str]:
    """A sample's line as a Prometheus-compatible engine keeps it: its numbers, and an info
    line whose tags carry its job id, energy and TFLOPS methods and MIG parent.

    VictoriaMetrics takes line protocol but keeps numbers only: it drops a string field. The
    info line (``nvidia_smi,<the GPU's tags>,job_id=...,energy_method=... info=1``) makes them
    labels of one series, ``nvidia_smi_info``, as Prometheus names such facts (an info metric,
    ``kube_pod_info``): a job starts one new series per GPU, not one per metric, and the metric
    series stay whole across jobs. Values stay name-encoded (``encode_name``), as the GPU's own
    tags are. A line without such a field (rollups, a lost GPU's marker) or that does not parse
    is returned as it is: the engine says what it refuses."""
    if '"' not in line:
        return [line]
    m = _LINE.fullmatch(line.strip())
    if m is None or _unescape(m[1]) != MEASUREMENT:
        return [line]
    measurement, tag_text, field_text, ts = m.groups()
    try:
        pairs = _field_pairs(field_text)
    except LineProtocolError:
        return [line]
    kept, labels = [], []
    for key, raw in pairs:
        if key in LABEL_FIELDS and raw.startswith('"') and raw.endswith('"') and len(raw) > 1:
            value = _unescape(raw[1:-1])  # name-encoded already: only tag escapes are added
            if value:
                labels.append(f"{key}={value.translate(_TAG_ESCAPES)}")
        else:
            kept.append(f"{key}={raw}")
    if not labels or not kept:
        return [line]
    return [
        f"{measurement}{tag_text} {','.join(kept)} {ts}",
        f"{measurement}{tag_text},{','.join(labels)} {FIELD_INFO}=1 {ts}",
    ]


def decode_line(line: str) -> GpuSample:
    """Parse one ``nvidia_smi`` line back into a sample (the spool -> SQLite path)."""
    measurement, tags, values, time_ns = parse_line(line)
    if measurement != MEASUREMENT:
        raise LineProtocolError(f"unexpected measurement {measurement!r}")
    return sample_from_fields(time_ns, tags, values)
