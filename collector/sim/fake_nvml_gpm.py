"""The GPM calls of the fake NVML: sample buffers, device and MIG samples, and the metrics of two
samples computed as NVML computes them (``collector.sim.fake_gpm``). Mixed into ``FakeNvml``."""

from __future__ import annotations

from typing import Any

from gpuwatt.collector.nvml_structs import gpm_codecs
from gpuwatt.collector.sim.fake_gpm import gpm_results, read_gpm_counters
from gpuwatt.collector.sim.fake_nvml_base import NV, address_of, fake_pointer, gpu_of, nvml_error

_GPM_HEADER = gpm_codecs(NV, 0).header
_GPM_CODECS: dict[int, tuple[Any, Any, int]] = {}  # numMetrics -> (ids, fill, fill offset)


class GpmCalls:
    """NVML's GPM functions; a sample buffer is a fake address keyed to its snapshot."""

    _gpm_snapshots: dict[int, tuple[float, ...] | None]

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        g = gpu_of(device, "nvmlGpmQueryDeviceSupport")
        support = NV.c_nvmlGpmSupport_t()
        support.version = NV.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(g.gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        sample = fake_pointer(NV.c_nvmlGpmSample_t)
        self._gpm_snapshots[address_of(sample)] = None
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        if self._gpm_snapshots.pop(address_of(gpmSample), False) is False:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        g = gpu_of(device, "nvmlGpmSampleGet")
        if not g.gpm_supported or g.mig_enabled:
            raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
        key = address_of(gpmSample)
        if key not in self._gpm_snapshots:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_snapshots[key] = read_gpm_counters(g)
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        g = gpu_of(device, "nvmlGpmMigSampleGet")
        if not g.gpm_supported:
            raise nvml_error(NV.NVML_ERROR_NOT_SUPPORTED)
        if not g.mig_enabled:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        mig = next((m for m in g.mig_devices if m and m.gpu_instance_id == gpuInstanceId), None)
        key = address_of(gpmSample)
        if mig is None or key not in self._gpm_snapshots:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_snapshots[key] = read_gpm_counters(mig)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        version, count, first_addr, second_addr = _GPM_HEADER.unpack_from(metricsGet)
        if version != NV.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(NV.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._gpm_snapshots.get(first_addr)
        second = self._gpm_snapshots.get(second_addr)
        if first is None or second is None or not 0 <= count <= NV.NVML_GPM_METRIC_MAX:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        if second[0] < first[0]:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        codecs = _GPM_CODECS.get(count)
        if codecs is None:
            full = gpm_codecs(NV, count)
            codecs = _GPM_CODECS[count] = (full.ids, full.fill, full.metrics_offset)
        ids_codec, fill_codec, offset = codecs
        results = gpm_results(ids_codec.unpack_from(metricsGet), first, second)
        fill_codec.pack_into(metricsGet, offset, *results)  # metricInfo left NULL
        return metricsGet
