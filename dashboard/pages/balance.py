"""Load balance: utilisation over time (heatmap), the imbalance index over time, per job."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc

from gpuwatt.dashboard.components import graph, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.figures import imbalance_figure, imbalance_grid, time_heatmap

PAGE = "balance"
PATH = "/balance"
NAME = "Load balance"
ORDER = 1
MAX_JOBS = 8


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


def render(ctx: PageContext) -> list[Any]:
    s = ctx.win.summary
    out: list[Any] = [
        section(
            "Utilisation over time",
            graph(time_heatmap(s.gpu_windows, "utilization_gpu_pct"), "balance-heatmap"),
            help_text="One row per GPU (per node beyond 64 GPUs), one column per time bucket.",
        ),
        section(
            "Imbalance index, whole cluster",
            graph(imbalance_figure(s.balance, "cluster", s.default_imbalance_index)),
            help_text="Coefficient of variation across GPUs per window: 0.1 means GPUs deviate "
            "from the mean by about 10 %. Lower is more even.",
        ),
    ]
    jobs = s.jobs[:MAX_JOBS]
    if jobs:
        scopes = [f"job:{j}" for j in jobs]
        out.append(
            section(
                "Imbalance per job",
                graph(imbalance_grid(s.balance, scopes, s.default_imbalance_index), "balance-jobs"),
                help_text="The same index within each job's GPUs, one small plot per job.",
            )
        )
    idle = [
        dmc.Text(i.explanation, size="sm", c="orange" if i.allocated else "dimmed") for i in s.idle
    ]
    out.append(section("Idle GPUs", *(idle or [dmc.Text("none", c="dimmed")])))
    return out
