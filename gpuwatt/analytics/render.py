"""Plain-text rendering of an ``AnalysisSummary`` for the terminal (``gpuwatt analyze``)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpuwatt.analytics.findings import findings
from gpuwatt.precision import fixed, settled

if TYPE_CHECKING:
    from gpuwatt.analytics.summary import AnalysisSummary

_METRIC_LABELS = {
    "utilization_gpu_pct": "utilisation",
    "power_w": "power",
    "tensor_active_pct": "tensor activity",
}


def _ts(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(settled(x), fmt)


def render_text(summary: AnalysisSummary, *, max_rows: int = 10) -> str:
    s = summary
    out: list[str] = []
    add = out.append
    add(
        f"gpuwatt analysis  {_ts(s.start_ns)} -> {_ts(s.now_ns)} UTC  "
        f"({len(s.windows)} windows of {s.window_s:g} s; {s.gpus} GPUs on {s.nodes} nodes; "
        f"{len(s.jobs)} jobs)"
    )
    if not s.windows:
        add("no samples in this range")
        out.extend(f"note: {n}" for n in s.notes)
        return "\n".join(out) + "\n"

    add("")
    add(f"STRAGGLERS ({len(s.active_stragglers)} active, {len(s.stragglers)} in range)")
    if not s.stragglers:
        add("  none")
    for st in s.stragglers[:max_rows]:
        state = "ACTIVE" if st.active else "ended "
        job = f" job {st.job_id}" if st.job_id else ""
        cause = st.cause + (" (inferred)" if st.cause_inferred else "")
        add(
            f"  [{st.severity:8s}] {state} {st.host} GPU {st.gpu_index}{job}: {cause}, "
            f"score {fixed(st.score, 2)}, since {_ts(st.onset_ns)}"
        )
        add(f"      {st.explanation}")

    add("")
    alloc = s.idle_allocated
    add(f"IDLE GPUS ({len(alloc)} allocated to a job, {len(s.idle) - len(alloc)} without a job)")
    for i in s.idle[:max_rows]:
        add(f"  {'ALLOCATED ' if i.allocated else 'free      '}{i.explanation}")
    if len(s.idle) > max_rows:
        add(f"  ... {len(s.idle) - max_rows} more")

    found = findings(s)
    add("")
    add(f"FINDINGS ({len(found)}: GPU, finding, cause, severity)")
    for f in found[: max_rows * 2]:
        add(f"  {f.host} GPU {f.gpu_index}: {f.finding}, cause {f.cause}, severity {f.severity}")

    if s.lost:
        add("")
        add(f"LOST GPUS ({len(s.lost)}: not in GPU-hours or utilisation means)")
        for lo in s.lost[:max_rows]:
            seen = _ts(lo.last_seen_ns) if lo.last_seen_ns is not None else "not in this range"
            add(
                f"  {lo.host} GPU {lo.gpu_index}: lost since {_ts(lo.lost_since_ns)}, "
                f"last seen {seen}"
            )

    add("")
    add(f"LOAD BALANCE (newest window; index: {s.default_imbalance_index}, lower is more even)")
    b = s.balance
    if not b.empty:
        newest = b.loc[(b["window_start_ns"] == b["window_start_ns"].max()) & (b["level"] == "gpu")]
        for scope, rows in newest.groupby("scope", sort=True):
            parts = []
            for _, r in rows.iterrows():
                label = _METRIC_LABELS.get(r["metric"], r["metric"])
                parts.append(
                    f"{label} mean {_f(r['mean'])} cv {_f(r['cv'], '.2f')} "
                    f"max/mean {_f(r['max_over_mean'], '.2f')} jain {_f(r['jain'], '.2f')}"
                )
            add(f"  {scope} ({int(rows['n'].max())} GPUs): " + "; ".join(parts))

    add("")
    add("ENERGY AND EFFICIENCY")
    for key, label in (
        ("gpu_hours", "GPU-hours (time seen)"),
        ("utilization_pct", "utilisation (mean over time seen)"),
        ("idle_gpu_hours", "idle GPU-hours"),
        ("straggler_minutes", "straggler minutes"),
        ("energy_kwh", "energy"),
        ("cost", "cost"),
        ("co2_kg", "CO2"),
        ("idle_energy_kwh", "energy at idle"),
        ("peers_waiting_energy_kwh", "energy of peers waiting on stragglers"),
        ("power_w", "power (sum of GPU means)"),
        ("tflops", "achieved TFLOPS (sum of GPU means)"),
        ("tflops_per_w", "TFLOPS/W"),
    ):
        fig = s.cluster.get(key)
        if fig is not None:
            text = fig.format(".4g")
            if fig.value is not None and fig.reason:
                text += f" ({fig.reason})"
            add(f"  {label:38s} {text}")
    jobs = s.energy_by_job
    if not jobs.empty:
        add("  per job:")
        for _, r in jobs.head(max_rows).iterrows():
            add(
                f"    {r['job_id']}: {r['gpus']} GPUs, {_f(r['energy_kwh'], '.3f')} kWh "
                f"[{r['energy_quality']}], util {_f(r['utilization_mean_pct'])} %"
            )
    if s.job_work:
        add("")
        add("APPLICATION-REPORTED WORK (model FLOPs per step / step time; MFU against dense peak)")
        for w in s.job_work[:max_rows]:
            add(f"  {w.line()}")
    for n in s.notes:
        add(f"note: {n}")
    return "\n".join(out) + "\n"
