"""GPM as the fake NVML computes it, as real NVML does: ``nvmlGpmSampleGet`` snapshots the
simulated GPU's cumulative activity counters (``read_gpm_counters``), and ``nvmlGpmMetricsGet``
turns the difference of two snapshots into percent of the elapsed (simulated) time, or MiB/s for
byte counters (``gpm_results``)."""

from __future__ import annotations

import operator
from typing import Any

from gpuwatt.collector.nvml import real_module

_NV = real_module()
_MIB = 1024 * 1024

# GPM snapshot layout: (time_s, then the counters in this order)
GPM_COUNTERS: tuple[str, ...] = (
    "sm_active_s",
    "sm_occupancy_s",
    "tensor_any_active_s",
    "tensor_hmma_active_s",
    "tensor_imma_active_s",
    "tensor_dfma_active_s",
    "fp64_active_s",
    "fp32_active_s",
    "fp16_active_s",
    "dram_active_s",
    "nvlink_rx_bytes",
    "nvlink_tx_bytes",
    "pcie_tx_kib_per_s",
    "pcie_rx_kib_per_s",
    "graphics_active_s",  # None where not simulated: that metric is NotSupported
)
read_gpm_counters = operator.attrgetter("time_s", *GPM_COUNTERS)
_PCT, _BYTES_RATE, _KIB_RATE_MEAN, _PCT_IF_SIMULATED = 0, 1, 2, 3
#: metric id -> (position in the snapshot, how to turn two snapshots into the value)
GPM_METRICS: dict[int, tuple[int, int]] = {
    _NV.NVML_GPM_METRIC_SM_UTIL: (1, _PCT),
    _NV.NVML_GPM_METRIC_SM_OCCUPANCY: (2, _PCT),
    _NV.NVML_GPM_METRIC_ANY_TENSOR_UTIL: (3, _PCT),
    _NV.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: (4, _PCT),
    _NV.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: (5, _PCT),
    _NV.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: (6, _PCT),
    _NV.NVML_GPM_METRIC_FP64_UTIL: (7, _PCT),
    _NV.NVML_GPM_METRIC_FP32_UTIL: (8, _PCT),
    _NV.NVML_GPM_METRIC_FP16_UTIL: (9, _PCT),
    _NV.NVML_GPM_METRIC_DRAM_BW_UTIL: (10, _PCT),
    _NV.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: (11, _BYTES_RATE),
    _NV.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: (12, _BYTES_RATE),
    _NV.NVML_GPM_METRIC_PCIE_TX_PER_SEC: (13, _KIB_RATE_MEAN),
    _NV.NVML_GPM_METRIC_PCIE_RX_PER_SEC: (14, _KIB_RATE_MEAN),
    _NV.NVML_GPM_METRIC_GRAPHICS_UTIL: (15, _PCT_IF_SIMULATED),
}


def gpm_results(ids: tuple[int, ...], a: tuple[float, ...], b: tuple[float, ...]) -> list[Any]:
    """What ``nvmlGpmMetricsGet`` computes for metric ``ids`` between snapshots ``a`` and ``b``:
    the (metricId, nvmlReturn, value) of each metric, flat, in request order."""
    dt_s = b[0] - a[0]
    out: list[Any] = []
    for metric_id in ids:
        how = GPM_METRICS.get(metric_id)
        if how is None:
            out += (metric_id, _NV.NVML_ERROR_NOT_SUPPORTED, 0.0)
            continue
        pos, kind = how
        if dt_s == 0:
            out += (metric_id, _NV.NVML_ERROR_NO_DATA, 0.0)
        elif kind == _PCT:
            out += (metric_id, _NV.NVML_SUCCESS, (b[pos] - a[pos]) / dt_s * 100.0)
        elif kind == _PCT_IF_SIMULATED:
            if a[pos] is None or b[pos] is None:
                out += (metric_id, _NV.NVML_ERROR_NOT_SUPPORTED, 0.0)
            else:
                out += (metric_id, _NV.NVML_SUCCESS, (b[pos] - a[pos]) / dt_s * 100.0)
        elif kind == _BYTES_RATE:
            out += (metric_id, _NV.NVML_SUCCESS, (b[pos] - a[pos]) / dt_s / _MIB)
        else:  # NVML reports PCIe throughput as the mean of the two samples, in MiB/s
            out += (metric_id, _NV.NVML_SUCCESS, (b[pos] + a[pos]) / 2.0 / 1024.0)
    return out
