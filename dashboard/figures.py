"""Pure figure builders: tables in, plotly figure dicts out (no I/O, no Dash).

Dicts rather than ``go.Figure`` objects: a callback returning a dict skips plotly's validation
and serialisation (measured several times cheaper). Point budgets: the cluster is shown as
heatmaps and percentile bands (one cell per GPU or node and time bucket); individual lines only
in a drill-down of one node. Traces are SVG (``scatter``), never WebGL: the point counts are
already small, and headless/remote browsers render WebGL in software.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpuwatt.dashboard.timerange import NS_PER_S
from gpuwatt.status import natural_key

Fig = dict[str, Any]

#: Beyond this many GPUs the heatmap over time shows one row per node instead of per GPU.
MAX_GPU_ROWS = 64
MUTED = "#868e96"
GRID = "rgba(134,142,150,0.25)"
LINE = "#228be6"
STRAGGLER = "#fa5252"
BAND = "rgba(134,142,150,0.25)"

#: Line colours for the ordinary series: no red or orange, which are kept for the highlighted
#: (straggler / selected) series so that it never shares a colour with another line.
OTHERS = (
    "#4c6ef5", "#12b886", "#7950f2", "#15aabf", "#82c91e", "#be4bdb", "#1c7ed6", "#868e96",
    "#40c057", "#3bc9db", "#5c7cfa", "#94d82d",
)  # fmt: skip

LABELS: dict[str, tuple[str, str]] = {
    "utilization_gpu_pct": ("utilisation", "%"),
    "power_w": ("power", "W"),
    "power_limit_w": ("power limit", "W"),
    "temperature_gpu_c": ("temperature", "°C"),
    "sm_clock_mhz": ("SM clock", "MHz"),
    "tensor_active_pct": ("tensor activity", "%"),
    "memory_used_bytes": ("memory used", "B"),
    "energy_j": ("energy counter", "J"),
    "fan_speed_pct": ("fan speed", "%"),
    "pcie_tx_bytes_per_s": ("PCIe transmit", "B/s"),
    "pcie_rx_bytes_per_s": ("PCIe receive", "B/s"),
    "nvlink_tx_bytes_per_s": ("NVLink transmit", "B/s"),
    "nvlink_rx_bytes_per_s": ("NVLink receive", "B/s"),
    "ecc_sbe_volatile_count": ("ECC single-bit errors (volatile)", ""),
    "ecc_dbe_volatile_count": ("ECC double-bit errors (volatile)", ""),
    "remapped_rows_correctable": ("remapped rows (correctable)", ""),
    "remapped_rows_uncorrectable": ("remapped rows (uncorrectable)", ""),
    "tflops": ("TFLOPS", "TFLOPS"),
}
#: Units shown with an SI prefix (plotly's d3 format ``~s``: 15.9k W -> "15.9kW").
SI_UNITS = frozenset({"W", "B", "B/s", "J", "Wh", "FLOPS"})


def natural_sorted(values: Iterable[Any]) -> list[str]:
    """Node names in human order: node-2 before node-10."""
    return sorted((str(v) for v in values), key=natural_key)


def value_axis(name: str, unit: str, **extra: Any) -> dict[str, Any]:
    """A y (or x) axis with a title naming the unit, SI-prefixed ticks for W, B/s, FLOPS..."""
    axis: dict[str, Any] = {
        "title": {"text": f"{name} ({unit})" if unit else name},
        "gridcolor": GRID,
        "zeroline": False,
    }
    if unit in SI_UNITS:
        axis.update(tickformat="~s", ticksuffix=unit)
    elif unit == "%":
        axis.update(ticksuffix=" %")
    else:
        axis.update(tickformat="~r")  # plain numbers, never e-notation
    axis.update(extra)
    return axis


def hover_value(unit: str, ref: str = "y") -> str:
    """The hover text of a value: SI prefix where the unit takes one, 3 significant digits."""
    if unit in SI_UNITS:
        return "%{" + ref + ":.3~s}" + unit
    return "%{" + ref + ":.3~r}" + (f" {unit}" if unit else "")


TIME_AXIS: dict[str, Any] = {
    "title": {"text": "time (UTC)"},
    "type": "date",
    "gridcolor": GRID,
    "zeroline": False,
}


def with_gaps(
    x_ns: np.ndarray, ys: Sequence[np.ndarray], step_s: float | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Insert a NaN point where consecutive buckets are more than 1.5 steps apart, so that a
    line is broken at a gap instead of joining across it (plotly breaks lines at null values
    when ``connectgaps`` is false). ``step_s`` defaults to the smallest spacing seen."""
    x = np.asarray(x_ns, dtype="int64")
    arrays = [np.asarray(y, dtype=float) for y in ys]
    if len(x) < 2:
        return x, arrays
    dx = np.diff(x)
    step_ns = float(step_s) * NS_PER_S if step_s else float(dx[dx > 0].min(initial=0) or 0)
    if step_ns <= 0:
        return x, arrays
    gaps = np.flatnonzero(dx > 1.5 * step_ns)
    if not len(gaps):
        return x, arrays
    at = gaps + 1
    x_out = np.insert(x, at, x[gaps] + np.int64(step_ns))
    return x_out, [np.insert(a, at, np.nan) for a in arrays]


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
        "hoverlabel": {"namelength": -1},
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


