"""Overview: is every GPU working, how busy, how much power and energy, and who is slow."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
import pandas as pd
from dash import Dash, Input, Output, dcc, html

from gpuwatt.analytics import Straggler
from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.components import figure_kpi, graph, kpi, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.data import DashboardData, DataError
from gpuwatt.dashboard.figures import node_gpu_heatmap
from gpuwatt.dashboard.timerange import TimeRange

PAGE = "overview"
PATH = "/"
NAME = "Overview"
ORDER = 0
STRAGGLER_BANNER = False  # the page lists them
TOP_STRAGGLERS = 3


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


def newest_per_gpu(gw: pd.DataFrame) -> pd.DataFrame:
    """Each GPU's newest analysis window (what the heatmap shows as "now")."""
    if gw.empty:
        return gw
    return gw.sort_values("window_start_ns").groupby("gpu", sort=False).tail(1)


def cluster_mean_now(ctx: PageContext, metric: str = "utilization_gpu_pct") -> float | None:
    b = ctx.win.summary.balance
    if b.empty:
        return None
    sel = b.loc[(b["scope"] == "cluster") & (b["level"] == "gpu") & (b["metric"] == metric)]
    if sel.empty:
        return None
    return float(sel.sort_values("window_start_ns")["mean"].iloc[-1])


def straggler_card(s: Straggler, ctx: PageContext) -> Any:
    state = "active" if s.active else "ended"
    cause = s.cause.replace("_", " ") + (" (inferred)" if s.cause_inferred else "")
    job = f"job {s.job_id}" if s.job_id else "no job"
    return dmc.Paper(
        [
            dmc.Group(
                [
                    dmc.Badge(s.severity, color="red" if s.severity == "critical" else "orange"),
                    dmc.Text(f"{s.host} GPU {s.gpu_index}", fw=700, className="straggler-name"),
                    dmc.Text(f"{cause} · {job} · {state}", size="sm", c="dimmed"),
                    dcc.Link(
                        "drill down",
                        href=ctx.link("/node", host=s.host, gpu=str(s.gpu_index)),
                    ),
                ],
                gap="sm",
            ),
            dmc.Text(s.explanation, size="sm", className="straggler-explanation"),
        ],
        p="sm",
        withBorder=True,
        radius="md",
        mb="xs",
    )


def alerts_kpi(ctx: PageContext) -> Any:
    help_text = "Alerts pending or firing now (from the alert evaluator)."
    if ctx.alerts is None:
        return kpi("Firing alerts", "n/a", help_text + " No alert evaluator is connected.")
    try:
        firing = [a for a in ctx.alerts.active() if a.state == "firing"]
    except Exception:  # an alerts backend failing must not take the overview down
        return kpi("Firing alerts", "n/a", help_text + " The alert evaluator did not answer.")
    color = "red" if firing else None
    return kpi("Firing alerts", str(len(firing)), help_text, color=color)


#: The newest values the overview shows (the power of the GPUs up), beside each GPU's state.
NEWEST_SHOWN = ("power_w",)
#: The "Energy today" KPI, and what asks for it when it is not in the cache (``today_slot``).
TODAY_ID = "overview-today"
TODAY_ASK_ID = "overview-today-ask"
TODAY_HELP = "Energy since 00:00 UTC, from energy-counter deltas."
TODAY_PLACEHOLDER = "…"


def prefetch(data: DashboardData, tr: TimeRange, query: dict[str, str], now_ns: int) -> None:
    """Start the reads the page makes after the window (``app.render_page``): the newest
    power figures of every GPU, which the view takes the GPUs seen from (one read, not two:
    ``DashboardData.read_newest``)."""
    data.read_newest(NEWEST_SHOWN)


def today_kpi(data: DashboardData, now_ns: int) -> Any:
    """The "Energy today" KPI (``DashboardData.energy_today``)."""
    try:
        today = data.energy_today(now_ns).cluster["energy_kwh"]
    except DataError as exc:
        return kpi("Energy today", "n/a", exc.message)
    return figure_kpi("Energy today", today, TODAY_HELP)


