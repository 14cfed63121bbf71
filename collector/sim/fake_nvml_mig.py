"""The MIG calls of the fake NVML: MIG mode, GPU instance profiles, MIG device handles and their
identity (``SimMigState`` on the parent ``SimGpuState``). Mixed into ``FakeNvml``."""

from __future__ import annotations

import ctypes
from typing import Any

from gpuwatt.collector.sim.fake_nvml_base import (
    MIB,
    NV,
    device_of,
    fake_pointer,
    gpu_of,
    mig_of,
    nvml_error,
)
from gpuwatt.collector.sim.state import SimMigState

_PROFILE_INFO_V1 = NV.c_nvmlGpuInstanceProfileInfo_t
_PROFILE_INFO_V2 = NV.c_nvmlGpuInstanceProfileInfo_v2_t
#: GPU instance profile id -> its compute slices (the plain profiles)
_PROFILE_SLICES: dict[int, int] = {
    NV.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1,
    NV.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 2,
    NV.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 3,
    NV.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4,
    NV.NVML_GPU_INSTANCE_PROFILE_7_SLICE: 7,
}


class MigCalls:
    """NVML's MIG functions over the simulated GPUs (handles made once per MIG device)."""

    _mig_handles: dict[int, Any]  # id(SimMigState) -> its handle

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        # NVML answers it on MIG device handles only
        d = mig_of(device, "nvmlDeviceGetAttributes")
        attrs = NV.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = d.multiprocessor_count
        attrs.memorySizeMB = d.memory_total_bytes // MIB
        attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = d.slices
        return attrs

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        g = gpu_of(device, "nvmlDeviceGetGpuInstanceProfileInfo")
        slices = _PROFILE_SLICES.get(profile, 0)
        sms = g.mig_profile_sms.get(slices)
        if not g.mig_max_devices or not slices or sms is None:
            raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
        if version not in (1, 2):
            raise nvml_error(NV.NVML_ERROR_FUNCTION_NOT_FOUND)
        info = (
            NV.c_nvmlGpuInstanceProfileInfo_v2_t()
            if version == 2
            else NV.c_nvmlGpuInstanceProfileInfo_t()
        )
        if version == 2:
            info.version = NV.nvmlGpuInstanceProfileInfo_v2
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = 7 // slices
        info.multiprocessorCount = sms
        info.memorySizeMB = g.memory_total_bytes // MIB * slices // 8
        return info

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        g = gpu_of(device, "nvmlDeviceGetMigMode")
        if not g.mig_max_devices:
            raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
        mode = int(g.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        g = gpu_of(device, "nvmlDeviceGetMaxMigDeviceCount")
        if not g.mig_max_devices:
            raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
        return g.mig_max_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        g = gpu_of(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < g.mig_max_devices:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        mig = g.mig_devices[index] if g.mig_enabled and index < len(g.mig_devices) else None
        if mig is None:
            raise nvml_error(NV.NVML_ERROR_NOT_FOUND)
        handle = self._mig_handles.get(id(mig))
        if handle is None:
            handle = self._mig_handles[id(mig)] = fake_pointer(NV.c_nvmlDevice_t)
            handle._sim = mig
            handle._parent = device
        return handle

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        # pynvml returns the c_uint itself here, not its value
        return ctypes.c_uint(
            int(isinstance(device_of(device, "nvmlDeviceIsMigDeviceHandle"), SimMigState))
        )

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        mig_of(migDevice, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return migDevice._parent

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return mig_of(device, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return mig_of(device, "nvmlDeviceGetComputeInstanceId").compute_instance_id
