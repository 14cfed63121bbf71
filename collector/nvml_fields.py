"""The sampler's query table: one row per NVML call, saying which sample field(s) it fills.

A row (``FieldQuery``) names the NVML function and its arguments after the device handle, how
its answer becomes the sample's value (``convert``), and, for a versioned or renamed call, the
older call to use where NVML refuses this one (``fallback``). ``bind`` turns a row into a
``Reader`` for one GPU (the function with the handle and arguments bound), which is what the
sampler calls each tick. Rows whose function the NVML module lacks are skipped; a missing newer
call starts at its fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpuwatt.collector.nvml_structs import struct_codec
from gpuwatt.model import ProcessSample

_KIB = 1024.0
_NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as unsigned long long


@dataclass(frozen=True, slots=True)
class FieldQuery:
    """One NVML call of the tick and the field(s) of ``GpuSample`` it fills."""

    key: str  # what NVML errors on it are logged and refused under (``ErrorPolicy``)
    field: str | None  # the field it fills; None: ``convert(answer, values)`` stores several
    call: Callable[..., Any] | None  # the NVML function; None where the module lacks it
    args: tuple[Any, ...] = ()  # passed after the handle
    kwargs: tuple[tuple[str, Any], ...] = ()
    convert: Callable[..., Any] = float
    fallback: FieldQuery | None = None  # the older call, where NVML refuses this one
    lacks: tuple[str, ...] = ()  # fields this call fills that the fallback cannot
    via: str = ""  # the call, for messages

    def available(self) -> FieldQuery | None:
        """This row, or the first fallback the module has a function for."""
        query: FieldQuery | None = self
        while query is not None and query.call is None:
            query = query.fallback
        return query


#: A ``FieldQuery`` bound to one GPU: ``(read, convert, field, query)``; ``convert(read())`` is
#: the value (or, with no ``field``, ``convert(read(), values)`` stores the values). A plain
#: tuple: the sampler's loop unpacks one about 50 ns faster than a NamedTuple, per row per tick.
Reader = tuple[Callable[[], Any], Callable[..., Any], str | None, FieldQuery]


def bind(query: FieldQuery, handle: Any) -> Reader:
    if query.call is None:
        raise ValueError(f"{query.via or query.key}: the NVML module lacks this function")
    read = partial(query.call, handle, *query.args, **dict(query.kwargs))
    return (read, query.convert, query.field, query)


def bind_all(queries: Sequence[FieldQuery], handle: Any) -> tuple[Reader, ...]:
    """Readers for one GPU, each row at its first available call (rows without one left out)."""
    available = (q.available() for q in queries)
    return tuple(bind(q, handle) for q in available if q is not None)


def rebind(readers: Sequence[Reader], handle: Any) -> tuple[Reader, ...]:
    """The same readers (fallbacks taken stay taken) for a new handle of the same GPU."""
    return tuple(bind(query, handle) for _read, _convert, _field, query in readers)


# --- the tables --------------------------------------------------------------------------------


def tick_queries(nv: Any) -> tuple[FieldQuery, ...]:
    """What every tick asks, in order (energy and GPM, which need power and clocks, come after)."""
    gpu_sensor = (nv.NVML_TEMPERATURE_GPU,)
    temperature_legacy = FieldQuery(
        "temperature_gpu_c",
        "temperature_gpu_c",
        nv.nvmlDeviceGetTemperature,
        gpu_sensor,
        via="nvmlDeviceGetTemperature",
    )
    reasons_old = FieldQuery(
        "clock_throttle_reasons",
        "clock_event_reasons",
        getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
        convert=int,
        via="nvmlDeviceGetCurrentClocksThrottleReasons",
    )
    clock = nv.nvmlDeviceGetClockInfo
    return (
        FieldQuery(
            "utilization",
            None,
            nv.nvmlDeviceGetUtilizationRates,
            convert=_utilization(nv),
            via="nvmlDeviceGetUtilizationRates",
        ),
        _memory_query(nv),
        FieldQuery(
            "temperature_gpu_c",
            "temperature_gpu_c",
            getattr(nv, "nvmlDeviceGetTemperatureV", None),
            gpu_sensor,
            fallback=temperature_legacy,
            via="nvmlDeviceGetTemperatureV",
        ),
        FieldQuery("power_w", "power_w", nv.nvmlDeviceGetPowerUsage, convert=_from_milli),
        FieldQuery(
            "power_limit_w",
            "power_limit_w",
            nv.nvmlDeviceGetEnforcedPowerLimit,
            convert=_from_milli,
        ),
        FieldQuery("sm_clock_mhz", "sm_clock_mhz", clock, (nv.NVML_CLOCK_SM,)),
        FieldQuery("memory_clock_mhz", "memory_clock_mhz", clock, (nv.NVML_CLOCK_MEM,)),
        FieldQuery("graphics_clock_mhz", "graphics_clock_mhz", clock, (nv.NVML_CLOCK_GRAPHICS,)),
        FieldQuery(
            "clock_event_reasons",
            "clock_event_reasons",
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None),
            convert=int,
            fallback=reasons_old,
            via="nvmlDeviceGetCurrentClocksEventReasons",
        ),
        FieldQuery("fan_speed_pct", "fan_speed_pct", nv.nvmlDeviceGetFanSpeed),
        # HBM temperature: only a field value (~10 us on an H100); GDDR boards refuse it
        FieldQuery(
            "temperature_memory_c",
            "temperature_memory_c",
            field_value_reader(nv),
            (getattr(nv, "NVML_FI_DEV_MEMORY_TEMP", 82),),
            via="nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
        ),
        FieldQuery(
            "processes",
            "processes",
            nv.nvmlDeviceGetComputeRunningProcesses,
            convert=processes,
        ),
    )


def mig_queries(nv: Any) -> tuple[FieldQuery, ...]:
    """What a MIG device's own handle answers each tick: its memory and its processes (power,
    clocks, temperature and utilisation are refused there: they are the parent GPU's)."""
    return (
        _memory_query(nv),
        FieldQuery(
            "processes",
            "processes",
            nv.nvmlDeviceGetComputeRunningProcesses,
            convert=processes,
        ),
    )


