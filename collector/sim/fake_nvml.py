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
"""

from __future__ import annotations

import ctypes
import inspect
import itertools
import struct
import time
from typing import Any

from gpuwatt.collector.nvml import real_module
from gpuwatt.collector.nvml_structs import gpm_codecs, struct_codec
from gpuwatt.collector.sim.fake_gpm import gpm_results, read_gpm_counters
from gpuwatt.collector.sim.state import SimCluster, SimGpuState, SimMigState

_NV = real_module()

#: Every non-function public name of the real module: constants, error classes, ctypes structs.
_REEXPORTS: dict[str, Any] = {
    name: value
    for name, value in vars(_NV).items()
    if not name.startswith("_") and not inspect.isfunction(value) and not inspect.ismodule(value)
}

_NVMLError = _NV.NVMLError
_VOID_P = ctypes.c_void_p
_DEVICE_T = _NV.c_nvmlDevice_t
_GPM_SAMPLE_T = _NV.c_nvmlGpmSample_t
_EVENT_SET_T = _NV.c_nvmlEventSet_t
_FRIENDLY = _NV.nvmlFriendlyObject
_ATTRIBUTES = _NV.c_nvmlDeviceAttributes
_PROFILE_INFO_V1 = _NV.c_nvmlGpuInstanceProfileInfo_t
_PROFILE_INFO_V2 = _NV.c_nvmlGpuInstanceProfileInfo_v2_t
_PCI_INFO = _NV.nvmlPciInfo_t
#: GPU instance profile id -> its compute slices (the plain profiles)
_PROFILE_SLICES: dict[int, int] = {
    _NV.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1,
    _NV.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 2,
    _NV.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 3,
    _NV.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4,
    _NV.NVML_GPU_INSTANCE_PROFILE_7_SLICE: 7,
}
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process outside MIG
_XID = _NV.nvmlEventTypeXidCriticalError
_MIB = 1024 * 1024

# Structs are built and filled through one struct.Struct call (pynvml's per-field hooks are slow).
_UTIL = _NV.c_nvmlUtilization_t
_UTIL_CODEC = struct_codec(_UTIL, ("gpu", "memory"))
_MEM1 = _NV.c_nvmlMemory_t
_MEM1_CODEC = struct_codec(_MEM1, ("total", "free", "used"))
_MEM2 = _NV.c_nvmlMemory_v2_t
_MEM2_CODEC = struct_codec(_MEM2, ("version", "total", "reserved", "free", "used"))
_GPM_HEADER = gpm_codecs(_NV, 0).header
_GPM_CODECS: dict[int, tuple[Any, Any, int]] = {}  # numMetrics -> (ids, fill, fill offset)
_POINTERS = (ctypes._Pointer, ctypes.c_void_p)
_POINTER_VALUE = struct.Struct("P")  # a ctypes pointer's buffer is the address it holds

# Fake addresses for handles, GPM samples and event sets: unique across FakeNvml instances.
_ADDRESSES = itertools.count(0x10000, 0x10)


def _error(code: int) -> Exception:
    """The real module's exception for ``code`` (NVMLError maps it to its subclass)."""
    return _NVMLError(code)


def _address(ptr: Any) -> int:
    if isinstance(ptr, _POINTERS):
        return _POINTER_VALUE.unpack_from(ptr)[0]
    return ctypes.cast(ptr, _VOID_P).value or 0


def _known(value: float) -> int:
    """A static fact as NVML's integer; NaN (a device profile's N/A) is NotSupported."""
    if value != value:
        raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
    return round(value)


def _pci_info(bus_id: str, pci_device_id: int) -> Any:
    """``nvmlPciInfo_t`` for a bus id such as ``00000000:18:00.0`` (empty: all zero)."""
    info = _PCI_INFO()
    info.pciDeviceId = pci_device_id
    if bus_id:
        domain, bus, rest = bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
        info.busId = info.busIdLegacy = bus_id.encode()
    return info


def _fake_pointer(ptr_type: Any) -> Any:
    return ctypes.cast(_VOID_P(next(_ADDRESSES)), ptr_type)