def today_slot(ctx: PageContext) -> tuple[Any, list[Any]]:
    """The "Energy today" KPI where the figure is in the cache (the dashboard's warmer keeps
    it), else a placeholder and what asks ``register``'s callback for it: the page does not
    wait for a day's read (at 1,024 GPUs and 20:00, ~0.35 s of a cold overview on
    VictoriaMetrics); the figure follows in its own request."""
    try:
        cached = ctx.data.energy_today_is_cached(ctx.now_ns)
    except DataError:  # said by the KPI its callback draws
        cached = False
    if cached:
        return html.Div(today_kpi(ctx.data, ctx.now_ns), id=TODAY_ID), []
    placeholder = kpi("Energy today", TODAY_PLACEHOLDER, "Reading the energy since 00:00 UTC.")
    return html.Div(placeholder, id=TODAY_ID), [dcc.Store(id=TODAY_ASK_ID, data=ctx.now_ns)]


def register(app: Dash, data: DashboardData) -> None:
    """The callback that fills the placeholder ``today_slot`` drew, fired when it is drawn (its
    input is in the content). The server's clock says which day, not the browser."""

    @app.callback(Output(TODAY_ID, "children"), Input(TODAY_ASK_ID, "data"))
    def _today(_asked: int | None) -> Any:
        return today_kpi(data, data.now_ns())


def render(ctx: PageContext) -> list[Any]:
    s = ctx.win.summary
    latest = ctx.data.latest_of(attrs=NEWEST_SHOWN)
    counts = ctx.win.counts(latest, ctx.now_ns)
    util = cluster_mean_now(ctx)
    up_power = sum(x.power_w for x in latest if not x.lost and x.power_w is not None)
    today, ask = today_slot(ctx)
    lost_color = "red" if counts.lost or counts.silent else None
    kpis = dmc.SimpleGrid(
        [
            kpi(
                "GPUs up",
                f"{counts.up} / {counts.total}"
                + (f" (+{counts.mig_devices} MIG)" if counts.mig_devices else ""),
                "GPUs whose newest sample is recent and not marked lost by NVML (MIG devices "
                "apart: they are counted with their GPU).",
                id_="kpi-gpus-up",
            ),
            kpi(
                "Lost / silent",
                f"{counts.lost} / {counts.silent}",
                "Lost: NVML reports the GPU lost. Silent: no sample for over 3 minutes "
                "(collector or node down).",
                color=lost_color,
            ),
            kpi(
                "Idle",
                str(counts.idle),
                "GPUs below 5 % utilisation for the last 3 windows; allocated ones are waste.",
            ),
            kpi(
                "Utilisation",
                fmt.percent(util),
                "Mean GPU utilisation of the cluster in the newest window.",
            ),
            kpi(
                "Power now",
                fmt.watts(up_power),
                "Sum of the newest power reading of every GPU that is up (measured).",
            ),
            today,
            figure_kpi(
                "TFLOPS/W",
                s.cluster["tflops_per_w"],
                "Achieved TFLOPS per watt over the range, GPUs with a GPM estimate only.",
            ),
            alerts_kpi(ctx),
        ],
        cols={"base": 2, "sm": 4, "lg": 8},
        spacing="sm",
        mb="md",
    )
    found = ctx.win.stragglers
    top = found[:TOP_STRAGGLERS]
    if top:
        body: list[Any] = [straggler_card(x, ctx) for x in top]
        if len(found) > TOP_STRAGGLERS:
            body.append(dcc.Link(f"all {len(found)} stragglers", href=ctx.link("/stragglers")))
    else:
        body = [dmc.Text("No straggler in this range.", c="dimmed", id="no-stragglers")]
    worst = section(
        "Worst stragglers",
        *body,
        help_text="GPUs persistently slower than their peers (same job, else same node), "
        "ranked by severity, with the cause.",
    )
    now = newest_per_gpu(s.gpu_windows)
    marked = [(x.host, x.gpu_index) for x in ctx.win.active_stragglers]
    heat = section(
        "Utilisation now, node x GPU",
        graph(node_gpu_heatmap(now, "utilization_gpu_pct", marked), "overview-heatmap"),
        help_text="Each cell is one GPU's mean utilisation in the newest window; "
        "red rings are active stragglers.",
    )
    notes = [dmc.Text(f"note: {n}", size="xs", c="dimmed") for n in s.notes]
    return [kpis, worst, heat, html.Div(notes), *ask]