def pcie_queries(nv: Any) -> tuple[FieldQuery, ...]:
    """PCIe throughput on a GPU without GPM (GPM measures it over the tick where it can)."""
    f = nv.nvmlDeviceGetPcieThroughput
    return (
        FieldQuery(
            "pcie_tx_bytes_per_s",
            "pcie_tx_bytes_per_s",
            f,
            (nv.NVML_PCIE_UTIL_TX_BYTES,),
            convert=_from_kib,
        ),
        FieldQuery(
            "pcie_rx_bytes_per_s",
            "pcie_rx_bytes_per_s",
            f,
            (nv.NVML_PCIE_UTIL_RX_BYTES,),
            convert=_from_kib,
        ),
    )


def slow_queries(nv: Any) -> tuple[FieldQuery, ...]:
    """The slow-cadence counters: volatile and lifetime ECC errors and row remapping."""
    f_ecc, volatile = nv.nvmlDeviceGetTotalEccErrors, nv.NVML_VOLATILE_ECC
    aggregate = nv.NVML_AGGREGATE_ECC
    return (
        FieldQuery(
            "ecc_sbe_volatile_count",
            "ecc_sbe_volatile_count",
            f_ecc,
            (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile),
            convert=int,
        ),
        FieldQuery(
            "ecc_dbe_volatile_count",
            "ecc_dbe_volatile_count",
            f_ecc,
            (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, volatile),
            convert=int,
        ),
        FieldQuery(
            "ecc_sbe_aggregate_count",
            "ecc_sbe_aggregate_count",
            f_ecc,
            (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, aggregate),
            convert=int,
        ),
        FieldQuery(
            "ecc_dbe_aggregate_count",
            "ecc_dbe_aggregate_count",
            f_ecc,
            (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, aggregate),
            convert=int,
        ),
        FieldQuery("remapped_rows", None, nv.nvmlDeviceGetRemappedRows, convert=_remapped_rows),
    )


# --- conversions -------------------------------------------------------------------------------

