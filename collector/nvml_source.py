"""The sampler: one ``GpuSample`` per GPU per tick, read through an injected NVML module.

The NVML module is an argument (the real ``pynvml`` from ``collector.nvml``, or the simulator's
``FakeNvml``). NVML errors never leave this module:

- every field is queried on its own; ``NotSupported``/``NoPermission`` make that field ``None`` for
  good on that GPU (it is not asked again), any other NVML error makes it ``None`` for this tick;
  each (gpu, field, cause) is logged once, not every tick;
- ``GpuIsLost``/``Unknown`` on any call make that GPU's sample ``lost=True`` with no metrics, while
  the other GPUs keep being sampled; a lost GPU is probed again every tick;
- versioned calls fall back (memory v2 -> v1, ``TemperatureV`` -> legacy, clocks-event reasons ->
  the older throttle-reasons name), and a GPU in MIG mode is sampled at the GPU level wherever NVML
  allows it.

Handles and static facts are read once in ``open()``. The per-GPU hot path uses pre-bound NVML
functions, inlines each field's call in its own try/except (errors, fallbacks and refused fields
go to helpers off that path), decodes ctypes structs with one ``struct`` call each, and builds the
sample with ``make_gpu_sample`` (positional, no frozen-dataclass ``__init__``). Budget and
breakdown: ``bench/collector_cost.py``.
"""

from __future__ import annotations

import ctypes
import logging
import operator
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from gpuwatt.collector.xid_events import XidListener
from gpuwatt.errors import NvmlUnavailable
from gpuwatt.gpu_specs import TENSOR_PRECISIONS, GpuSpec, lookup
from gpuwatt.model import (
    EnergyMethod,
    GpuSample,
    ProcessSample,
    TflopsMethod,
    make_gpu_sample,
    make_process_sample,
)
from gpuwatt.tflops import PipePeaks, tflops_from_pipes

_log = logging.getLogger(__name__)

_KIB = 1024.0
_MIB = 1024.0 * 1024.0
_NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as unsigned long long

#: GPM metrics the sampler asks for, in order: (NVML constant name, GpuSample attribute, scale).
GPM_METRICS: tuple[tuple[str, str, float], ...] = (
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_pct", 1.0),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_pct", 1.0),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active_pct", 1.0),
    ("NVML_GPM_METRIC_HMMA_TENSOR_UTIL", "tensor_hmma_active_pct", 1.0),
    ("NVML_GPM_METRIC_IMMA_TENSOR_UTIL", "tensor_imma_active_pct", 1.0),
    ("NVML_GPM_METRIC_DFMA_TENSOR_UTIL", "tensor_dfma_active_pct", 1.0),
    ("NVML_GPM_METRIC_FP64_UTIL", "fp64_active_pct", 1.0),
    ("NVML_GPM_METRIC_FP32_UTIL", "fp32_active_pct", 1.0),
    ("NVML_GPM_METRIC_FP16_UTIL", "fp16_active_pct", 1.0),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active_pct", 1.0),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bytes_per_s", _MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bytes_per_s", _MIB),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bytes_per_s", _MIB),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bytes_per_s", _MIB),
)
_N_GPM = len(GPM_METRICS)
_NO_GPM: tuple[None, ...] = (None,) * _N_GPM
_GPM_SCALES: tuple[float, ...] = tuple(scale for _const, _attr, scale in GPM_METRICS)
_GPM_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION; checked against the module in open()
_mul = operator.mul
_COUNTER = EnergyMethod.COUNTER
_GPM_METHOD = TflopsMethod.GPM

#: GpuSample's leading fields, in the order ``NvmlSampler._sample_gpu`` passes them positionally
#: to ``make_gpu_sample`` (the fields after them keep their defaults).
_SAMPLE_FIELDS: tuple[str, ...] = (
    "time_ns",
    "host",
    "gpu_index",
    "uuid",
    "name",
    "lost",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "memory_free_bytes",
    "memory_reserved_bytes",
    "temperature_gpu_c",
    "temperature_memory_c",
    "fan_speed_pct",
    "power_w",
    "power_limit_w",
    "energy_j",
    "energy_method",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "graphics_clock_mhz",
    "sm_clock_max_mhz",
    "clock_event_reasons",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "tensor_hmma_active_pct",
    "tensor_imma_active_pct",
    "tensor_dfma_active_pct",
    "fp64_active_pct",
    "fp32_active_pct",
    "fp16_active_pct",
    "dram_active_pct",
    "tflops_estimate",
    "tflops_method",
    "xid_errors",
    "ecc_sbe_volatile_count",
    "ecc_dbe_volatile_count",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "mig_enabled",
    "processes",
)
if tuple(f.name for f in fields(GpuSample))[: len(_SAMPLE_FIELDS)] != _SAMPLE_FIELDS:
    raise ImportError(
        "GpuSample's fields changed: update _SAMPLE_FIELDS and the positional make_gpu_sample "
        "call in NvmlSampler._sample_gpu"
    )


