"""Efficiency: energy, cost, CO2, TFLOPS and TFLOPS/W per cluster, node and job, each with its
measurement quality (measured, estimated, not available and why)."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
import numpy as np

from gpuwatt.dashboard.components import (
    QUALITY_TEXT,
    data_table,
    figure_kpi,
    graph,
    page_frame,
    section,
)
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.figures import bar_figure, efficiency_figure

PAGE = "efficiency"
PATH = "/efficiency"
NAME = "Efficiency"
ORDER = 3

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


def _fmt(x: Any, fmt: str = ".3g") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return format(v, fmt) if np.isfinite(v) else "n/a"


def job_table(ctx: PageContext) -> Any:
    jobs = ctx.win.summary.energy_by_job
    if jobs.empty:
        return dmc.Text("no job data in this range", c="dimmed")
    cur = ctx.win.summary.tariff.currency
    rows = [
        (
            r["job_id"],
            r["gpus"],
            _fmt(r["energy_kwh"]),
            _fmt(r["cost"]),
            _fmt(r["co2_kg"]),
            QUALITY_TEXT.get(str(r["energy_quality"]), str(r["energy_quality"])),
        )
        for _, r in jobs.iterrows()
    ]
    head = ("job", "GPUs", "energy kWh", f"cost {cur}", "CO2 kg", "quality")
    return data_table(head, rows, striped=True, fz="sm", id_="energy-per-job")


def render(ctx: PageContext) -> list[Any]:
    s = ctx.win.summary
    kpis = [
        figure_kpi(label, s.cluster[key], help_text)
        for key, (label, help_text) in _HELP.items()
        if key in s.cluster
    ]
    tf = s.cluster.get("tflops_per_w")
    reason = tf.reason if tf is not None and tf.value is None else ""
    nodes = s.energy_by_node
    out: list[Any] = [
        dmc.SimpleGrid(
            kpis, cols={"base": 2, "sm": 4}, spacing="sm", mb="md", id="efficiency-kpis"
        ),
        section(
            "Power and TFLOPS/W over time", graph(efficiency_figure(s.efficiency_over_time, reason))
        ),
        section(
            "Energy per node",
            graph(
                bar_figure(
                    [str(h) for h in nodes.get("host", [])],
                    list(nodes.get("energy_kwh", [])),
                    title="energy",
                    unit="kWh",
                )
            ),
        ),
        section("Energy per job", job_table(ctx)),
    ]
    return out
