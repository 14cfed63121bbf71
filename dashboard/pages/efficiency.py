"""Efficiency: energy, cost, CO2, TFLOPS and TFLOPS/W per cluster, node and job, each with its
measurement quality (measured, estimated, not available and why)."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
import numpy as np
from dash import dcc

from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.components import (
    QUALITY_TEXT,
    data_table,
    figure_kpi,
    graph,
    page_frame,
    section,
)
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.figures import bar_figure, efficiency_figure, histogram_figure
from gpuwatt.status import natural_key

PAGE = "efficiency"
PATH = "/efficiency"
NAME = "Efficiency"
#: The content is drawn from the view's window, range and query alone (``render_cache``).
RENDERS_FROM_WINDOW = True
ORDER = 3
#: A bar per node up to this many nodes; beyond, a histogram and the TOP_NODES highest.
MAX_NODE_BARS = 32
TOP_NODES = 15

_HELP = {
    "energy_kwh": ("Energy", "Energy over the range from energy-counter deltas."),
    "cost": ("Cost", "Energy x the configured electricity price."),
    "co2_kg": ("CO2", "Energy x the configured carbon intensity."),
    "idle_energy_kwh": ("Energy at idle", "Energy of GPUs in windows where they were idle."),
    "peers_waiting_energy_kwh": (
        "Energy waiting on stragglers",
        "Estimated energy peers of synchronous stragglers spent waiting at the barrier.",
    ),
    "power_w": ("Power (mean)", "Sum of each GPU's mean power over the range."),
    "tflops": ("TFLOPS", "Achieved TFLOPS (sum of GPU means), from GPM pipe activity."),
    "tflops_per_w": ("TFLOPS/W", "Achieved TFLOPS per watt of the GPUs with an estimate."),
}


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


def job_table(ctx: PageContext) -> Any:
    jobs = ctx.win.summary.energy_by_job
    if jobs.empty:
        return dmc.Text("no job data in this range", c="dimmed")
    cur = ctx.win.summary.tariff.currency
    rows = [
        (
            r["job_id"],
            r["gpus"],
            fmt.energy_kwh(r["energy_kwh"]),
            fmt.money(r["cost"], cur),
            fmt.mass_kg(r["co2_kg"]),
            QUALITY_TEXT.get(str(r["energy_quality"]), str(r["energy_quality"])),
        )
        for _, r in jobs.iterrows()
    ]
    head = ("job", "GPUs", "energy", "cost", "CO2", "quality")
    table = data_table(head, rows, striped=True, fz="sm", id_="energy-per-job")
    return dmc.Stack(
        [table, dcc.Link("every job's efficiency: the Jobs page", href=ctx.link("/jobs"))], gap=4
    )


def node_energy(ctx: PageContext) -> list[Any]:
    """Energy per node: a bar each up to MAX_NODE_BARS nodes; beyond, the distribution over
    all nodes plus the TOP_NODES highest (a bar per node of 128 is unreadable). The nodes of
    active stragglers are red in either."""
    nodes = ctx.win.summary.energy_by_node
    if nodes.empty:
        return [graph(bar_figure([], [], title="energy", unit="Wh"))]
    hosts = [str(h) for h in nodes["host"]]
    wh = nodes["energy_kwh"].to_numpy(dtype=float) * 1000.0
    marked = sorted({x.host for x in ctx.win.active_stragglers}, key=natural_key)
    if len(hosts) <= MAX_NODE_BARS:
        order = sorted(range(len(hosts)), key=lambda i: natural_key(hosts[i]))
        return [
            graph(
                bar_figure(
                    [hosts[i] for i in order],
                    [wh[i] for i in order],
                    title="energy per node",
                    unit="Wh",
                    axis="energy",
                    highlight=marked,
                ),
                "energy-per-node",
            )
        ]
    by_host = dict(zip(hosts, wh, strict=True))
    top = np.argsort(-wh)[:TOP_NODES]
    return [
        graph(
            histogram_figure(
                wh,
                title=f"energy of the {len(hosts)} nodes (red: nodes with an active straggler)",
                unit="Wh",
                axis="energy",
                marks=[(h, by_host[h]) for h in marked if h in by_host],
            ),
            "energy-distribution",
        ),
        graph(
            bar_figure(
                [hosts[i] for i in top],
                [wh[i] for i in top],
                title=f"the {len(top)} nodes using the most energy",
                unit="Wh",
                axis="energy",
                highlight=marked,
            ),
            "energy-per-node",
        ),
    ]


def render(ctx: PageContext) -> list[Any]:
    s = ctx.win.summary
    kpis = [
        figure_kpi(label, s.cluster[key], help_text)
        for key, (label, help_text) in _HELP.items()
        if key in s.cluster
    ]
    tf = s.cluster.get("tflops_per_w")
    reason = tf.reason if tf is not None and tf.value is None else ""
    out: list[Any] = [
        dmc.SimpleGrid(
            kpis, cols={"base": 2, "sm": 4}, spacing="sm", mb="md", id="efficiency-kpis"
        ),
        section(
            "Power and TFLOPS/W over time",
            graph(efficiency_figure(s.efficiency_over_time, reason, ctx.range.step_s), zoom=True),
        ),
        section("Energy per node", *node_energy(ctx)),
        section("Energy per job", job_table(ctx)),
    ]
    return out
