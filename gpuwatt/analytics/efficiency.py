"""Achieved TFLOPS and TFLOPS per watt, with the quality of every figure.

Per row, the achieved TFLOPS is taken from the collector's ``tflops_estimate`` when present, else
computed from the GPM pipe-activity columns and the GPU table (``gpuwatt.tflops``'s formula,
vectorised): sum over pipes of activity x dense peak x (SM clock / the clock the peak is quoted
at). A GPU without GPM counters (older than Hopper) gets no figure and the reason, never a number
made up from utilisation. TFLOPS/W divides by the power of the same GPUs only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwatt.analytics.quality import Quality
from gpuwatt.analytics.windows import model_codes
from gpuwatt.gpu_specs import TENSOR_PRECISIONS, GpuSpec, lookup

SRC_NONE = 0
SRC_GPM = 1
SRC_UPPER_BOUND = 2

_PIPES: tuple[str, ...] = (
    "tensor_hmma_active_pct",
    "tensor_dfma_active_pct",
    "fp64_active_pct",
    "fp32_active_pct",
    "fp16_active_pct",
)


def _peaks(spec: GpuSpec, precision: str) -> tuple[float, ...]:
    return (
        spec.tensor_peak_tflops(precision) or 0.0,
        spec.fp64_tensor_tflops or 0.0,
        spec.fp64_tflops or 0.0,
        spec.fp32_tflops or 0.0,
        spec.fp16_tflops or 0.0,
    )


def absent_reason(name: str, spec: GpuSpec | None) -> str:
    if not name:
        return "no GPU model name in the data: no peak throughput known"
    if spec is None:
        return f"unknown GPU model {name!r}: no peak throughput in the GPU table"
    if not spec.has_gpm:
        return f"{spec.model} ({spec.architecture}) has no GPM tensor counters"
    return "no GPM pipe activity in the data (not sampled)"


def pipe_tflops(block: pd.DataFrame, spec: GpuSpec, precision: str) -> np.ndarray:
    """Vectorised ``tflops.estimate_tflops_from_pipes`` over the rows of one GPU model."""
    n = len(block)
    total = np.zeros(n)
    any_measured = np.zeros(n, dtype=bool)
    clk = (
        block["sm_clock_mhz"].to_numpy(dtype=float)
        if "sm_clock_mhz" in block.columns
        else np.full(n, np.nan)
    )
    for col, peak in zip(_PIPES, _peaks(spec, precision), strict=True):
        if col not in block.columns:
            continue
        pct = block[col].to_numpy(dtype=float)
        fin = np.isfinite(pct)
        any_measured |= fin
        at_mhz = spec.hmma_clock_mhz if col == "tensor_hmma_active_pct" else spec.peak_clock_mhz
        ratio = np.where(np.isfinite(clk), clk / at_mhz, 1.0)
        total += np.where(fin, pct, 0.0) / 100.0 * peak * ratio
    return np.where(any_measured, total, np.nan)


def add_row_tflops(rows: pd.DataFrame, *, tensor_precision: str = "bf16") -> pd.DataFrame:
    """Add ``tflops`` (NaN where unknown) and ``tflops_src`` (SRC_*) to the rows."""
    if tensor_precision not in TENSOR_PRECISIONS:
        raise ValueError(f"tensor_precision must be one of {TENSOR_PRECISIONS}")
    n = len(rows)
    tflops = np.full(n, np.nan)
    src = np.full(n, SRC_NONE, dtype=np.int8)
    # one model per code: comparing every row's name string per model cost ~5 ms at 1,024 GPUs
    codes_of_models, models = model_codes(rows)
    one_model = len(models) == 1 and bool((codes_of_models == 0).all())  # no name: -1
    for k, name in enumerate(models):
        idx = np.arange(n) if one_model else np.flatnonzero(codes_of_models == k)
        spec = lookup(name)
        vals = np.full(len(idx), np.nan)
        codes = np.full(len(idx), SRC_NONE, dtype=np.int8)
        if "tflops_estimate" in rows.columns:
            est = rows["tflops_estimate"].to_numpy(dtype=float)[idx]
            fin = np.isfinite(est)
            vals = np.where(fin, est, vals)
            if "tflops_method" in rows.columns:
                ub = (
                    (rows["tflops_method"].astype(str).to_numpy()[idx]) == "sm_activity_upper_bound"
                )
            else:
                ub = np.full(len(idx), spec is not None and not spec.has_gpm)
            codes[fin] = np.where(ub[fin], SRC_UPPER_BOUND, SRC_GPM)
        if spec is not None and spec.has_gpm:
            computed = pipe_tflops(rows.iloc[idx] if len(idx) < n else rows, spec, tensor_precision)
            fill = ~np.isfinite(vals) & np.isfinite(computed)
            vals = np.where(fill, computed, vals)
            codes[fill] = SRC_GPM
        tflops[idx] = vals
        src[idx] = codes
    rows["tflops"] = tflops
    rows["tflops_src"] = src
    # upper bounds are kept apart: they are not achieved work
    rows["tflops_gpm"] = np.where(src == SRC_GPM, tflops, np.nan)
    return rows


def gpu_tflops_quality(rows: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: the quality of its TFLOPS figure and, when absent, why."""
    codes = rows["gpu_code"].to_numpy()
    n = int(codes.max()) + 1 if len(codes) else 0
    src = rows["tflops_src"].to_numpy()
    gpm = np.bincount(codes, weights=src == SRC_GPM, minlength=n) > 0
    ub = np.bincount(codes, weights=src == SRC_UPPER_BOUND, minlength=n) > 0
    last = np.zeros(n, dtype=np.int64)
    np.maximum.at(last, codes, np.arange(len(codes), dtype=np.int64))
    # as ``model_codes`` reads them: text, a missing name none
    names = ["" if pd.isna(n) else str(n) for n in rows["name"].to_numpy(dtype=object)[last]]
    quality, reason = [], []
    for name, g, u in zip(names, gpm, ub, strict=True):
        if g:
            quality.append(Quality.GPM_ESTIMATE.value)
            reason.append("")
        elif u:
            quality.append(Quality.UPPER_BOUND.value)
            reason.append("no pipe counters: SM activity x tensor peak, an upper bound")
        else:
            quality.append(Quality.NOT_AVAILABLE.value)
            reason.append(absent_reason(name, lookup(name)))
    return pd.DataFrame(
        {"tflops_quality": quality, "tflops_reason": reason},
        index=pd.Index(np.arange(n), name="gpu_code"),
    )


