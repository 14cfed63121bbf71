"""Pure figure builders: tables in, plotly figure dicts out (no I/O, no Dash).

Dicts rather than ``go.Figure`` objects: a callback returning a dict skips plotly's validation
and serialisation (measured several times cheaper). One module per kind of figure; ``base``
holds what they share. The names are re-exported here, so pages import from
``gpuwatt.dashboard.figures``.
"""

from gpuwatt.dashboard.figures.balance import (
    COLORWAY,
    imbalance_figure,
    imbalance_grid,
    unusual_gpus,
)
from gpuwatt.dashboard.figures.base import (
    LABELS,
    MAX_GPU_ROWS,
    SI_UNITS,
    TIME_AXIS,
    Fig,
    empty_figure,
    hover_value,
    natural_sorted,
    point_count,
    to_seconds,
    value_axis,
    with_gaps,
)
from gpuwatt.dashboard.figures.distribution import bar_figure, histogram_figure
from gpuwatt.dashboard.figures.heatmaps import node_gpu_heatmap, time_heatmap
from gpuwatt.dashboard.figures.time_series import (
    band_figure,
    band_rows,
    efficiency_figure,
    node_lines,
)

__all__ = [
    "COLORWAY",
    "LABELS",
    "MAX_GPU_ROWS",
    "SI_UNITS",
    "TIME_AXIS",
    "Fig",
    "band_figure",
    "band_rows",
    "bar_figure",
    "efficiency_figure",
    "empty_figure",
    "histogram_figure",
    "hover_value",
    "imbalance_figure",
    "imbalance_grid",
    "natural_sorted",
    "node_gpu_heatmap",
    "node_lines",
    "point_count",
    "time_heatmap",
    "to_seconds",
    "unusual_gpus",
    "value_axis",
    "with_gaps",
]
