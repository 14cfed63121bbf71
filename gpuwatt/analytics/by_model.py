"""Heterogeneous clusters: one row per GPU model, and which model does the most work per watt.

``by_model(summary)`` groups an analysis (``analytics.analyze``) by GPU model (the GPU table's
model for each NVML name, ``gpuwatt.gpu_specs``; an unknown name is its own model): GPUs,
GPU-hours, mean utilisation, energy, mean power, counter TFLOPS per watt over the windows the
GPUs were busy, and the application-reported work per joule of the jobs that ran on one model
only (``analyze(job_steps=...)``). The comparison is over this cluster's own jobs, so a model
whose jobs were lighter looks less efficient: read it beside the jobs each model ran.

Work per watt is ranked by the reported figure where every model has one (it is what the jobs
say they did), else by the counter estimate where every model's is of the same quality; a
ranking across qualities (a GPM estimate against an SM-activity upper bound) is not made.
Units: TFLOPS per W is TFLOP per J.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwatt.analytics.quality import Quality, worst
from gpuwatt.analytics.summary import AnalysisSummary
from gpuwatt.gpu_specs import lookup
from gpuwatt.precision import settled

COLUMNS: tuple[str, ...] = (
    "model",
    "gpus",
    "gpu_hours_h",
    "gpu_hours_quality",
    "busy_gpu_hours_h",
    "utilization_mean_pct",
    "utilization_quality",
    "energy_kwh",
    "energy_quality",
    "power_mean_w",
    "tflops_per_w",
    "tflops_quality",
    "reported_tflop_per_j",
    "reported_jobs",
    "peak_tflops_per_w",
    "work_per_w_rank",
)


def model_of(name: str) -> str:
    """The GPU table's model for an NVML name, else the name itself."""
    spec = lookup(name) if name else None
    return spec.model if spec is not None else (name or "unknown")


def by_model(
    summary: AnalysisSummary,
    *,
    job_work_windows: pd.DataFrame | None = None,
    tensor_precision: str = "bf16",
) -> pd.DataFrame:
    """One row per GPU model (``COLUMNS``), best work per watt first.

    ``job_work_windows``: per (job, window) reported work (``reported.reported_work``), where the
    summary was made without job steps; default ``summary.job_work_windows``.
    """
    gw = summary.gpu_windows
    if gw is None or gw.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    names = gw["name"].fillna("").astype(str)
    models = {n: model_of(n) for n in names.unique()}
    gw = gw.assign(model=names.map(models))
    busy = ~gw["idle"].astype(bool) if "idle" in gw.columns else pd.Series(True, index=gw.index)
    # GPU-hours are the time each GPU was seen, to the second, as in every other view
    # (docs/accounting.md); means are weighted by it.
    if "seen_s" in gw.columns:
        seen_s = gw["seen_s"].astype(float)
    else:
        seen_s = pd.Series(summary.window_s, index=gw.index, dtype=float)
    util = gw["utilization_gpu_pct"].astype(float)
    gw = gw.assign(
        seen_s=seen_s,
        busy_s=seen_s.where(busy, 0.0),
        util_w=seen_s.where(util.notna(), 0.0),
        util_x=(util * seen_s).fillna(0.0),
    )
    # a GPU split with MIG counts once: its devices are inside it (docs/accounting.md, "MIG")
    whole = gw.loc[~gw["mig"].to_numpy(dtype=bool)] if "mig" in gw.columns else gw
    grp = whole.groupby("model", sort=True)
    util_w = grp["util_w"].sum()
    out = pd.DataFrame(
        {
            "gpus": grp["gpu"].nunique(),
            "gpu_hours_h": grp["seen_s"].sum() / 3600.0,
            "busy_gpu_hours_h": grp["busy_s"].sum() / 3600.0,
            "utilization_mean_pct": grp["util_x"].sum() / util_w.where(util_w > 0),
            "power_mean_w": grp["power_w"].mean(),
        }
    )
    out["gpu_hours_quality"] = Quality.MEASURED.value  # seen time, to the second
    out["utilization_quality"] = np.where(
        out["utilization_mean_pct"].notna(), Quality.MEASURED.value, Quality.NOT_AVAILABLE.value
    )
    out["energy_kwh"] = _energy_kwh(summary, models).reindex(out.index)
    out["energy_quality"] = (
        _energy_quality(summary, models).reindex(out.index).fillna(Quality.NOT_AVAILABLE.value)
    )
    tf = gw.loc[busy & gw["tflops"].notna() & gw["power_w"].notna()]
    tsum = tf.groupby("model")["tflops"].sum(min_count=1)
    psum = tf.groupby("model")["power_w"].sum(min_count=1)
    out["tflops_per_w"] = (tsum / psum.where(psum > 0)).reindex(out.index)
    out["tflops_quality"] = _tflops_quality(summary, models).reindex(out.index)
    jw = summary.job_work_windows if job_work_windows is None else job_work_windows
    reported, jobs = _reported(jw, gw)
    out["reported_tflop_per_j"] = reported.reindex(out.index)
    out["reported_jobs"] = jobs.reindex(out.index).fillna(0).astype(int)
    out["peak_tflops_per_w"] = [_peak_per_w(m, tensor_precision) for m in out.index]
    out["work_per_w_rank"] = _rank(out)
    out = out.reset_index().rename(columns={"index": "model"})
    order = out.sort_values(["work_per_w_rank", "model"], na_position="last", kind="stable")
    return order[list(COLUMNS)].reset_index(drop=True)


