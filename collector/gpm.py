"""GPM (GPU Performance Monitoring, Hopper and newer): one GPU's metrics between two ticks.

NVML computes GPM metrics from two snapshots of the GPU's counters. Each GPU gets two sample
buffers used in turn (this tick's snapshot, the previous tick's) and one metrics request that is
filled in place every tick with ``nvml_structs`` codecs (no per-field ctypes access).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
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
#: A MIG device's: NVML gives it no utilisation of its own, GPM's graphics-engine activity (the
#: share of time any kernel ran on its SMs, what ``utilization.gpu`` is for a whole GPU) stands in.
MIG_GPM_METRICS: tuple[tuple[str, str, float], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "utilization_gpu_pct", 1.0),
    *GPM_METRICS,
)
_GPM_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION; checked against the module in open_gpm()


class GpmReader:
    """One GPU's GPM buffers and requests. ``read()`` each tick, ``close()`` once.

    The first snapshot (after opening, a failed snapshot or a lost GPU) gives no metrics: there
    is no interval yet. ``refused`` turns True when NVML refuses GPM for good on this GPU.
    """

    def __init__(
        self,
        nv: Any,
        policy: ErrorPolicy,
        index: int,
        off: set[str],
        buffers: tuple[Any, Any],
        *,
        sample_get: Callable[[Any, Any], Any] | None = None,
        label: str = "gpm",
        metrics: tuple[tuple[str, str, float], ...] = GPM_METRICS,
    ) -> None:
        self._nv = nv
        self._policy = policy
        self._errors = policy.errors
        self._index = index
        self._off = off
        self._label = label  # the field its errors are recorded under
        # (handle, buffer) -> snapshot: the GPU's own, or a MIG instance's through its parent
        self._sample_get = sample_get or nv.nvmlGpmSampleGet
        self._metrics_get = nv.nvmlGpmMetricsGet
        self._buffers = buffers
        first, second = buffers
        first_at = ctypes.cast(first, ctypes.c_void_p).value
        second_at = ctypes.cast(second, ctypes.c_void_p).value
        count = len(metrics)
        self._fields = tuple(attr for _const, attr, _scale in metrics)
        self._scales = tuple(scale for _const, _attr, scale in metrics)
        self._scaled = tuple((attr, scale) for _const, attr, scale in metrics if scale != 1.0)
        header, ids, results, _fill, _base = gpm_codecs(nv, count)
        metric_ids = [getattr(nv, const) for const, _attr, _scale in metrics]

        def request(older_at: int | None, newer_at: int | None) -> Any:
            get = nv.c_nvmlGpmMetricsGet_t()  # written raw, see nvml_structs
            ids.pack_into(get, 0, *metric_ids)  # zeroes what lies before them: header last
            header.pack_into(get, 0, _GPM_GET_VERSION, count, older_at, newer_at)
            return get

        # The buffers take turns: each tick snapshots into one and asks for the metrics between
        # the other (the previous tick's snapshot) and it, so each turn has its request ready.
        self._turns = (
            (second, request(first_at, second_at)),
            (first, request(second_at, first_at)),
        )
        self._turn = 0
        self._results = results
        self.primed = False
        self.refused = False

    def read(self, handle: Any, values: dict[str, Any]) -> bool:
        """Store the GPM metrics since the previous ``read`` in ``values``; False if there are
        none (a metric NVML failed on alone is left out)."""
        buffer, request = self._turns[self._turn]
        try:
            self._sample_get(handle, buffer)
        except self._errors as exc:
            self.primed = False
            self.refused = self._policy.failed(self._index, self._off, self._label, exc)
            return False
        self._turn ^= 1
        if not self.primed:
            self.primed = True
            return False
        try:
            self._metrics_get(request)
        except self._errors as exc:
            self._policy.failed(self._index, self._off, f"{self._label}_metrics", exc)
            return False
        raw = self._results.unpack_from(request)  # (nvmlReturn, value) per metric
        if any(raw[0::2]):  # some metric failed: it alone is left out
            for i, (name, scale) in enumerate(zip(self._fields, self._scales, strict=True)):
                if not raw[2 * i]:
                    values[name] = raw[2 * i + 1] * scale
        else:
            # the lengths match by construction; strict=True would cost ~0.4 us per GPU-sample
            values.update(zip(self._fields, raw[1::2], strict=False))
            for name, scale in self._scaled:
                values[name] *= scale
        return True

    def close(self, log: logging.Logger) -> None:
        """Free both sample buffers (a failure is only logged)."""
        for buf in self._buffers:
            try:
                self._nv.nvmlGpmSampleFree(buf)
            except self._errors as exc:
                log.debug("GPU %d: nvmlGpmSampleFree failed (%s)", self._index, exc)


def open_gpm(
    nv: Any,
    policy: ErrorPolicy,
    index: int,
    off: set[str],
    handle: Any,
    *,
    mig_gpu_instance_id: int | None = None,
    label: str = "gpm",
    metrics: tuple[tuple[str, str, float], ...] = GPM_METRICS,
) -> GpmReader | None:
    """A ``GpmReader`` for the GPU if NVML offers GPM on it, else None (and why is recorded).

    With ``mig_gpu_instance_id``, ``handle`` is the parent GPU's and the reader snapshots that
    GPU instance (``nvmlGpmMigSampleGet``): its metrics are percent of the instance's own SMs.
    """
    query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
    if mig_gpu_instance_id is None:
        sample_get = getattr(nv, "nvmlGpmSampleGet", None)
    else:
        mig_get = getattr(nv, "nvmlGpmMigSampleGet", None)
        gi = mig_gpu_instance_id
        sample_get = None if mig_get is None else (lambda h, buf: mig_get(h, gi, buf))
    if query is None or sample_get is None:
        return None
    if getattr(nv, "NVML_GPM_METRICS_GET_VERSION", None) != _GPM_GET_VERSION:
        policy.unsupported.setdefault(f"gpu{index}/{label}", "unknown GPM request version")
        return None
    if label in off:
        return None
    try:
        support = query(handle)
    except policy.errors as exc:
        policy.failed(index, off, label, exc)
        return None
    if not support.isSupportedDevice:
        policy.unsupported.setdefault(f"gpu{index}/{label}", "not a GPM device")
        return None
    buffers: list[Any] = []
    try:
        while len(buffers) < 2:
            buffers.append(nv.nvmlGpmSampleAlloc())
    except policy.errors as exc:
        for buf in buffers:  # the first may have been allocated
            nv.nvmlGpmSampleFree(buf)
        policy.failed(index, off, label, exc)
        return None
    return GpmReader(
        nv,
        policy,
        index,
        off,
        (buffers[0], buffers[1]),
        sample_get=sample_get,
        label=label,
        metrics=metrics,
    )
