"""What every part of the fake NVML shares: the real module, its errors, fake addresses, and the
lookup of the simulated GPU or MIG device behind a handle (with the misbehaviour tests script on
it: lost, unsupported, failing; see ``collector.sim.fake_nvml``)."""

from __future__ import annotations

import ctypes
import itertools
import struct
from collections.abc import Mapping
from typing import Any

from gpuwatt.collector.nvml import real_module
from gpuwatt.collector.sim.state import SimGpuState, SimMigState

NV = real_module()
MIB = 1024 * 1024
_VOID_P = ctypes.c_void_p
_POINTERS = (ctypes._Pointer, ctypes.c_void_p)
_POINTER_VALUE = struct.Struct("P")  # a ctypes pointer's buffer is the address it holds

# Fake addresses for handles, GPM samples and event sets: unique across FakeNvml instances.
_ADDRESSES = itertools.count(0x10000, 0x10)


def nvml_error(code: int) -> Exception:
    """The real module's exception for ``code`` (NVMLError maps it to its subclass)."""
    return NV.NVMLError(code)


def require_init(init_count: int) -> None:
    """NVML refuses every call but ``nvmlInit`` before it (or after the last shutdown)."""
    if init_count <= 0:
        raise nvml_error(NV.NVML_ERROR_UNINITIALIZED)


def selected(g: SimGpuState, arg: int, attrs: Mapping[int, str], refused: int) -> Any:
    """The attribute of ``g`` that an enum argument names in ``attrs`` (a clock type, a
    threshold, a counter); another value raises NVML's error ``refused``."""
    name = attrs.get(arg)
    if name is None:
        raise nvml_error(refused)
    return getattr(g, name)


def address_of(ptr: Any) -> int:
    if isinstance(ptr, _POINTERS):
        return _POINTER_VALUE.unpack_from(ptr)[0]
    return ctypes.cast(ptr, _VOID_P).value or 0


def known(value: float) -> int:
    """A static fact as NVML's integer; NaN (a device profile's N/A) is NotSupported."""
    if value != value:
        raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
    return round(value)


def pci_info(bus_id: str, pci_device_id: int) -> Any:
    """``nvmlPciInfo_t`` for a bus id such as ``00000000:18:00.0`` (empty: all zero)."""
    info = NV.nvmlPciInfo_t()
    info.pciDeviceId = pci_device_id
    if bus_id:
        domain, bus, rest = bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
        info.busId = info.busIdLegacy = bus_id.encode()
    return info


def fake_pointer(ptr_type: Any) -> Any:
    return ctypes.cast(_VOID_P(next(_ADDRESSES)), ptr_type)


def misbehave(g: SimGpuState, fn: str) -> None:
    if g.lost:
        raise nvml_error(NV.NVML_ERROR_GPU_IS_LOST)
    if fn in g.unsupported:
        raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
    code = g.failing.get(fn)
    if code is not None:
        raise nvml_error(code)


def gpu_of(handle: Any, fn: str) -> SimGpuState:
    """The simulated GPU behind ``handle``, or the error NVML would raise for ``fn`` on it (a
    MIG device's handle refuses every GPU-level call through its ``unsupported`` set)."""
    try:
        g: SimGpuState = handle._sim
    except AttributeError:
        raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT) from None
    if g.lost or (g.unsupported and fn in g.unsupported) or (g.failing and fn in g.failing):
        misbehave(g, fn)
    return g


def device_of(handle: Any, fn: str) -> SimGpuState | SimMigState:
    """The GPU or MIG device behind ``handle`` (for calls that answer on both)."""
    return gpu_of(handle, fn)


def mig_of(handle: Any, fn: str) -> SimMigState:
    """The MIG device behind ``handle``; a whole GPU's handle is refused as NVML refuses it."""
    d = device_of(handle, fn)
    if not isinstance(d, SimMigState):
        raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
    return d
