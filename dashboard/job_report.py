"""The jobs page's figures as a table and as text (pure; no Dash, no I/O): the columns that
``gpuwatt report --by job`` adds to the CSV report, and the ``gpuwatt job ID`` summary a user
pastes into a ticket."""

from __future__ import annotations

import math

import pandas as pd

from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.jobs import JobRow
from gpuwatt.dashboard.serving import Served

#: What the jobs page shows beyond the CSV report's own columns (units in the names).
EXTRA_COLUMNS: tuple[str, ...] = (
    "reported_tflops",
    "mfu_pct",
    "stragglers",
    "idle_gpu_hours_h",
    "requests",
    "energy_per_1k_requests_wh",
    "energy_per_m_tokens_wh",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "verdict",
)


def _nan_none(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def extra_columns(rows: list[JobRow], served: dict[str, Served]) -> pd.DataFrame:
    """One row per job: ``job_id`` and ``EXTRA_COLUMNS`` (None where not measured)."""
    out = []
    for r in rows:
        s = served.get(r.job_id)
        wh = r.energy_kwh * 1000.0
        out.append(
            {
                "job_id": r.job_id,
                "reported_tflops": _nan_none(r.reported_tflops),
                "mfu_pct": _nan_none(r.mfu_pct),
                "stragglers": len(r.stragglers),
                "idle_gpu_hours_h": _nan_none(r.idle_gpu_hours_h),
                "requests": s.requests if s else None,
                "energy_per_1k_requests_wh": _nan_none(s.per_thousand_requests(wh)) if s else None,
                "energy_per_m_tokens_wh": _nan_none(s.per_million_tokens(wh)) if s else None,
                "latency_p50_s": _nan_none(s.latency_p50_s) if s else None,
                "latency_p95_s": _nan_none(s.latency_p95_s) if s else None,
                "latency_p99_s": _nan_none(s.latency_p99_s) if s else None,
                "verdict": r.verdict,
            }
        )
    return pd.DataFrame(out, columns=["job_id", *EXTRA_COLUMNS])


def with_extra_columns(report: pd.DataFrame, extra: pd.DataFrame) -> pd.DataFrame:
    """The CSV report by job (``csv_export.build_report``) with the jobs page's columns after
    its own, matched on ``job_id``."""
    if report.empty:
        return pd.DataFrame(columns=[*report.columns, *EXTRA_COLUMNS])
    merged = report.merge(extra, on="job_id", how="left")
    merged["stragglers"] = merged["stragglers"].fillna(0).astype("int64")
    return merged


def job_text(
    row: JobRow, served: Served | None, *, range_label: str, currency: str, gpus_shown: int = 8
) -> str:
    """A job's summary in plain text, for a ticket: figures with units, stragglers, verdict."""
    lines = [
        f"gpuwatt job {row.job_id} ({range_label})",
        f"  verdict        {row.verdict}",
        f"  GPUs           {row.gpus}  ({fmt.hours(row.gpu_hours_h)} GPU-hours, "
        f"{fmt.hours(row.idle_gpu_hours_h)} idle)",
        f"  energy         {fmt.energy_kwh(row.energy_kwh)}  cost {fmt.money(row.cost, currency)}"
        f"  CO2 {fmt.mass_kg(row.co2_kg)}",
        f"  utilisation    {fmt.percent(row.utilization_mean_pct)} (mean)",
        f"  TFLOPS/W       {fmt.plain(row.tflops_per_w)} (GPU counters)",
        f"  reported       {fmt.tflops(row.reported_tflops)}  MFU {fmt.percent(row.mfu_pct, 1)}",
    ]
    if served is not None:
        wh = row.energy_kwh * 1000.0
        lines += [
            f"  served         {fmt.si(served.requests)} requests, {fmt.si(served.tokens)} tokens",
            f"  per 1k req.    {fmt.si(served.per_thousand_requests(wh), 'Wh')}  "
            f"{fmt.money(served.per_thousand_requests(row.cost), currency)}",
            f"  per M tokens   {fmt.si(served.per_million_tokens(wh), 'Wh')}  "
            f"{fmt.money(served.per_million_tokens(row.cost), currency)}",
            "  latency        p50 {} / p95 {} / p99 {}".format(
                *(fmt.si(v, "s") for v in (served.latency_p50_s, served.latency_p95_s,
                                           served.latency_p99_s))
            ),
        ]  # fmt: skip
    if row.stragglers:
        lines.append(
            f"  stragglers     {len(row.stragglers)} "
            f"({fmt.minutes(row.straggler_minutes_min)} flagged, "
            f"peers waiting {fmt.energy_kwh(row.peers_waiting_kwh)})"
        )
        for s in row.stragglers[:gpus_shown]:
            lines.append(f"    - {s.explanation}")
    else:
        lines.append("  stragglers     none")
    if row.gpu_keys:
        shown = ", ".join(f"{h}:{i}" for h, i in row.gpu_keys[:gpus_shown])
        more = len(row.gpu_keys) - gpus_shown
        lines.append(f"  GPUs           {shown}" + (f" and {more} more" if more > 0 else ""))
    return "\n".join(lines)
