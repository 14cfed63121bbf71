"""A fake NVML module that answers from the simulated cluster's ``SimGpuState``.

``FakeNvml(cluster, host)`` has the same function surface as ``pynvml`` for every function the
sampler, the XID listener and gpustat call: same names, same parameters and defaults, same return
types (ctypes structs, friendly objects, lists). It defines no constant, error class or struct of
its own: every non-function name of the real module is re-exported as the very same object, and
errors are raised as ``NVMLError(code)`` so the real module picks the right subclass.

How a simulated GPU misbehaves (tests script these on ``SimGpuState``):

- ``lost``: every call on its handle raises ``NVMLError_GpuIsLost``.
- ``unsupported``: function names that raise ``NVMLError_NotSupported``. Versioned variants use the
  C name of the variant: ``"nvmlDeviceGetMemoryInfo_v2"`` refuses only ``version=nvmlMemory_v2``
  calls, ``"nvmlDeviceGetMemoryInfo"`` refuses both.
- ``failing``: function name -> ``NVML_ERROR_*`` code raised on every call.
- a static fact (limit, threshold, max clock) that is NaN: ``NotSupported`` for that argument
  (a real device's ``N/A``: ``collector.sim.device_profile``).
- ``mig_enabled``: utilisation and device-level GPM answer ``NotSupported``, as NVML does in MIG
  mode; everything else answers at the GPU level. Its ``mig_devices`` (``SimMigState``) have
  handles of their own (``nvmlDeviceGetMigDeviceHandleByIndex``) that answer identity, memory,
  processes and attributes and refuse the rest (``state.MIG_REFUSED``); their GPM is read
  through the parent's handle (``nvmlGpmMigSampleGet``).

GPM is computed as real NVML computes it (``collector.sim.fake_gpm``): each ``nvmlGpmSampleGet``
snapshots the cumulative activity counters, and ``nvmlGpmMetricsGet`` turns the difference of two
snapshots into percent of the elapsed (simulated) time, or MiB/s for byte counters.

The MIG, GPM and event calls live in ``fake_nvml_mig``, ``fake_nvml_gpm`` and ``fake_nvml_events``
(mixed into ``FakeNvml``); what they share (handle lookup, errors, fake addresses) in
``fake_nvml_base``.
"""

from __future__ import annotations

import inspect
from typing import Any

from gpuwatt.collector.nvml_structs import struct_codec
from gpuwatt.collector.sim.fake_nvml_base import (
    NV,
    device_of,
    fake_pointer,
    gpu_of,
    known,
    misbehave,
    nvml_error,
    pci_info,
    require_init,
    selected,
)
from gpuwatt.collector.sim.fake_nvml_events import EventCalls
from gpuwatt.collector.sim.fake_nvml_gpm import GpmCalls
from gpuwatt.collector.sim.fake_nvml_mig import MigCalls
from gpuwatt.collector.sim.state import SimCluster, SimGpuState, SimMigState

#: Every non-function public name of the real module: constants, error classes, ctypes structs.
_REEXPORTS: dict[str, Any] = {
    name: value
    for name, value in vars(NV).items()
    if not name.startswith("_") and not inspect.isfunction(value) and not inspect.ismodule(value)
}

_FRIENDLY = NV.nvmlFriendlyObject
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process outside MIG

# Structs are built and filled through one struct.Struct call (pynvml's per-field hooks are slow).
_UTIL = NV.c_nvmlUtilization_t
_UTIL_CODEC = struct_codec(_UTIL, ("gpu", "memory"))
_MEM1 = NV.c_nvmlMemory_t
_MEM1_CODEC = struct_codec(_MEM1, ("total", "free", "used"))
_MEM2 = NV.c_nvmlMemory_v2_t
_MEM2_CODEC = struct_codec(_MEM2, ("version", "total", "reserved", "free", "used"))

