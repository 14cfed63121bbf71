"""Heatmaps: node x GPU now, and GPUs (or nodes) over time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from gpuwatt.dashboard.figures import base as fb


def _heat_colorbar(unit: str) -> dict[str, Any]:
    bar: dict[str, Any] = {"title": {"text": unit}, "thickness": 12}
    if unit in fb.SI_UNITS:
        bar.update(tickformat="~s", ticksuffix=unit)
    return bar


def node_gpu_heatmap(
    gpus: pd.DataFrame,
    metric: str = "utilization_gpu_pct",
    marked: Sequence[tuple[str, int]] = (),
    mark_label: str = "straggler",
) -> fb.Fig:
    """Nodes (rows) x GPU index (columns) of one value per GPU; ``marked`` GPUs get a ring.

    ``gpus`` has columns ``host``, ``gpu_index`` and ``metric`` (one row per GPU). Nodes in
    natural order (node-2 before node-10), the first at the top.
    """
    if gpus.empty or metric not in gpus.columns:
        return fb.empty_figure("no data in this range")
    name, unit = fb.LABELS.get(metric, (metric, ""))
    table = gpus.pivot_table(index="host", columns="gpu_index", values=metric, aggfunc="mean")
    hosts = fb.natural_sorted(table.index)[::-1]  # first node at the top
    table = table.reindex(hosts)
    cols = [int(c) for c in table.columns]
    z = [fb.json_floats(row, 0) for row in table.to_numpy(dtype=float)]
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "z": z,
            "x": [f"GPU {c}" for c in cols],
            "y": hosts,
            "zmin": 0,
            "zmax": 100 if unit == "%" else None,
            "colorscale": "Viridis",
            "colorbar": _heat_colorbar(unit),
            "hovertemplate": "%{y} %{x}<br>"
            + name
            + " "
            + fb.hover_value(unit, "z")
            + "<extra></extra>",
            "xgap": 1,
            "ygap": 1 if len(hosts) <= 64 else 0,
        }
    ]
    if marked:
        pos = {h: i for i, h in enumerate(hosts)}
        mx = [f"GPU {i}" for h, i in marked if h in pos]
        my = [h for h, _ in marked if h in pos]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": mx,
                "y": my,
                "marker": {
                    "symbol": "circle-open",
                    "size": 16,
                    "color": fb.STRAGGLER,
                    "line": {"width": 3},
                },
                "name": mark_label,
                "hovertemplate": "%{y} %{x}: " + mark_label + "<extra></extra>",
                "showlegend": False,
            }
        )
    height = min(900, max(220, 22 * len(hosts) + 100))
    return {
        "data": data,
        "layout": fb.base_layout(
            height=height,
            # GPU labels at the top, clear of the mode bar (shown on hover, top right)
            xaxis={"side": "top", "type": "category", "title": {"text": "GPU index"}},
            yaxis={"type": "category", "title": {"text": "node"}},
            margin={"l": 90, "r": 20, "t": 60, "b": 10},
        ),
    }


def time_heatmap(
    gw: pd.DataFrame,
    metric: str = "utilization_gpu_pct",
    *,
    per: str = "auto",
    title: str = "",
) -> fb.Fig:
    """GPUs (or nodes) x time buckets, colour = metric.

    ``gw`` is the per-(window, GPU) table of the analytics summary. ``per="auto"`` shows one
    row per GPU up to ``fb.MAX_GPU_ROWS`` GPUs, else one per node (mean); ``"gpu"`` or ``"node"``
    force it. Rows in natural order, the first at the top.
    """
    if gw.empty or metric not in gw.columns:
        return fb.empty_figure("no data in this range")
    name, unit = fb.LABELS.get(metric, (metric, ""))
    if per == "node" or (per == "auto" and gw["gpu"].nunique() > fb.MAX_GPU_ROWS):
        rows = gw["host"].astype(str)
        what = "node (mean of its GPUs)"
    else:
        rows = gw["host"].astype(str) + " GPU " + gw["gpu_index"].astype(str)
        what = "GPU"
    table = gw.assign(row=rows).pivot_table(
        index="row", columns="window_start_ns", values=metric, aggfunc="mean"
    )
    order = fb.natural_sorted(table.index)[::-1]
    table = table.reindex(order)
    z = [fb.json_floats(r, 0) for r in table.to_numpy(dtype=float)]
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z,
                "x": fb.iso_dates(table.columns.to_numpy()),
                "y": order,
                "zmin": 0,
                "zmax": 100 if unit == "%" else None,
                "colorscale": "Viridis",
                "colorbar": _heat_colorbar(unit),
                "hovertemplate": "%{y}<br>%{x}<br>"
                + name
                + " "
                + fb.hover_value(unit, "z")
                + "<extra></extra>",
            }
        ],
        "layout": fb.base_layout(
            title or f"{name} per {what} over time",
            height=min(900, max(260, 14 * len(order) + 110)),
            xaxis=fb.TIME_AXIS,
            yaxis={"type": "category"},
            margin={"l": 130, "r": 20, "t": 40, "b": 50},
        ),
    }
