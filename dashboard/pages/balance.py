"""Load balance: utilisation over time (heatmap), the imbalance index over time, per job."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc

from gpuwatt.dashboard.components import graph, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.figures import (
    MAX_GPU_ROWS,
    imbalance_figure,
    imbalance_grid,
    time_heatmap,
    unusual_gpus,
)

PAGE = "balance"
PATH = "/balance"
NAME = "Load balance"
#: The content is drawn from the view's window, range and query alone (``render_cache``).
RENDERS_FROM_WINDOW = True
ORDER = 1
MAX_JOBS = 8
#: Beyond MAX_GPU_ROWS GPUs: this many GPU rows, those furthest from their node's median.
UNUSUAL_ROWS = 32


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


def utilisation_sections(ctx: PageContext) -> list[Any]:
    """Utilisation over time: a row per GPU; beyond MAX_GPU_ROWS GPUs a row per node *and* the
    GPUs furthest from their node's median (stragglers first), so that a node's mean never
    hides the one slow GPU at 1,000 GPUs."""
    gw = ctx.win.summary.gpu_windows
    metric = "utilization_gpu_pct"
    if gw.empty or gw["gpu"].nunique() <= MAX_GPU_ROWS:
        return [
            section(
                "Utilisation over time",
                graph(time_heatmap(gw, metric, per="gpu"), "balance-heatmap", zoom=True),
                help_text="One row per GPU, one column per time bucket.",
            )
        ]
    strag = [x.uuid for x in ctx.win.stragglers]
    keep = unusual_gpus(gw, metric, UNUSUAL_ROWS, strag)
    sub = gw.loc[gw["gpu"].isin(keep)]
    return [
        section(
            f"The {len(keep)} most unusual GPUs over time",
            graph(
                time_heatmap(
                    sub,
                    metric,
                    per="gpu",
                    title=f"utilisation of the {len(keep)} GPUs "
                    "furthest from their node's median (stragglers first)",
                ),
                "balance-unusual",
                zoom=True,
            ),
            help_text="Ranked by the mean distance of their utilisation from the median of "
            "their node's GPUs; active stragglers always included.",
        ),
        section(
            "Utilisation over time, per node",
            graph(time_heatmap(gw, metric, per="node"), "balance-heatmap", zoom=True),
            help_text="The mean of each node's GPUs: an even node can still hide one slow GPU, "
            "which the chart above shows.",
        ),
    ]


def render(ctx: PageContext) -> list[Any]:
    s = ctx.win.summary
    step = ctx.range.step_s
    out: list[Any] = [*utilisation_sections(ctx)]
    out += [
        section(
            "Imbalance index, whole cluster",
            graph(
                imbalance_figure(s.balance, "cluster", s.default_imbalance_index, step),
                zoom=True,
            ),
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
                graph(
                    imbalance_grid(s.balance, scopes, s.default_imbalance_index, step_s=step),
                    "balance-jobs",
                    zoom=True,
                ),
                help_text="The same index within each job's GPUs, one small plot per job.",
            )
        )
    idle = [
        dmc.Text(i.explanation, size="sm", c="orange" if i.allocated else "dimmed") for i in s.idle
    ]
    out.append(section("Idle GPUs", *(idle or [dmc.Text("none", c="dimmed")])))
    return out
