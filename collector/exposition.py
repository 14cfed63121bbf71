"""``/metrics``: the collector's latest samples in the Prometheus exposition format.

Opt-in (``gpuwatt collect --metrics-port PORT``), bound to 127.0.0.1 unless told otherwise, so a
site that scrapes can use gpuwatt's collector like any exporter. Names follow Prometheus'
conventions: a ``gpuwatt_`` prefix, base units in the name (seconds, bytes, watts, joules,
hertz, celsius, ratios 0-1), ``_total`` for counters. Every series carries the GPU's identity as
labels (``host``, ``gpu``, ``uuid``, ``name``) and its ``job`` ("" when none is known).

A metric that the GPU does not report is absent from the page, never 0 (as in the store). The
page is rendered from the newest tick at scrape time by prometheus_client: the collector's own
tick only swaps a reference.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from gpuwatt.model import GpuSample
from gpuwatt.schema import (
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)

LABELS: tuple[str, ...] = ("host", "gpu", "uuid", "name", "job")


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


def _labels(s: GpuSample) -> list[str]:
    return [s.host, str(s.gpu_index), s.uuid, s.name, s.job_id or ""]


class LatestSamples(Collector):
    """A prometheus_client collector over the newest tick's samples (``update`` swaps them)."""

    def __init__(self) -> None:
        self._samples: tuple[GpuSample, ...] = ()
        self._xid_totals: dict[str, int] = {}
        self._lock = threading.Lock()

    def update(self, samples: Iterable[GpuSample]) -> None:
        """The collector's ``on_samples`` hook: keep this tick, count XID events per GPU."""
        batch = tuple(samples)
        with self._lock:
            for s in batch:
                self._xid_totals[s.uuid] = self._xid_totals.get(s.uuid, 0) + len(s.xid_errors)
            self._samples = batch

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            samples, xids = self._samples, dict(self._xid_totals)
        up = GaugeMetricFamily(
            "gpuwatt_gpu_up", "1 while the GPU answers NVML, 0 once it is lost", labels=LABELS
        )
        seen = GaugeMetricFamily(
            "gpuwatt_sample_timestamp_seconds",
            "When the newest sample of the GPU was taken (Unix time)",
            labels=LABELS,
        )
        for s in samples:
            up.add_metric(_labels(s), 0.0 if s.lost else 1.0)
            seen.add_metric(_labels(s), s.time_ns / 1e9)
        yield up
        yield seen
        live = [s for s in samples if not s.lost]
        for gauge in GAUGES:
            family = GaugeMetricFamily(gauge.name, gauge.help, labels=LABELS)
            for s in live:
                value = getattr(s, gauge.attr)
                if value is not None:
                    family.add_metric(_labels(s), float(value) * gauge.scale)
            yield family
        energy = CounterMetricFamily(
            "gpuwatt_energy_joules",
            "Energy consumed since the collector started (NVML counter, else integrated power)",
            labels=[*LABELS, "method"],
        )
        reasons = GaugeMetricFamily(
            "gpuwatt_clock_event_reason_active",
            "1 while the clock-event (throttle) reason is active",
            labels=[*LABELS, "reason"],
        )
        xid = CounterMetricFamily(
            "gpuwatt_xid_errors", "XID events seen since the collector started", labels=LABELS
        )
        for s in live:
            if s.energy_j is not None:
                method = s.energy_method.value if s.energy_method else ""
                energy.add_metric([*_labels(s), method], s.energy_j)
            if s.clock_event_reasons is not None:
                for reason, bit in REASONS:
                    active = 1.0 if s.clock_event_reasons & bit else 0.0
                    reasons.add_metric([*_labels(s), reason], active)
            xid.add_metric(_labels(s), float(xids.get(s.uuid, 0)))
        yield energy
        yield reasons
        yield xid


class MetricsEndpoint:
    """``/metrics`` served from a daemon thread (prometheus_client's WSGI server)."""

    def __init__(self, latest: LatestSamples, *, port: int, bind: str = "127.0.0.1") -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(latest)
        self._server: WSGIServer
        self._server, self._thread = start_http_server(port, addr=bind, registry=registry)
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
