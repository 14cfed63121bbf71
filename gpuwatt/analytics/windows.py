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
        # Map each distinct GPU once, then spread to its rows (not a dict lookup per row).
        codes, uniq = pd.factorize(frame["uuid"].astype(object), use_na_sentinel=False)
        mapped = np.array([jobs.get(u) for u in uniq], dtype=object)[codes]
        missing = pd.isna(mapped)
        if "gpu" in frame.columns and missing.any():
            gcodes, guniq = pd.factorize(frame["gpu"].astype(object), use_na_sentinel=False)
            by_gpu = np.array([jobs.get(g) for g in guniq], dtype=object)[gcodes]
            mapped = np.where(missing, by_gpu, mapped)
        col = col.where(col.notna(), pd.Series(mapped, index=frame.index, dtype=object))
        col = col.where(col.notna(), None)
    return col


def gpu_keys(frame: pd.DataFrame) -> pd.Series:
    """A GPU's identity: its uuid, or ``host:index`` when the uuid is unknown.

    Computed once per distinct (host, index, uuid) and spread to the rows: string work per row
    was most of ``prepare``'s time at 1,000 GPUs.
    """
    if frame.empty:
        return pd.Series([], index=frame.index, dtype=str)
    hcodes, hosts = pd.factorize(frame["host"].astype(object), use_na_sentinel=False)
    ucodes, uuids = pd.factorize(frame["uuid"].astype(object), use_na_sentinel=False)
    icodes, indexes = pd.factorize(frame["gpu_index"], use_na_sentinel=False)
    key = (hcodes.astype(np.int64) * len(indexes) + icodes) * len(uuids) + ucodes
    uniq, inverse = np.unique(key, return_inverse=True)
    u_code = uniq % len(uuids)
    rest = uniq // len(uuids)
    h_code, i_code = rest // len(indexes), rest % len(indexes)
    names = []
    for h, i, u in zip(h_code.tolist(), i_code.tolist(), u_code.tolist(), strict=True):
        uuid = uuids[u]
        if isinstance(uuid, str) and uuid != "":
            names.append(uuid)
        else:
            names.append(f"{hosts[h]}:{indexes[i]}")
    return pd.Series(np.array(names, dtype=object)[inverse], index=frame.index).astype(str)


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
    codes, _ = pd.factorize(out["gpu"], sort=True)
    out["gpu_code"] = codes.astype(np.int64)  # integer identity: cheap to sort and group by
    out = out.sort_values(["gpu_code", "time_ns"], kind="stable").reset_index(drop=True)
    return out


def per_gpu_window(
    rows: pd.DataFrame, *, sums: tuple[str, ...] = (), means: tuple[str, ...] = ()
) -> pd.DataFrame:
    """One row per (window, GPU): gauge means, ``samples``, sums of ``sums`` columns, the job.

    Columns starting with ``frac_`` (per-row 0/1/NaN flags) are averaged into fractions, as are
    the GAUGES and ``means`` present in the rows. Means skip NaN; a sum with no value is NaN.
    Rows must be sorted by GPU then time (as ``prepare`` leaves them); the identity and job of a
    (window, GPU) are those of its newest row. Integer keys and ``bincount`` keep this fast.
    """
    n = len(rows)
    gcodes = rows["gpu_code"].to_numpy(dtype=np.int64)
    w = rows["window_start_ns"].to_numpy(dtype=np.int64)
    wcodes, wuniq = pd.factorize(w, sort=True)
    n_gpu = int(gcodes.max()) + 1 if n else 0
    key = wcodes.astype(np.int64) * max(n_gpu, 1) + gcodes
    uniq, inv = np.unique(key, return_inverse=True)
    m = len(uniq)
    last = np.zeros(m, dtype=np.int64)
    np.maximum.at(last, inv, np.arange(n, dtype=np.int64))
    out = rows[["gpu", "gpu_code", "host", "gpu_index", "uuid", "name", "job_id"]].iloc[last]
    out = out.reset_index(drop=True)
    out.insert(0, "window_start_ns", np.asarray(wuniq, dtype=np.int64)[uniq // max(n_gpu, 1)])
    cols: dict[str, np.ndarray] = {}
    mean_cols = [c for c in rows.columns if c in GAUGES or c in means or c.startswith("frac_")]
    for col in mean_cols:
        v = rows[col].to_numpy(dtype=float)
        ok = np.isfinite(v)
        cnt = np.bincount(inv, weights=ok, minlength=m)
        tot = np.bincount(inv, weights=np.where(ok, v, 0.0), minlength=m)
        with np.errstate(divide="ignore", invalid="ignore"):
            cols[col] = np.where(cnt > 0, tot / cnt, np.nan)
    cols["samples"] = np.bincount(inv, minlength=m)
    for col in sums:
        if col in rows.columns:
            v = rows[col].to_numpy(dtype=float)
            ok = np.isfinite(v)
            cnt = np.bincount(inv, weights=ok, minlength=m)
            tot = np.bincount(inv, weights=np.where(ok, v, 0.0), minlength=m)
            cols[col] = np.where(cnt > 0, tot, np.nan)
    return pd.concat([out, pd.DataFrame(cols)], axis=1)


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
