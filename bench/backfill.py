"""Backfill a large simulated cluster into the embedded store quickly (for bench/dashboard.py).

A synchronous training job on every node (8 jobs of 64 GPUs), utilisation following a slow daily
swing plus noise, power and temperature following utilisation and clock, the energy counter
integrating power, tensor activity and an estimated TFLOPS from it; a thermal straggler on
``STRAGGLER`` (node, GPU) for the last 6 hours slows its node's peers.

88.5 M samples (1,024 GPUs x 24 h of 1-second samples) do not go through ``GpuSample`` objects
and ``write_samples`` (building the objects alone would take longer than the writes): values are
generated with numpy, a minute of rounds at a time, and appended as rounds to the store's open
segment as ``write_samples`` appends them (format 3); rollups, closing segments and retention
are then run by the store's own maintenance, exactly as after a ``write_samples`` batch. The
first and the last round go through ``write_samples`` (they register the GPUs and their tails,
and set each GPU's newest sample).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpuwatt.model import EnergyMethod, GpuSample, TflopsMethod
from gpuwatt.store import rounds
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
STRAGGLER = (57, 3)  # node-057 GPU 3
NAME = "NVIDIA H100 80GB HBM3"
PEAK_DENSE_FP16_TFLOPS = 989.4  # H100 SXM (gpuwatt.gpu_specs)
MAX_CLOCK_MHZ = 1980.0


def cluster_arguments(ap: argparse.ArgumentParser, *, interval_s: float) -> None:
    """The command-line options of a bench that backfills ``Cluster`` into the embedded store:
    its size, span and sampling interval, and where to keep the database."""
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--interval-s", type=float, default=interval_s)
    ap.add_argument("--db", type=Path, help="keep/reuse the database here")


class Cluster:
    """The signal model: one call per round returns every GPU's values as arrays."""

    def __init__(self, gpus: int, hours: float, interval_s: float, end_ns: int) -> None:
        self.gpus = gpus
        self.hours = hours
        self.interval_s = interval_s
        self.steps = int(hours * 3600 / interval_s)
        self.start_ns = end_ns - self.steps * round(interval_s * NS)
        n_nodes = gpus // 8
        self.hosts = [f"node-{h:03d}" for h in range(n_nodes) for _ in range(8)]
        self.index = [i for _ in range(n_nodes) for i in range(8)]
        self.uuids = [f"GPU-{h:04d}-{i}" for h in range(n_nodes) for i in range(8)]
        self.jobs = [f"train-{g // 64:02d}" for g in range(gpus)]
        self.straggler = STRAGGLER[0] * 8 + STRAGGLER[1]
        self.reset()

    def reset(self) -> None:
        """Start again from the first round: ``round`` draws the same values again."""
        self.rng = np.random.default_rng(7)
        self.energy = self.rng.uniform(1e8, 2e8, self.gpus)
        self.base_util = self.rng.uniform(70, 95, self.gpus)

    def time_ns(self, k: int) -> int:
        return self.start_ns + k * round(self.interval_s * NS)

    def round(self, k: int) -> dict[str, np.ndarray]:
        g, rng = self.gpus, self.rng
        hour = k * self.interval_s / 3600
        util = np.clip(self.base_util + rng.normal(0, 3, g) + 8 * np.sin(hour), 0, 100)
        clock = np.full(g, MAX_CLOCK_MHZ)
        reasons = np.full(g, 4, dtype=np.int64)  # SW power cap: what a busy H100 reports
        temp = 45 + util * 0.3 + rng.normal(0, 1, g)
        s = self.straggler
        if hour >= self.hours - 6 and s < g:
            clock[s], reasons[s], temp[s] = 1350.0, 0x48, 91.0  # HW + HW thermal slowdown
            node = slice(STRAGGLER[0] * 8, STRAGGLER[0] * 8 + 8)
            util[node] *= 0.75  # its peers wait for it
            util[s] = 99.0
        power = 120 + util * 5.2 * clock / MAX_CLOCK_MHZ
        self.energy += power * self.interval_s
        tensor = util * 0.6
        # As NVML reports them (whole % and °C, mW and mJ) and the line protocol keeps them (three
        # decimals): every store then holds the very same values, and the engines' rollups
        # (``engine_load``, from these values) agree with their raw samples.
        return {
            "utilization_gpu_pct": np.round(util),
            "temperature_gpu_c": np.round(temp),
            "power_w": np.round(power, 3),
            "energy_j": np.round(self.energy, 3),
            "sm_clock_mhz": clock,
            "clock_event_reasons": reasons,
            "tensor_active_pct": np.round(tensor, 3),
            "tensor_hmma_active_pct": np.round(tensor, 3),
            "tflops_estimate": np.round(
                PEAK_DENSE_FP16_TFLOPS * tensor / 100 * clock / MAX_CLOCK_MHZ, 3
            ),
        }

    def samples(self, k: int) -> list[GpuSample]:
        return self.samples_of(self.time_ns(k), self.round(k))

    def samples_of(self, t: int, v: dict[str, np.ndarray]) -> list[GpuSample]:
        """The samples of one round whose values ``round`` returned."""
        return [
            GpuSample(
                time_ns=t,
                host=self.hosts[i],
                gpu_index=self.index[i],
                uuid=self.uuids[i],
                name=NAME,
                utilization_gpu_pct=float(v["utilization_gpu_pct"][i]),
                temperature_gpu_c=float(v["temperature_gpu_c"][i]),
                power_w=float(v["power_w"][i]),
                energy_j=float(v["energy_j"][i]),
                energy_method=EnergyMethod.COUNTER,
                sm_clock_mhz=float(v["sm_clock_mhz"][i]),
                sm_clock_max_mhz=MAX_CLOCK_MHZ,
                clock_event_reasons=int(v["clock_event_reasons"][i]),
                tensor_active_pct=float(v["tensor_active_pct"][i]),
                tensor_hmma_active_pct=float(v["tensor_hmma_active_pct"][i]),
                tflops_estimate=float(v["tflops_estimate"][i]),
                tflops_method=TflopsMethod.GPM,
                memory_used_bytes=60 * 2**30,
                job_id=self.jobs[i],
            )
            for i in range(self.gpus)
        ]