def _power(gw: pd.DataFrame) -> np.ndarray:
    if "power_w" in gw.columns:
        return gw["power_w"].to_numpy(dtype=float)
    return np.full(len(gw), np.nan)


def efficiency_over_time(gw: pd.DataFrame) -> pd.DataFrame:
    """Per window: achieved TFLOPS and power of the GPUs with a GPM estimate, and TFLOPS/W.

    ``power_w`` is the power of every GPU; ``tflops_per_w`` divides the TFLOPS by the power of
    only the GPUs that have an estimate, so GPUs without counters do not dilute it.
    """
    has = np.isfinite(gw["tflops_gpm"].to_numpy(dtype=float))
    power = (
        gw["power_w"].to_numpy(dtype=float) if "power_w" in gw.columns else np.full(len(gw), np.nan)
    )
    df = pd.DataFrame(
        {
            "window_start_ns": gw["window_start_ns"].to_numpy(),
            "tflops": np.where(has, gw["tflops_gpm"].to_numpy(dtype=float), np.nan),
            "power_w": power,
            "power_w_with_tflops": np.where(has, power, np.nan),
            "has": has,
        }
    )
    g = df.groupby("window_start_ns", sort=True)
    out = pd.DataFrame(
        {
            "tflops": g["tflops"].sum(min_count=1),
            "power_w": g["power_w"].sum(min_count=1),
            "gpus_with_tflops": g["has"].sum(),
            "gpus": g.size(),
        }
    )
    pw = g["power_w_with_tflops"].sum(min_count=1)
    out["tflops_per_w"] = out["tflops"] / pw.where(pw > 0)
    return out.reset_index()