#: ``c_nvmlValue_t``'s member for each ``NVML_VALUE_TYPE_*`` (0 double ... 6 unsigned short)
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def field_value_reader(nv: Any) -> Callable[[Any, int], float] | None:
    """``read(handle, field_id)``: one NVML field value as a number, raising the NVML error of
    its own return code (a batch call answers each field's error in the field, not by raising);
    None where the module lacks ``nvmlDeviceGetFieldValues``."""
    get = getattr(nv, "nvmlDeviceGetFieldValues", None)
    if get is None:
        return None
    success = nv.NVML_SUCCESS

    def read(handle: Any, field_id: int) -> float:
        (value,) = get(handle, [field_id])
        if value.nvmlReturn != success:
            raise nv.NVMLError(value.nvmlReturn)
        return float(getattr(value.value, _VALUE_MEMBERS[value.valueType]))

    return read


def _from_milli(value: int) -> float:
    return value / 1000.0


def _from_kib(value: int) -> float:
    return value * _KIB


def _utilization(nv: Any) -> Callable[[Any, dict[str, Any]], None]:
    struct_type = nv.c_nvmlUtilization_t
    unpack = struct_codec(struct_type, ("gpu", "memory")).unpack_from

    def convert(util: Any, values: dict[str, Any]) -> None:
        gpu, memory = unpack(util) if type(util) is struct_type else (util.gpu, util.memory)
        values["utilization_gpu_pct"] = float(gpu)
        values["utilization_memory_pct"] = float(memory)

    return convert


def _memory_query(nv: Any) -> FieldQuery:
    """Memory v2 (with the driver's reservation apart), falling back to v1 (reservation in used)."""
    f_mem = nv.nvmlDeviceGetMemoryInfo
    v1_type = nv.c_nvmlMemory_t
    unpack_v1 = struct_codec(v1_type, ("total", "free", "used")).unpack_from

    def convert_v1(m: Any, values: dict[str, Any]) -> None:
        if type(m) is v1_type:
            total, free, used = unpack_v1(m)
        else:
            total, free, used = int(m.total), int(m.free), int(m.used)
        values["memory_used_bytes"] = used
        values["memory_total_bytes"] = total
        values["memory_free_bytes"] = free

    v1 = FieldQuery("memory", None, f_mem, convert=convert_v1, via="nvmlDeviceGetMemoryInfo(v1)")
    v2_type, v2_version = getattr(nv, "c_nvmlMemory_v2_t", None), getattr(nv, "nvmlMemory_v2", None)
    if v2_type is None or v2_version is None:
        return v1
    unpack_v2 = struct_codec(v2_type, ("total", "reserved", "free", "used")).unpack_from

    def convert_v2(m: Any, values: dict[str, Any]) -> None:
        if type(m) is v2_type:
            total, reserved, free, used = unpack_v2(m)
        else:
            total, reserved, free = int(m.total), int(m.reserved), int(m.free)
            used = int(m.used)
        values["memory_used_bytes"] = used
        values["memory_total_bytes"] = total
        values["memory_free_bytes"] = free
        values["memory_reserved_bytes"] = reserved

    return FieldQuery(
        "memory",
        None,
        f_mem,
        kwargs=(("version", v2_version),),
        convert=convert_v2,
        fallback=v1,
        lacks=("memory_reserved_bytes",),
        via="nvmlDeviceGetMemoryInfo(v2)",
    )


def processes(procs: Any) -> tuple[ProcessSample, ...]:
    """NVML's process list as samples (NVML_VALUE_NOT_AVAILABLE memory becomes None)."""
    out = []
    for p in procs:
        used = p.usedGpuMemory
        if used is not None and (used == _NOT_AVAILABLE_ULL or used < 0):
            used = None
        out.append(ProcessSample(int(p.pid), int(used) if used is not None else None))
    return tuple(out)


def _remapped_rows(rows: Sequence[int], values: dict[str, Any]) -> None:
    values["remapped_rows_correctable"] = int(rows[0])
    values["remapped_rows_uncorrectable"] = int(rows[1])
    values["remapped_rows_pending"] = bool(rows[2])
    values["remapped_rows_failure"] = bool(rows[3])
