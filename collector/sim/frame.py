"""The simulated cluster read straight into an analysis frame, without NVML or a store.

What ``gpuwatt.analytics.analyze`` needs, one row per GPU and second, as NVML would answer it
(integer utilisation and temperature, the energy counter in J, tensor activity from the GPM
counters' deltas). The detection benchmark and tests use it to run many scenarios quickly; the
full path (fake NVML, sampler, store) is exercised by ``bench/detect.py --pipeline``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwatt.collector.sim.scenario import Scenario
from gpuwatt.collector.sim.simulator import Simulator

NS = 1_000_000_000


def sample_frame(scenario: Scenario, duration_s: float, start_ns: int) -> pd.DataFrame:
    """The simulator's GPU states every second as analysis rows (what NVML would answer)."""
    sim = Simulator(scenario, start_time_s=start_ns / NS)
    gpus = sim.gpus
    n, steps = len(gpus), int(duration_s)
    cols = {
        k: np.empty((steps, n))
        for k in ("util", "mem", "temp", "power", "energy", "clock", "reasons", "tensor", "procs")
    }
    prev = np.array([g.tensor_hmma_active_s for g in gpus])
    for t in range(steps):
        sim.advance_to(start_ns / NS + t + 1)
        hm = np.array([g.tensor_hmma_active_s for g in gpus])
        cols["tensor"][t] = (hm - prev) * 100.0
        prev = hm
        cols["util"][t] = [g.utilization_gpu_pct for g in gpus]
        cols["mem"][t] = [g.memory_used_bytes for g in gpus]
        cols["temp"][t] = [g.temperature_c for g in gpus]
        cols["power"][t] = [g.power_w for g in gpus]
        cols["energy"][t] = [g.energy_mj / 1000.0 for g in gpus]
        cols["clock"][t] = [g.sm_clock_mhz for g in gpus]
        cols["reasons"][t] = [g.clock_event_reasons for g in gpus]
        cols["procs"][t] = [len(g.processes) for g in gpus]
    times = start_ns + (np.arange(steps, dtype=np.int64) + 1) * NS
    return pd.DataFrame(
        {
            "time_ns": np.repeat(times, n),
            "host": np.tile([g.host for g in gpus], steps),
            "gpu_index": np.tile([g.index for g in gpus], steps),
            "uuid": np.tile([g.uuid for g in gpus], steps),
            "name": np.tile([g.name for g in gpus], steps),
            "utilization_gpu_pct": np.round(cols["util"].ravel()),  # NVML gives integers
            "memory_used_bytes": cols["mem"].ravel(),
            "temperature_gpu_c": np.round(cols["temp"].ravel()),
            "power_w": cols["power"].ravel(),
            "energy_j": cols["energy"].ravel(),
            "sm_clock_mhz": cols["clock"].ravel(),
            "clock_event_reasons": cols["reasons"].ravel(),
            "tensor_active_pct": cols["tensor"].ravel(),
            "tensor_hmma_active_pct": cols["tensor"].ravel(),
            "process_count": cols["procs"].ravel(),
        }
    )


def attach_jobs(frame: pd.DataFrame, scenario: Scenario, start_ns: int) -> pd.DataFrame:
    """The simulator's own job resolver: the scenario's job on each GPU at each sample time."""
    job = np.full(len(frame), None, dtype=object)
    t_s = (frame["time_ns"].to_numpy() - start_ns) / NS
    hosts = frame["host"].to_numpy()
    idx = frame["gpu_index"].to_numpy()
    for j in scenario.jobs:
        on = np.zeros(len(frame), dtype=bool)
        for h, i in j.gpus:
            on |= (hosts == h) & (idx == i)
        on &= t_s >= j.start_s
        if j.end_s is not None:
            on &= t_s < j.end_s
        job[on] = j.id
    return frame.assign(job_id=job)
