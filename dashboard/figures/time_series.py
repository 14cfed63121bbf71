"""Lines and bands over time: percentile bands, efficiency, one node's GPUs, on/off rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpuwatt.dashboard.figures import base as fb


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
) -> fb.Fig:
    """One GPU's line against its peers' median and 10th-90th percentile band."""
    xg, (own, median, low, high) = fb.with_gaps(x_ns, [own, median, low, high], step_s)
    x = fb.iso_dates(xg)
    hover = "%{x}<br>" + fb.hover_value(unit) + "<extra>%{fullData.name}</extra>"
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": fb.json_floats(high),
                "line": {"width": 0},
                "hoverinfo": "skip",
                "showlegend": False,
                "connectgaps": False,
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": fb.json_floats(low),
                "fill": "tonexty",
                "fillcolor": fb.BAND,
                "line": {"width": 0},
                "name": "peers p10-p90",
                "connectgaps": False,
                "hoverinfo": "skip",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": fb.json_floats(median),
                "line": {"color": fb.LINE, "dash": "dot"},
                "name": "peer median",
                "connectgaps": False,
                "hovertemplate": hover,
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": fb.json_floats(own),
                "line": {"color": fb.STRAGGLER, "width": 2.5},
                "name": own_name,
                "connectgaps": False,
                "hovertemplate": hover,
            },
        ],
        "layout": fb.time_layout(title, unit),
    }


def efficiency_figure(eff: pd.DataFrame, reason: str = "", step_s: float | None = None) -> fb.Fig:
    """Cluster power over time (W, SI-prefixed) and TFLOPS/W on a second axis (where measured)."""
    if eff.empty:
        return fb.empty_figure("no data in this range")
    eff = eff.sort_values("window_start_ns")
    xg, (power, tfw) = fb.with_gaps(
        eff["window_start_ns"].to_numpy(),
        [eff["power_w"].to_numpy(dtype=float), eff["tflops_per_w"].to_numpy(dtype=float)],
        step_s,
    )
    x = fb.iso_dates(xg)
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "power",
            "x": x,
            "y": fb.json_floats(power, 0),
            "connectgaps": False,
            "line": {"color": fb.LINE},
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
                "y": fb.json_floats(tfw, 4),
                "yaxis": "y2",
                "connectgaps": False,
                "line": {"color": "#12b886"},
                "hovertemplate": "%{x}<br>%{y:.3~r} TFLOPS/W<extra>efficiency</extra>",
            }
        )
    title = "power and TFLOPS/W" if has_tf else f"power (TFLOPS/W not available: {reason})"
    return {
        "data": data,
        "layout": fb.base_layout(
            title,
            xaxis=fb.TIME_AXIS,
            yaxis=fb.value_axis("power", "W", rangemode="tozero"),
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


def node_lines(
    frame: pd.DataFrame,
    metric: str,
    *,
    highlight: int | None = None,
    events: pd.DataFrame | None = None,
    xids: pd.DataFrame | None = None,
    step_s: float | None = None,
    label: tuple[str, str] | None = None,
) -> fb.Fig:
    """One line per GPU of a node for one metric; ``events`` (time_ns, gpu_index, label) and
    ``xids`` (``store.base.XID_COLUMNS``: a sample's XID events) marked on the time axis.

    For a drill-down: one node's GPUs (a few dozen lines at most) in server-side buckets. The
    ``highlight`` GPU is drawn thick and red; no other line is red or orange.
    """
    name, unit = label or fb.LABELS.get(metric, (metric, ""))
    if frame.empty or metric not in frame.columns or frame[metric].notna().sum() == 0:
        return fb.empty_figure(f"{name}: not measured in this range")
    data = []
    line_hover = "%{x}<br>" + fb.hover_value(unit) + "<extra>%{fullData.name}</extra>"
    for k, (idx, rows) in enumerate(frame.groupby("gpu_index", sort=True)):
        hl = highlight is not None and int(idx) == highlight
        rows = rows.sort_values("time_ns")
        x, (y,) = fb.with_gaps(rows["time_ns"].to_numpy(), [rows[metric].to_numpy(float)], step_s)
        color = fb.STRAGGLER if hl else fb.OTHERS[k % len(fb.OTHERS)]
        width = 3 if hl else (1.0 if highlight is not None else 1.4)
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"GPU {idx}",
                "x": fb.iso_dates(x),
                "y": fb.json_floats(y, 2),
                "connectgaps": False,
                "line": {"width": width, "color": color},
                "hovertemplate": line_hover,
            }
        )
    if highlight is not None:  # the highlighted line on top
        data.sort(key=lambda t: t["name"] == f"GPU {highlight}")
    if events is not None and not events.empty:
        labels = [
            f"GPU {g}: {t}" for g, t in zip(events["gpu_index"], events["label"], strict=True)
        ]
        marker = {"symbol": "triangle-up", "color": "#f08c00", "size": 9}
        data.append(event_markers("throttle onset", events["time_ns"], labels, 0.3, marker))
    if xids is not None and not xids.empty:
        data.append(xid_markers(xids))
    return {
        "data": data,
        "layout": fb.time_layout(
            name, unit, yaxis2={"overlaying": "y", "visible": False, "range": [0, 10]}
        ),
    }


def xid_text(gpu_index: int, last: float, count: float) -> str:
    """A marker's label: the GPU, its XID code, and how many it raised in that sample."""
    code = "?" if np.isnan(last) else str(int(last))
    more = f" ({int(count)} XIDs in one sample, the last shown)" if count > 1 else ""
    return f"GPU {gpu_index}: XID {code}{more}"


def event_markers(
    name: str, time_ns: Any, labels: list[str], y: float, marker: dict[str, Any]
) -> dict[str, Any]:
    """Events as markers at height ``y`` of a node chart's hidden second axis (0 to 10)."""
    return {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "x": fb.iso_dates(np.asarray(time_ns)),
        "y": [y] * len(labels),
        "yaxis": "y2",
        "text": labels,
        "hovertemplate": "%{x}<br>%{text}<extra></extra>",
        "marker": marker,
    }


def xid_markers(xids: pd.DataFrame) -> dict[str, Any]:
    """XID events (``store.base.XID_COLUMNS``) as markers along the bottom of a node chart."""
    labels = [
        xid_text(int(g), float(last), float(n))
        for g, last, n in xids[["gpu_index", "xid_last", "xid_count"]].itertuples(index=False)
    ]
    marker = {"symbol": "x", "color": "#9c36b5", "size": 11, "line": {"width": 1}}
    return event_markers("XID", xids["time_ns"], labels, 0.6, marker)


def band_rows(
    rows: Sequence[tuple[str, np.ndarray, np.ndarray]],
    *,
    title: str,
    x_range: tuple[int, int] | None = None,
) -> fb.Fig:
    """On/off states over time as a band per row (a reason, an event kind): a heatmap of
    0/1 (or a fraction of the bucket), one row per ``(label, time_ns, value)``."""
    if not rows:
        return fb.empty_figure(f"{title}: nothing in this range", height=160)
    times = np.unique(np.concatenate([np.asarray(t, dtype="int64") for _, t, _ in rows]))
    pos = {int(t): i for i, t in enumerate(times)}
    z = []
    for _, t, v in rows:
        line = np.full(len(times), np.nan)
        for ti, vi in zip(np.asarray(t, dtype="int64"), np.asarray(v, dtype=float), strict=True):
            line[pos[int(ti)]] = vi
        z.append(fb.json_floats(line, 2))
    layout = fb.base_layout(
        title,
        height=max(160, 26 * len(rows) + 90),
        xaxis=dict(fb.TIME_AXIS),
        yaxis={"type": "category", "autorange": "reversed"},
        margin={"l": 170, "r": 20, "t": 40, "b": 50},
    )
    if x_range is not None:
        layout["xaxis"]["range"] = fb.iso_dates(list(x_range))
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z,
                "x": fb.iso_dates(times),
                "y": [label for label, _, _ in rows],
                "zmin": 0,
                "zmax": 1,
                "colorscale": [[0, "rgba(134,142,150,0.08)"], [1, fb.STRAGGLER]],
                "showscale": False,
                "xgap": 0,
                "ygap": 2,
                "hovertemplate": "%{y}<br>%{x}<br>active %{z:.0%} of the bucket<extra></extra>",
            }
        ],
        "layout": layout,
    }
