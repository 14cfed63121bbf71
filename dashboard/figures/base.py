"""What every figure builder shares: the figure type, colours, labels, axes, gaps, layout.

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

from gpuwatt.dashboard.timerange import NS_PER_S
from gpuwatt.precision import settled_array
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
    "ecc_sbe_aggregate_count": ("ECC single-bit errors (lifetime)", ""),
    "ecc_dbe_aggregate_count": ("ECC double-bit errors (lifetime)", ""),
    "remapped_rows_correctable": ("remapped rows (correctable)", ""),
    "remapped_rows_uncorrectable": ("remapped rows (uncorrectable)", ""),
    "tflops": ("TFLOPS", "TFLOPS"),
}
#: Units shown with an SI prefix (plotly's d3 format ``~s``: 15.9k W -> "15.9kW").
SI_UNITS = frozenset({"W", "B", "B/s", "J", "Wh", "FLOPS"})
#: Units of quantities that are never negative: their axes include zero.
ZERO_BASED_UNITS = frozenset({"W", "B", "B/s", "%"})


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
        axis.update(tickformat=".3~s", ticksuffix=unit)
    elif unit == "%":
        axis.update(ticksuffix=" %")
    else:
        axis.update(tickformat="~r")  # plain numbers, never e-notation
    if unit in ZERO_BASED_UNITS:
        # A quantity that is never negative starts at zero: a constant value (memory held by a
        # job) then reads as one height among round ticks, not as one label on every tick.
        axis.update(rangemode="tozero")
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


def iso_dates(ns: np.ndarray | Sequence[int]) -> list[str]:
    """Epoch ns -> ISO strings plotly reads as dates (UTC)."""
    arr = np.asarray(ns, dtype="int64").astype("datetime64[ns]").astype("datetime64[s]")
    return [str(x) for x in arr]


def json_floats(values: np.ndarray, digits: int = 1) -> list[float | None]:
    """Rounded floats with None for NaN (JSON has no NaN; fewer digits, smaller responses),
    settled first (``gpuwatt.precision``: a value at a rounding tie is drawn alike on every
    store)."""
    out: list[float | None] = []
    for v in np.round(settled_array(np.asarray(values, dtype=float)), digits):
        out.append(None if not math.isfinite(v) else float(v))
    return out


def base_layout(title: str = "", height: int = 320, **extra: Any) -> dict[str, Any]:
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


def time_layout(title: str, unit: str, **extra: Any) -> dict[str, Any]:
    """The layout of lines over time: UTC time axis, value axis with its unit, legend below."""
    return base_layout(
        title,
        height=280,
        xaxis=TIME_AXIS,
        yaxis=value_axis(title, unit),
        legend={"orientation": "h", "y": -0.35},
        margin={"l": 70, "r": 20, "t": 40, "b": 50},
        **extra,
    )


def empty_figure(message: str, height: int = 220) -> Fig:
    """A figure that says why there is nothing to plot."""
    return {
        "data": [],
        "layout": base_layout(
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
