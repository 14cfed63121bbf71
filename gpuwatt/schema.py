"""Every measurement, tag and field name gpuwatt writes, and the line-protocol codec.

The fields Telegraf's ``nvidia_smi`` input has keep Telegraf's names, units and types, so a site
that already runs Telegraf + InfluxDB can point gpuwatt's dashboard at the data it has. Our extra
fields carry their unit in the name. A metric that was not measured (``None``) is omitted from the
point, never written as zero (Telegraf does the same).
"""

from __future__ import annotations

import enum
import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any

from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod

MEASUREMENT = "nvidia_smi"

# Tags (Telegraf's names). Never a PID; a job id only when its cardinality is known to be modest.
TAG_HOST = "host"
TAG_INDEX = "index"
TAG_UUID = "uuid"
TAG_NAME = "name"
TAGS: tuple[str, ...] = (TAG_HOST, TAG_INDEX, TAG_UUID, TAG_NAME)

MIB = 1024 * 1024


class Kind(enum.Enum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """How one ``GpuSample`` attribute is stored: field name, type and scale.

    ``scale`` converts the model's unit into the stored unit (stored = model / scale):
    memory is bytes in the model and MiB in Telegraf's fields.
    """

    attr: str
    field: str
    kind: Kind
    scale: float = 1.0
    telegraf: bool = False
    doc: str = ""


def _t(attr: str, fld: str, kind: Kind, scale: float = 1.0, doc: str = "") -> FieldSpec:
    return FieldSpec(attr, fld, kind, scale, True, doc)


def _x(attr: str, kind: Kind, doc: str = "") -> FieldSpec:
    """An extra (non-Telegraf) field: stored under the model's own, unit-bearing name."""
    return FieldSpec(attr, attr, kind, 1.0, False, doc)


#: Numeric metric fields, in the order they are written.
FIELDS: tuple[FieldSpec, ...] = (
    _t("utilization_gpu_pct", "utilization_gpu", Kind.INT, doc="% of time a kernel ran"),
    _t("utilization_memory_pct", "utilization_memory", Kind.INT, doc="% of time memory was R/W"),
    _t("memory_used_bytes", "memory_used", Kind.INT, MIB, "MiB"),
    _t("memory_total_bytes", "memory_total", Kind.INT, MIB, "MiB"),
    _t("memory_free_bytes", "memory_free", Kind.INT, MIB, "MiB"),
    _t("memory_reserved_bytes", "memory_reserved", Kind.INT, MIB, "MiB"),
    _t("temperature_gpu_c", "temperature_gpu", Kind.INT, doc="°C"),
    _x("temperature_memory_c", Kind.FLOAT, "HBM temperature, °C"),
    _t("fan_speed_pct", "fan_speed", Kind.INT, doc="%"),
    _t("power_w", "power_draw", Kind.FLOAT, doc="W"),
    _t("power_limit_w", "power_limit", Kind.FLOAT, doc="enforced power limit, W"),
    _x("energy_j", Kind.FLOAT, "cumulative energy, J (see energy_method)"),
    _t("sm_clock_mhz", "clocks_current_sm", Kind.INT, doc="MHz"),
    _t("memory_clock_mhz", "clocks_current_memory", Kind.INT, doc="MHz"),
    _t("graphics_clock_mhz", "clocks_current_graphics", Kind.INT, doc="MHz"),
    _t("sm_clock_max_mhz", "clocks_max_sm", Kind.INT, doc="MHz"),
    _x("clock_event_reasons", Kind.INT, "NVML clocks-event reason bitmask"),
    _x("pcie_tx_bytes_per_s", Kind.FLOAT),
    _x("pcie_rx_bytes_per_s", Kind.FLOAT),
    _x("nvlink_tx_bytes_per_s", Kind.FLOAT),
    _x("nvlink_rx_bytes_per_s", Kind.FLOAT),
    _x("sm_active_pct", Kind.FLOAT, "GPM: % of SMs busy"),
    _x("sm_occupancy_pct", Kind.FLOAT, "GPM: % of warps resident vs max"),
    _x("tensor_active_pct", Kind.FLOAT, "GPM: % of time any tensor pipe active"),
    _x("tensor_hmma_active_pct", Kind.FLOAT, "GPM: half-precision tensor (FP16/BF16/TF32)"),
    _x("tensor_imma_active_pct", Kind.FLOAT, "GPM: integer tensor"),
    _x("tensor_dfma_active_pct", Kind.FLOAT, "GPM: FP64 tensor"),
    _x("fp64_active_pct", Kind.FLOAT, "GPM: non-tensor FP64 pipe"),
    _x("fp32_active_pct", Kind.FLOAT, "GPM: non-tensor FP32 pipe"),
    _x("fp16_active_pct", Kind.FLOAT, "GPM: non-tensor FP16 pipe"),
    _x("dram_active_pct", Kind.FLOAT, "GPM: % of peak DRAM bandwidth"),
    _x("tflops_estimate", Kind.FLOAT, "achieved TFLOPS estimate (see tflops_method)"),
    _x("ecc_sbe_volatile_count", Kind.INT),
    _x("ecc_dbe_volatile_count", Kind.INT),
    _x("remapped_rows_correctable", Kind.INT),
    _x("remapped_rows_uncorrectable", Kind.INT),
    _x("remapped_rows_pending", Kind.BOOL),
    _x("remapped_rows_failure", Kind.BOOL),
    _x("mig_enabled", Kind.BOOL),
)

# Fields that are not a plain attribute of GpuSample.
FIELD_LOST = "gpu_lost"
FIELD_ENERGY_METHOD = "energy_method"
FIELD_TFLOPS_METHOD = "tflops_method"
FIELD_XID_LAST = "xid_last"
FIELD_XID_COUNT = "xid_count"
FIELD_PROCESS_COUNT = "process_count"
FIELD_PROCESSES = "processes"  # "pid:bytes;pid:bytes" (bytes empty when unknown)
# The job id is a string *field*, not a tag: a tag per job id creates one series per GPU and job,
# and a cluster running thousands of short jobs a day would grow the series index without bound.
# As a field it costs nothing in cardinality; InfluxQL can still filter on it (a scan, not an
# index lookup). Sites with few long jobs may prefer a tag; see the README.
FIELD_JOB_ID = "job_id"
# A MIG device's point (tags: its own uuid and name, the parent GPU's index): its parent GPU's
# uuid (string) and its GPU and compute instance ids (int). Absent on a whole GPU.
FIELD_PARENT_UUID = "parent_uuid"
FIELD_GPU_INSTANCE_ID = "gpu_instance_id"
FIELD_COMPUTE_INSTANCE_ID = "compute_instance_id"

FIELD_BY_ATTR: dict[str, FieldSpec] = {f.attr: f for f in FIELDS}
FIELD_BY_NAME: dict[str, FieldSpec] = {f.field: f for f in FIELDS}

#: Fields whose rollup is the last value in the bucket (counters), not the mean.
COUNTER_ATTRS: frozenset[str] = frozenset(
    {
        "energy_j",
        "ecc_sbe_volatile_count",
        "ecc_dbe_volatile_count",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
    }
)


# NVML clock-event (throttle) reason bits carried in ``clock_event_reasons`` (nvml.h's
# nvmlClocksEventReason*). HW slowdown, HW thermal slowdown and HW power brake are faults; the SW
# power cap is what a GPU at full load normally shows.
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80


# --- line protocol ------------------------------------------------------------------------------

_TAG_ESCAPES = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ "})
_STR_ESCAPES = str.maketrans({'"': r"\"", "\\": "\\\\"})

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
        return value.translate(_STR_ESCAPES)
    return value


def format_processes(processes: Iterable[ProcessSample]) -> str:
    if type(processes) is tuple and len(processes) == 1:  # the usual case: one per GPU
        (p,) = processes
        return f"{p.pid}:{'' if p.used_memory_bytes is None else p.used_memory_bytes}"
    return ";".join(
        f"{p.pid}:{'' if p.used_memory_bytes is None else p.used_memory_bytes}" for p in processes
    )


def parse_processes(text: str) -> tuple[ProcessSample, ...]:
    out = []
    for item in filter(None, text.split(";")):
        pid, _, mem = item.partition(":")
        out.append(ProcessSample(int(pid), int(mem) if mem else None))
    return tuple(out)


class LineEncoder:
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
        if s.parent_uuid is not None:  # a MIG device
            extra.append(f'{FIELD_PARENT_UUID}="{_escape_str(s.parent_uuid)}"')
            if s.gpu_instance_id is not None:
                extra.append(f"{FIELD_GPU_INSTANCE_ID}={s.gpu_instance_id}i")
            if s.compute_instance_id is not None:
                extra.append(f"{FIELD_COMPUTE_INSTANCE_ID}={s.compute_instance_id}i")
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


class LineProtocolError(ValueError):
    pass


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


def parse_line(line: str) -> tuple[str, dict[str, str], dict[str, Any], int]:
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


def sample_from_fields(time_ns: int, tags: dict[str, str], values: dict[str, Any]) -> GpuSample:
    """Build a sample from stored tags and fields (line protocol, InfluxQL rows)."""
    kwargs: dict[str, Any] = {}
    for name, v in values.items():
        if v is None:
            continue
        spec = FIELD_BY_NAME.get(name)
        if spec is not None:
            if spec.kind is Kind.INT:
                kwargs[spec.attr] = round(v * spec.scale)
            elif spec.kind is Kind.FLOAT:
                kwargs[spec.attr] = float(v) * spec.scale
            else:
                kwargs[spec.attr] = bool(v)
    if (m := values.get(FIELD_ENERGY_METHOD)) is not None:
        kwargs["energy_method"] = EnergyMethod(m)
    if (m := values.get(FIELD_TFLOPS_METHOD)) is not None:
        kwargs["tflops_method"] = TflopsMethod(m)
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
    return GpuSample(
        time_ns=int(time_ns),
        host=decode_name(tags.get(TAG_HOST, "")),
        gpu_index=int(tags.get(TAG_INDEX, -1)),
        uuid=decode_name(tags.get(TAG_UUID, "")),
        name=decode_name(tags.get(TAG_NAME, "")),
        lost=bool(values.get(FIELD_LOST, False)),
        **kwargs,
    )


def decode_line(line: str) -> GpuSample:
    """Parse one ``nvidia_smi`` line back into a sample (the spool -> SQLite path)."""
    measurement, tags, values, time_ns = parse_line(line)
    if measurement != MEASUREMENT:
        raise LineProtocolError(f"unexpected measurement {measurement!r}")
    return sample_from_fields(time_ns, tags, values)


# --- application-reported work: the ``gpuwatt_job_step`` measurement ------------------------------
#
# A training job reports each optimizer step (``gpuwatt.work.WorkReporter``): how long it took and
# how many model FLOPs it did, so the analytics can put a true MFU beside the counter estimate.
#
# - Tags ``host``, ``job_id``, ``rank``. Unlike ``nvidia_smi`` (where the job id is a *field*, see
#   FIELD_JOB_ID), the job id is a tag here: every point of this measurement belongs to exactly one
#   job, and reads always select by job. The cost is one series per (host, job, rank): a site
#   running 1,000 jobs a day whose jobs report from every one of 64 ranks adds 64,000 series a day
#   (1,000 a day when only rank 0 reports, which is enough: ``model_flops_per_step`` is the job's
#   total). Give the bucket a retention, or report from rank 0 only, where that matters.
# - ``step`` (int): the optimizer step number. ``step_time_s`` (float, s): wall time of the step
#   on this rank, forward + backward + optimizer + communication.
# - ``model_flops_per_step`` (float, FLOP): the *job's total* model FLOPs per optimizer step, over
#   all ranks (the global batch): for a dense transformer ~6 x parameters x tokens per step
#   (PaLM's MFU definition: model FLOPs, not hardware FLOPs, so activation recomputation does not
#   count). Every rank that reports sends the same job total; the analytics count each step once.
# - ``tokens_per_step`` (float, optional): tokens in the global batch per step.
# - ``gpu_uuids`` (string, optional): the GPUs of this rank, comma-separated NVML UUIDs
#   (``GPU-...``), or ``host:index`` where the UUID is not known.
# - ``precision`` (string, optional): the tensor precision of the model's matmuls (one of
#   ``gpu_specs.TENSOR_PRECISIONS``); it picks the peak MFU is measured against.
# The point's time is the end of the step (ns).

JOB_STEP_MEASUREMENT = "gpuwatt_job_step"
TAG_JOB_ID = "job_id"
TAG_RANK = "rank"
JOB_STEP_TAGS: tuple[str, ...] = (TAG_HOST, TAG_JOB_ID, TAG_RANK)
FIELD_STEP = "step"
FIELD_STEP_TIME_S = "step_time_s"
FIELD_MODEL_FLOPS_PER_STEP = "model_flops_per_step"
FIELD_TOKENS_PER_STEP = "tokens_per_step"
FIELD_GPU_UUIDS = "gpu_uuids"
FIELD_PRECISION = "precision"
JOB_STEP_FIELDS: tuple[str, ...] = (
    FIELD_STEP,
    FIELD_STEP_TIME_S,
    FIELD_MODEL_FLOPS_PER_STEP,
    FIELD_TOKENS_PER_STEP,
    FIELD_GPU_UUIDS,
    FIELD_PRECISION,
)
#: Columns of a job-step frame (``JobStepStore.job_steps``), in order.
JOB_STEP_COLUMNS: tuple[str, ...] = ("time_ns", *JOB_STEP_TAGS, *JOB_STEP_FIELDS)


@dataclass(frozen=True, slots=True)
class JobStep:
    """One optimizer step of one rank of a job, as the job reports it (see the notes above)."""

    time_ns: int  # end of the step
    job_id: str
    rank: int
    step: int
    step_time_s: float
    model_flops_per_step: float | None = None  # the job's total over all ranks, FLOP
    tokens_per_step: float | None = None
    gpu_uuids: tuple[str, ...] = ()
    precision: str | None = None
    host: str = ""


def _lp_float(value: float) -> str:
    """Shortest exact text of a float (line protocol accepts ``1e+15``)."""
    return repr(float(value))


def encode_job_step(s: JobStep) -> str:
    """One ``gpuwatt_job_step`` line (precision ns). Non-finite optional fields are left out."""
    if not s.job_id:
        raise ValueError("a job step needs a job_id")
    if not math.isfinite(s.step_time_s):
        raise ValueError(f"step_time_s must be finite, got {s.step_time_s!r}")
    tags = [JOB_STEP_MEASUREMENT]
    if s.host:
        tags.append(f"{TAG_HOST}={escape_tag(s.host)}")
    tags.append(f"{TAG_JOB_ID}={escape_tag(s.job_id)}")
    tags.append(f"{TAG_RANK}={int(s.rank)}")
    fields_ = [f"{FIELD_STEP}={int(s.step)}i", f"{FIELD_STEP_TIME_S}={_lp_float(s.step_time_s)}"]
    for name, v in (
        (FIELD_MODEL_FLOPS_PER_STEP, s.model_flops_per_step),
        (FIELD_TOKENS_PER_STEP, s.tokens_per_step),
    ):
        if v is not None and math.isfinite(v):
            fields_.append(f"{name}={_lp_float(v)}")
    if s.gpu_uuids:
        text = ",".join(s.gpu_uuids).translate(_STR_ESCAPES)
        fields_.append(f'{FIELD_GPU_UUIDS}="{text}"')
    if s.precision:
        fields_.append(f'{FIELD_PRECISION}="{s.precision.translate(_STR_ESCAPES)}"')
    return f"{','.join(tags)} {','.join(fields_)} {int(s.time_ns)}"


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def job_step_from_fields(time_ns: int, tags: dict[str, str], values: dict[str, Any]) -> JobStep:
    """Build a job step from stored tags and fields (line protocol, InfluxQL rows)."""
    uuids = values.get(FIELD_GPU_UUIDS)
    precision = values.get(FIELD_PRECISION)
    return JobStep(
        time_ns=int(time_ns),
        job_id=decode_name(tags.get(TAG_JOB_ID, "")),
        rank=int(tags.get(TAG_RANK) or 0),
        step=int(values[FIELD_STEP]),
        step_time_s=float(values[FIELD_STEP_TIME_S]),
        model_flops_per_step=_opt_float(values.get(FIELD_MODEL_FLOPS_PER_STEP)),
        tokens_per_step=_opt_float(values.get(FIELD_TOKENS_PER_STEP)),
        gpu_uuids=tuple(filter(None, str(uuids).split(","))) if uuids else (),
        precision=str(precision) if precision else None,
        host=decode_name(tags.get(TAG_HOST, "")),
    )


def decode_job_step(line: str) -> JobStep:
    """Parse one ``gpuwatt_job_step`` line back into a ``JobStep``."""
    measurement, tags, values, time_ns = parse_line(line)
    if measurement != JOB_STEP_MEASUREMENT:
        raise LineProtocolError(f"unexpected measurement {measurement!r}")
    missing = [f for f in (FIELD_STEP, FIELD_STEP_TIME_S) if f not in values]
    if missing or TAG_JOB_ID not in tags:
        raise LineProtocolError(f"job step without {missing or [TAG_JOB_ID]}")
    return job_step_from_fields(time_ns, tags, values)
