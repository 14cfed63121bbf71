"""Jobs: every job in the range with its efficiency (sortable), and one job's drill-down
(``?job=ID``): its figures, a one-line verdict, its GPUs (links to the node page) over time."""

from __future__ import annotations

import math
from typing import Any

import dash_mantine_components as dmc
import pandas as pd
from dash import dcc, html

from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.components import graph, kpi, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.figures import (
    MAX_GPU_ROWS,
    imbalance_figure,
    time_heatmap,
    unusual_gpus,
)
from gpuwatt.dashboard.grid import (
    link_column,
    md_link,
    number_column,
    si_column,
    sortable_table,
    text_column,
)
from gpuwatt.dashboard.jobs import JobRow, job_rows
from gpuwatt.dashboard.serving import Served
from gpuwatt.precision import settled
from gpuwatt.status import natural_key

PAGE = "jobs"
PATH = "/jobs"
NAME = "Jobs"
#: The content is drawn from the view's window, range and query and from the job-step source's
#: results for the window (``render_cache``).
RENDERS_FROM_WINDOW = RENDERS_FROM_WORK = True
ORDER = 4


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


def _num(value: float, digits: int = 3) -> float | None:
    """A table cell: rounded, None (an empty cell that sorts last) for NaN."""
    if value is None or not math.isfinite(value):
        return None
    return round(settled(float(value)), digits)


def job_table(ctx: PageContext, rows: list[JobRow], served: dict[str, Served]) -> Any:
    cur = ctx.win.summary.tariff.currency or ""
    columns = [
        link_column("job", "job"),
        text_column("verdict", "verdict"),  # first: what to do, before the figures behind it
        number_column("gpus", "GPUs", "d"),
        number_column("gpu_hours", "GPU-hours"),
        si_column("energy_wh", "energy", "Wh"),
        number_column("cost", f"cost {cur}".strip(), ",.2f"),
        number_column("co2_kg", "CO2 kg"),
        number_column("util", "util. %", ".0f"),
        number_column("tflops_per_w", "TFLOPS/W", ".3~r"),
        si_column("reported_flops", "reported", "FLOPS"),
        number_column("mfu", "MFU %", ".1f"),
        number_column("stragglers", "stragglers", "d"),
        number_column("straggler_min", "straggler min", ".0f"),
        number_column("idle_gpu_hours", "idle GPU-h"),
        si_column("wh_per_k_requests", "energy / 1k req.", "Wh"),
        si_column("wh_per_m_tokens", "energy / M tokens", "Wh"),
    ]
    data = [
        {
            "job": md_link(r.job_id, ctx.link("/jobs", job=r.job_id)),
            "gpus": r.gpus,
            "gpu_hours": _num(r.gpu_hours_h),
            "energy_wh": _num(r.energy_kwh * 1000.0, 1),
            "cost": _num(r.cost, 2),
            "co2_kg": _num(r.co2_kg),
            "util": _num(r.utilization_mean_pct, 1),
            "tflops_per_w": _num(r.tflops_per_w, 4),
            "reported_flops": _num(r.reported_tflops * 1e12, 0),
            "mfu": _num(r.mfu_pct, 1),
            "stragglers": len(r.stragglers),
            "straggler_min": _num(r.straggler_minutes_min, 1),
            "idle_gpu_hours": _num(r.idle_gpu_hours_h),
            **_served_cells(served.get(r.job_id), r),
            "verdict": r.verdict,
        }
        for r in rows
    ]
    return sortable_table(columns, data, "jobs-table")


def _served_cells(s: Served | None, r: JobRow) -> dict[str, float | None]:
    if s is None:
        return {"wh_per_k_requests": None, "wh_per_m_tokens": None}
    wh = r.energy_kwh * 1000.0
    return {
        "wh_per_k_requests": _num(s.per_thousand_requests(wh), 2),
        "wh_per_m_tokens": _num(s.per_million_tokens(wh), 1),
    }