def _misbehave(g: SimGpuState, fn: str) -> None:
    if g.lost:
        raise _error(_NV.NVML_ERROR_GPU_IS_LOST)
    if fn in g.unsupported:
        raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
    code = g.failing.get(fn)
    if code is not None:
        raise _error(code)


def _gpu(handle: Any, fn: str) -> SimGpuState:
    """The simulated GPU behind ``handle``, or the error NVML would raise for ``fn`` on it (a
    MIG device's handle refuses every GPU-level call through its ``unsupported`` set)."""
    try:
        g: SimGpuState = handle._sim
    except AttributeError:
        raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT) from None
    if g.lost or (g.unsupported and fn in g.unsupported) or (g.failing and fn in g.failing):
        _misbehave(g, fn)
    return g


def _device(handle: Any, fn: str) -> SimGpuState | SimMigState:
    """The GPU or MIG device behind ``handle`` (for calls that answer on both)."""
    return _gpu(handle, fn)


def _mig(handle: Any, fn: str) -> SimMigState:
    """The MIG device behind ``handle``; a whole GPU's handle is refused as NVML refuses it."""
    d = _device(handle, fn)
    if not isinstance(d, SimMigState):
        raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
    return d


class FakeNvml:
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

    def _require_init(self) -> None:
        if self._init_count <= 0:
            raise _error(_NV.NVML_ERROR_UNINITIALIZED)

    def _build_handles(self) -> None:
        if self._handles:
            return
        for state in self._cluster.on_host(self._host):
            handle = _fake_pointer(_DEVICE_T)
            handle._sim = state  # the state rides on the handle: no lookup on the hot path
            self._handles.append(handle)
            self._parents[id(state)] = handle

    # --- init, system, enumeration -------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._init_count += 1
        self._build_handles()

    def nvmlShutdown(self) -> None:
        self._require_init()
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return "simulated"

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self._handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._require_init()
        if not 0 <= index < len(self._handles):
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return _gpu(handle, "nvmlDeviceGetIndex").index

    # --- static facts ---------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return _gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return _gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g = _gpu(handle, "nvmlDeviceGetPciInfo")
        if g.pci_device_id is None:
            raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
        return _pci_info(g.pci_bus_id, g.pci_device_id)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        g = _gpu(handle, "nvmlDeviceGetMaxClockInfo")
        if type == _NV.NVML_CLOCK_MEM:
            return _known(g.memory_clock_max_mhz)
        if type in (_NV.NVML_CLOCK_SM, _NV.NVML_CLOCK_GRAPHICS):
            return _known(g.sm_clock_max_mhz)
        raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        g = _gpu(handle, "nvmlDeviceGetPowerManagementDefaultLimit")
        return _known(g.spec.tdp_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return round(_gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return round(_gpu(handle, "nvmlDeviceGetPowerManagementLimit").power_limit_w * 1000)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        g = _gpu(handle, "nvmlDeviceGetTemperatureThreshold")
        if threshold == _NV.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            return _known(g.slowdown_temp_c)
        if threshold == _NV.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
            return _known(g.shutdown_temp_c)
        raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        # NVML answers it on MIG device handles only
        d = _mig(device, "nvmlDeviceGetAttributes")
        attrs = _ATTRIBUTES()
        attrs.multiprocessorCount = d.multiprocessor_count
        attrs.memorySizeMB = d.memory_total_bytes // _MIB
        attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = d.slices
        return attrs

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        g = _gpu(device, "nvmlDeviceGetGpuInstanceProfileInfo")
        slices = _PROFILE_SLICES.get(profile, 0)
        sms = g.mig_profile_sms.get(slices)
        if not g.mig_max_devices or not slices or sms is None:
            raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
        if version not in (1, 2):
            raise _error(_NV.NVML_ERROR_FUNCTION_NOT_FOUND)
        info = _PROFILE_INFO_V2() if version == 2 else _PROFILE_INFO_V1()
        if version == 2:
            info.version = _NV.nvmlGpuInstanceProfileInfo_v2
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = 7 // slices
        info.multiprocessorCount = sms
        info.memorySizeMB = g.memory_total_bytes // _MIB * slices // 8
        return info

    # --- MIG ------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        g = _gpu(device, "nvmlDeviceGetMigMode")
        if not g.mig_max_devices:
            raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
        mode = int(g.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        g = _gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
        if not g.mig_max_devices:
            raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
        return g.mig_max_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        g = _gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < g.mig_max_devices:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        mig = g.mig_devices[index] if g.mig_enabled and index < len(g.mig_devices) else None
        if mig is None:
            raise _error(_NV.NVML_ERROR_NOT_FOUND)
        handle = self._mig_handles.get(id(mig))
        if handle is None:
            handle = self._mig_handles[id(mig)] = _fake_pointer(_DEVICE_T)
            handle._sim = mig
            handle._parent = device
        return handle

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        # pynvml returns the c_uint itself here, not its value
        return ctypes.c_uint(
            int(isinstance(_device(device, "nvmlDeviceIsMigDeviceHandle"), SimMigState))
        )

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        _mig(migDevice, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return migDevice._parent

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return _mig(device, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return _mig(device, "nvmlDeviceGetComputeInstanceId").compute_instance_id

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        g = _gpu(device, "nvmlGpmQueryDeviceSupport")
        support = _NV.c_nvmlGpmSupport_t()
        support.version = _NV.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(g.gpm_supported)
        return support

    # --- per-tick metrics -----------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g = _gpu(handle, "nvmlDeviceGetUtilizationRates")
        if g.mig_enabled:
            raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
        return _UTIL.from_buffer_copy(
            _UTIL_CODEC.pack(round(g.utilization_gpu_pct), round(g.utilization_memory_pct))
        )

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        _gpu(handle, "nvmlDeviceGetEncoderUtilization")
        return [0, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        _gpu(handle, "nvmlDeviceGetDecoderUtilization")
        return [0, 167000]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        g = _gpu(handle, "nvmlDeviceGetMemoryInfo")
        total, used, reserved = g.memory_total_bytes, g.memory_used_bytes, g.memory_reserved_bytes
        if not version:
            # v1 counts the driver's reservation as used
            free = max(total - used - reserved, 0)
            return _MEM1.from_buffer_copy(_MEM1_CODEC.pack(total, free, used + reserved))
        if g.unsupported or g.failing:
            _misbehave(g, "nvmlDeviceGetMemoryInfo_v2")
        if version != _NV.nvmlMemory_v2:
            raise _error(_NV.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        free = max(total - used - reserved, 0)
        return _MEM2.from_buffer_copy(_MEM2_CODEC.pack(version, total, reserved, free, used))

    def nvmlDeviceGetTemperatureV(
        self, handle: Any, sensor: int, version: int = _NV.nvmlTemperature_v1
    ) -> int:
        g = _gpu(handle, "nvmlDeviceGetTemperatureV")
        if version != _NV.nvmlTemperature_v1:
            raise _error(_NV.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if sensor != _NV.NVML_TEMPERATURE_GPU:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        return round(g.temperature_c)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        g = _gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != _NV.NVML_TEMPERATURE_GPU:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        return round(g.temperature_c)

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        return round(_gpu(handle, "nvmlDeviceGetFanSpeed").fan_speed_pct)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return round(_gpu(handle, "nvmlDeviceGetPowerUsage").power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return _gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        g = _gpu(handle, "nvmlDeviceGetClockInfo")
        if type == _NV.NVML_CLOCK_SM:
            return round(g.sm_clock_mhz)
        if type == _NV.NVML_CLOCK_MEM:
            return round(g.memory_clock_mhz)
        if type == _NV.NVML_CLOCK_GRAPHICS:
            return round(g.graphics_clock_mhz)
        raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return _gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return _gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_event_reasons

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        g = _gpu(device, "nvmlDeviceGetPcieThroughput")
        if counter == _NV.NVML_PCIE_UTIL_TX_BYTES:
            return round(g.pcie_tx_kib_per_s)
        if counter == _NV.NVML_PCIE_UTIL_RX_BYTES:
            return round(g.pcie_rx_kib_per_s)
        raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)

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
        return self._processes(_device(handle, "nvmlDeviceGetComputeRunningProcesses"))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        _gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []

    # --- slow counters --------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        g = _gpu(handle, "nvmlDeviceGetTotalEccErrors")
        lifetime = counterType == _NV.NVML_AGGREGATE_ECC
        if counterType not in (_NV.NVML_VOLATILE_ECC, _NV.NVML_AGGREGATE_ECC):
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        if errorType == _NV.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return g.ecc_sbe_volatile + (g.ecc_sbe_aggregate_base if lifetime else 0)
        if errorType == _NV.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return g.ecc_dbe_volatile + (g.ecc_dbe_aggregate_base if lifetime else 0)
        raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        g = _gpu(device, "nvmlDeviceGetRemappedRows")
        return (
            g.remapped_rows_correctable,
            g.remapped_rows_uncorrectable,
            int(g.remapped_rows_pending),
            int(g.remapped_rows_failure),
        )

    # --- GPM ------------------------------------------------------------------------------------

    def nvmlGpmSampleAlloc(self) -> Any:
        sample = _fake_pointer(_GPM_SAMPLE_T)
        self._gpm_snapshots[_address(sample)] = None
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        if self._gpm_snapshots.pop(_address(gpmSample), False) is False:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        g = _gpu(device, "nvmlGpmSampleGet")
        if not g.gpm_supported or g.mig_enabled:
            raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
        key = _address(gpmSample)
        if key not in self._gpm_snapshots:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_snapshots[key] = read_gpm_counters(g)
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        g = _gpu(device, "nvmlGpmMigSampleGet")
        if not g.gpm_supported:
            raise _error(_NV.NVML_ERROR_NOT_SUPPORTED)
        if not g.mig_enabled:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        mig = next((m for m in g.mig_devices if m and m.gpu_instance_id == gpuInstanceId), None)
        key = _address(gpmSample)
        if mig is None or key not in self._gpm_snapshots:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_snapshots[key] = read_gpm_counters(mig)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        version, count, first_addr, second_addr = _GPM_HEADER.unpack_from(metricsGet)
        if version != _NV.NVML_GPM_METRICS_GET_VERSION:
            raise _error(_NV.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._gpm_snapshots.get(first_addr)
        second = self._gpm_snapshots.get(second_addr)
        if first is None or second is None or not 0 <= count <= _NV.NVML_GPM_METRIC_MAX:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        if second[0] < first[0]:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        codecs = _GPM_CODECS.get(count)
        if codecs is None:
            full = gpm_codecs(_NV, count)
            codecs = _GPM_CODECS[count] = (full.ids, full.fill, full.metrics_offset)
        ids_codec, fill_codec, offset = codecs
        results = gpm_results(ids_codec.unpack_from(metricsGet), first, second)
        fill_codec.pack_into(metricsGet, offset, *results)  # metricInfo left NULL
        return metricsGet

    # --- events ---------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._require_init()
        event_set = _fake_pointer(_EVENT_SET_T)
        self._event_sets[_address(event_set)] = []
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        _gpu(handle, "nvmlDeviceRegisterEvents")
        registered = self._event_sets.get(_address(eventSet))
        if registered is None:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & _XID:
            registered.append(handle)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        _gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        return _XID

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        """Block on the cluster's condition until an XID is pending or ``timeoutms`` passes."""
        registered = self._event_sets.get(_address(eventSet))
        if registered is None:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000.0
        condition = self._cluster.condition
        with condition:
            while True:
                for handle in registered:
                    pending = handle._sim.pending_xids
                    if pending:
                        data = _NV.c_nvmlEventData_t()
                        data.device = handle
                        data.eventType = _XID
                        data.eventData = pending.popleft()
                        data.gpuInstanceId = 0xFFFFFFFF
                        data.computeInstanceId = 0xFFFFFFFF
                        return data
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise _error(_NV.NVML_ERROR_TIMEOUT)
                condition.wait(remaining_s)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        if self._event_sets.pop(_address(eventSet), None) is None:
            raise _error(_NV.NVML_ERROR_INVALID_ARGUMENT)