def backfill(
    store: SqliteStore,
    cluster: Cluster,
    progress: Callable[[str], None] = print,
    rounds_per_batch: int = 60,
) -> int:
    """Write every round of ``cluster`` into ``store``; returns the number of samples."""
    store.write_samples(cluster.samples(0))
    ids = {
        (h, i): gid
        for gid, h, i in store._writer.execute("SELECT id, host, gpu_index FROM gpus").fetchall()
    }
    gpu_ids = [ids[(h, i)] for h, i in zip(cluster.hosts, cluster.index, strict=True)]
    gid_array = np.array(gpu_ids, dtype=np.int64)
    # The values that do not change, and each GPU's tail (its job) as the store recorded it.
    layout = store._layout
    column = {a: 1 + i for i, a in enumerate(layout.attrs)}  # a row: lost, metrics..., tail
    base = np.full((cluster.gpus, layout.width), np.nan)
    base[:, rounds.LOST] = 0.0
    base[:, column["sm_clock_max_mhz"]] = MAX_CLOCK_MHZ
    base[:, column["memory_used_bytes"]] = 60 * 2**30
    base[:, layout.tail] = [store._states[u].tail for u in cluster.uuids]
    written, last = cluster.gpus, cluster.steps - 1
    t0 = time.perf_counter()
    next_report = 0.0
    k = 1
    while k < last:
        ks = range(k, min(k + rounds_per_batch, last))
        t_lo, t_hi = cluster.time_ns(ks[0]), cluster.time_ns(ks[-1])
        with store._lock, store._transaction(store._writer):
            for j in ks:
                vals = base.copy()
                for attr, values in cluster.round(j).items():
                    vals[:, column[attr]] = values
                store._segments.append(  # as write_samples appends a round (format 3)
                    store._writer, cluster.time_ns(j), gid_array, store._segments.rounded(vals)
                )
            store._maintain(store._writer, (t_lo, t_hi), t_lo, t_hi)
        written += len(ks) * cluster.gpus
        k = ks[-1] + 1
        if k / last >= next_report:
            rate = written / (time.perf_counter() - t0)
            progress(f"  backfill {k / last:5.0%}  {written:,} samples  {rate:,.0f}/s")
            next_report += 0.05
    store.write_samples(cluster.samples(last))
    store.flush_rollups()
    return written + cluster.gpus
