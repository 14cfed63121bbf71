"""Bars and histograms (a value per node or GPU, its distribution)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuwatt.dashboard.figures import base as fb


def bar_figure(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    unit: str,
    axis: str = "",
    highlight: Sequence[str] = (),
) -> fb.Fig:
    """A horizontal bar per entry (per node or job): small categorical data; the ``highlight``
    entries (e.g. a straggler's node) in red."""
    if not labels:
        return fb.empty_figure("no data in this range")
    marked = set(highlight)
    colors = [fb.STRAGGLER if lab in marked else fb.LINE for lab in labels]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": list(labels),
                "x": fb.json_floats(np.asarray(values, dtype=float), 3),
                "marker": {"color": colors},
                "hovertemplate": "%{y}: " + fb.hover_value(unit, "x") + "<extra></extra>",
            }
        ],
        "layout": fb.base_layout(
            title,
            height=min(900, max(220, 20 * len(labels) + 90)),
            xaxis=fb.value_axis(axis or title, unit),
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
) -> fb.Fig:
    """The distribution of one value per entity (too many for a bar each), ``marks`` (name,
    value) drawn as red lines: where the straggler's node sits."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return fb.empty_figure("no data in this range")
    shapes = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": float(x),
            "x1": float(x),
            "y0": 0,
            "y1": 1,
            "line": {"color": fb.STRAGGLER, "width": 2, "dash": "dot"},
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
            "font": {"color": fb.STRAGGLER, "size": 11},
        }
        for name, x in marks
    ]
    return {
        "data": [
            {
                "type": "histogram",
                "x": fb.json_floats(v, 3),
                "nbinsx": min(40, max(5, len(v) // 3)),
                "marker": {"color": fb.LINE},
                "hovertemplate": "%{x}: %{y} " + what + "<extra></extra>",
            }
        ],
        "layout": fb.base_layout(
            title,
            height=280,
            xaxis=fb.value_axis(axis, unit),
            yaxis=fb.value_axis(what, ""),
            shapes=shapes,
            annotations=notes,
            bargap=0.05,
            margin={"l": 60, "r": 20, "t": 50, "b": 50},
        ),
    }
