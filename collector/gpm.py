"""GPM (GPU Performance Monitoring, Hopper and newer): one GPU's metrics between two ticks.

NVML computes GPM metrics from two snapshots of the GPU's counters. Each GPU gets two sample
buffers used in turn (this tick's snapshot, the previous tick's) and one metrics request that is
filled in place every tick with ``nvml_structs`` codecs (no per-field ctypes access).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from gpuwatt.collector.nvml_errors import ErrorPolicy
from gpuwatt.collector.nvml_structs import gpm_codecs

_MIB = 1024.0 * 1024.0

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
GPM_FIELDS: tuple[str, ...] = tuple(attr for _const, attr, _scale in GPM_METRICS)
_N_GPM = len(GPM_METRICS)
_SCALES: tuple[float, ...] = tuple(scale for _const, _attr, scale in GPM_METRICS)
_SCALED: tuple[tuple[str, float], ...] = tuple(
    (attr, scale) for _const, attr, scale in GPM_METRICS if scale != 1.0
)
_GPM_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION; checked against the module in open_gpm()


class GpmReader:
    """One GPU's GPM buffers and request. ``read()`` each tick, ``close()`` once.

    The first snapshot (after opening, a failed snapshot or a lost GPU) gives no metrics: there
    is no interval yet. ``refused`` turns True when NVML refuses GPM for good on this GPU.
    """

    def __init__(
        self, nv: Any, policy: ErrorPolicy, index: int, off: set[str], buffers: tuple[Any, Any]
    ) -> None:
        self._nv = nv
        self._policy = policy
        self._errors = policy.errors
        self._index = index
        self._off = off
        self._sample_get = nv.nvmlGpmSampleGet
        self._metrics_get = nv.nvmlGpmMetricsGet
        # each buffer with its address: the request is written raw (see nvml_structs)
        first, second = buffers
        self._prev: tuple[Any, Any] = (first, ctypes.cast(first, ctypes.c_void_p).value)
        self._cur: tuple[Any, Any] = (second, ctypes.cast(second, ctypes.c_void_p).value)
        header, ids, results, _fill, _base = gpm_codecs(nv, _N_GPM)
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = _GPM_GET_VERSION
        request.numMetrics = _N_GPM
        ids.pack_into(request, 0, *(getattr(nv, const) for const, _attr, _scale in GPM_METRICS))
        self._request = request
        self._header = header
        self._results = results
        self.primed = False
        self.refused = False

    def read(self, handle: Any, values: dict[str, Any]) -> bool:
        """Store the GPM metrics since the previous ``read`` in ``values``; False if there are
        none (a metric NVML failed on alone is left out)."""
        cur = self._cur
        try:
            self._sample_get(handle, cur[0])
        except self._errors as exc:
            self.primed = False
            self.refused = self._policy.failed(self._index, self._off, "gpm", exc)
            return False
        prev = self._prev
        self._cur, self._prev = prev, cur
        if not self.primed:
            self.primed = True
            return False
        request = self._request
        self._header.pack_into(request, 0, _GPM_GET_VERSION, _N_GPM, prev[1], cur[1])
        try:
            self._metrics_get(request)
        except self._errors as exc:
            self._policy.failed(self._index, self._off, "gpm_metrics", exc)
            return False
        raw = self._results.unpack_from(request)  # (nvmlReturn, value) per metric
        if any(raw[0::2]):  # some metric failed: it alone is left out
            for i, (name, scale) in enumerate(zip(GPM_FIELDS, _SCALES, strict=True)):
                if not raw[2 * i]:
                    values[name] = raw[2 * i + 1] * scale
        else:
            # the lengths match by construction; strict=True would cost ~0.4 us per GPU-sample
            values.update(zip(GPM_FIELDS, raw[1::2], strict=False))
            for name, scale in _SCALED:
                values[name] *= scale
        return True

    def close(self, log: logging.Logger) -> None:
        """Free both sample buffers (a failure is only logged)."""
        for buf, _address in (self._prev, self._cur):
            try:
                self._nv.nvmlGpmSampleFree(buf)
            except self._errors as exc:
                log.debug("GPU %d: nvmlGpmSampleFree failed (%s)", self._index, exc)


def open_gpm(
    nv: Any, policy: ErrorPolicy, index: int, off: set[str], handle: Any
) -> GpmReader | None:
    """A ``GpmReader`` for the GPU if NVML offers GPM on it, else None (and why is recorded)."""
    query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
    if query is None or getattr(nv, "nvmlGpmSampleGet", None) is None:
        return None
    if getattr(nv, "NVML_GPM_METRICS_GET_VERSION", None) != _GPM_GET_VERSION:
        policy.unsupported.setdefault(f"gpu{index}/gpm", "unknown GPM request version")
        return None
    if "gpm" in off:
        return None
    try:
        support = query(handle)
    except policy.errors as exc:
        policy.failed(index, off, "gpm", exc)
        return None
    if not support.isSupportedDevice:
        policy.unsupported.setdefault(f"gpu{index}/gpm", "not a GPM device")
        return None
    buffers: list[Any] = []
    try:
        while len(buffers) < 2:
            buffers.append(nv.nvmlGpmSampleAlloc())
    except policy.errors as exc:
        for buf in buffers:  # the first may have been allocated
            nv.nvmlGpmSampleFree(buf)
        policy.failed(index, off, "gpm", exc)
        return None
    return GpmReader(nv, policy, index, off, (buffers[0], buffers[1]))
