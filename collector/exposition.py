"""``/metrics``: the collector's latest samples in the Prometheus exposition format.

Opt-in (``gpuwatt collect --metrics-port PORT``), bound to 127.0.0.1 unless told otherwise, so a
site that scrapes can use gpuwatt's collector like any exporter. Names follow Prometheus'
conventions: a ``gpuwatt_`` prefix, base units in the name (seconds, bytes, watts, joules,
hertz, celsius, ratios 0-1), ``_total`` for counters. Every series carries the GPU's identity as
labels (``host``, ``gpu``, ``uuid``, ``name``) and its ``job_id`` ("" when none is known).

A metric that the GPU does not report is absent from the page, never 0 (as in the store). The
page is rendered from the newest tick at scrape time by prometheus_client: the collector's own
tick only swaps a reference.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from gpuwatt.model import GpuSample
from gpuwatt.prometheus_names import (
    ENERGY,
    GAUGES,
    LABELS,
    REASON_ACTIVE,
    REASONS,
    REASONS_MASK,
    SAMPLE_TIME,
    UP,
    XID,
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
        up = GaugeMetricFamily(UP, "1 while the GPU answers NVML, 0 once it is lost", labels=LABELS)
        seen = GaugeMetricFamily(
            SAMPLE_TIME,
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
            ENERGY,
            "Energy consumed since the collector started (NVML counter, else integrated power)",
            labels=[*LABELS, "method"],
        )
        reasons = GaugeMetricFamily(
            REASON_ACTIVE,
            "1 while the clock-event (throttle) reason is active",
            labels=[*LABELS, "reason"],
        )
        mask = GaugeMetricFamily(
            REASONS_MASK, "NVML clock-event (throttle) reason bitmask", labels=LABELS
        )
        xid = CounterMetricFamily(XID, "XID events seen since the collector started", labels=LABELS)
        for s in live:
            if s.energy_j is not None:
                method = s.energy_method.value if s.energy_method else ""
                energy.add_metric([*_labels(s), method], s.energy_j)
            if s.clock_event_reasons is not None:
                mask.add_metric(_labels(s), float(s.clock_event_reasons))
                for reason, bit in REASONS:
                    active = 1.0 if s.clock_event_reasons & bit else 0.0
                    reasons.add_metric([*_labels(s), reason], active)
            xid.add_metric(_labels(s), float(xids.get(s.uuid, 0)))
        yield energy
        yield reasons
        yield mask
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
