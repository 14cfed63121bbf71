"""Application-reported work: a job's own TFLOPS and MFU beside the GPU-counter estimate.

Input: the job steps a training job reported (``schema.JOB_STEP_COLUMNS``; see ``gpuwatt.work``)
and the per-(window, GPU) frame ``analyze`` builds (``AnalysisSummary.gpu_windows``:
``window_start_ns``, ``job_id``, ``uuid``, ``host``, ``gpu_index``, ``name``, ``tflops_gpm``).

Per job and window:

- ``reported_tflops`` = sum of ``model_flops_per_step`` / sum of ``step_time_s`` of the steps that
  ended in the window, 1e-12. ``model_flops_per_step`` is the job's total over all ranks, so a step
  reported by several ranks is counted once (its longest ``step_time_s``).
- the job's GPUs: those the collector attributes to the job in that window; where it attributes
  none, the GPUs the ranks reported (``gpu_uuids``: UUIDs or ``host:index``) found in the samples
  (which covers only the ranks that report: without collector job attribution, report from every
  rank).
- ``coverage``: the reported step time over the analysed part of the window; the counter
  comparison uses only windows covered at least ``MIN_COVERAGE``.
- ``peak_tflops``: the sum of those GPUs' dense tensor peaks for the job's reported precision
  (``gpuwatt.gpu_specs``; else the analysis' ``tensor_precision``), at the quoted boost clock.
- ``mfu_pct`` = 100 x reported / peak (PaLM's model FLOPs utilisation).
- ``counter_tflops``: the sum of the same GPUs' GPM estimates (``tflops_gpm``), and
  ``counter_ratio`` = counters / reported. Counters see hardware FLOPs (recomputation, padding,
  the optimizer) that model FLOPs leave out, so a ratio a little above 1 is expected; far from 1
  means the reported FLOPs formula, the precision or the GPU attribution is off.

Per job over the analysed range the same figures are step-time weighted over the windows that
have them. Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.analytics.quality import Figure, Quality, not_available
from gpuwatt.analytics.windows import window_starts
from gpuwatt.gpu_specs import TENSOR_PRECISIONS, lookup
from gpuwatt.precision import fixed

#: Columns of ``AnalysisSummary.job_work_windows``.
WINDOW_COLUMNS: tuple[str, ...] = (
    "job_id",
    "window_start_ns",
    "steps",
    "step_time_mean_s",
    "reported_tflops",
    "precision",
    "gpus",
    "gpus_source",
    "peak_tflops",
    "mfu_pct",
    "coverage",
    "counter_tflops",
    "counter_ratio",
)

#: Windows whose reported steps cover less than this share of the window (the job started or
#: stopped in it, or stopped reporting) are left out of the counter comparison: the counters
#: average the whole window.
MIN_COVERAGE = 0.9

SOURCE_COLLECTOR = "collector job attribution"
SOURCE_REPORTED = "GPUs reported by the job"


@dataclass(frozen=True, slots=True)
class JobWork:
    """A job's reported work over the analysed range, beside the counter estimate."""

    job_id: str
    steps: int
    step_time_mean_s: float
    precision: str
    gpus: int
    gpus_source: str  # SOURCE_COLLECTOR | SOURCE_REPORTED | "" (unknown)
    reported_tflops: Figure  # quality REPORTED
    mfu_pct: Figure  # quality REPORTED, or not available with the reason
    counter_tflops: Figure  # quality GPM_ESTIMATE, or not available with the reason
    counter_ratio: float | None  # counter / reported over the same windows

    def line(self) -> str:
        """``job X: 412 TFLOPS reported (MFU 41.6 %), counters estimate 455 TFLOPS (x1.10)``."""
        r = self.reported_tflops
        if r.value is None:
            return f"job {self.job_id}: {self.steps} steps reported, no FLOPs ({r.reason})"
        mfu = (
            f"MFU {fixed(self.mfu_pct.value, 1)} %"
            if self.mfu_pct.value is not None
            else f"MFU n/a: {self.mfu_pct.reason}"
        )
        c = self.counter_tflops
        if c.value is not None and self.counter_ratio is not None:
            counters = (
                f"counters estimate {fixed(c.value)} TFLOPS (x{fixed(self.counter_ratio, 2)})"
            )
        else:
            counters = f"counters estimate n/a ({c.reason})"
        return f"job {self.job_id}: {fixed(r.value)} TFLOPS reported ({mfu}), {counters}"