# What an enum argument selects: NVML constant -> SimGpuState attribute.
_MAX_CLOCKS = {
    NV.NVML_CLOCK_MEM: "memory_clock_max_mhz",
    NV.NVML_CLOCK_SM: "sm_clock_max_mhz",
    NV.NVML_CLOCK_GRAPHICS: "sm_clock_max_mhz",
}
_CLOCKS = {
    NV.NVML_CLOCK_SM: "sm_clock_mhz",
    NV.NVML_CLOCK_MEM: "memory_clock_mhz",
    NV.NVML_CLOCK_GRAPHICS: "graphics_clock_mhz",
}
_THRESHOLDS = {
    NV.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown_temp_c",
    NV.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown_temp_c",
}
_PCIE = {
    NV.NVML_PCIE_UTIL_TX_BYTES: "pcie_tx_kib_per_s",
    NV.NVML_PCIE_UTIL_RX_BYTES: "pcie_rx_kib_per_s",
}


class FakeNvml(MigCalls, GpmCalls, EventCalls):
    """A stand-in for the ``pynvml`` module over the GPUs of one simulated host."""

    def __init__(self, cluster: SimCluster, host: str) -> None:
        self.__dict__.update(_REEXPORTS)
        self._cluster = cluster
        self._host = host
        self._init_count = 0
        self._handles: list[Any] = []
        self._parents: dict[int, Any] = {}  # id(SimGpuState) -> its handle
        self._mig_handles: dict[int, Any] = {}  # id(SimMigState) -> its handle
        self._gpm_snapshots: dict[int, tuple[float, ...] | None] = {}
        self._event_sets: dict[int, list[Any]] = {}

    # --- internals ----------------------------------------------------------------------------

    def _build_handles(self) -> None:
        if self._handles:
            return
        for state in self._cluster.on_host(self._host):
            handle = fake_pointer(NV.c_nvmlDevice_t)
            handle._sim = state  # the state rides on the handle: no lookup on the hot path
            self._handles.append(handle)
            self._parents[id(state)] = handle

    # --- init, system, enumeration -------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._init_count += 1
        self._build_handles()

    def nvmlShutdown(self) -> None:
        require_init(self._init_count)
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        require_init(self._init_count)
        return "simulated"

    def nvmlDeviceGetCount(self) -> int:
        require_init(self._init_count)
        return len(self._handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        require_init(self._init_count)
        if not 0 <= index < len(self._handles):
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return gpu_of(handle, "nvmlDeviceGetIndex").index

    # --- static facts ---------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return gpu_of(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return gpu_of(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g = gpu_of(handle, "nvmlDeviceGetPciInfo")
        if g.pci_device_id is None:
            raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
        return pci_info(g.pci_bus_id, g.pci_device_id)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        g = gpu_of(handle, "nvmlDeviceGetMaxClockInfo")
        return known(selected(g, type, _MAX_CLOCKS, NV.NVML_ERROR_NOT_SUPPORTED))

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        g = gpu_of(handle, "nvmlDeviceGetPowerManagementDefaultLimit")
        return known(g.spec.tdp_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return round(gpu_of(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return round(gpu_of(handle, "nvmlDeviceGetPowerManagementLimit").power_limit_w * 1000)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        g = gpu_of(handle, "nvmlDeviceGetTemperatureThreshold")
        return known(selected(g, threshold, _THRESHOLDS, NV.NVML_ERROR_NOT_SUPPORTED))

    # --- per-tick metrics -----------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g = gpu_of(handle, "nvmlDeviceGetUtilizationRates")
        if g.mig_enabled:
            raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
        return _UTIL.from_buffer_copy(
            _UTIL_CODEC.pack(round(g.utilization_gpu_pct), round(g.utilization_memory_pct))
        )

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        gpu_of(handle, "nvmlDeviceGetEncoderUtilization")
        return [0, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        gpu_of(handle, "nvmlDeviceGetDecoderUtilization")
        return [0, 167000]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        g = gpu_of(handle, "nvmlDeviceGetMemoryInfo")
        total, used, reserved = g.memory_total_bytes, g.memory_used_bytes, g.memory_reserved_bytes
        if not version:
            # v1 counts the driver's reservation as used
            free = max(total - used - reserved, 0)
            return _MEM1.from_buffer_copy(_MEM1_CODEC.pack(total, free, used + reserved))
        if g.unsupported or g.failing:
            misbehave(g, "nvmlDeviceGetMemoryInfo_v2")
        if version != NV.nvmlMemory_v2:
            raise nvml_error(NV.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        free = max(total - used - reserved, 0)
        return _MEM2.from_buffer_copy(_MEM2_CODEC.pack(version, total, reserved, free, used))

    def nvmlDeviceGetTemperatureV(
        self, handle: Any, sensor: int, version: int = NV.nvmlTemperature_v1
    ) -> int:
        g = gpu_of(handle, "nvmlDeviceGetTemperatureV")
        if version != NV.nvmlTemperature_v1:
            raise nvml_error(NV.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if sensor != NV.NVML_TEMPERATURE_GPU:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        return round(g.temperature_c)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        g = gpu_of(handle, "nvmlDeviceGetTemperature")
        if sensor != NV.NVML_TEMPERATURE_GPU:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        return round(g.temperature_c)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any:
        """HBM temperature (``NVML_FI_DEV_MEMORY_TEMP``) as an unsigned int; every other field id
        answers NotSupported in its own ``nvmlReturn``, as NVML does for one it does not know.
        ``"NVML_FI_DEV_MEMORY_TEMP"`` in a GPU's ``unsupported`` refuses it the same way."""
        g = gpu_of(handle, "nvmlDeviceGetFieldValues")
        values = (NV.c_nvmlFieldValue_t * len(fieldIds))()
        for value, field_id in zip(values, fieldIds, strict=True):
            value.fieldId = field_id
            value.timestamp = round(g.time_s * 1e6)
            if field_id == NV.NVML_FI_DEV_MEMORY_TEMP and "NVML_FI_DEV_MEMORY_TEMP" not in (
                g.unsupported
            ):
                value.valueType = NV.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = round(g.memory_temperature_c)
                value.nvmlReturn = NV.NVML_SUCCESS
            else:
                value.nvmlReturn = NV.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        return round(gpu_of(handle, "nvmlDeviceGetFanSpeed").fan_speed_pct)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return round(gpu_of(handle, "nvmlDeviceGetPowerUsage").power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return gpu_of(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        g = gpu_of(handle, "nvmlDeviceGetClockInfo")
        return round(selected(g, type, _CLOCKS, NV.NVML_ERROR_NOT_SUPPORTED))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return gpu_of(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return gpu_of(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_event_reasons

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        g = gpu_of(device, "nvmlDeviceGetPcieThroughput")
        return round(selected(g, counter, _PCIE, NV.NVML_ERROR_INVALID_ARGUMENT))

    def _processes(self, d: SimGpuState | SimMigState) -> list[Any]:
        """What pynvml returns: friendly objects of c_nvmlProcessInfo_v3_t's fields, with
        usedGpuMemory None where NVML says NVML_VALUE_NOT_AVAILABLE. A GPU in MIG mode lists
        the processes of all its MIG devices, each with its instance ids."""
        procs: list[tuple[int, int, SimMigState | None]]
        if isinstance(d, SimMigState):
            procs = [(pid, used, d) for pid, used in d.processes]
        elif d.mig_enabled:
            procs = [
                (pid, used, m) for m in d.mig_devices if m is not None for pid, used in m.processes
            ]
        else:
            procs = [(pid, used, None) for pid, used in d.processes]
        return [
            _FRIENDLY(
                {
                    "pid": pid,
                    "usedGpuMemory": None if used is None or used < 0 else used,
                    "gpuInstanceId": _NO_INSTANCE if m is None else m.gpu_instance_id,
                    "computeInstanceId": _NO_INSTANCE if m is None else m.compute_instance_id,
                }
            )
            for pid, used, m in procs
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(device_of(handle, "nvmlDeviceGetComputeRunningProcesses"))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        gpu_of(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []

    # --- slow counters --------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        g = gpu_of(handle, "nvmlDeviceGetTotalEccErrors")
        lifetime = counterType == NV.NVML_AGGREGATE_ECC
        if counterType not in (NV.NVML_VOLATILE_ECC, NV.NVML_AGGREGATE_ECC):
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        if errorType == NV.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return g.ecc_sbe_volatile + (g.ecc_sbe_aggregate_base if lifetime else 0)
        if errorType == NV.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return g.ecc_dbe_volatile + (g.ecc_dbe_aggregate_base if lifetime else 0)
        raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        g = gpu_of(device, "nvmlDeviceGetRemappedRows")
        return (
            g.remapped_rows_correctable,
            g.remapped_rows_uncorrectable,
            int(g.remapped_rows_pending),
            int(g.remapped_rows_failure),
        )
