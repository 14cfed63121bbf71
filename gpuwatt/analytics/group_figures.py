"""Per GPU, per node and per job figures from the per (window, GPU) table: identity, energy
sums, seen, idle and straggler time, seen-weighted utilisation and the worst energy quality."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuwatt.analytics.energy import Tariff, add_cost_columns
from gpuwatt.analytics.quality import Quality
from gpuwatt.analytics.windows import label_codes, sorted_unique

#: Energy qualities, worst first: a node or job takes the worst of its GPUs.
QUALITY_ORDER: tuple[str, ...] = (
    Quality.NOT_AVAILABLE.value,
    Quality.INTEGRATED_POWER.value,
    Quality.MODEL_ESTIMATE.value,  # a MIG device's share of its parent's measured energy
    Quality.MEASURED_COUNTER.value,
)


def nanmean_by(codes: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    ok = np.isfinite(v)
    cnt = np.bincount(codes, weights=ok, minlength=n)
    tot = np.bincount(codes, weights=np.where(ok, v, 0.0), minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cnt > 0, tot / cnt, np.nan)


def seen_mean_by(codes: np.ndarray, v: np.ndarray, seen_s: np.ndarray, n: int) -> np.ndarray:
    """Means weighted by seen time (docs/accounting.md, "Utilisation")."""
    ok = np.isfinite(v) & (seen_s > 0)
    w = np.where(ok, seen_s, 0.0)
    tot = np.bincount(codes, weights=np.where(ok, v * w, 0.0), minlength=n)
    den = np.bincount(codes, weights=w, minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, tot / den, np.nan)


def nansum_by(codes: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    ok = np.isfinite(v)
    cnt = np.bincount(codes, weights=ok, minlength=n)
    tot = np.bincount(codes, weights=np.where(ok, v, 0.0), minlength=n)
    return np.where(cnt > 0, tot, np.nan)


def by_group(gw: pd.DataFrame, key: str, per_gpu: pd.DataFrame, tariff: Tariff) -> pd.DataFrame:
    """Energy, power and utilisation per node (``host``) or per job, from the GPU windows."""
    all_codes, uniq = label_codes(gw, key)
    mig = gw["mig"].to_numpy(dtype=bool) if "mig" in gw else np.zeros(len(gw), dtype=bool)
    keep = all_codes >= 0
    if key == "host":
        keep &= ~mig  # a node's figures are its whole GPUs' (the parent measures its devices)
    if not keep.any():
        return pd.DataFrame(
            columns=[key, "gpus", "mig_devices", "energy_j", "idle_energy_j", "energy_quality"]
        )
    codes = all_codes[keep]
    n = len(uniq)
    gcode = gw["gpu_code"].to_numpy(dtype=np.int64)[keep]
    n_gpu = int(gw["gpu_code"].max()) + 1
    pairs, _ = sorted_unique(codes * n_gpu + gcode)
    # MIG devices counted apart: for a node all of them, for a job those it ran on
    m_keep = (all_codes >= 0) & mig
    m_pairs, _ = sorted_unique(all_codes[m_keep] * n_gpu + gw["gpu_code"].to_numpy()[m_keep])
    is_mig_gpu = np.zeros(n_gpu, dtype=bool)
    is_mig_gpu[gw["gpu_code"].to_numpy()[mig]] = True
    whole = pairs[~is_mig_gpu[pairs % n_gpu]]
    # GPU time: a MIG device's seen time counts by its share of the GPU (GPU-hours add up)
    share = gw["gpu_share"].to_numpy(dtype=float)[keep] if "gpu_share" in gw else 1.0

    def values(c: str) -> np.ndarray:
        return gw[c].to_numpy(dtype=float)[keep]

    def gpu_time(c: str) -> np.ndarray:
        return np.bincount(codes, weights=values(c) * share, minlength=n)

    col = {c: values(c) for c in ("power_w", "utilization_gpu_pct") if c in gw}
    out = pd.DataFrame(
        {
            key: np.asarray(uniq, dtype=object),
            "gpus": np.bincount(whole // n_gpu, minlength=n),
            "mig_devices": np.bincount(m_pairs // n_gpu, minlength=n),
            "energy_j": nansum_by(codes, values("energy_delta_j"), n),
            "idle_energy_j": nansum_by(codes, values("idle_energy_j"), n),
            "seen_s": gpu_time("seen_s"),
            "idle_s": gpu_time("idle_s"),
            "straggler_s": gpu_time("straggler_s"),
            "power_mean_w": nanmean_by(codes, col["power_w"], n) if "power_w" in col else np.nan,
            "utilization_mean_pct": seen_mean_by(
                codes, col["utilization_gpu_pct"], values("seen_s"), n
            )
            if "utilization_gpu_pct" in col
            else np.nan,
        }
    )
    rank = {q: i for i, q in enumerate(QUALITY_ORDER)}
    gpu_rank = np.full(n_gpu, len(QUALITY_ORDER) - 1, dtype=np.int64)
    qualities = per_gpu["energy_quality"].to_numpy(dtype=object)  # iterating a Series is slow
    gpu_rank[per_gpu["gpu_code"].to_numpy()] = [rank[q] for q in qualities]
    worst_rank = np.full(n, len(QUALITY_ORDER) - 1, dtype=np.int64)
    np.minimum.at(worst_rank, pairs // n_gpu, gpu_rank[pairs % n_gpu])
    out["energy_quality"] = [QUALITY_ORDER[r] for r in worst_rank]
    return add_cost_columns(out, tariff)


def per_gpu_figures(gw: pd.DataFrame) -> pd.DataFrame:
    """Per GPU (indexed by ``gpu_code``, sorted): its identity and job as ``groupby.last()``
    gives them, energy sums, idle windows and the means of power, utilisation and TFLOPS."""
    codes = gw["gpu_code"].to_numpy(dtype=np.int64)
    newest = newest_rows(codes, np.ones(len(codes), dtype=bool))
    present = np.flatnonzero(newest >= 0)
    index = pd.Index(present, name="gpu_code")
    cols: dict[str, object] = {"gpu_code": present}
    for c in ("gpu", "host", "gpu_index", "uuid", "name", "job_id"):
        values = newest_valid(gw[c], codes, newest[present], present)
        cols[c] = pd.Series(values, index=index, dtype=gw[c].dtype)  # object stays object
    g = gw.groupby("gpu_code", sort=True)
    sums = g[["energy_delta_j", "idle_energy_j"]].sum(min_count=1)
    seen_cols = [c for c in ("seen_s", "idle_s", "straggler_s") if c in gw]
    seen = g[seen_cols].sum() if seen_cols else pd.DataFrame(index=sums.index)
    mean_of = {"power_w": "power_mean_w", "utilization_gpu_pct": "utilization_mean_pct"}
    means = g[[c for c in (*mean_of, "tflops_gpm") if c in gw]].mean()
    cols["energy_j"] = sums["energy_delta_j"].to_numpy()
    cols["idle_energy_j"] = sums["idle_energy_j"].to_numpy()
    cols["idle_windows"] = g["idle"].sum().to_numpy()
    for c in ("seen_s", "idle_s", "straggler_s"):
        cols[c] = seen[c].to_numpy() if c in seen else np.nan
    for c, name in mean_of.items():
        cols[name] = means[c].to_numpy() if c in means else np.nan
    if "utilization_gpu_pct" in gw and "seen_s" in gw:
        n = int(codes.max()) + 1
        util = seen_mean_by(codes, gw["utilization_gpu_pct"].to_numpy(dtype=float),
                             gw["seen_s"].to_numpy(dtype=float), n)  # fmt: skip
        cols["utilization_mean_pct"] = util[present]
    cols["tflops_mean"] = means["tflops_gpm"].to_numpy()
    return pd.DataFrame(cols, index=index)


def newest_rows(codes: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Per GPU code: the position of its newest row where ``ok`` (rows in time order), or -1."""
    newest = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
    np.maximum.at(newest, codes[ok], np.flatnonzero(ok))
    return newest


def newest_valid(col: pd.Series, codes: np.ndarray, rows: np.ndarray, present: np.ndarray) -> Any:
    """``col``'s newest non-missing value per GPU, as ``groupby.last()``: the value of its newest
    row (``rows``) unless missing; only then is the column searched for the newest value.
    Taking one row per GPU avoids testing the strings of every row for missing values."""
    values = col.array.take(rows)
    if not pd.isna(values).any():
        return values
    at = newest_rows(codes, col.notna().to_numpy())[present]
    if col.dtype != object:
        return col.array.take(at, allow_fill=True)
    out = np.asarray(col.array.take(np.maximum(at, 0)), dtype=object)
    out[at < 0] = None  # ``last()`` of object values all missing is None
    return out
