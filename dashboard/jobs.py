"""Per-job efficiency: one row per job from the analytics summary (pure; no Dash, no I/O).

GPU-hours, idle GPU-hours, mean utilisation and TFLOPS/W come from the per-(window, GPU) table
(``AnalysisSummary.gpu_windows``: a GPU counts for a job in the windows it is attributed to it);
energy, cost and CO2 are the analytics engine's own per-job figures (``energy_by_job``);
stragglers and straggler minutes from the straggler findings; reported TFLOPS and MFU from the
job's own reports (``analytics.reported.JobWork``) where it sends them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuwatt.analytics import AnalysisSummary, JobWork, Straggler
from gpuwatt.precision import fixed

#: Verdict thresholds.
LOW_UTIL_PCT = 30.0
IDLE_SHARE = 0.25
LOW_MFU_PCT = 25.0


@dataclass(frozen=True)
class JobRow:
    job_id: str
    gpus: int
    gpu_hours_h: float
    idle_gpu_hours_h: float
    energy_kwh: float
    cost: float
    co2_kg: float
    utilization_mean_pct: float
    tflops_per_w: float  # GPM estimate, NaN where not measured
    reported_tflops: float  # NaN where the job reports nothing
    mfu_pct: float
    stragglers: list[Straggler] = field(default_factory=list)
    straggler_minutes_min: float = 0.0
    peers_waiting_kwh: float = 0.0
    verdict: str = ""
    gpu_keys: list[tuple[str, int]] = field(default_factory=list)  # (host, index), natural order


def _f(value: object) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def verdict(row: JobRow) -> str:
    """One line a user can act on: the biggest efficiency problem of the job, or that it has
    none."""
    from gpuwatt.dashboard import format as fmt

    if row.stragglers:
        s = row.stragglers[0]
        more = f" (+{len(row.stragglers) - 1} more)" if len(row.stragglers) > 1 else ""
        return (
            f"Straggler {s.host} GPU {s.gpu_index}{more}: {s.cause.replace('_', ' ')} for "
            f"{fmt.minutes(row.straggler_minutes_min)}; its peers wait on it. Fix it first."
        )
    if row.gpu_hours_h > 0 and row.idle_gpu_hours_h >= IDLE_SHARE * row.gpu_hours_h:
        share = 100.0 * row.idle_gpu_hours_h / row.gpu_hours_h
        return (
            f"Idle {fixed(share)} % of its GPU-hours ({fmt.hours(row.idle_gpu_hours_h)}): "
            "release the GPUs it does not use."
        )
    if math.isfinite(row.utilization_mean_pct) and row.utilization_mean_pct < LOW_UTIL_PCT:
        return (
            f"Low utilisation ({fixed(row.utilization_mean_pct)} %): the GPUs wait on data, the "
            "CPU or the network, or the job is too small for them."
        )
    if math.isfinite(row.mfu_pct) and row.mfu_pct < LOW_MFU_PCT:
        return f"MFU {fixed(row.mfu_pct)} %: busy GPUs, but far below their peak FLOPS."
    return "Efficient: busy GPUs, no straggler, no idle GPU."


def job_rows(
    summary: AnalysisSummary,
    stragglers: Sequence[Straggler] = (),
    work: Sequence[JobWork] = (),
) -> list[JobRow]:
    """One row per job seen in the range, by job id."""
    from gpuwatt.status import natural_key

    gw = summary.gpu_windows
    if gw.empty or "job_id" not in gw.columns:
        return []
    used = {
        "job_id",
        "gpu",
        "tflops",
        "power_w",
        "host",
        "gpu_index",
        "idle",
        "utilization_gpu_pct",
    }
    gw = gw.loc[
        gw["job_id"].notna() & (gw["job_id"].astype(str) != ""), [c for c in gw if c in used]
    ]
    if gw.empty:
        return []
    window_h = summary.window_s / 3600.0
    energy = summary.energy_by_job.set_index("job_id") if not summary.energy_by_job.empty else None
    sw = summary.straggler_windows
    flagged = (
        sw.loc[sw["flagged"].astype(bool)]
        if not sw.empty and "flagged" in sw.columns
        else pd.DataFrame(columns=["job_id", "gpu", "window_start_ns"])
    )
    by_work = {w.job_id: w for w in work}
    # jobs and GPUs as integer codes (jobs in sorted order), the rows of a job and of its GPUs
    # as slices: grouping 60,000 (window, GPU) rows by their strings, and copies of the table
    # per job, were ~40 ms at 1,024 GPUs x 1 h
    job_code, jobs = pd.factorize(gw["job_id"].astype(str), sort=True)
    gpu_code, _ = pd.factorize(gw["gpu"])
    # one aggregation for every (job, GPU): a loop of them costs ~10 ms per job at 1,000 GPUs
    per_job_gpu = gw.groupby([job_code, gpu_code], sort=False).agg(
        tflops=("tflops", "mean"), power=("power_w", "mean"), host=("host", "first"),
        index=("gpu_index", "first"),
    )  # fmt: skip
    flags_by_job = flagged["job_id"].astype(str).value_counts() if len(flagged) else {}
    order = np.argsort(job_code, kind="stable")
    bounds = np.searchsorted(job_code[order], np.arange(len(jobs) + 1))
    pj_job = per_job_gpu.index.get_level_values(0).to_numpy()
    pj_order = np.argsort(pj_job, kind="stable")
    per_job_gpu = per_job_gpu.iloc[pj_order]
    pj_bounds = np.searchsorted(pj_job[pj_order], np.arange(len(jobs) + 1))
    tflops, power = (per_job_gpu[c].to_numpy(dtype=float) for c in ("tflops", "power"))
    hosts, indexes = per_job_gpu["host"].to_numpy(), per_job_gpu["index"].to_numpy()
    host_key = functools.cache(natural_key)  # per host, not per GPU of every job
    rows: list[JobRow] = []
    for k, job in enumerate(jobs):
        part = order[bounds[k] : bounds[k + 1]]  # the job's rows of ``gw``
        mine_gpus = slice(pj_bounds[k], pj_bounds[k + 1])  # the job's rows of ``per_job_gpu``
        tf = tflops[mine_gpus]
        has_tf = ~np.isnan(tf)
        # NaN counted as 0, as pandas' Series.sum does (the same sum, to the last bit)
        p = power[mine_gpus][has_tf]
        tf_power = float(np.where(np.isnan(p), 0.0, p).sum())
        tfw = float(tf[has_tf].sum()) / tf_power if tf_power > 0 else math.nan
        e = energy.loc[job] if energy is not None and job in energy.index else None
        mine = [s for s in stragglers if s.job_id == job]
        n_flagged = int(flags_by_job.get(job, 0))
        w = by_work.get(job)
        keys = sorted(
            {(str(h), int(i)) for h, i in zip(hosts[mine_gpus], indexes[mine_gpus], strict=True)},
            key=lambda k: (host_key(k[0]), k[1]),
        )
        # time figures as the CSV report has them: seen time (docs/accounting.md)
        acc: pd.Series = e if e is not None else pd.Series(dtype=float)
        seen = "seen_s" in acc.index
        row = JobRow(
            job_id=job,
            gpus=int(pj_bounds[k + 1] - pj_bounds[k]),
            gpu_hours_h=_f(acc["seen_s"]) / 3600 if seen else len(part) * window_h,
            idle_gpu_hours_h=_f(acc["idle_s"]) / 3600
            if seen
            else float(gw["idle"].iloc[part].astype(bool).sum()) * window_h
            if "idle" in gw.columns
            else 0.0,
            energy_kwh=_f(e["energy_kwh"]) if e is not None else math.nan,
            cost=_f(e["cost"]) if e is not None else math.nan,
            co2_kg=_f(e["co2_kg"]) if e is not None else math.nan,
            utilization_mean_pct=_f(acc["utilization_mean_pct"])
            if seen
            else _f(gw["utilization_gpu_pct"].iloc[part].mean()),
            tflops_per_w=tfw,
            reported_tflops=_f(w.reported_tflops.value) if w is not None else math.nan,
            mfu_pct=_f(w.mfu_pct.value) if w is not None else math.nan,
            stragglers=mine,
            straggler_minutes_min=_f(acc["straggler_s"]) / 60
            if seen
            else n_flagged * summary.window_s / 60.0,
            peers_waiting_kwh=_f(e.get("peers_waiting_energy_j", np.nan)) / 3.6e6
            if e is not None
            else math.nan,
            gpu_keys=keys,
        )
        rows.append(_with_verdict(row))
    return rows


def _with_verdict(row: JobRow) -> JobRow:
    from dataclasses import replace

    return replace(row, verdict=verdict(row))