# --- reading ctypes structs without pynvml's per-field Python hook ----------------------------
# pynvml's structs override __getattribute__/__setattr__ in Python (bytes -> str conversion), so
# each field access costs about a microsecond. The hot path instead reads (and the fake writes)
# the fields it needs in one struct.Struct call over the structure's buffer, with the offsets
# taken from the ctypes class itself, so the layout can never drift from pynvml's.

_INT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


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
    outer, elem = nv.c_nvmlGpmMetricsGet_t, nv.c_nvmlGpmMetric_t
    types = dict((f[0], f[1]) for f in elem._fields_)
    base, size = outer.metrics.offset, ctypes.sizeof(elem)

    def per_metric(names: Sequence[str]) -> list[tuple[int, Any]]:
        return [
            (base + i * size + getattr(elem, n).offset, types[n])
            for i in range(count)
            for n in names
        ]

    return GpmCodecs(
        header=_layout(
            [(getattr(outer, n).offset, dict(outer._fields_)[n]) for n in _GPM_HEADER], None
        ),
        ids=_layout(per_metric(("metricId",)), None),
        results=_layout(per_metric(("nvmlReturn", "value")), None),
        fill=_layout(per_metric(("metricId", "nvmlReturn", "value")), None, origin=base),
        metrics_offset=base,
    )


_GPM_HEADER = ("version", "numMetrics", "sample1", "sample2")


