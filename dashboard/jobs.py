"""Per-job efficiency: one row per job from the analytics summary (pure; no Dash, no I/O).

GPU-hours, idle GPU-hours, mean utilisation and TFLOPS/W come from the per-(window, GPU) table
(``AnalysisSummary.gpu_windows``: a GPU counts for a job in the windows it is attributed to it);
energy, cost and CO2 are the analytics engine's own per-job figures (``energy_by_job``);
stragglers and straggler minutes from the straggler findings; reported TFLOPS and MFU from the
job's own reports (``analytics.reported.JobWork``) where it sends them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuwatt.analytics import AnalysisSummary, JobWork, Straggler

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
            f"Idle {share:.0f} % of its GPU-hours ({fmt.hours(row.idle_gpu_hours_h)}): "
            "release the GPUs it does not use."
        )
    if math.isfinite(row.utilization_mean_pct) and row.utilization_mean_pct < LOW_UTIL_PCT:
        return (
            f"Low utilisation ({row.utilization_mean_pct:.0f} %): the GPUs wait on data, the "
            "CPU or the network, or the job is too small for them."
        )
    if math.isfinite(row.mfu_pct) and row.mfu_pct < LOW_MFU_PCT:
        return f"MFU {row.mfu_pct:.0f} %: busy GPUs, but far below their peak FLOPS."
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
    gw = gw.loc[gw["job_id"].notna() & (gw["job_id"].astype(str) != "")]
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
    job_key = gw["job_id"].astype(str)
    # one aggregation for every (job, GPU): a loop of them costs ~10 ms per job at 1,000 GPUs
    per_job_gpu = gw.groupby([job_key, gw["gpu"]], sort=False).agg(
        tflops=("tflops", "mean"), power=("power_w", "mean"), host=("host", "first"),
        index=("gpu_index", "first"),
    )  # fmt: skip
    rows: list[JobRow] = []
    for job, part in gw.groupby(job_key, sort=True):
        per_gpu = per_job_gpu.xs(job, level=0)
        has_tf = per_gpu["tflops"].notna()
        tf_power = float(per_gpu.loc[has_tf, "power"].sum())
        tfw = float(per_gpu.loc[has_tf, "tflops"].sum()) / tf_power if tf_power > 0 else math.nan
        e = energy.loc[job] if energy is not None and job in energy.index else None
        mine = [s for s in stragglers if s.job_id == job]
        flag = flagged.loc[flagged["job_id"].astype(str) == job] if len(flagged) else flagged
        w = by_work.get(job)
        keys = sorted(
            {(str(h), int(i)) for h, i in zip(per_gpu["host"], per_gpu["index"], strict=True)},
            key=lambda k: (natural_key(k[0]), k[1]),
        )
        # time figures as the CSV report has them: seen time (docs/accounting.md)
        acc: pd.Series = e if e is not None else pd.Series(dtype=float)
        seen = "seen_s" in acc.index
        row = JobRow(
            job_id=job,
            gpus=int(part["gpu"].nunique()),
            gpu_hours_h=_f(acc["seen_s"]) / 3600 if seen else len(part) * window_h,
            idle_gpu_hours_h=_f(acc["idle_s"]) / 3600
            if seen
            else float(part["idle"].astype(bool).sum()) * window_h
            if "idle" in part.columns
            else 0.0,
            energy_kwh=_f(e["energy_kwh"]) if e is not None else math.nan,
            cost=_f(e["cost"]) if e is not None else math.nan,
            co2_kg=_f(e["co2_kg"]) if e is not None else math.nan,
            utilization_mean_pct=_f(acc["utilization_mean_pct"])
            if seen
            else _f(part["utilization_gpu_pct"].mean()),
            tflops_per_w=tfw,
            reported_tflops=_f(w.reported_tflops.value) if w is not None else math.nan,
            mfu_pct=_f(w.mfu_pct.value) if w is not None else math.nan,
            stragglers=mine,
            straggler_minutes_min=_f(acc["straggler_s"]) / 60
            if seen
            else len(flag) * summary.window_s / 60.0,
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
