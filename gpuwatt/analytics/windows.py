"""Bucketing samples into analysis windows and aggregating them per GPU and window.

Windows are aligned to multiples of ``window_s`` since the epoch, so that they coincide with the
store's rollup buckets (a 1-minute rollup row falls entirely inside one 60 s window). The last
window may be partial; ``coverage`` says how much of it has data.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

NS_PER_S = 1_000_000_000

#: Gauges averaged per GPU and window (when present in the frame).
GAUGES: tuple[str, ...] = (
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_gpu_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "sm_active_pct",
    "tensor_active_pct",
    "process_count",
)

ID_COLUMNS: tuple[str, ...] = ("gpu", "host", "gpu_index", "uuid", "name")


def window_starts(time_ns: pd.Series | np.ndarray, window_s: float) -> np.ndarray:
    """The start (ns) of the epoch-aligned window each timestamp falls in."""
    w = round(window_s * NS_PER_S)
    t = np.asarray(time_ns, dtype=np.int64)
    return (t // w) * w


def _job_column(frame: pd.DataFrame, jobs: Mapping[str, str] | None) -> pd.Series:
    """Job id per row as object dtype with None for "no job" (NaN and "" count as no job)."""
    if "job_id" in frame.columns:
        col = frame["job_id"].astype(object)
        col = col.where(col.notna() & (col != ""), None)
    else:
        col = pd.Series([None] * len(frame), index=frame.index, dtype=object)
    if jobs:
        mapped = frame["uuid"].map(jobs)
        if "gpu" in frame.columns:
            mapped = mapped.fillna(frame["gpu"].map(jobs))
        col = col.where(col.notna(), mapped.astype(object))
        col = col.where(col.notna(), None)
    return col


def gpu_keys(frame: pd.DataFrame) -> pd.Series:
    """A GPU's identity: its uuid, or ``host:index`` when the uuid is unknown."""
    hi = frame["host"].astype(str) + ":" + frame["gpu_index"].astype(str)
    uuid = frame["uuid"].astype(object)
    return uuid.where(uuid.notna() & (uuid != ""), hi).astype(str)


def prepare(
    frame: pd.DataFrame,
    *,
    now_ns: int,
    window_s: float,
    start_ns: int | None = None,
    jobs: Mapping[str, str] | None = None,
    job: str | None = None,
) -> pd.DataFrame:
    """Restrict to ``[start_ns, now_ns)``, add ``gpu``, ``window_start_ns`` and ``job_id``.

    ``jobs`` maps a uuid (or ``host:index``) to a job id for rows that carry none; ``job``
    keeps only that job's GPUs. Rows are sorted by GPU then time.
    """
    t = frame["time_ns"].to_numpy(dtype=np.int64)
    keep = t < now_ns
    if start_ns is not None:
        keep &= t >= start_ns
    out = frame.loc[keep].copy()
    out["gpu"] = gpu_keys(out)
    out["job_id"] = _job_column(out, jobs)
    if job is not None:
        out = out.loc[out["job_id"] == job]
    out["window_start_ns"] = window_starts(out["time_ns"], window_s)
    for col in GAUGES:
        if col in out.columns:
            out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    out = out.sort_values(["gpu", "time_ns"], kind="stable").reset_index(drop=True)
    return out


def per_gpu_window(
    rows: pd.DataFrame, *, sums: tuple[str, ...] = (), means: tuple[str, ...] = ()
) -> pd.DataFrame:
    """One row per (window, GPU): gauge means, ``samples``, sums of ``sums`` columns, the job.

    Columns starting with ``frac_`` (per-row 0/1/NaN flags) are averaged into fractions, as are
    the GAUGES and ``means`` present in the rows.
    """
    keys = ["window_start_ns", "gpu"]
    means_ = [c for c in rows.columns if c in GAUGES or c in means or c.startswith("frac_")]
    g = rows.groupby(keys, sort=True, observed=True)
    out = g[means_].mean() if means_ else g.size().to_frame("samples")[[]]
    out["samples"] = g.size()
    for col in sums:
        if col in rows.columns:
            out[col] = g[col].sum(min_count=1)
    ids = g[["host", "gpu_index", "uuid", "name", "job_id"]].last()
    out = out.join(ids)
    return out.reset_index()


def window_list(rows: pd.DataFrame) -> list[int]:
    return sorted(int(x) for x in pd.unique(rows["window_start_ns"]))


def run_lengths(gpus: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """For rows sorted by GPU then window: the length of the run of True flags ending at each row.

    Consecutive rows of one GPU are taken as consecutive windows (a GPU with no data in a window
    simply has no row there).
    """
    n = len(flags)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    f = np.asarray(flags, dtype=bool)
    new_gpu = np.ones(n, dtype=bool)
    new_gpu[1:] = gpus[1:] != gpus[:-1]
    breaks = new_gpu | ~f
    run_id = np.cumsum(breaks)
    counts = pd.Series(f.astype(np.int64)).groupby(run_id).cumsum().to_numpy()
    return np.where(f, counts, 0)