def served_section(ctx: PageContext, row: JobRow, s: Served) -> Any:
    """An inference job's cost per inference: energy and cost per 1,000 requests and per million
    tokens over the range, and the latency percentiles it reported."""
    cur = ctx.win.summary.tariff.currency or ""
    wh = row.energy_kwh * 1000.0
    kpis = [
        kpi("Requests", fmt.si(s.requests), "Requests the job reported serving in the range."),
        kpi("Tokens", fmt.si(s.tokens), "Tokens its requests produced."),
    ]
    for label, per, what in (
        ("1k requests", s.per_thousand_requests, "per 1,000 requests served"),
        ("M tokens", s.per_million_tokens, "per million tokens produced"),
    ):
        kpis.append(
            kpi(
                f"Energy / {label}",
                fmt.si(per(wh), "Wh"),
                f"The job's GPU energy over the range {what}.",
            )
        )
        kpis.append(
            kpi(
                f"Cost / {label}",
                fmt.money(per(row.cost), cur),
                f"Energy cost {what} (the configured price).",
            )
        )
    kpis += [
        kpi(
            "Latency p50 / p95 / p99",
            " / ".join(fmt.si(v, "s") for v in (s.latency_p50_s, s.latency_p95_s, s.latency_p99_s)),
            "Request latencies the job reported.",
        ),
    ]
    return section(
        "Served (reported by the job)",
        html.Div(
            dmc.SimpleGrid(kpis, cols={"base": 2, "sm": 4, "lg": 7}, spacing="sm"),
            id="job-served",
        ),
        help_text="From the requests the job reports (gpuwatt.work.WorkReporter.request); "
        "energy is the GPU counters' over the same range.",
    )


def render(ctx: PageContext) -> list[Any]:
    work = ctx.work.work(ctx.win) if ctx.work is not None else []
    served = ctx.work.served(ctx.win) if ctx.work is not None else {}
    rows = job_rows(ctx.win.summary, ctx.win.stragglers, work)
    job = ctx.query.get("job")
    if job:
        row = next((r for r in rows if r.job_id == job), None)
        if row is None:
            return [
                dcc.Link("all jobs", href=ctx.link("/jobs")),
                dmc.Alert(
                    f"No job '{job[:60]}' in this range.",
                    color="yellow",
                    id="job-missing",
                    mt="sm",
                ),
            ]
        return job_detail(
            ctx, row, reported=any(w.job_id == job for w in work), served=served.get(job)
        )
    if not rows:
        return [dmc.Alert("No GPU was attributed to a job in this range.", color="gray")]
    note = (
        "Click a column to sort. Reported TFLOPS and MFU come from the job's own step reports "
        "(gpuwatt.work); TFLOPS/W is the GPU-counter estimate; energy per 1k requests and per "
        "million tokens for inference jobs that report their requests."
    )
    if ctx.work is None:
        note += " No job-step store is connected: reported TFLOPS and MFU are not shown."
    return [
        section(
            f"{len(rows)} jobs in this range",
            dmc.Text(note, size="xs", c="dimmed", mb="xs"),
            job_table(ctx, rows, served),
        )
    ]