def most_work_per_watt(table: pd.DataFrame) -> str:
    """One sentence on which model does the most work per watt (``by_model``'s table)."""
    ranked = table.loc[table["work_per_w_rank"].notna()].sort_values("work_per_w_rank")
    if len(ranked) < 2:
        return "no comparison: fewer than two models with a comparable work-per-watt figure"
    reported = ranked["reported_tflop_per_j"].notna().all()
    col, what = (
        ("reported_tflop_per_j", "TFLOP/J reported by the jobs")
        if reported
        else ("tflops_per_w", f"TFLOPS/W ({ranked['tflops_quality'].iloc[0]})")
    )
    best = ranked.iloc[0]
    others = ", ".join(
        f"{r.model} {settled(getattr(r, col)):.3g}" for r in ranked.iloc[1:].itertuples()
    )
    return (
        f"{best['model']} does the most work per watt on this cluster's jobs: "
        f"{settled(best[col]):.3g} {what} (then {others})"
    )


def _whole_gpus(eg: pd.DataFrame) -> pd.DataFrame:
    """The whole GPUs of a per-GPU table: a MIG device's energy is inside its parent's."""
    return eg.loc[~eg["mig"].to_numpy(dtype=bool)] if "mig" in eg.columns else eg


def _energy_kwh(summary: AnalysisSummary, models: dict[str, str]) -> pd.Series:
    eg = summary.energy_by_gpu
    if eg is None or eg.empty:
        return pd.Series(dtype=float)
    eg = _whole_gpus(eg)
    m = eg["name"].fillna("").astype(str).map(lambda n: models.get(n) or model_of(n))
    return eg.groupby(m)["energy_j"].sum(min_count=1) / 3.6e6


def _energy_quality(summary: AnalysisSummary, models: dict[str, str]) -> pd.Series:
    """Per model, the worst of its GPUs' energy qualities (as the node and job reports do)."""
    eg = summary.energy_by_gpu
    if eg is None or eg.empty or "energy_quality" not in eg.columns:
        return pd.Series(dtype=object)
    eg = _whole_gpus(eg)
    m = eg["name"].fillna("").astype(str).map(lambda n: models.get(n) or model_of(n))
    return eg.groupby(m)["energy_quality"].agg(lambda s: worst([Quality(q) for q in s]).value)


def _tflops_quality(summary: AnalysisSummary, models: dict[str, str]) -> pd.Series:
    eg = summary.energy_by_gpu
    if eg is None or eg.empty or "tflops_quality" not in eg.columns:
        return pd.Series(dtype=object)
    m = eg["name"].fillna("").astype(str).map(lambda n: models.get(n) or model_of(n))
    return eg.groupby(m)["tflops_quality"].agg(lambda s: s.iloc[0] if s.nunique() == 1 else "mixed")


def _reported(jw: pd.DataFrame | None, gw: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Reported TFLOP per J per model, over (job, window)s whose GPUs are all of one model."""
    empty = pd.Series(dtype=float), pd.Series(dtype=int)
    if jw is None or jw.empty or "job_id" not in gw.columns:
        return empty
    jw = jw.loc[jw["reported_tflops"].notna()]
    on = gw.loc[gw["job_id"].notna()]
    per = on.groupby(["job_id", "window_start_ns"]).agg(
        power_w=("power_w", "sum"), models=("model", "nunique"), model=("model", "first")
    )
    joined = jw.join(per, on=["job_id", "window_start_ns"], how="inner")
    joined = joined.loc[(joined["models"] == 1) & (joined["power_w"] > 0)]
    if joined.empty:
        return empty
    cov = joined["coverage"].fillna(1.0).clip(0.0, 1.0).to_numpy(dtype=float)
    joined = joined.assign(
        work=joined["reported_tflops"].to_numpy(dtype=float) * cov,
        watts=joined["power_w"].to_numpy(dtype=float) * cov,
    )
    g = joined.groupby("model")
    return g["work"].sum() / g["watts"].sum(), g["job_id"].nunique()


def _peak_per_w(model: str, precision: str) -> float:
    spec = lookup(model)
    peak = spec.tensor_peak_tflops(precision) if spec is not None else None
    return peak / spec.tdp_w if spec is not None and peak else np.nan


def _rank(table: pd.DataFrame) -> pd.Series:
    """1 = most work per watt; NaN where the models' figures are not comparable."""
    rep = table["reported_tflop_per_j"]
    if len(table) and rep.notna().all():
        return rep.rank(ascending=False, method="min")
    q = table["tflops_quality"].dropna()
    tf = table["tflops_per_w"]
    if len(table) and tf.notna().all() and q.nunique() == 1 and len(q) == len(table):
        return tf.rank(ascending=False, method="min")
    return pd.Series(np.nan, index=table.index)