def _heat_colorbar(unit: str) -> dict[str, Any]:
    bar: dict[str, Any] = {"title": {"text": unit}, "thickness": 12}
    if unit in SI_UNITS:
        bar.update(tickformat="~s", ticksuffix=unit)
    return bar


def node_gpu_heatmap(
    gpus: pd.DataFrame,
    metric: str = "utilization_gpu_pct",
    marked: Sequence[tuple[str, int]] = (),
    mark_label: str = "straggler",
) -> Fig:
    """Nodes (rows) x GPU index (columns) of one value per GPU; ``marked`` GPUs get a ring.

    ``gpus`` has columns ``host``, ``gpu_index`` and ``metric`` (one row per GPU). Nodes in
    natural order (node-2 before node-10), the first at the top.
    """
    if gpus.empty or metric not in gpus.columns:
        return empty_figure("no data in this range")
    name, unit = LABELS.get(metric, (metric, ""))
    table = gpus.pivot_table(index="host", columns="gpu_index", values=metric, aggfunc="mean")
    hosts = natural_sorted(table.index)[::-1]  # first node at the top
    table = table.reindex(hosts)
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
            "colorbar": _heat_colorbar(unit),
            "hovertemplate": "%{y} %{x}<br>"
            + name
            + " "
            + hover_value(unit, "z")
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
                    "color": STRAGGLER,
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
        "layout": _layout(
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
) -> Fig:
    """GPUs (or nodes) x time buckets, colour = metric.

    ``gw`` is the per-(window, GPU) table of the analytics summary. ``per="auto"`` shows one
    row per GPU up to ``MAX_GPU_ROWS`` GPUs, else one per node (mean); ``"gpu"`` or ``"node"``
    force it. Rows in natural order, the first at the top.
    """
    if gw.empty or metric not in gw.columns:
        return empty_figure("no data in this range")
    name, unit = LABELS.get(metric, (metric, ""))
    if per == "node" or (per == "auto" and gw["gpu"].nunique() > MAX_GPU_ROWS):
        rows = gw["host"].astype(str)
        what = "node (mean of its GPUs)"
    else:
        rows = gw["host"].astype(str) + " GPU " + gw["gpu_index"].astype(str)
        what = "GPU"
    table = gw.assign(row=rows).pivot_table(
        index="row", columns="window_start_ns", values=metric, aggfunc="mean"
    )
    order = natural_sorted(table.index)[::-1]
    table = table.reindex(order)
    z = [_clean(r, 0) for r in table.to_numpy(dtype=float)]
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z,
                "x": _iso(table.columns.to_numpy()),
                "y": order,
                "zmin": 0,
                "zmax": 100 if unit == "%" else None,
                "colorscale": "Viridis",
                "colorbar": _heat_colorbar(unit),
                "hovertemplate": "%{y}<br>%{x}<br>"
                + name
                + " "
                + hover_value(unit, "z")
                + "<extra></extra>",
            }
        ],
        "layout": _layout(
            title or f"{name} per {what} over time",
            height=min(900, max(260, 14 * len(order) + 110)),
            xaxis=TIME_AXIS,
            yaxis={"type": "category"},
            margin={"l": 130, "r": 20, "t": 40, "b": 50},
        ),
    }


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
) -> Fig:
    """The imbalance index over time for one scope, one line per metric (GPU level)."""
    if balance.empty:
        return empty_figure("no data in this range")
    sel = balance.loc[(balance["scope"] == scope) & (balance["level"] == "gpu")]
    if sel.empty:
        return empty_figure(f"no load-balance data for {scope}")
    data = []
    for i, (metric, rows) in enumerate(sel.groupby("metric", sort=True)):
        rows = rows.sort_values("window_start_ns")
        x, (y,) = with_gaps(rows["window_start_ns"].to_numpy(), [rows[index].to_numpy()], step_s)
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": LABELS.get(str(metric), (str(metric), ""))[0],
                "x": _iso(x),
                "y": _clean(y, 3),
                "connectgaps": False,
                "line": {"color": COLORWAY[i % len(COLORWAY)]},
                "hovertemplate": "%{x}<br>%{y:.3~r}<extra>%{fullData.name}</extra>",
            }
        )
    label = {"cv": "coefficient of variation", "jain": "Jain's fairness"}.get(index, index)
    return {
        "data": data,
        "layout": _layout(
            f"imbalance ({label}; lower is more even) - {scope}",
            xaxis=TIME_AXIS,
            yaxis=value_axis(label, "", rangemode="tozero"),
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
            "type": "date",
            **({"matches": "x"} if k else {}),
        }
        layout_axes[f"yaxis{suffix}"] = {
            "domain": [y0, y1],
            "anchor": f"x{suffix}",
            "gridcolor": GRID,
            "zeroline": False,
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
            x, (y,) = with_gaps(
                rows_m["window_start_ns"].to_numpy(), [rows_m[index].to_numpy()], step_s
            )
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": LABELS.get(m, (m, ""))[0],
                    "legendgroup": m,
                    "showlegend": k == 0,
                    "line": {"color": color[m]},
                    "connectgaps": False,
                    "x": _iso(x),
                    "y": _clean(y, 3),
                    "xaxis": f"x{suffix}",
                    "yaxis": f"y{suffix}",
                    "hovertemplate": scope + "<br>%{x}<br>%{y:.3~r}<extra>%{fullData.name}</extra>",
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
    step_s: float | None = None,
) -> Fig:
    """One GPU's line against its peers' median and 10th-90th percentile band."""
    xg, (own, median, low, high) = with_gaps(x_ns, [own, median, low, high], step_s)
    x = _iso(xg)
    hover = "%{x}<br>" + hover_value(unit) + "<extra>%{fullData.name}</extra>"
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
                "connectgaps": False,
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
                "connectgaps": False,
                "hoverinfo": "skip",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": _clean(median),
                "line": {"color": LINE, "dash": "dot"},
                "name": "peer median",
                "connectgaps": False,
                "hovertemplate": hover,
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": _clean(own),
                "line": {"color": STRAGGLER, "width": 2.5},
                "name": own_name,
                "connectgaps": False,
                "hovertemplate": hover,
            },
        ],
        "layout": _layout(
            title,
            height=280,
            xaxis=TIME_AXIS,
            yaxis=value_axis(title, unit),
            legend={"orientation": "h", "y": -0.35},
            margin={"l": 70, "r": 20, "t": 40, "b": 50},
        ),
    }


