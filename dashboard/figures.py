"""Pure figure builders: tables in, plotly figure dicts out (no I/O, no Dash).

Dicts rather than ``go.Figure`` objects: a callback returning a dict skips plotly's validation
and serialisation (measured several times cheaper). Point budgets: the cluster is shown as
heatmaps and percentile bands (one cell per GPU or node and time bucket); individual lines only
in a drill-down of one node. Traces are SVG (``scatter``), never WebGL: the point counts are
already small, and headless/remote browsers render WebGL in software.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpuwatt.dashboard.timerange import NS_PER_S

Fig = dict[str, Any]

#: Beyond this many GPUs the heatmap over time shows one row per node instead of per GPU.
MAX_GPU_ROWS = 64
MUTED = "#868e96"
GRID = "rgba(134,142,150,0.25)"
LINE = "#228be6"
STRAGGLER = "#fa5252"
BAND = "rgba(134,142,150,0.25)"

LABELS: dict[str, tuple[str, str]] = {
    "utilization_gpu_pct": ("utilisation", "%"),
    "power_w": ("power", "W"),
    "temperature_gpu_c": ("temperature", "°C"),
    "sm_clock_mhz": ("SM clock", "MHz"),
    "tensor_active_pct": ("tensor activity", "%"),
    "memory_used_bytes": ("memory used", "GiB"),
    "energy_j": ("energy counter", "kWh"),
}


def _iso(ns: np.ndarray | Sequence[int]) -> list[str]:
    """Epoch ns -> ISO strings plotly reads as dates (UTC)."""
    arr = np.asarray(ns, dtype="int64").astype("datetime64[ns]").astype("datetime64[s]")
    return [str(x) for x in arr]


def _clean(values: np.ndarray, digits: int = 1) -> list[float | None]:
    """Rounded floats with None for NaN (JSON has no NaN; fewer digits, smaller responses)."""
    out: list[float | None] = []
    for v in np.round(np.asarray(values, dtype=float), digits):
        out.append(None if not math.isfinite(v) else float(v))
    return out


def _layout(title: str = "", height: int = 320, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40 if title else 10, "b": 40},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"color": MUTED},
        "xaxis": {"gridcolor": GRID, "zeroline": False},
        "yaxis": {"gridcolor": GRID, "zeroline": False},
        "hovermode": "closest",
    }
    layout.update(extra)
    return layout


def empty_figure(message: str, height: int = 220) -> Fig:
    """A figure that says why there is nothing to plot."""
    return {
        "data": [],
        "layout": _layout(
            height=height,
            xaxis={"visible": False},
            yaxis={"visible": False},
            annotations=[
                {
                    "text": message,
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": 0.5,
                    "font": {"size": 14, "color": MUTED},
                }
            ],
        ),
    }


def node_gpu_heatmap(
    gpus: pd.DataFrame,
    metric: str = "utilization_gpu_pct",
    marked: Sequence[tuple[str, int]] = (),
) -> Fig:
    """Nodes (rows) x GPU index (columns) of one value per GPU; ``marked`` GPUs get a ring.

    ``gpus`` has columns ``host``, ``gpu_index`` and ``metric`` (one row per GPU).
    """
    if gpus.empty or metric not in gpus.columns:
        return empty_figure("no data in this range")
    name, unit = LABELS.get(metric, (metric, ""))
    table = gpus.pivot_table(index="host", columns="gpu_index", values=metric, aggfunc="mean")
    table = table.sort_index(ascending=False)  # first node at the top
    hosts = [str(h) for h in table.index]
    cols = [int(c) for c in table.columns]
    z = [_clean(row, 0) for row in table.to_numpy(dtype=float)]
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "z": z,
            "x": [f"GPU {c}" for c in cols],
            "y": hosts,
            "zmin": 0,
            "zmax": 100 if unit == "%" else None,
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": unit}, "thickness": 12},
            "hovertemplate": "%{y} %{x}<br>" + name + " %{z} " + unit + "<extra></extra>",
            "xgap": 1,
            "ygap": 1,
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
                    "color": STRAGGLER,
                    "line": {"width": 3},
                },
                "name": "straggler",
                "hovertemplate": "%{y} %{x}: straggler<extra></extra>",
                "showlegend": False,
            }
        )
    height = min(900, max(220, 22 * len(hosts) + 80))
    return {
        "data": data,
        "layout": _layout(
            height=height,
            xaxis={"side": "top", "type": "category"},
            yaxis={"type": "category"},
            margin={"l": 80, "r": 20, "t": 30, "b": 10},
        ),
    }


def time_heatmap(gw: pd.DataFrame, metric: str = "utilization_gpu_pct") -> Fig:
    """GPUs (or nodes, for more than MAX_GPU_ROWS GPUs) x time buckets, colour = metric.

    ``gw`` is the per-(window, GPU) table of the analytics summary.
    """
    if gw.empty or metric not in gw.columns:
        return empty_figure("no data in this range")
    name, unit = LABELS.get(metric, (metric, ""))
    if gw["gpu"].nunique() > MAX_GPU_ROWS:
        rows = gw["host"].astype(str)
        what = "node mean"
    else:
        rows = gw["host"].astype(str) + " GPU " + gw["gpu_index"].astype(str)
        what = "GPU"
    table = (
        gw.assign(row=rows)
        .pivot_table(index="row", columns="window_start_ns", values=metric, aggfunc="mean")
        .sort_index(ascending=False)
    )
    z = [_clean(r, 0) for r in table.to_numpy(dtype=float)]
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z,
                "x": _iso(table.columns.to_numpy()),
                "y": [str(r) for r in table.index],
                "zmin": 0,
                "zmax": 100 if unit == "%" else None,
                "colorscale": "Viridis",
                "colorbar": {"title": {"text": unit}, "thickness": 12},
                "hovertemplate": "%{y}<br>%{x}<br>" + name + " %{z} " + unit + "<extra></extra>",
            }
        ],
        "layout": _layout(
            f"{name} per {what} over time",
            height=min(900, max(260, 14 * len(table.index) + 90)),
            yaxis={"type": "category"},
            margin={"l": 120, "r": 20, "t": 40, "b": 40},
        ),
    }


def imbalance_figure(balance: pd.DataFrame, scope: str = "cluster", index: str = "cv") -> Fig:
    """The imbalance index over time for one scope, one line per metric (GPU level)."""
    if balance.empty:
        return empty_figure("no data in this range")
    sel = balance.loc[(balance["scope"] == scope) & (balance["level"] == "gpu")]
    if sel.empty:
        return empty_figure(f"no load-balance data for {scope}")
    data = []
    for metric, rows in sel.groupby("metric", sort=True):
        rows = rows.sort_values("window_start_ns")
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": LABELS.get(str(metric), (str(metric), ""))[0],
                "x": _iso(rows["window_start_ns"].to_numpy()),
                "y": _clean(rows[index].to_numpy(), 3),
            }
        )
    label = {"cv": "coefficient of variation", "jain": "Jain's fairness"}.get(index, index)
    return {
        "data": data,
        "layout": _layout(
            f"imbalance ({label}; lower is more even) - {scope}",
            yaxis={"gridcolor": GRID, "rangemode": "tozero"},
            legend={"orientation": "h", "y": -0.2},
        ),
    }


#: Metric colours shared by every small multiple (plotly's default colorway, in metric order).
COLORWAY = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692")


def imbalance_grid(
    balance: pd.DataFrame, scopes: Sequence[str], index: str = "cv", cols: int = 2
) -> Fig:
    """The imbalance index over time for several scopes (jobs) as small multiples in one figure.

    Same lines as ``imbalance_figure`` per scope (one per metric, GPU level), one subplot per
    scope with its name above it, one legend, linked time axes. One plotly graph instead of one
    per job: each graph costs the browser a full plot, legend, mode bar and resize handling.
    """
    sel = balance.loc[balance["scope"].isin(list(scopes)) & (balance["level"] == "gpu")]
    if balance.empty or sel.empty:
        return empty_figure("no load-balance data for these jobs")
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
        layout_axes[f"xaxis{suffix}"] = {
            "domain": [x0, x1],
            "anchor": f"y{suffix}",
            "gridcolor": GRID,
            "zeroline": False,
            **({"matches": "x"} if k else {}),
        }
        layout_axes[f"yaxis{suffix}"] = {
            "domain": [y0, y1],
            "anchor": f"x{suffix}",
            "gridcolor": GRID,
            "zeroline": False,
            "rangemode": "tozero",
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
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": LABELS.get(m, (m, ""))[0],
                    "legendgroup": m,
                    "showlegend": k == 0,
                    "line": {"color": color[m]},
                    "x": _iso(rows_m["window_start_ns"].to_numpy()),
                    "y": _clean(rows_m[index].to_numpy(), 3),
                    "xaxis": f"x{suffix}",
                    "yaxis": f"y{suffix}",
                    "hovertemplate": scope + "<br>%{x}<br>%{y}<extra>%{fullData.name}</extra>",
                }
            )
    label = {"cv": "coefficient of variation", "jain": "Jain's fairness"}.get(index, index)
    layout = _layout(
        f"imbalance ({label}; lower is more even) per job",
        height=height,
        margin={"l": 60, "r": 20, "t": top, "b": bottom},
        legend={"orientation": "h", "y": 0, "yanchor": "top"},
        annotations=names,
    )
    layout.update(layout_axes)
    return {"data": data, "layout": layout}


def band_figure(
    x_ns: np.ndarray,
    own: np.ndarray,
    median: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    *,
    title: str,
    own_name: str,
    unit: str,
) -> Fig:
    """One GPU's line against its peers' median and 10th-90th percentile band."""
    x = _iso(x_ns)
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": _clean(high),
                "line": {"width": 0},
                "hoverinfo": "skip",
                "showlegend": False,
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": _clean(low),
                "fill": "tonexty",
                "fillcolor": BAND,
                "line": {"width": 0},
                "name": "peers p10-p90",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": _clean(median),
                "line": {"color": MUTED, "dash": "dot"},
                "name": "peer median",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": _clean(own),
                "line": {"color": STRAGGLER, "width": 2},
                "name": own_name,
            },
        ],
        "layout": _layout(f"{title} ({unit})", height=260, legend={"orientation": "h", "y": -0.25}),
    }


def efficiency_figure(eff: pd.DataFrame, reason: str = "") -> Fig:
    """Cluster TFLOPS and power over time, TFLOPS/W on a second axis (where measured)."""
    if eff.empty:
        return empty_figure("no data in this range")
    x = _iso(eff["window_start_ns"].to_numpy())
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "power (kW)",
            "x": x,
            "y": _clean(eff["power_w"].to_numpy() / 1000.0, 2),
        }
    ]
    has_tf = eff["tflops"].notna().any()
    if has_tf:
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "TFLOPS/W (GPM estimate)",
                "x": x,
                "y": _clean(eff["tflops_per_w"].to_numpy(), 4),
                "yaxis": "y2",
            }
        )
    title = "power and TFLOPS/W" if has_tf else f"power (TFLOPS/W not available: {reason})"
    return {
        "data": data,
        "layout": _layout(
            title,
            yaxis2={"overlaying": "y", "side": "right", "showgrid": False},
            legend={"orientation": "h", "y": -0.2},
        ),
    }


def bar_figure(labels: Sequence[str], values: Sequence[float], *, title: str, unit: str) -> Fig:
    """A horizontal bar per entry (per node or job): small categorical data."""
    if not labels:
        return empty_figure("no data in this range")
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": list(labels),
                "x": _clean(np.asarray(values, dtype=float), 3),
                "marker": {"color": LINE},
                "hovertemplate": "%{y}: %{x} " + unit + "<extra></extra>",
            }
        ],
        "layout": _layout(
            f"{title} ({unit})",
            height=min(900, max(220, 20 * len(labels) + 80)),
            yaxis={"type": "category", "autorange": "reversed"},
            margin={"l": 120, "r": 20, "t": 40, "b": 40},
        ),
    }


def node_lines(
    frame: pd.DataFrame,
    metric: str,
    *,
    highlight: int | None = None,
    events: pd.DataFrame | None = None,
) -> Fig:
    """One line per GPU of a node for one metric; ``events`` (time_ns, gpu_index, label) marked.

    For a drill-down: one node's GPUs (a few dozen lines at most) in server-side buckets.
    """
    if frame.empty or metric not in frame.columns or frame[metric].notna().sum() == 0:
        return empty_figure(f"{LABELS.get(metric, (metric, ''))[0]}: not measured in this range")
    name, unit = LABELS.get(metric, (metric, ""))
    scale = 1.0
    if metric == "memory_used_bytes":
        scale = 1 / 2**30
    elif metric == "energy_j":
        scale = 1 / 3.6e6
    data = []
    for idx, rows in frame.groupby("gpu_index", sort=True):
        hl = highlight is not None and int(idx) == highlight
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"GPU {idx}",
                "x": _iso(rows["time_ns"].to_numpy()),
                "y": _clean(rows[metric].to_numpy(dtype=float) * scale, 2),
                "line": {"width": 3 if hl else 1.2, **({"color": STRAGGLER} if hl else {})},
            }
        )
    if events is not None and not events.empty:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "throttle / XID",
                "x": _iso(events["time_ns"].to_numpy()),
                "y": [0.3] * len(events),
                "yaxis": "y2",
                "text": [
                    f"GPU {g}: {t}"
                    for g, t in zip(events["gpu_index"], events["label"], strict=True)
                ],
                "hovertemplate": "%{x}<br>%{text}<extra></extra>",
                "marker": {"symbol": "triangle-up", "color": STRAGGLER, "size": 8},
            }
        )
    return {
        "data": data,
        "layout": _layout(
            f"{name} ({unit})",
            height=260,
            yaxis2={"overlaying": "y", "visible": False, "range": [0, 10]},
            legend={"orientation": "h", "y": -0.25},
        ),
    }


def point_count(fig: Fig) -> int:
    """How many values a figure carries (for the point-budget tests and the bench)."""
    n = 0
    for trace in fig.get("data", []):
        z = trace.get("z")
        if z is not None:
            n += sum(len(r) for r in z)
        else:
            n += len(trace.get("y") or trace.get("x") or [])
    return n


def to_seconds(ns: int) -> float:
    return ns / NS_PER_S