class _GpuLost(Exception):
    """Internal: NVML said GpuIsLost/Unknown for this GPU during this tick."""

    def __init__(self, cause: str, field: str) -> None:
        super().__init__(cause, field)
        self.cause = cause
        self.field = field


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Static facts about one GPU, read once in ``open()`` (None = NVML did not say)."""

    index: int
    uuid: str
    name: str
    spec: GpuSpec | None
    memory_total_bytes: int | None
    sm_clock_max_mhz: float | None
    power_limit_default_w: float | None
    power_limit_enforced_w: float | None
    slowdown_temp_c: float | None
    shutdown_temp_c: float | None
    gpm_supported: bool
    mig_enabled: bool | None


class _Gpu:
    """Per-GPU state of the sampler: handle, static facts, fallbacks, counters, GPM buffers."""

    __slots__ = (
        "energy_counter",
        "energy_integrated_j",
        "energy_last_mono_s",
        "energy_last_power_w",
        "energy_last_raw_j",
        "energy_offset_j",
        "gpm",
        "gpm_cur",
        "gpm_get",
        "gpm_header",
        "gpm_prev",
        "gpm_primed",
        "gpm_results",
        "handle",
        "index",
        "info",
        "lost",
        "mem_v2",
        "mig_enabled",
        "name",
        "off",
        "sm_clock_max_mhz",
        "spec",
        "temp_v",
        "tflops_peaks",
        "uuid",
        "xids",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.info: DeviceInfo | None = None
        self.uuid = ""
        self.name = ""
        self.spec: GpuSpec | None = None
        self.tflops_peaks: PipePeaks | None = None  # at the configured tensor precision
        self.sm_clock_max_mhz: float | None = None
        self.mig_enabled: bool | None = None
        self.lost = False
        self.off: set[str] = set()  # fields NVML refused for good (NotSupported/NoPermission)
        self.mem_v2 = True
        self.temp_v = True
        self.energy_counter = True
        self.energy_offset_j = 0.0
        self.energy_last_raw_j: float | None = None
        self.energy_integrated_j = 0.0
        self.energy_last_mono_s: float | None = None
        self.energy_last_power_w: float | None = None
        self.gpm = False
        self.gpm_prev: Any = None
        self.gpm_cur: Any = None
        self.gpm_get: Any = None
        self.gpm_header: struct.Struct | None = None
        self.gpm_results: struct.Struct | None = None
        self.gpm_primed = False
        self.xids: deque[int] = deque()


class NvmlSampler:
    """Samples every GPU NVML sees on this host. ``open()`` once, ``sample()`` each tick."""

    def __init__(
        self,
        nvml: Any,
        host: str,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic_s: Callable[[], float] = time.monotonic,
        tensor_precision: str = "bf16",
        logger: logging.Logger | None = None,
        xid_events: bool = True,
        xid_wait_ms: int = 200,
    ) -> None:
        if tensor_precision not in TENSOR_PRECISIONS:
            raise ValueError(f"tensor_precision must be one of {TENSOR_PRECISIONS}")
        self._nv = nvml
        self._host = host
        self._clock_ns = clock_ns
        self._monotonic_s = monotonic_s
        self._precision = tensor_precision
        self._log = logger or _log
        self._want_xids = xid_events
        self._xid_wait_ms = xid_wait_ms
        self._gpus: list[_Gpu] = []
        self._listener: XidListener | None = None
        self._logged: set[tuple[int, str, str]] = set()
        self._unsupported: dict[str, str] = {}
        self._opened = False
        errors: list[type[BaseException]] = [nvml.NVMLError]
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        if isinstance(mismatch, type) and issubclass(mismatch, Exception):
            errors.append(mismatch)
        self._errors = tuple(errors)
        self._lost_codes = frozenset({nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_UNKNOWN})
        self._for_good_codes = frozenset(
            {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NO_PERMISSION}
        )
        self._fallback_codes = frozenset(
            {
                nvml.NVML_ERROR_NOT_SUPPORTED,
                nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            }
        )
        self._bind(nvml)

    def _bind(self, nv: Any) -> None:
        """Resolve every NVML function and constant once: the hot path does no module lookups."""
        self._f_util = nv.nvmlDeviceGetUtilizationRates
        self._t_util = nv.c_nvmlUtilization_t
        self._rd_util = struct_codec(self._t_util, ("gpu", "memory")).unpack_from
        self._t_mem1 = nv.c_nvmlMemory_t
        self._rd_mem1 = struct_codec(self._t_mem1, ("total", "free", "used")).unpack_from
        self._t_mem2 = getattr(nv, "c_nvmlMemory_v2_t", None)
        if self._t_mem2 is not None:
            names = ("total", "reserved", "free", "used")
            self._rd_mem2 = struct_codec(self._t_mem2, names).unpack_from
        self._f_mem = nv.nvmlDeviceGetMemoryInfo
        self._mem_v2 = getattr(nv, "nvmlMemory_v2", None)
        self._f_temp_v = getattr(nv, "nvmlDeviceGetTemperatureV", None)
        self._f_temp = nv.nvmlDeviceGetTemperature
        self._temp_gpu = nv.NVML_TEMPERATURE_GPU
        self._f_power = nv.nvmlDeviceGetPowerUsage
        self._f_limit = nv.nvmlDeviceGetEnforcedPowerLimit
        self._f_energy = nv.nvmlDeviceGetTotalEnergyConsumption
        self._f_clock = nv.nvmlDeviceGetClockInfo
        self._clk_sm = nv.NVML_CLOCK_SM
        self._clk_mem = nv.NVML_CLOCK_MEM
        self._clk_gfx = nv.NVML_CLOCK_GRAPHICS
        self._f_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._f_reasons_old = getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        self._f_fan = nv.nvmlDeviceGetFanSpeed
        self._f_pcie = nv.nvmlDeviceGetPcieThroughput
        self._pcie_tx = nv.NVML_PCIE_UTIL_TX_BYTES
        self._pcie_rx = nv.NVML_PCIE_UTIL_RX_BYTES
        self._f_procs = nv.nvmlDeviceGetComputeRunningProcesses
        self._f_ecc = nv.nvmlDeviceGetTotalEccErrors
        self._ecc_corr = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        self._ecc_unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        self._ecc_volatile = nv.NVML_VOLATILE_ECC
        self._f_remap = nv.nvmlDeviceGetRemappedRows
        self._f_gpm_get = getattr(nv, "nvmlGpmSampleGet", None)
        self._f_gpm_metrics = getattr(nv, "nvmlGpmMetricsGet", None)

    # --- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML, enumerate the GPUs, read static facts, start the XID listener."""
        nv = self._nv
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except self._errors as exc:
            raise NvmlUnavailable(f"NVML is not available ({exc})") from None
        self._opened = True
        self._gpus = [_Gpu(i) for i in range(count)]
        for g in self._gpus:
            g.mem_v2 = self._mem_v2 is not None
            g.temp_v = self._f_temp_v is not None
            self._open_gpu(g)
        if self._want_xids:
            handles = {g.index: g.handle for g in self._gpus if g.handle is not None}
            self._listener = XidListener(
                nv, handles, self._on_xid, wait_ms=self._xid_wait_ms, logger=self._log
            )
            self._listener.start()

    def close(self) -> None:
        """Stop the XID listener, free GPM buffers and shut NVML down. Idempotent."""
        if not self._opened:
            return
        self._opened = False
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        nv = self._nv
        for g in self._gpus:
            for buf in (g.gpm_prev, g.gpm_cur):
                if buf is not None:
                    try:
                        nv.nvmlGpmSampleFree(buf[0])
                    except self._errors as exc:
                        self._log.debug("GPU %d: nvmlGpmSampleFree failed (%s)", g.index, exc)
            g.gpm_prev = g.gpm_cur = None
            g.gpm = False
        try:
            nv.nvmlShutdown()
        except self._errors as exc:
            self._log.debug("nvmlShutdown failed (%s)", exc)

    def __enter__(self) -> NvmlSampler:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- public queries -------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    def devices(self) -> list[DeviceInfo]:
        """Static facts of the GPUs whose facts could be read (a lost GPU may have none yet)."""
        return [g.info for g in self._gpus if g.info is not None]

    def unsupported_fields(self) -> dict[str, str]:
        """``"gpu<index>/<field>"`` -> cause, for every field NVML refused for good."""
        return dict(self._unsupported)

    @property
    def xid_listener_active(self) -> bool:
        return self._listener is not None and self._listener.active

    # --- error handling -------------------------------------------------------------------------

    def _failed(self, g: _Gpu, field: str, exc: BaseException) -> None:
        """Decide what an NVML error on one field means. Raises _GpuLost for a lost GPU."""
        code = getattr(exc, "value", None)
        cause = type(exc).__name__
        if code in self._lost_codes:
            raise _GpuLost(cause, field)
        if code in self._for_good_codes or not isinstance(exc, self._nv.NVMLError):
            g.off.add(field)
            self._unsupported[f"gpu{g.index}/{field}"] = cause
        self._log_once(g, field, cause, "%s: %s", exc)

    def _log_once(self, g: _Gpu, field: str, cause: str, fmt: str, *args: object) -> None:
        key = (g.index, field, cause)
        if key in self._logged:
            return
        self._logged.add(key)
        self._log.info("GPU %d %s " + fmt, g.index, field, cause, *args)

    def _q1(self, g: _Gpu, field: str, fn: Callable[[Any], Any], h: Any) -> Any:
        if field in g.off:
            return None
        try:
            return fn(h)
        except self._errors as exc:
            self._failed(g, field, exc)
            return None

    def _q2(self, g: _Gpu, field: str, fn: Callable[[Any, Any], Any], h: Any, arg: Any) -> Any:
        if field in g.off:
            return None
        try:
            return fn(h, arg)
        except self._errors as exc:
            self._failed(g, field, exc)
            return None

    # --- open -----------------------------------------------------------------------------------

    def _open_gpu(self, g: _Gpu) -> None:
        try:
            g.handle = self._nv.nvmlDeviceGetHandleByIndex(g.index)
            self._read_static(g)
        except self._errors as exc:
            self._mark_lost(g, type(exc).__name__, "handle")
        except _GpuLost as lost:
            self._mark_lost(g, lost.cause, lost.field)

    def _read_static(self, g: _Gpu) -> None:
        nv, h, q1, q2 = self._nv, g.handle, self._q1, self._q2
        uuid = q1(g, "uuid", nv.nvmlDeviceGetUUID, h)
        name = q1(g, "name", nv.nvmlDeviceGetName, h)
        g.uuid = _text(uuid) if uuid is not None else ""
        g.name = _text(name) if name is not None else ""
        g.spec = spec = lookup(g.name) if g.name else None
        g.tflops_peaks = PipePeaks.of(spec, self._precision) if spec is not None else None
        mem = q1(g, "memory_total_bytes", nv.nvmlDeviceGetMemoryInfo, h)
        sm_max = q2(g, "sm_clock_max_mhz", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
        g.sm_clock_max_mhz = float(sm_max) if sm_max is not None else None
        default_mw = q1(g, "power_limit_default_w", nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
        enforced_mw = q1(g, "power_limit_w", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        thr = nv.nvmlDeviceGetTemperatureThreshold
        slowdown = q2(g, "slowdown_temp_c", thr, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        shutdown = q2(g, "shutdown_temp_c", thr, h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        mig = q1(g, "mig_enabled", getattr(nv, "nvmlDeviceGetMigMode", None) or _absent, h)
        g.mig_enabled = bool(mig[0]) if mig is not None else None
        self._open_gpm(g)
        g.info = DeviceInfo(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            spec=g.spec,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            sm_clock_max_mhz=g.sm_clock_max_mhz,
            power_limit_default_w=default_mw / 1000.0 if default_mw is not None else None,
            power_limit_enforced_w=enforced_mw / 1000.0 if enforced_mw is not None else None,
            slowdown_temp_c=float(slowdown) if slowdown is not None else None,
            shutdown_temp_c=float(shutdown) if shutdown is not None else None,
            gpm_supported=g.gpm,
            mig_enabled=g.mig_enabled,
        )

    def _open_gpm(self, g: _Gpu) -> None:
        """Allocate two GPM sample buffers and one metrics request if the GPU has GPM."""
        nv = self._nv
        query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
        if query is None or self._f_gpm_get is None:
            return
        if getattr(nv, "NVML_GPM_METRICS_GET_VERSION", None) != _GPM_GET_VERSION:
            self._unsupported.setdefault(f"gpu{g.index}/gpm", "unknown GPM request version")
            return
        support = self._q1(g, "gpm", query, g.handle)
        if support is None or not support.isSupportedDevice:
            if support is not None:
                self._unsupported.setdefault(f"gpu{g.index}/gpm", "not a GPM device")
            return
        try:
            first = nv.nvmlGpmSampleAlloc()
            second = nv.nvmlGpmSampleAlloc()
        except self._errors as exc:
            self._failed(g, "gpm", exc)
            return
        # each buffer with its address: the request is written raw (see struct_codec)
        g.gpm_prev = (first, ctypes.cast(first, ctypes.c_void_p).value)
        g.gpm_cur = (second, ctypes.cast(second, ctypes.c_void_p).value)
        header, ids, results, _fill, _base = gpm_codecs(nv, _N_GPM)
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = _N_GPM
        ids.pack_into(get, 0, *(getattr(nv, const) for const, _attr, _scale in GPM_METRICS))
        g.gpm_get = get
        g.gpm_header = header
        g.gpm_results = results
        g.gpm = True

    def _mark_lost(self, g: _Gpu, cause: str, field: str) -> None:
        if not g.lost:
            g.lost = True
            self._log.warning(
                "GPU %d is lost (%s on %s); other GPUs continue", g.index, cause, field
            )
        g.gpm_primed = False

    def _on_xid(self, gpu_index: int, xid: int) -> None:
        if 0 <= gpu_index < len(self._gpus):
            self._gpus[gpu_index].xids.append(xid)

    # --- sampling -------------------------------------------------------------------------------

    def sample(self, include_slow: bool = False) -> list[GpuSample]:
        """One sample per GPU for this tick (a lost GPU: ``lost=True``). Raises no NVML error."""
        if not self._opened:
            raise RuntimeError("NvmlSampler.sample() before open()")
        t_ns = self._clock_ns()
        mono_s = self._monotonic_s()
        out = []
        for g in self._gpus:
            try:
                if g.handle is None or g.info is None:
                    self._reopen(g)
                s = self._sample_gpu(g, t_ns, mono_s, include_slow)
                if g.lost:
                    g.lost = False
                    self._log.warning("GPU %d answers again", g.index)
            except _GpuLost as lost:
                self._mark_lost(g, lost.cause, lost.field)
                s = GpuSample(
                    time_ns=t_ns,
                    host=self._host,
                    gpu_index=g.index,
                    uuid=g.uuid,
                    name=g.name,
                    lost=True,
                    xid_errors=_drain(g.xids),
                )
            out.append(s)
        return out

    def _reopen(self, g: _Gpu) -> None:
        try:
            if g.handle is None:
                g.handle = self._nv.nvmlDeviceGetHandleByIndex(g.index)
        except self._errors as exc:
            raise _GpuLost(type(exc).__name__, "handle") from None
        self._read_static(g)

    def _sample_gpu(self, g: _Gpu, t_ns: int, mono_s: float, include_slow: bool) -> GpuSample:
        # The hot path: every field's NVML call is inlined with its own try/except (free when
        # nothing is raised), so a healthy field costs its NVML call and a set lookup. Whatever
        # goes wrong (an error, a fallback, a refused field) is handled by the helpers below.
        h, off, errors, failed = g.handle, g.off, self._errors, self._failed

        if "utilization" in off:
            util_gpu = util_mem = None
        else:
            try:
                util = self._f_util(h)
            except errors as exc:
                util = failed(g, "utilization", exc)
            if util is None:
                util_gpu = util_mem = None
            elif type(util) is self._t_util:
                u_gpu, u_mem = self._rd_util(util)
                util_gpu, util_mem = float(u_gpu), float(u_mem)
            else:
                util_gpu, util_mem = float(util.gpu), float(util.memory)

        if "memory" in off:
            mem_used = mem_total = mem_free = mem_reserved = None
        elif g.mem_v2:
            try:
                m = self._f_mem(h, version=self._mem_v2)
            except errors as exc:
                mem_used, mem_total, mem_free, mem_reserved = self._memory_v2_failed(g, h, exc)
            else:
                if type(m) is self._t_mem2:
                    mem_total, mem_reserved, mem_free, mem_used = self._rd_mem2(m)
                else:
                    mem_used, mem_total = int(m.used), int(m.total)
                    mem_free, mem_reserved = int(m.free), int(m.reserved)
        else:
            mem_used, mem_total, mem_free, mem_reserved = self._memory_v1(g, h)

        if "temperature_gpu_c" in off:
            temp = None
        elif g.temp_v:
            try:
                temp = float(self._f_temp_v(h, self._temp_gpu))
            except errors as exc:
                temp = self._temperature_v_failed(g, h, exc)
        else:
            temp = self._temperature_legacy(g, h)

        if "power_w" in off:
            power_w = None
        else:
            try:
                power_w = self._f_power(h) / 1000.0
            except errors as exc:
                power_w = failed(g, "power_w", exc)

        if "power_limit_w" in off:
            limit_w = None
        else:
            try:
                limit_w = self._f_limit(h) / 1000.0
            except errors as exc:
                limit_w = failed(g, "power_limit_w", exc)

        if g.energy_counter:
            try:
                raw_j = self._f_energy(h) / 1000.0
            except errors as exc:
                energy_j, energy_method = self._energy_counter_failed(g, exc, mono_s, power_w)
            else:
                last = g.energy_last_raw_j
                if last is not None and raw_j < last:
                    self._energy_counter_reset(g, last, raw_j)
                g.energy_last_raw_j = raw_j
                energy_j, energy_method = g.energy_offset_j + raw_j, _COUNTER
        else:
            energy_j, energy_method = self._energy_integrated(g, mono_s, power_w)

        f_clock = self._f_clock
        if "sm_clock_mhz" in off:
            sm_mhz = None
        else:
            try:
                sm_mhz = float(f_clock(h, self._clk_sm))
            except errors as exc:
                sm_mhz = failed(g, "sm_clock_mhz", exc)
        if "memory_clock_mhz" in off:
            mem_mhz = None
        else:
            try:
                mem_mhz = float(f_clock(h, self._clk_mem))
            except errors as exc:
                mem_mhz = failed(g, "memory_clock_mhz", exc)
        if "graphics_clock_mhz" in off:
            gfx_mhz = None
        else:
            try:
                gfx_mhz = float(f_clock(h, self._clk_gfx))
            except errors as exc:
                gfx_mhz = failed(g, "graphics_clock_mhz", exc)

        f_reasons = self._f_reasons
        if f_reasons is None or "clock_event_reasons" in off:
            reasons = self._reasons_old(g, h)
        else:
            try:
                reasons = int(f_reasons(h))
            except errors as exc:
                reasons = self._reasons_failed(g, h, exc)

        if "fan_speed_pct" in off:
            fan = None
        else:
            try:
                fan = float(self._f_fan(h))
            except errors as exc:
                fan = failed(g, "fan_speed_pct", exc)

        tflops = None
        if g.gpm:
            (
                sm_act,
                sm_occ,
                tensor,
                hmma,
                imma,
                dfma,
                fp64,
                fp32,
                fp16,
                dram,
                nvl_rx,
                nvl_tx,
                pcie_tx,
                pcie_rx,
            ) = self._gpm(g, h) if g.gpm_primed else self._gpm_unprimed(g, h)
            if g.tflops_peaks is not None:
                tflops = tflops_from_pipes(g.tflops_peaks, sm_mhz, hmma, dfma, fp64, fp32, fp16)
        else:
            sm_act = sm_occ = tensor = hmma = imma = dfma = fp64 = fp32 = fp16 = dram = None
            nvl_rx = nvl_tx = pcie_tx = pcie_rx = None
        if not g.gpm:  # no GPM, or it was refused for good just now
            pcie_tx, pcie_rx = self._pcie(g, h)

        if "processes" in off:
            processes = None
        else:
            try:
                procs = self._f_procs(h)
            except errors as exc:
                processes = failed(g, "processes", exc)
            else:
                processes = _processes(procs)

        sbe = dbe = rr_corr = rr_unc = rr_pending = rr_failure = None
        if include_slow:
            f_ecc, vol = self._f_ecc, self._ecc_volatile
            if "ecc_sbe_volatile_count" not in off:
                sbe = self._ecc(g, "ecc_sbe_volatile_count", f_ecc, h, self._ecc_corr, vol)
            if "ecc_dbe_volatile_count" not in off:
                dbe = self._ecc(g, "ecc_dbe_volatile_count", f_ecc, h, self._ecc_unc, vol)
            rows = self._q1(g, "remapped_rows", self._f_remap, h)
            if rows is not None:
                rr_corr, rr_unc = int(rows[0]), int(rows[1])
                rr_pending, rr_failure = bool(rows[2]), bool(rows[3])

        # positionally, in GpuSample's field order (_SAMPLE_FIELDS, checked at import)
        return make_gpu_sample(
            t_ns,  # time_ns
            self._host,  # host
            g.index,  # gpu_index
            g.uuid,  # uuid
            g.name,  # name
            False,  # lost
            util_gpu,  # utilization_gpu_pct
            util_mem,  # utilization_memory_pct
            mem_used,  # memory_used_bytes
            mem_total,  # memory_total_bytes
            mem_free,  # memory_free_bytes
            mem_reserved,  # memory_reserved_bytes
            temp,  # temperature_gpu_c
            None,  # temperature_memory_c
            fan,  # fan_speed_pct
            power_w,  # power_w
            limit_w,  # power_limit_w
            energy_j,  # energy_j
            energy_method,  # energy_method
            sm_mhz,  # sm_clock_mhz
            mem_mhz,  # memory_clock_mhz
            gfx_mhz,  # graphics_clock_mhz
            g.sm_clock_max_mhz,  # sm_clock_max_mhz
            reasons,  # clock_event_reasons
            pcie_tx,  # pcie_tx_bytes_per_s
            pcie_rx,  # pcie_rx_bytes_per_s
            nvl_tx,  # nvlink_tx_bytes_per_s
            nvl_rx,  # nvlink_rx_bytes_per_s
            sm_act,  # sm_active_pct
            sm_occ,  # sm_occupancy_pct
            tensor,  # tensor_active_pct
            hmma,  # tensor_hmma_active_pct
            imma,  # tensor_imma_active_pct
            dfma,  # tensor_dfma_active_pct
            fp64,  # fp64_active_pct
            fp32,  # fp32_active_pct
            fp16,  # fp16_active_pct
            dram,  # dram_active_pct
            tflops,  # tflops_estimate
            _GPM_METHOD if tflops is not None else None,  # tflops_method
            _drain(g.xids) if g.xids else (),  # xid_errors
            sbe,  # ecc_sbe_volatile_count
            dbe,  # ecc_dbe_volatile_count
            rr_corr,  # remapped_rows_correctable
            rr_unc,  # remapped_rows_uncorrectable
            rr_pending,  # remapped_rows_pending
            rr_failure,  # remapped_rows_failure
            g.mig_enabled,  # mig_enabled
            processes,  # processes
        )

    # --- per-field helpers: fallbacks and failures, off the hot path ---------------------------

    def _memory_v2_failed(
        self, g: _Gpu, h: Any, exc: BaseException
    ) -> tuple[int | None, int | None, int | None, int | None]:
        if getattr(exc, "value", None) not in self._fallback_codes:
            self._failed(g, "memory", exc)
            return None, None, None, None
        g.mem_v2 = False
        self._unsupported[f"gpu{g.index}/memory_reserved_bytes"] = (
            f"{type(exc).__name__} (memory v2; using v1)"
        )
        self._log_once(g, "memory", "v2", "%s: falling back to v1", type(exc).__name__)
        return self._memory_v1(g, h)

    def _memory_v1(self, g: _Gpu, h: Any) -> tuple[int | None, int | None, int | None, None]:
        m = self._q1(g, "memory", self._f_mem, h)
        if m is None:
            return None, None, None, None
        if type(m) is self._t_mem1:
            total, free, used = self._rd_mem1(m)
            return used, total, free, None
        return int(m.used), int(m.total), int(m.free), None

    def _temperature_v_failed(self, g: _Gpu, h: Any, exc: BaseException) -> float | None:
        if getattr(exc, "value", None) not in self._fallback_codes:
            self._failed(g, "temperature_gpu_c", exc)
            return None
        g.temp_v = False
        self._log_once(g, "temperature_gpu_c", "TemperatureV", "%s: legacy call", exc)
        return self._temperature_legacy(g, h)

    def _temperature_legacy(self, g: _Gpu, h: Any) -> float | None:
        t = self._q2(g, "temperature_gpu_c", self._f_temp, h, self._temp_gpu)
        return float(t) if t is not None else None

    def _reasons_failed(self, g: _Gpu, h: Any, exc: BaseException) -> int | None:
        if getattr(exc, "value", None) != self._nv.NVML_ERROR_FUNCTION_NOT_FOUND:
            self._failed(g, "clock_event_reasons", exc)
            return None
        self._f_reasons = None  # the driver predates the new name: use the old one
        return self._reasons_old(g, h)

    def _reasons_old(self, g: _Gpu, h: Any) -> int | None:
        if self._f_reasons_old is None:
            return None
        r = self._q1(g, "clock_throttle_reasons", self._f_reasons_old, h)
        return int(r) if r is not None else None

    def _pcie(self, g: _Gpu, h: Any) -> tuple[float | None, float | None]:
        """PCIe throughput from nvmlDeviceGetPcieThroughput (KiB/s) on a GPU without GPM."""
        tx_kib = self._q2(g, "pcie_tx_bytes_per_s", self._f_pcie, h, self._pcie_tx)
        rx_kib = self._q2(g, "pcie_rx_bytes_per_s", self._f_pcie, h, self._pcie_rx)
        return (
            tx_kib * _KIB if tx_kib is not None else None,
            rx_kib * _KIB if rx_kib is not None else None,
        )

    def _energy_counter_failed(
        self, g: _Gpu, exc: BaseException, mono_s: float, power_w: float | None
    ) -> tuple[float | None, EnergyMethod | None]:
        """The energy counter raised: None this tick, or integrate power from now on."""
        code = getattr(exc, "value", None)
        if code in self._lost_codes or code not in self._for_good_codes:
            self._failed(g, "energy_j", exc)
            return None, None
        g.energy_counter = False
        # integration continues from what the counter had counted: never a step down
        g.energy_integrated_j = g.energy_offset_j + (g.energy_last_raw_j or 0.0)
        self._unsupported[f"gpu{g.index}/energy_counter"] = (
            f"{type(exc).__name__} (integrating power instead)"
        )
        self._log_once(g, "energy_j", "counter", "%s: integrating power", exc)
        return self._energy_integrated(g, mono_s, power_w)

    def _energy_counter_reset(self, g: _Gpu, last_j: float, raw_j: float) -> None:
        # the counter restarted (driver reload, GPU reset): keep what was counted
        g.energy_offset_j += last_j
        self._log.info("GPU %d energy counter reset (%.0f J -> %.0f J)", g.index, last_j, raw_j)

    def _energy_integrated(
        self, g: _Gpu, mono_s: float, power_w: float | None
    ) -> tuple[float | None, EnergyMethod | None]:
        """Power integrated over monotonic time (trapezoids): energy without a counter."""
        if power_w is None:
            g.energy_last_mono_s = None  # an unknown gap is not integrated
            return None, None
        last_t, last_p = g.energy_last_mono_s, g.energy_last_power_w
        if last_t is not None and last_p is not None and mono_s > last_t:
            g.energy_integrated_j += (last_p + power_w) / 2.0 * (mono_s - last_t)
        g.energy_last_mono_s = mono_s
        g.energy_last_power_w = power_w
        return g.energy_integrated_j, EnergyMethod.INTEGRATED

    def _ecc(self, g: _Gpu, field: str, fn: Any, h: Any, kind: int, counter: int) -> int | None:
        try:
            return int(fn(h, kind, counter))
        except self._errors as exc:
            self._failed(g, field, exc)
            return None

    def _gpm(self, g: _Gpu, h: Any) -> tuple[float | None, ...]:
        """GPM metrics between the previous and this tick's GPM sample (``g.gpm_primed``)."""
        cur = g.gpm_cur
        try:
            self._f_gpm_get(h, cur[0])
        except self._errors as exc:
            return self._gpm_sample_failed(g, exc)
        prev = g.gpm_prev
        g.gpm_cur, g.gpm_prev = prev, cur
        get = g.gpm_get
        g.gpm_header.pack_into(get, 0, _GPM_GET_VERSION, _N_GPM, prev[1], cur[1])
        try:
            self._f_gpm_metrics(get)
        except self._errors as exc:
            self._failed(g, "gpm_metrics", exc)
            return _NO_GPM
        raw = g.gpm_results.unpack_from(get)  # (nvmlReturn, value) per metric
        if any(raw[0::2]):  # some metric failed: it alone is None
            return tuple(
                None if raw[2 * i] else raw[2 * i + 1] * scale
                for i, scale in enumerate(_GPM_SCALES)
            )
        return tuple(map(_mul, raw[1::2], _GPM_SCALES))

    def _gpm_unprimed(self, g: _Gpu, h: Any) -> tuple[None, ...]:
        """The first GPM sample (after open, a failure or a lost GPU): no interval yet."""
        cur = g.gpm_cur
        try:
            self._f_gpm_get(h, cur[0])
        except self._errors as exc:
            return self._gpm_sample_failed(g, exc)
        g.gpm_cur, g.gpm_prev = g.gpm_prev, cur
        g.gpm_primed = True
        return _NO_GPM

    def _gpm_sample_failed(self, g: _Gpu, exc: BaseException) -> tuple[None, ...]:
        g.gpm_primed = False
        self._failed(g, "gpm", exc)
        if "gpm" in g.off:
            g.gpm = False
        return _NO_GPM


def _absent(_handle: Any) -> Any:
    """Stands in for an NVML function this module version lacks: the field is then None."""
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _drain(xids: deque[int]) -> tuple[int, ...]:
    out = []
    while xids:
        out.append(xids.popleft())
    return tuple(out)


def _processes(procs: Any) -> tuple[ProcessSample, ...]:
    out = []
    for p in procs:
        used = p.usedGpuMemory
        if used is not None and (used == _NOT_AVAILABLE_ULL or used < 0):
            used = None
        out.append(make_process_sample(int(p.pid), int(used) if used is not None else None))
    return tuple(out)