def _gpu_keys(gw: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    uuid = gw["uuid"].astype(str).to_numpy()
    hi = (gw["host"].astype(str) + ":" + gw["gpu_index"].astype(str)).to_numpy()
    return uuid, hi


def _dedupe(steps: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """One row per (job, window, step): the longest step time and the largest FLOPs reported."""
    df = steps.loc[np.isfinite(steps["step_time_s"].to_numpy(dtype=float))]
    df = df.loc[df["step_time_s"] > 0].copy()
    df["window_start_ns"] = window_starts(df["time_ns"], window_s)
    prec = df["precision"] if "precision" in df.columns else pd.Series(None, index=df.index)
    df["precision"] = prec.astype(object).where(prec.notna() & (prec != ""), None)
    g = df.groupby(["job_id", "window_start_ns", "step"], sort=True)
    return g.agg(
        step_time_s=("step_time_s", "max"),
        model_flops_per_step=("model_flops_per_step", "max"),
        precision=("precision", "first"),
    ).reset_index()


def _reported_keys(steps: pd.DataFrame, job: str) -> set[str]:
    if "gpu_uuids" not in steps.columns:
        return set()
    texts = steps.loc[steps["job_id"] == job, "gpu_uuids"].dropna().astype(str)
    return {k for text in pd.unique(texts) for k in text.split(",") if k}


def _job_windows(
    job: str,
    ds: pd.DataFrame,
    gw: pd.DataFrame,
    keys: tuple[np.ndarray, np.ndarray],
    reported: set[str],
    default_precision: str,
    span: tuple[float, int | None, int | None],
) -> tuple[pd.DataFrame, str]:
    """The per-window rows of one job, and its precision."""
    precs = ds["precision"].dropna()
    precision = str(precs.mode().iloc[0]) if len(precs) else default_precision
    flops = ds["model_flops_per_step"].to_numpy(dtype=float)
    has_flops = np.isfinite(flops)
    work = pd.DataFrame(
        {
            "window_start_ns": ds["window_start_ns"].to_numpy(),
            "time_s": ds["step_time_s"].to_numpy(dtype=float),
            "flops": np.where(has_flops, flops, 0.0),
            "time_flops_s": np.where(has_flops, ds["step_time_s"].to_numpy(dtype=float), 0.0),
        }
    )
    w = work.groupby("window_start_ns", sort=True).agg(
        steps=("time_s", "size"),
        time_s=("time_s", "sum"),
        flops=("flops", "sum"),
        time_flops_s=("time_flops_s", "sum"),
    )
    mine = gw["job_id"].to_numpy(dtype=object) == job
    source = SOURCE_COLLECTOR
    if not mine.any() and reported:
        uuid, hi = keys
        mine = np.isin(uuid, list(reported)) | np.isin(hi, list(reported))
        source = SOURCE_REPORTED
    if not mine.any():
        source = ""
    sub = gw.loc[mine]
    names = sub["name"].astype(str)
    peak_of = {}
    for n in pd.unique(names):
        spec = lookup(n)
        peak = spec.tensor_peak_tflops(precision) if spec is not None else None
        peak_of[n] = np.nan if peak is None or precision not in TENSOR_PRECISIONS else peak
    per = pd.DataFrame(
        {
            "window_start_ns": sub["window_start_ns"].to_numpy(),
            "peak": names.map(peak_of).to_numpy(dtype=float),
            "counter": sub["tflops_gpm"].to_numpy(dtype=float)
            if "tflops_gpm" in sub.columns
            else np.full(len(sub), np.nan),
        }
    )
    g = per.groupby("window_start_ns", sort=True)
    gpus = g.size()
    peak = g["peak"].sum(min_count=1).where(g["peak"].count() == gpus)
    counter = g["counter"].sum(min_count=1).where(g["counter"].count() == gpus)
    w = w.join(pd.DataFrame({"gpus": gpus, "peak_tflops": peak, "counter_tflops": counter}))
    w["gpus"] = w["gpus"].fillna(0).astype(np.int64)
    window_s, start_ns, now_ns = span
    w0 = w.index.to_numpy(dtype=np.int64)
    lo = w0 if start_ns is None else np.maximum(w0, start_ns)
    hi = w0 + round(window_s * 1e9)
    hi = hi if now_ns is None else np.minimum(hi, now_ns)
    w["coverage"] = w["time_s"].to_numpy() / np.maximum((hi - lo) / 1e9, 1e-9)
    w["counter_tflops"] = w["counter_tflops"].where(w["coverage"] >= MIN_COVERAGE)
    with np.errstate(divide="ignore", invalid="ignore"):
        w["step_time_mean_s"] = w["time_s"] / w["steps"]
        rep = np.where(w["time_flops_s"] > 0, w["flops"] / w["time_flops_s"] / 1e12, np.nan)
        w["reported_tflops"] = rep
        w["mfu_pct"] = 100.0 * rep / w["peak_tflops"].where(w["peak_tflops"] > 0)
        w["counter_ratio"] = w["counter_tflops"] / w["reported_tflops"].where(rep > 0)
    w["job_id"] = job
    w["precision"] = precision
    w["gpus_source"] = source
    return w.reset_index(), precision


def _mfu_reason(w: pd.DataFrame, source: str, precision: str) -> str:
    if not source:
        return "the job's GPUs are unknown (no collector job attribution, no gpu_uuids reported)"
    if precision not in TENSOR_PRECISIONS:
        return f"unknown precision {precision!r} (use one of {', '.join(TENSOR_PRECISIONS)})"
    if not (w["gpus"] > 0).any():
        return "no samples of the job's GPUs in the windows with reported steps"
    return f"no {precision} tensor peak in the GPU table for some of the job's GPUs"


def _summarise(job: str, w: pd.DataFrame, steps: int, precision: str) -> JobWork:
    source = str(w["gpus_source"].iloc[0]) if len(w) else ""
    tf = w["time_flops_s"].to_numpy(dtype=float)
    fl = w["flops"].to_numpy(dtype=float)
    if tf.sum() > 0:
        reported = Figure(fl.sum() / tf.sum() / 1e12, "TFLOPS", Quality.REPORTED)
    else:
        reported = not_available("TFLOPS", "the job reports no model_flops_per_step")
    peak = w["peak_tflops"].to_numpy(dtype=float)
    ok = np.isfinite(peak) & (peak > 0) & (tf > 0)
    if ok.any():
        mfu_value = 100.0 * fl[ok].sum() / (tf[ok] * peak[ok] * 1e12).sum()
        mfu = Figure(mfu_value, "%", Quality.REPORTED)
        if mfu_value > 100.0:
            mfu = not_available(
                "%",
                f"{fixed(mfu_value)} % of the peak of the {int(w['gpus'].max())} GPUs known for "
                f"the job ({source}) is impossible: check that model_flops_per_step is the whole "
                "job's, and report from every rank or let the collector attribute jobs",
            )
    elif reported.value is None:
        mfu = not_available("%", reported.reason)
    else:
        mfu = not_available("%", _mfu_reason(w, source, precision))
    counter = w["counter_tflops"].to_numpy(dtype=float)
    okc = np.isfinite(counter) & (tf > 0)
    ratio = None
    if okc.any():
        c = float((counter[okc] * tf[okc]).sum() / tf[okc].sum())
        counter_fig = Figure(c, "TFLOPS", Quality.GPM_ESTIMATE)
        rep_same = fl[okc].sum() / tf[okc].sum() / 1e12
        ratio = c / rep_same if rep_same > 0 else None
    elif not source:
        counter_fig = not_available("TFLOPS", "the job's GPUs are unknown")
    elif not (w["coverage"] >= MIN_COVERAGE).any():
        counter_fig = not_available(
            "TFLOPS", f"no window {MIN_COVERAGE:.0%} covered by reported steps to compare with"
        )
    else:
        counter_fig = not_available("TFLOPS", "no GPM estimate for all of the job's GPUs")
    time_s = float(w["time_s"].sum())
    return JobWork(
        job_id=job,
        steps=steps,
        step_time_mean_s=time_s / steps if steps else math.nan,
        precision=precision,
        gpus=int(w["gpus"].max()) if len(w) else 0,
        gpus_source=source,
        reported_tflops=reported,
        mfu_pct=mfu,
        counter_tflops=counter_fig,
        counter_ratio=ratio,
    )


def reported_work(
    job_steps: pd.DataFrame,
    gpu_windows: pd.DataFrame,
    *,
    window_s: float,
    tensor_precision: str = "bf16",
    start_ns: int | None = None,
    now_ns: int | None = None,
) -> tuple[pd.DataFrame, list[JobWork]]:
    """Per (job, window) rows (``WINDOW_COLUMNS``) and one ``JobWork`` per job, by job id.

    ``job_steps`` should already be restricted to the analysed range ``[start_ns, now_ns)``
    and jobs; the range only clips the first and last window for ``coverage``.
    """
    empty = pd.DataFrame(columns=list(WINDOW_COLUMNS))
    if job_steps is None or job_steps.empty:
        return empty, []
    ds = _dedupe(job_steps, window_s)
    if ds.empty:
        return empty, []
    keys = _gpu_keys(gpu_windows) if len(gpu_windows) else (np.array([]), np.array([]))
    frames, out = [], []
    for job, part in ds.groupby("job_id", sort=True):
        w, precision = _job_windows(
            str(job),
            part,
            gpu_windows if len(gpu_windows) else _EMPTY_GW,
            keys,
            _reported_keys(job_steps, str(job)),
            tensor_precision,
            (window_s, start_ns, now_ns),
        )
        frames.append(w)
        out.append(_summarise(str(job), w, len(part), precision))
    windows = pd.concat(frames, ignore_index=True)[list(WINDOW_COLUMNS)]
    return windows, out


_EMPTY_GW = pd.DataFrame(
    {
        "window_start_ns": pd.Series([], dtype="int64"),
        "job_id": pd.Series([], dtype=object),
        "uuid": pd.Series([], dtype=object),
        "host": pd.Series([], dtype=object),
        "gpu_index": pd.Series([], dtype="int64"),
        "name": pd.Series([], dtype=object),
        "tflops_gpm": pd.Series([], dtype="float64"),
    }
)
