"""Whose series a Prometheus-compatible engine holds (a *dialect*: gpuwatt's ``/metrics``,
NVIDIA's dcgm-exporter, gpuwatt's line protocol in VictoriaMetrics): metric names, scales and
labels per source, and the PromQL literals that select them (``promql``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatt.line_protocol import FIELD_INFO
from gpuwatt.prometheus_names import ENERGY, GAUGES, REASONS_MASK, SAMPLE_TIME, UP
from gpuwatt.schema import FIELD_JOB_ID, FIELD_LOST, FIELDS, MEASUREMENT, MIB, Kind

NS_PER_MS = 1_000_000
PRESENCE = "__presence__"  # the pseudo-attribute under which the presence metric is read


@dataclass(frozen=True)
class SeriesName:
    """Where one ``GpuSample`` attribute lives in the engine: model value = engine value x scale.

    ``metric`` may be a regular expression of alternative names (dcgm-exporter renamed the
    throttle-reason field); ``kind`` rounds integers and turns booleans back into bools.
    """

    attr: str
    metric: str
    scale: float = 1.0


@dataclass(frozen=True)
class Dialect:
    """Whose series an engine holds: metric names, scales and identity labels."""

    name: str
    series: tuple[SeriesName, ...]
    host: str
    index: str
    uuid: str
    model: str
    jobs: tuple[str, ...]  # labels naming the job, the first non-empty wins
    presence: str  # a metric every sample of every GPU has (counts, times)
    sample_time: str | None = None  # a metric whose value is the sample's Unix time
    lost_metric: str | None = None  # the presence metric, where its ``lost_value`` marks lost
    lost_value: float = 1.0
    encoded_names: bool = False  # names written by gpuwatt's line protocol (``encode_name``)
    #: a series per GPU and job whose labels name the job (and how energy and TFLOPS were
    #: obtained) at each sample, where the metric series do not carry them (None: they do)
    info: str | None = None

    def by_attr(self) -> dict[str, SeriesName]:
        return {s.attr: s for s in self.series}


GPUWATT = Dialect(
    name="gpuwatt",
    series=(
        *(SeriesName(g.attr, g.name, 1.0 / g.scale) for g in GAUGES),
        SeriesName("energy_j", ENERGY + "_total"),
        SeriesName("clock_event_reasons", REASONS_MASK),
    ),
    host="host",
    index="gpu",
    uuid="uuid",
    model="name",
    jobs=("job_id",),
    presence=UP,
    sample_time=SAMPLE_TIME,
    lost_metric=UP,
    lost_value=0.0,
)

#: dcgm-exporter's field names (its etc/default-counters.csv and dcp-metrics-included.csv) and
#: units: utilisation in %, memory in MiB, energy in mJ since boot, clocks in MHz, DCP (PROF)
#: activities as 0-1 ratios, PROF PCIe/NVLink bytes as bytes per second.
DCGM = Dialect(
    name="dcgm",
    series=(
        SeriesName("utilization_gpu_pct", "DCGM_FI_DEV_GPU_UTIL"),
        SeriesName("utilization_memory_pct", "DCGM_FI_DEV_MEM_COPY_UTIL"),
        SeriesName("memory_used_bytes", "DCGM_FI_DEV_FB_USED", MIB),
        SeriesName("memory_free_bytes", "DCGM_FI_DEV_FB_FREE", MIB),
        SeriesName("temperature_gpu_c", "DCGM_FI_DEV_GPU_TEMP"),
        SeriesName("temperature_memory_c", "DCGM_FI_DEV_MEMORY_TEMP"),
        SeriesName("power_w", "DCGM_FI_DEV_POWER_USAGE"),
        SeriesName("energy_j", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),
        SeriesName("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK"),
        SeriesName("memory_clock_mhz", "DCGM_FI_DEV_MEM_CLOCK"),
        SeriesName(
            "clock_event_reasons",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS|DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        ),
        SeriesName("pcie_tx_bytes_per_s", "DCGM_FI_PROF_PCIE_TX_BYTES"),
        SeriesName("pcie_rx_bytes_per_s", "DCGM_FI_PROF_PCIE_RX_BYTES"),
        SeriesName("nvlink_tx_bytes_per_s", "DCGM_FI_PROF_NVLINK_TX_BYTES"),
        SeriesName("nvlink_rx_bytes_per_s", "DCGM_FI_PROF_NVLINK_RX_BYTES"),
        SeriesName("sm_active_pct", "DCGM_FI_PROF_SM_ACTIVE", 100.0),
        SeriesName("sm_occupancy_pct", "DCGM_FI_PROF_SM_OCCUPANCY", 100.0),
        SeriesName("tensor_active_pct", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100.0),
        SeriesName("fp64_active_pct", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", 100.0),
        SeriesName("fp32_active_pct", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", 100.0),
        SeriesName("fp16_active_pct", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", 100.0),
        SeriesName("dram_active_pct", "DCGM_FI_PROF_DRAM_ACTIVE", 100.0),
        SeriesName("ecc_sbe_volatile_count", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
        SeriesName("ecc_dbe_volatile_count", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
        SeriesName("ecc_sbe_aggregate_count", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
        SeriesName("ecc_dbe_aggregate_count", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
        SeriesName("remapped_rows_correctable", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
        SeriesName("remapped_rows_uncorrectable", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    ),
    host="Hostname",
    index="gpu",
    uuid="UUID",
    model="modelName",
    jobs=("hpc_job", "pod"),
    presence="DCGM_FI_DEV_GPU_UTIL",
)

#: gpuwatt's line protocol as VictoriaMetrics stores it: ``<measurement>_<field>``, tags as
#: labels, booleans as 0/1. The engine keeps no string fields: gpuwatt writes the job id and the
#: energy and TFLOPS methods as the labels of ``nvidia_smi_info`` (``line_protocol.
#: with_info_line``); per-process details are not kept.
INFLUX = Dialect(
    name="influx",
    series=tuple(
        SeriesName(f.attr, f"{MEASUREMENT}_{f.field}", f.scale)
        for f in FIELDS
        if f.kind is not Kind.STR
    ),
    host="host",
    index="index",
    uuid="uuid",
    model="name",
    jobs=(FIELD_JOB_ID,),
    presence=f"{MEASUREMENT}_{FIELD_LOST}",
    lost_metric=f"{MEASUREMENT}_{FIELD_LOST}",
    encoded_names=True,
    info=f"{MEASUREMENT}_{FIELD_INFO}",
)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (GPUWATT, DCGM, INFLUX)}
KIND = {f.attr: f.kind for f in FIELDS}


def promql_string(value: str) -> str:
    """A PromQL string literal (Go escaping; JSON's escapes are a subset Go accepts)."""
    return json.dumps(value)


def regex_alternatives(values: Sequence[str]) -> str:
    """An RE2 pattern matching exactly one of ``values`` (PromQL anchors label regexes)."""
    specials = set("\\.+*?()|[]{}^$")
    return "|".join("".join("\\" + c if c in specials else c for c in v) for v in values)