def job_detail(
    ctx: PageContext, row: JobRow, *, reported: bool, served: Served | None = None
) -> list[Any]:
    cur = ctx.win.summary.tariff.currency or ""
    mfu_help = (
        "Model FLOPs utilisation: the job's reported model FLOPs per second over its GPUs' "
        "dense tensor peak."
    )
    if not reported:
        mfu_help += " This job reports no steps (see gpuwatt.work)."
    kpis = [
        kpi("GPUs", str(row.gpus), "GPUs attributed to the job in the range."),
        kpi("GPU-hours", fmt.hours(row.gpu_hours_h), "GPUs x time attributed to the job."),
        kpi("Energy", fmt.energy_kwh(row.energy_kwh), "Energy of the job's GPUs (counters)."),
        kpi("Cost", fmt.money(row.cost, cur), "Energy x the configured price."),
        kpi("CO2", fmt.mass_kg(row.co2_kg), "Energy x the configured carbon intensity."),
        kpi("Utilisation", fmt.percent(row.utilization_mean_pct), "Mean GPU utilisation."),
        kpi(
            "TFLOPS/W",
            fmt.plain(row.tflops_per_w),
            "Achieved TFLOPS per watt, GPU-counter (GPM) estimate.",
        ),
        kpi("Reported", fmt.tflops(row.reported_tflops), "TFLOPS the job reports itself."),
        kpi("MFU", fmt.percent(row.mfu_pct, 1), mfu_help),
        kpi(
            "Straggler time",
            fmt.minutes(row.straggler_minutes_min),
            "Windows in which one of its GPUs was a persistent straggler.",
            color="red" if row.stragglers else None,
        ),
        kpi(
            "Idle GPU-hours",
            fmt.hours(row.idle_gpu_hours_h),
            "GPU-hours in which its GPUs were idle.",
            color="orange" if row.idle_gpu_hours_h > 0 else None,
        ),
        kpi(
            "Peers waiting",
            fmt.energy_kwh(row.peers_waiting_kwh),
            "Estimated energy its GPUs spent waiting for stragglers at the barrier.",
        ),
    ]
    gw = ctx.win.summary.gpu_windows
    part = gw.loc[gw["job_id"].astype(str) == row.job_id]
    metric = "utilization_gpu_pct"
    if part["gpu"].nunique() > MAX_GPU_ROWS:
        keep = unusual_gpus(part, metric, 32, [s.uuid for s in row.stragglers])
        heat = time_heatmap(
            part.loc[part["gpu"].isin(keep)],
            metric,
            per="gpu",
            title=f"utilisation of the job's {len(keep)} most unusual GPUs (stragglers first)",
        )
    else:
        heat = time_heatmap(part, metric, per="gpu", title="utilisation of the job's GPUs")
    color = "red" if row.stragglers else ("orange" if "Efficient" not in row.verdict else "green")
    return [
        dmc.Group(
            [
                dcc.Link("all jobs", href=ctx.link("/jobs")),
                dmc.Title(f"job {row.job_id}", order=3, id="job-title"),
            ],
            gap="md",
            mb="xs",
        ),
        dmc.Alert(row.verdict, color=color, title="verdict", id="job-verdict", mb="sm"),
        dmc.SimpleGrid(kpis, cols={"base": 2, "sm": 4, "lg": 6}, spacing="sm", mb="md"),
        *([served_section(ctx, row, served)] if served is not None else []),
        section("Utilisation over time", graph(heat, "job-heatmap", zoom=True)),
        section(
            "Imbalance within the job",
            graph(
                imbalance_figure(
                    ctx.win.summary.balance,
                    f"job:{row.job_id}",
                    ctx.win.summary.default_imbalance_index,
                    ctx.range.step_s,
                ),
                zoom=True,
            ),
        ),
        section("GPUs", gpu_table(ctx, part, row)),
    ]


def gpu_table(ctx: PageContext, part: pd.DataFrame, row: JobRow) -> Any:
    """The job's GPUs over the range, each a link to its node page with the GPU selected."""
    strag = {s.uuid for s in row.stragglers}
    per = part.groupby("gpu", sort=False).agg(
        host=("host", "first"), index=("gpu_index", "first"), uuid=("uuid", "first"),
        util=("utilization_gpu_pct", "mean"), power=("power_w", "mean"),
        tflops=("tflops", "mean"), energy_j=("energy_delta_j", "sum"),
    )  # fmt: skip
    uuids, hosts, indexes = (per[c].to_numpy() for c in ("uuid", "host", "index"))
    per = per.iloc[
        sorted(  # stragglers first: at 1,000 GPUs they would sit on a page of their own
            range(len(per)),
            key=lambda i: (uuids[i] not in strag, natural_key(str(hosts[i])), int(indexes[i])),
        )
    ]
    data = []
    for r in per.itertuples(index=False):
        label = f"{r.host} GPU {r.index}"
        tfw = r.tflops / r.power if r.power and math.isfinite(r.tflops) else math.nan
        data.append(
            {
                "gpu": md_link(label, ctx.link("/node", host=str(r.host), gpu=str(r.index))),
                "straggler": "straggler" if r.uuid in strag else "",
                "util": _num(r.util, 1),
                "power": _num(r.power, 1),
                "energy_wh": _num(r.energy_j / 3600.0, 1),
                "tflops_per_w": _num(tfw, 4),
            }
        )
    columns = [
        link_column("gpu", "GPU"),
        text_column("straggler", "straggler", cellStyle={"color": "#fa5252"}),
        number_column("util", "util. %", ".0f"),
        si_column("power", "power (mean)", "W"),
        si_column("energy_wh", "energy", "Wh"),
        number_column("tflops_per_w", "TFLOPS/W"),
    ]
    return sortable_table(columns, data, "job-gpus")