def efficiency_figure(eff: pd.DataFrame, reason: str = "", step_s: float | None = None) -> Fig:
    """Cluster power over time (W, SI-prefixed) and TFLOPS/W on a second axis (where measured)."""
    if eff.empty:
        return empty_figure("no data in this range")
    eff = eff.sort_values("window_start_ns")
    xg, (power, tfw) = with_gaps(
        eff["window_start_ns"].to_numpy(),
        [eff["power_w"].to_numpy(dtype=float), eff["tflops_per_w"].to_numpy(dtype=float)],
        step_s,
    )
    x = _iso(xg)
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "power",
            "x": x,
            "y": _clean(power, 0),
            "connectgaps": False,
            "line": {"color": LINE},
            "hovertemplate": "%{x}<br>%{y:.3~s}W<extra>power</extra>",
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
                "y": _clean(tfw, 4),
                "yaxis": "y2",
                "connectgaps": False,
                "line": {"color": "#12b886"},
                "hovertemplate": "%{x}<br>%{y:.3~r} TFLOPS/W<extra>efficiency</extra>",
            }
        )
    title = "power and TFLOPS/W" if has_tf else f"power (TFLOPS/W not available: {reason})"
    return {
        "data": data,
        "layout": _layout(
            title,
            xaxis=TIME_AXIS,
            yaxis=value_axis("power", "W", rangemode="tozero"),
            # from zero, 2 decimals: a flat 1.04-1.07 no longer reads "1.0" on every tick
            yaxis2={
                "overlaying": "y",
                "side": "right",
                "showgrid": False,
                "rangemode": "tozero",
                "tickformat": ".2f",
                "title": {"text": "TFLOPS/W"},
            },
            legend={"orientation": "h", "y": -0.3},
            margin={"l": 70, "r": 70, "t": 40, "b": 50},
        ),
    }


