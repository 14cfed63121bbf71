"""The slow counters of each GPU's newest sample, filled in from the samples just before it.

ECC counts and remapped rows are sampled once per slow interval (a minute by default), so the
newest sample of a GPU usually lacks them and a health table built from ``Store.latest`` alone
reads "not measured". This reads those fields over the last few slow intervals and takes each
GPU's newest measured value of each, as the rollup rule does for counters and flags.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from gpuwatt.model import GpuSample
from gpuwatt.schema import COUNTER_ATTRS, FIELDS

#: Counters and flags the collector samples once per slow interval: the schema's counters but
#: the energy counter (read every sample), and the row-remapping flags.
SLOW_COUNTS: tuple[str, ...] = tuple(
    f.attr for f in FIELDS if f.attr in COUNTER_ATTRS and f.attr != "energy_j"
)
SLOW_FLAGS: tuple[str, ...] = ("remapped_rows_pending", "remapped_rows_failure")
SLOW_FIELDS: tuple[str, ...] = SLOW_COUNTS + SLOW_FLAGS
#: How far back to look: two and a half of the default 60 s slow interval, so that one late or
#: missed slow sample still leaves one in the window. Read raw: a bucketed read of the
#: embedded store gives NaN for these (its rollups keep each bucket's last sample).
SLOW_LOOKBACK_S = 150


def newest_measured(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per GPU uuid, the newest non-missing value of each slow field in ``frame``."""
    fields = [f for f in SLOW_FIELDS if f in frame.columns]
    if frame.empty or not fields:
        return {}
    ordered = frame.sort_values("time_ns")
    last = ordered.groupby("uuid", sort=False)[fields].last()  # last() skips NaN
    out: dict[str, dict[str, float]] = {}
    for uuid, row in zip(last.index, last.to_numpy(dtype=float).tolist(), strict=True):
        values = {f: v for f, v in zip(fields, row, strict=True) if np.isfinite(v)}
        if values:
            out[str(uuid)] = values
    return out


def with_slow_fields(
    samples: list[GpuSample], newest: dict[str, dict[str, float]]
) -> list[GpuSample]:
    """``samples`` with each missing slow field taken from ``newest`` (a measured value in the
    sample itself is kept: it is the newest)."""
    out = []
    for s in samples:
        values = newest.get(s.uuid)
        fill: dict[str, Any] = {}
        for field, value in (values or {}).items():
            if getattr(s, field) is None:
                fill[field] = bool(value) if field in SLOW_FLAGS else int(value)
        out.append(replace(s, **fill) if fill else s)
    return out
