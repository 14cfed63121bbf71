"""What one GPU-sample costs the collector, beside gpustat's own query, on the same fake NVML.

Run: ``.venv/bin/python bench/collector_cost.py``

Both sides query the same simulated node (8 x H100 SXM, one compute process per GPU) through
``collector.sim.fake_nvml.FakeNvml``. The collector's figure is ``NvmlSampler.sample()`` plus
line-protocol encoding (``gpuwatt.schema.LineEncoder``), per GPU-sample, median of several runs;
the simulator's own step is outside the timed region. gpustat's ``GPUStatCollection.new_query()``
runs with the ``pynvml`` module's functions replaced by the fake's for the duration (restored
after). As shipped, gpustat sleeps 0.1 s in every query that finds processes (to measure their
CPU %); that sleep is reported, then patched out so the comparison is of query work alone.

On real hardware each NVML call is a driver ioctl of several microseconds, which neither side can
avoid; this bench measures the Python work each tool adds on top.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from nvml_fixtures import Activity, make_cluster, run_all

from collector.nvml_source import NvmlSampler
from collector.sim.fake_nvml import FakeNvml
from collector.sim.state import SimCluster
from gpuwatt.schema import LineEncoder

HOST = "node-1"
GPUS = 8
RUNS = 7
TICKS_PER_RUN = 250
GPUSTAT_QUERIES_PER_RUN = 40
TARGET_US = 30.0
BUSY = Activity(
    sm_clock_mhz=1980.0,
    power_w=650.0,
    tensor_hmma_pct=55.0,
    fp32_pct=10.0,
    nvlink_rx_bytes_per_s=100e9,
    nvlink_tx_bytes_per_s=100e9,
)


def build_cluster() -> SimCluster:
    cluster = make_cluster(GPUS, (HOST,), "H100 SXM")
    for g in cluster.gpus:
        g.processes = [(os.getpid(), 40 * 1024**3)]
        g.unsupported.add("nvmlDeviceGetFanSpeed")  # SXM boards have no fan NVML can read
        g.pcie_tx_kib_per_s = g.pcie_rx_kib_per_s = 2_000_000.0
    return cluster


def collector_us_per_gpu(include_slow: bool) -> tuple[float, list[float]]:
    cluster = build_cluster()
    sampler = NvmlSampler(FakeNvml(cluster, HOST), HOST)
    encoder = LineEncoder()
    encode_many = encoder.encode_many
    sample = sampler.sample
    sampler.open()
    try:
        for _ in range(20):  # warm up (GPM primed, encoder caches filled)
            run_all(cluster, 1.0, BUSY)
            encode_many(sample(include_slow))
        runs = []
        for _ in range(RUNS):
            spent_s = 0.0
            for _ in range(TICKS_PER_RUN):
                run_all(cluster, 1.0, BUSY)
                t0 = time.perf_counter()
                lines = encode_many(sample(include_slow))
                spent_s += time.perf_counter() - t0
            assert len(lines) == GPUS and "tflops_estimate=" in lines[0]
            runs.append(spent_s / (TICKS_PER_RUN * GPUS) * 1e6)
    finally:
        sampler.close()
    return statistics.median(runs), runs


@contextmanager
def pynvml_patched(fake: FakeNvml) -> Iterator[None]:
    """Point the pynvml module's nvml* functions at the fake's, and restore them after."""
    names = [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]
    names = [n for n in names if not isinstance(getattr(fake, n), type)]
    saved = {n: getattr(pynvml, n) for n in names if hasattr(pynvml, n)}
    for n in names:
        setattr(pynvml, n, getattr(fake, n))
    try:
        yield
    finally:
        for n in names:
            if n in saved:
                setattr(pynvml, n, saved[n])
            else:
                delattr(pynvml, n)


@contextmanager
def gpustat_sleep_removed() -> Iterator[None]:
    import gpustat.core as core

    real_time = core.time
    core.time = types.SimpleNamespace(sleep=lambda _s: None)  # only core.time.sleep is used
    try:
        yield
    finally:
        core.time = real_time


def gpustat_us_per_gpu(queries: int, runs: int) -> float:
    from gpustat.core import GPUStatCollection

    cluster = build_cluster()
    fake = FakeNvml(cluster, HOST)
    results = []
    with pynvml_patched(fake):
        for _ in range(runs):
            spent_s = 0.0
            for _ in range(queries):
                run_all(cluster, 1.0, BUSY)
                t0 = time.perf_counter()
                stats = GPUStatCollection.new_query()
                spent_s += time.perf_counter() - t0
                assert len(stats) == GPUS and stats[0].power_draw is not None
            results.append(spent_s / (queries * GPUS) * 1e6)
    return statistics.median(results)


def main() -> None:
    print(f"fake NVML: {GPUS} x H100 SXM, 1 process per GPU; median of {RUNS} runs")
    fast_us, fast_runs = collector_us_per_gpu(include_slow=False)
    slow_us, _ = collector_us_per_gpu(include_slow=True)
    print(
        "  runs (fast cadence): " + ", ".join(f"{r:.1f}" for r in fast_runs) + " us per GPU-sample"
    )
    print(f"  collector, slow-cadence tick (adds ECC + remapped rows): {slow_us:.1f} us per GPU")
    shipped_us = gpustat_us_per_gpu(queries=2, runs=1)
    print(f"  gpustat new_query as shipped (sleeps 0.1 s per query): {shipped_us:.0f} us per GPU")
    with gpustat_sleep_removed():
        gpustat_us = gpustat_us_per_gpu(GPUSTAT_QUERIES_PER_RUN, RUNS)
    print()
    print(f"collector: {fast_us:.1f} us per GPU-sample (target <= {TARGET_US:.0f} us)")
    print(f"gpustat new_query: {gpustat_us:.1f} us per GPU (its 0.1 s sleep removed)")
    print(f"ratio Y/X: {gpustat_us / fast_us:.2f}")


if __name__ == "__main__":
    main()
