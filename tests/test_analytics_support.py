"""Synthetic sample frames for the analytics tests (no tests here: a helper module)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

NS = 1_000_000_000
T0_NS = 1_700_000_040 * NS  # a multiple of 60 s
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def cluster_frame(
    *,
    hosts: int = 2,
    gpus: int = 4,
    duration_s: int = 900,
    step_s: int = 1,
    name: str = H100,
    jobs: Sequence[str | None] | None = None,
    util_pct: float | Sequence[float] = 95.0,
    power_w: float = 600.0,
    clock_mhz: float = 1980.0,
    temperature_c: float = 65.0,
    reasons: int = 0x4,
    tensor_pct: float = 60.0,
    memory_bytes: float = 40 * 2**30,
    seed: int = 0,
) -> pd.DataFrame:
    """``hosts`` x ``gpus`` GPUs sampled every ``step_s`` for ``duration_s`` from ``T0_NS``.

    ``jobs`` gives the job of each GPU in order (host-major); ``util_pct`` one value or one per
    GPU. Power scales with utilisation; the energy counter integrates power exactly.
    """
    rng = np.random.default_rng(seed)
    n_gpu = hosts * gpus
    n_t = duration_s // step_s
    t = T0_NS + np.arange(n_t, dtype=np.int64) * step_s * NS
    utils = np.broadcast_to(np.asarray(util_pct, dtype=float), (n_gpu,))
    frames = []
    for k in range(n_gpu):
        h, i = divmod(k, gpus)
        u = np.clip(utils[k] + rng.normal(0, 1.0, n_t), 0, 100)
        p = 80.0 + (power_w - 80.0) * u / 100.0
        df = pd.DataFrame(
            {
                "time_ns": t,
                "host": f"node-{h}",
                "gpu_index": i,
                "uuid": f"GPU-{h:02d}-{i:02d}",
                "name": name,
                "utilization_gpu_pct": u,
                "power_w": p,
                "temperature_gpu_c": temperature_c + rng.normal(0, 0.5, n_t),
                "sm_clock_mhz": np.full(n_t, clock_mhz),
                "clock_event_reasons": np.full(n_t, float(reasons if utils[k] > 50 else 0)),
                "tensor_active_pct": tensor_pct * u / 100.0,
                "tensor_hmma_active_pct": tensor_pct * u / 100.0,
                "memory_used_bytes": np.full(n_t, memory_bytes),
                "job_id": (jobs[k] if jobs is not None else None),
            }
        )
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    return with_energy_counter(out)


def with_energy_counter(frame: pd.DataFrame, start_j: float = 1e6) -> pd.DataFrame:
    """Set ``energy_j`` to the exact (trapezoid) integral of ``power_w`` per GPU."""
    frame = frame.sort_values(["uuid", "time_ns"]).reset_index(drop=True)
    out = np.empty(len(frame))
    for _, idx in frame.groupby("uuid").indices.items():
        t = frame["time_ns"].to_numpy()[idx] / NS
        p = frame["power_w"].to_numpy()[idx]
        inc = np.concatenate([[0.0], (p[1:] + p[:-1]) / 2 * np.diff(t)])
        out[idx] = start_j + np.cumsum(inc)
    frame["energy_j"] = out
    return frame


def straggle(
    frame: pd.DataFrame,
    uuid: str,
    *,
    onset_s: float,
    clock_mhz: float,
    reasons: int,
    temperature_c: float | None = None,
    power_w: float | None = None,
    util_pct: float | None = None,
    peers_util_pct: float | None = None,
    peers: Sequence[str] = (),
) -> pd.DataFrame:
    """Make ``uuid`` slow from ``onset_s``; optionally make ``peers`` wait (synchronous job)."""
    f = frame.copy()
    after = f["time_ns"] >= T0_NS + int(onset_s * NS)
    me = after & (f["uuid"] == uuid)
    f.loc[me, "sm_clock_mhz"] = clock_mhz
    f.loc[me, "clock_event_reasons"] = float(reasons)
    if temperature_c is not None:
        f.loc[me, "temperature_gpu_c"] = temperature_c
    if util_pct is not None:
        f.loc[me, "utilization_gpu_pct"] = util_pct
    if power_w is not None:
        f.loc[me, "power_w"] = power_w
    if peers_util_pct is not None:
        them = after & f["uuid"].isin(list(peers))
        f.loc[them, "utilization_gpu_pct"] = peers_util_pct
        f.loc[them, "tensor_active_pct"] = f.loc[them, "tensor_active_pct"] * peers_util_pct / 95
        f.loc[them, "power_w"] = 80.0 + 520.0 * peers_util_pct / 100.0
    return with_energy_counter(f)


def rollup(frame: pd.DataFrame, step_s: int = 60) -> pd.DataFrame:
    """What ``store.series(step_s=60)`` returns: bucket means, last value for counters."""
    f = frame.copy()
    f["time_ns"] = (f["time_ns"] // (step_s * NS)) * step_s * NS
    keys = ["time_ns", "host", "gpu_index", "uuid", "name"]
    last = ("energy_j", "job_id", "clock_event_reasons")  # the SQLite store keeps these last
    gauges = [c for c in f.columns if c not in keys and c not in last]
    g = f.groupby(keys, sort=True)
    out = g[gauges].mean()
    out["energy_j"] = g["energy_j"].last()
    out["clock_event_reasons"] = g["clock_event_reasons"].last()
    if "job_id" in f.columns:
        out["job_id"] = g["job_id"].last()
    return out.reset_index()
