"""Balance within nodes: the GPUs furthest from their node's median, small multiples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from gpuwatt.dashboard.figures import base as fb


def unusual_gpus(gw: pd.DataFrame, metric: str, k: int, always: Sequence[str] = ()) -> list[str]:
    """The ``k`` GPUs (``gpu`` keys) furthest from their node's median over the range, the
    ``always`` ones (stragglers) first: what a cluster-wide heatmap must not average away."""
    if gw.empty or metric not in gw.columns:
        return []
    med = gw.groupby(["window_start_ns", "host"])[metric].transform("median")
    dev = (gw[metric] - med).abs().groupby(gw["gpu"]).mean().sort_values(ascending=False)
    first = [g for g in always if g in dev.index]
    rest = [g for g in dev.index if g not in set(first)]
    return (first + rest)[: max(k, len(first))]


def imbalance_figure(
    balance: pd.DataFrame, scope: str = "cluster", index: str = "cv", step_s: float | None = None
) -> fb.Fig:
    """The imbalance index over time for one scope, one line per metric (GPU level)."""
    if balance.empty:
        return fb.empty_figure("no data in this range")
    sel = balance.loc[(balance["scope"] == scope) & (balance["level"] == "gpu")]
    if sel.empty:
        return fb.empty_figure(f"no load-balance data for {scope}")
    data = []
    for i, (metric, rows) in enumerate(sel.groupby("metric", sort=True)):
        rows = rows.sort_values("window_start_ns")
        x, (y,) = fb.with_gaps(rows["window_start_ns"].to_numpy(), [rows[index].to_numpy()], step_s)
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": fb.LABELS.get(str(metric), (str(metric), ""))[0],
                "x": fb.iso_dates(x),
                "y": fb.json_floats(y, 3),
                "connectgaps": False,
                "line": {"color": COLORWAY[i % len(COLORWAY)]},
                "hovertemplate": "%{x}<br>%{y:.3~r}<extra>%{fullData.name}</extra>",
            }
        )
    label = {"cv": "coefficient of variation", "jain": "Jain's fairness"}.get(index, index)
    return {
        "data": data,
        "layout": fb.base_layout(
            f"imbalance ({label}; lower is more even) - {scope}",
            xaxis=fb.TIME_AXIS,
            yaxis=fb.value_axis(label, "", rangemode="tozero"),
            legend={"orientation": "h", "y": -0.3},
            margin={"l": 60, "r": 20, "t": 40, "b": 50},
        ),
    }


#: Metric colours shared by every small multiple (no red: red marks stragglers).
COLORWAY = ("#4c6ef5", "#12b886", "#7950f2", "#fab005", "#15aabf", "#be4bdb", "#82c91e")


def imbalance_grid(
    balance: pd.DataFrame,
    scopes: Sequence[str],
    index: str = "cv",
    cols: int = 2,
    step_s: float | None = None,
) -> fb.Fig:
    """The imbalance index over time for several scopes (jobs) as small multiples in one figure.

    Same lines as ``imbalance_figure`` per scope (one per metric, GPU level), one subplot per
    scope with its name above it, one legend, linked time axes. One plotly graph instead of one
    per job: each graph costs the browser a full plot, legend, mode bar and resize handling.
    """
    sel = balance.loc[balance["scope"].isin(list(scopes)) & (balance["level"] == "gpu")]
    if balance.empty or sel.empty:
        return fb.empty_figure("no load-balance data for these jobs")
    shown = [sc for sc in scopes if (sel["scope"] == sc).any()]
    metrics = sorted(str(m) for m in sel["metric"].unique())
    color = {m: COLORWAY[i % len(COLORWAY)] for i, m in enumerate(metrics)}
    cols = max(1, min(cols, len(shown)))
    rows = math.ceil(len(shown) / cols)
    row_h, top, bottom = 200, 40, 40  # px per subplot row; title above, legend below
    name_h, ticks_h = 22, 42  # px in each row for the subplot's name and its time labels
    height = rows * row_h + top + bottom
    gap_x = 0.06
    data: list[dict[str, Any]] = []
    layout_axes: dict[str, Any] = {}
    names: list[dict[str, Any]] = []
    for k, scope in enumerate(shown):
        r, c = divmod(k, cols)
        suffix = "" if k == 0 else str(k + 1)
        x0 = c / cols + (gap_x / 2 if c else 0)
        x1 = (c + 1) / cols - (gap_x / 2 if c < cols - 1 else 0)
        slot_top = (rows - r) * row_h  # px from the bottom of the plotting area
        y1 = (slot_top - name_h) / (rows * row_h)
        y0 = (slot_top - row_h + ticks_h) / (rows * row_h)
        grid = {"gridcolor": fb.GRID, "zeroline": False}
        layout_axes[f"xaxis{suffix}"] = grid | {
            "domain": [x0, x1],
            "anchor": f"y{suffix}",
            "type": "date",
            **({"matches": "x"} if k else {}),
        }
        layout_axes[f"yaxis{suffix}"] = grid | {
            "domain": [y0, y1],
            "anchor": f"x{suffix}",
            "rangemode": "tozero",
            "tickformat": "~r",
            **({"title": {"text": "CV"}} if c == 0 else {}),
        }
        names.append(
            {
                "text": scope,
                "showarrow": False,
                "xref": "paper",
                "yref": "paper",
                "x": x0,
                "y": y1,
                "xanchor": "left",
                "yanchor": "bottom",
                "font": {"size": 12},
            }
        )
        for metric, rows_m in sel.loc[sel["scope"] == scope].groupby("metric", sort=True):
            rows_m = rows_m.sort_values("window_start_ns")
            m = str(metric)
            x, (y,) = fb.with_gaps(
                rows_m["window_start_ns"].to_numpy(), [rows_m[index].to_numpy()], step_s
            )
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": fb.LABELS.get(m, (m, ""))[0],
                    "legendgroup": m,
                    "showlegend": k == 0,
                    "line": {"color": color[m]},
                    "connectgaps": False,
                    "x": fb.iso_dates(x),
                    "y": fb.json_floats(y, 3),
                    "xaxis": f"x{suffix}",
                    "yaxis": f"y{suffix}",
                    "hovertemplate": scope + "<br>%{x}<br>%{y:.3~r}<extra>%{fullData.name}</extra>",
                }
            )
    label = {"cv": "coefficient of variation", "jain": "Jain's fairness"}.get(index, index)
    layout = fb.base_layout(
        f"imbalance ({label}; lower is more even) per job",
        height=height,
        margin={"l": 60, "r": 20, "t": top, "b": bottom},
        legend={"orientation": "h", "y": 0, "yanchor": "top"},
        annotations=names,
    )
    layout.update(layout_axes)
    return {"data": data, "layout": layout}