def bar_figure(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    unit: str,
    axis: str = "",
    highlight: Sequence[str] = (),
) -> Fig:
    """A horizontal bar per entry (per node or job): small categorical data; the ``highlight``
    entries (e.g. a straggler's node) in red."""
    if not labels:
        return empty_figure("no data in this range")
    marked = set(highlight)
    colors = [STRAGGLER if lab in marked else LINE for lab in labels]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": list(labels),
                "x": _clean(np.asarray(values, dtype=float), 3),
                "marker": {"color": colors},
                "hovertemplate": "%{y}: " + hover_value(unit, "x") + "<extra></extra>",
            }
        ],
        "layout": _layout(
            title,
            height=min(900, max(220, 20 * len(labels) + 90)),
            xaxis=value_axis(axis or title, unit),
            yaxis={"type": "category", "autorange": "reversed"},
            margin={"l": 120, "r": 20, "t": 40, "b": 50},
        ),
    }


def histogram_figure(
    values: Sequence[float],
    *,
    title: str,
    unit: str,
    axis: str,
    what: str = "nodes",
    marks: Sequence[tuple[str, float]] = (),
) -> Fig:
    """The distribution of one value per entity (too many for a bar each), ``marks`` (name,
    value) drawn as red lines: where the straggler's node sits."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return empty_figure("no data in this range")
    shapes = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": float(x),
            "x1": float(x),
            "y0": 0,
            "y1": 1,
            "line": {"color": STRAGGLER, "width": 2, "dash": "dot"},
        }
        for _, x in marks
    ]
    notes = [
        {
            "x": float(x),
            "y": 1,
            "xref": "x",
            "yref": "paper",
            "text": name,
            "showarrow": False,
            "yanchor": "bottom",
            "font": {"color": STRAGGLER, "size": 11},
        }
        for name, x in marks
    ]
    return {
        "data": [
            {
                "type": "histogram",
                "x": _clean(v, 3),
                "nbinsx": min(40, max(5, len(v) // 3)),
                "marker": {"color": LINE},
                "hovertemplate": "%{x}: %{y} " + what + "<extra></extra>",
            }
        ],
        "layout": _layout(
            title,
            height=280,
            xaxis=value_axis(axis, unit),
            yaxis=value_axis(what, ""),
            shapes=shapes,
            annotations=notes,
            bargap=0.05,
            margin={"l": 60, "r": 20, "t": 50, "b": 50},
        ),
    }


def node_lines(
    frame: pd.DataFrame,
    metric: str,
    *,
    highlight: int | None = None,
    events: pd.DataFrame | None = None,
    step_s: float | None = None,
    label: tuple[str, str] | None = None,
) -> Fig:
    """One line per GPU of a node for one metric; ``events`` (time_ns, gpu_index, label) marked.

    For a drill-down: one node's GPUs (a few dozen lines at most) in server-side buckets. The
    ``highlight`` GPU is drawn thick and red; no other line is red or orange.
    """
    name, unit = label or LABELS.get(metric, (metric, ""))
    if frame.empty or metric not in frame.columns or frame[metric].notna().sum() == 0:
        return empty_figure(f"{name}: not measured in this range")
    data = []
    for k, (idx, rows) in enumerate(frame.groupby("gpu_index", sort=True)):
        hl = highlight is not None and int(idx) == highlight
        rows = rows.sort_values("time_ns")
        x, (y,) = with_gaps(rows["time_ns"].to_numpy(), [rows[metric].to_numpy(float)], step_s)
        color = STRAGGLER if hl else OTHERS[k % len(OTHERS)]
        width = 3 if hl else (1.0 if highlight is not None else 1.4)
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"GPU {idx}",
                "x": _iso(x),
                "y": _clean(y, 2),
                "connectgaps": False,
                "line": {"width": width, "color": color},
                "hovertemplate": "%{x}<br>" + hover_value(unit) + "<extra>%{fullData.name}</extra>",
            }
        )
    if highlight is not None:  # the highlighted line on top
        data.sort(key=lambda t: t["name"] == f"GPU {highlight}")
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
                "marker": {"symbol": "triangle-up", "color": "#f08c00", "size": 9},
            }
        )
    return {
        "data": data,
        "layout": _layout(
            name,
            height=280,
            xaxis=TIME_AXIS,
            yaxis=value_axis(name, unit),
            yaxis2={"overlaying": "y", "visible": False, "range": [0, 10]},
            legend={"orientation": "h", "y": -0.35},
            margin={"l": 70, "r": 20, "t": 40, "b": 50},
        ),
    }


def band_rows(
    rows: Sequence[tuple[str, np.ndarray, np.ndarray]],
    *,
    title: str,
    x_range: tuple[int, int] | None = None,
) -> Fig:
    """On/off states over time as a band per row (a reason, an event kind): a heatmap of
    0/1 (or a fraction of the bucket), one row per ``(label, time_ns, value)``."""
    if not rows:
        return empty_figure(f"{title}: nothing in this range", height=160)
    times = np.unique(np.concatenate([np.asarray(t, dtype="int64") for _, t, _ in rows]))
    pos = {int(t): i for i, t in enumerate(times)}
    z = []
    for _, t, v in rows:
        line = np.full(len(times), np.nan)
        for ti, vi in zip(np.asarray(t, dtype="int64"), np.asarray(v, dtype=float), strict=True):
            line[pos[int(ti)]] = vi
        z.append(_clean(line, 2))
    layout = _layout(
        title,
        height=max(160, 26 * len(rows) + 90),
        xaxis=dict(TIME_AXIS),
        yaxis={"type": "category", "autorange": "reversed"},
        margin={"l": 170, "r": 20, "t": 40, "b": 50},
    )
    if x_range is not None:
        layout["xaxis"]["range"] = _iso(list(x_range))
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z,
                "x": _iso(times),
                "y": [label for label, _, _ in rows],
                "zmin": 0,
                "zmax": 1,
                "colorscale": [[0, "rgba(134,142,150,0.08)"], [1, STRAGGLER]],
                "showscale": False,
                "xgap": 0,
                "ygap": 2,
                "hovertemplate": "%{y}<br>%{x}<br>active %{z:.0%} of the bucket<extra></extra>",
            }
        ],
        "layout": layout,
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
