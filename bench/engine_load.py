"""Load bench/backfill.py's simulated cluster into a real engine (for bench/dashboard.py --store).

Starts Debian's ``influxd`` (1.6.7) or ``victoria-metrics`` on 127.0.0.1 with its own temporary
data directory (the test fixtures' server classes), writes every round as gpuwatt's own line
protocol (``LineEncoder``, exactly what collectors send) in batches of ``batch_lines`` through the
store's own ``write_lines`` (the fastest path both engines take: one HTTP request per batch), and
writes the engine rollups (``engine_rollups``) of every minute and hour. The rollups are computed
here from the generated values with the same ``rollup_rule.combine`` and ``rollup_lines`` a
collector uses; a collector reads each bucket back from the engine first (``engine_rollups.roll``),
which a bulk load of 1,440 minutes can skip (the engine holds exactly these samples).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from backfill import Cluster
from servers import InfluxDB1Server, VictoriaMetricsServer

from gpuwatt.line_protocol import LineEncoder
from gpuwatt.store import LAST_VALUE_ATTRS, open_store
from gpuwatt.store.engine_rollups import (
    HOUR_NS,
    MINUTE_NS,
    GpuIds,
    concat,
)
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.rollup_rule import as_level, combine

#: The attributes the simulated cluster sets (the others are not measured: NaN, not rolled).
ATTRS = (
    "utilization_gpu_pct",
    "temperature_gpu_c",
    "power_w",
    "energy_j",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "clock_event_reasons",
    "tensor_active_pct",
    "tensor_hmma_active_pct",
    "tflops_estimate",
    "memory_used_bytes",
)


class Engine:
    """A started engine, the store that reads it, and the CPU time its server process used."""

    def __init__(self, kind: str, end_ns: int) -> None:
        self.kind = kind
        self.end_ns = end_ns  # the newest sample the bench loads
        self.server: Any = InfluxDB1Server() if kind == "influxdb" else VictoriaMetricsServer()
        self.server.start()
        if kind == "influxdb":
            self.server.create_database("bench")
            self.url = self.server.url.replace("http://", "influxdb://") + "/bench?timeout=120s"
        else:
            url = self.server.url.replace("http://", "victoriametrics://")
            self.url = url + "?timeout=120s&rollups=on"

    def store(self, *, use_rollups: bool = True) -> Any:
        store = open_store(self.url, environ={})
        store.use_rollups = use_rollups  # type: ignore[attr-defined]
        if self.kind == "victoriametrics":  # latest() looks back from the wall clock
            age_s = time.time() - self.end_ns / 1e9
            store.latest_lookback_s = age_s + 2 * 86_400.0  # type: ignore[attr-defined]
        return store

    def flush(self) -> None:
        if self.kind == "victoriametrics":
            self.server.force_flush()

    def cpu_s(self) -> float:
        """User + system CPU seconds of the engine's process so far."""
        fields = Path(f"/proc/{self.server._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.server.cleanup()


def load(
    engine: Engine,
    cluster: Cluster,
    *,
    batch_lines: int = 50_000,
    progress: Callable[[str], None] = print,
) -> int:
    """Write every round of ``cluster`` and its minute and hour rollups; the samples written."""
    store = engine.store()
    encoder = LineEncoder()
    ids = GpuIds()
    gids = np.array(
        [
            ids.of((h, i, u, "NVIDIA H100 80GB HBM3"))
            for h, i, u in zip(cluster.hosts, cluster.index, cluster.uuids, strict=True)
        ]
    )
    pending: list[str] = []
    minute_rows: list[dict[str, np.ndarray]] = []  # the current minute's samples (level cols)
    hour_minutes: list[dict[str, np.ndarray]] = []
    written, t0, next_report = 0, time.perf_counter(), 0.0

    def send(lines: list[str]) -> None:
        for i in range(0, len(lines), batch_lines):
            _write(store, lines[i : i + batch_lines])

    def close_minute() -> None:
        if minute_rows:
            cols = combine(
                concat(minute_rows, ATTRS), MINUTE_NS, ATTRS, LAST_VALUE_ATTRS, level_ns=0
            )
            pending.extend(store.rollups.rollup_lines(MINUTE_NS, cols, ids.idents))
            hour_minutes.append(cols)
            minute_rows.clear()

    def close_hour() -> None:
        close_minute()
        if hour_minutes:
            cols = combine(concat(hour_minutes, ATTRS), HOUR_NS, ATTRS, LAST_VALUE_ATTRS)
            pending.extend(store.rollups.rollup_lines(HOUR_NS, cols, ids.idents))
            hour_minutes.clear()

    for k in range(cluster.steps):
        t = cluster.time_ns(k)
        if minute_rows and t % MINUTE_NS < round(cluster.interval_s * 1e9):
            if t % HOUR_NS < round(cluster.interval_s * 1e9):
                close_hour()
            else:
                close_minute()
        samples = cluster.samples(k)
        pending.extend(encoder.encode_many(samples))
        values = {a: np.array([getattr(s, a) for s in samples], dtype=np.float64) for a in ATTRS}
        minute_rows.append(
            as_level(np.full(len(samples), t), gids, np.zeros(len(samples), bool), values)
        )
        written += len(samples)
        if len(pending) >= batch_lines:
            send(pending)
            pending.clear()
        if (k + 1) / cluster.steps >= next_report:
            rate = written / (time.perf_counter() - t0)
            progress(f"  load {(k + 1) / cluster.steps:5.0%}  {written:,} samples  {rate:,.0f}/s")
            next_report += 0.1
    close_hour()
    send(pending)
    engine.flush()
    store.close()
    return written


def _write(store: Any, lines: list[str]) -> None:
    for attempt in range(5):  # a busy shared machine: the engine may time out a large batch
        try:
            store.write_lines(lines)
            return
        except Exception:
            if attempt == 4:
                raise
            time.sleep(2.0)


__all__ = ["Engine", "InfluxStore", "load"]
