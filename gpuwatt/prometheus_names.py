"""The names gpuwatt's ``/metrics`` page gives its series (Prometheus exposition format).

One table for both sides: the collector's exposition (``gpuwatt.collector.exposition``) writes
these names, and the Prometheus-compatible store (``gpuwatt.store.promql``) reads them back from
an engine that scraped a collector. Names follow Prometheus' conventions: a ``gpuwatt_`` prefix,
base units in the name (bytes, watts, joules, hertz, celsius, ratios 0-1), ``_total`` on counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatt.schema import (
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)

#: Identity labels of every series; ``job_id`` is "" when no job is known. (Not ``job``: that is
#: the label Prometheus gives every scraped series, its scrape job's name.)
LABELS: tuple[str, ...] = ("host", "gpu", "uuid", "name", "job_id")

UP = "gpuwatt_gpu_up"
SAMPLE_TIME = "gpuwatt_sample_timestamp_seconds"
ENERGY = "gpuwatt_energy_joules"  # a counter: the page shows it as gpuwatt_energy_joules_total
REASON_ACTIVE = "gpuwatt_clock_event_reason_active"
REASONS_MASK = "gpuwatt_clock_event_reasons"
XID = "gpuwatt_xid_errors"  # a counter


@dataclass(frozen=True)
class Gauge:
    """One sample attribute exposed as a gauge: ``value * scale`` in the named base unit."""

    attr: str
    name: str
    help: str
    scale: float = 1.0


#: The gauges, in page order. Percentages become ratios, MHz become hertz, TFLOPS become FLOP/s.
GAUGES: tuple[Gauge, ...] = (
    Gauge("utilization_gpu_pct", "gpuwatt_gpu_utilization_ratio",
          "Fraction of the last sample period during which a kernel ran", 0.01),
    Gauge("utilization_memory_pct", "gpuwatt_memory_utilization_ratio",
          "Fraction of the last sample period during which device memory was read or written",
          0.01),
    Gauge("memory_used_bytes", "gpuwatt_memory_used_bytes", "Device memory in use"),
    Gauge("memory_total_bytes", "gpuwatt_memory_total_bytes", "Device memory installed"),
    Gauge("temperature_gpu_c", "gpuwatt_gpu_temperature_celsius", "GPU die temperature"),
    Gauge("temperature_memory_c", "gpuwatt_memory_temperature_celsius", "HBM temperature"),
    Gauge("fan_speed_pct", "gpuwatt_fan_speed_ratio", "Fan speed as a fraction of its maximum",
          0.01),
    Gauge("power_w", "gpuwatt_power_watts", "Power draw"),
    Gauge("power_limit_w", "gpuwatt_power_limit_watts", "Enforced power limit"),
    Gauge("sm_clock_mhz", "gpuwatt_sm_clock_hertz", "SM clock", 1e6),
    Gauge("memory_clock_mhz", "gpuwatt_memory_clock_hertz", "Memory clock", 1e6),
    Gauge("sm_clock_max_mhz", "gpuwatt_sm_clock_max_hertz", "Maximum SM clock", 1e6),
    Gauge("pcie_tx_bytes_per_s", "gpuwatt_pcie_transmit_bytes_per_second", "PCIe transmit rate"),
    Gauge("pcie_rx_bytes_per_s", "gpuwatt_pcie_receive_bytes_per_second", "PCIe receive rate"),
    Gauge("nvlink_tx_bytes_per_s", "gpuwatt_nvlink_transmit_bytes_per_second",
          "NVLink transmit rate"),
    Gauge("nvlink_rx_bytes_per_s", "gpuwatt_nvlink_receive_bytes_per_second",
          "NVLink receive rate"),
    Gauge("sm_active_pct", "gpuwatt_sm_active_ratio", "Fraction of SMs active (GPM)", 0.01),
    Gauge("tensor_active_pct", "gpuwatt_tensor_active_ratio",
          "Fraction of time tensor pipes were active (GPM)", 0.01),
    Gauge("dram_active_pct", "gpuwatt_dram_active_ratio",
          "Fraction of peak DRAM bandwidth used (GPM)", 0.01),
    Gauge("tflops_estimate", "gpuwatt_achieved_flops_per_second",
          "Achieved FLOP/s estimated from GPM pipe counters (an upper bound without GPM)", 1e12),
    Gauge("ecc_sbe_volatile_count", "gpuwatt_ecc_corrected_volatile_errors",
          "Corrected (single-bit) ECC errors since the driver loaded"),
    Gauge("ecc_dbe_volatile_count", "gpuwatt_ecc_uncorrected_volatile_errors",
          "Uncorrected (double-bit) ECC errors since the driver loaded"),
    Gauge("ecc_sbe_aggregate_count", "gpuwatt_ecc_corrected_aggregate_errors",
          "Corrected (single-bit) ECC errors over the GPU's lifetime"),
    Gauge("ecc_dbe_aggregate_count", "gpuwatt_ecc_uncorrected_aggregate_errors",
          "Uncorrected (double-bit) ECC errors over the GPU's lifetime"),
    Gauge("remapped_rows_correctable", "gpuwatt_remapped_rows_correctable",
          "Rows remapped for correctable errors"),
    Gauge("remapped_rows_uncorrectable", "gpuwatt_remapped_rows_uncorrectable",
          "Rows remapped for uncorrectable errors"),
)  # fmt: skip

#: Clock-event (throttle) reasons, one 0/1 series each. SW power cap is normal at full load.
REASONS: tuple[tuple[str, int], ...] = (
    ("sw_power_cap", REASON_SW_POWER_CAP),
    ("hw_slowdown", REASON_HW_SLOWDOWN),
    ("sw_thermal", REASON_SW_THERMAL),
    ("hw_thermal", REASON_HW_THERMAL),
    ("hw_power_brake", REASON_HW_POWER_BRAKE),
)
