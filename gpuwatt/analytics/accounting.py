"""Seen time and the rows before a range (docs/accounting.md, rules 1-3).

Each row (a raw sample, or a bucket of a rollup read) stands for a *slot*: from its time to the
next row of its GPU, at most one step (the read step, else the rows' typical spacing), and never
past the range's end. A bucket keyed at its start therefore stands for the bucket, one cut by
the range's start for the part inside the range, and a raw sample for one sampling interval,
so that raw samples, minutes and hours give the same seen time wherever the GPU was seen for
whole buckets.

*Context rows* are rows before ``start_ns`` that a reader adds (``analytics.inputs``): the
newest one of each GPU gives the counter value at the range's start, so that the range's first
delta is a counter delta like any other and energy telescopes: ``E[a, b) = E(last sample before
b) - E(last sample before a)`` within one counter run, whatever level served the rows. A range
is then exactly the sum of its parts. Context rows are counted in nothing themselves; the part
of a raw context row's slot inside the range is seen time of the range.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Columns that say a row holds a measurement; a row with none of them (a bucket holding only
#: lost-GPU markers, a marker itself) is not seen.
MEASURED_COLUMNS: tuple[str, ...] = ("utilization_gpu_pct", "power_w", "energy_j")


def measured(rows: pd.DataFrame) -> np.ndarray:
    """Per row: it holds a measurement and is not a lost-GPU marker."""
    ok = np.zeros(len(rows), dtype=bool)
    for c in MEASURED_COLUMNS:
        if c in rows.columns:
            ok |= np.isfinite(pd.to_numeric(rows[c], errors="coerce").to_numpy(dtype=float))
    if "lost" in rows.columns:
        ok &= ~rows["lost"].fillna(False).astype(bool).to_numpy()
    return ok


def newest_context(rows: pd.DataFrame, start_ns: int | None) -> np.ndarray:
    """Rows (sorted by GPU then time) to keep: all from ``start_ns`` on, and each GPU's newest
    row before it."""
    if start_ns is None or rows.empty:
        return np.ones(len(rows), dtype=bool)
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    g = rows["gpu_code"].to_numpy(dtype=np.int64)
    before = t < start_ns
    last_of_gpu = np.ones(len(rows), dtype=bool)
    last_of_gpu[:-1] = (g[1:] != g[:-1]) | ~before[1:]
    return ~before | (before & last_of_gpu)


def add_row_seen(rows: pd.DataFrame, *, start_ns: int, end_ns: int, slot_ns: int) -> pd.DataFrame:
    """Add ``seen_s``: the part of each row's slot inside ``[start_ns, end_ns)`` (rows sorted
    by GPU then time). A context row's part inside the range is moved to its GPU's next row."""
    n = len(rows)
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    g = rows["gpu_code"].to_numpy(dtype=np.int64)
    same_next = np.zeros(n, dtype=bool)
    same_next[:-1] = g[1:] == g[:-1]
    nxt = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    nxt[:-1] = np.where(same_next[:-1], t[1:], nxt[:-1])
    slot_end = np.minimum(np.minimum(t + max(slot_ns, 1), nxt), end_ns)
    seen_ns = np.maximum(slot_end - np.maximum(t, start_ns), 0)
    context = t < start_ns
    move = context & same_next & (seen_ns > 0)
    if move.any():
        to = np.flatnonzero(move) + 1
        seen_ns[to] += seen_ns[move]
        seen_ns[move] = 0
    rows["seen_s"] = seen_ns / 1e9
    return rows


def slot_ns_of(rows: pd.DataFrame, step_s: float | None, median_step_ns: int, span_ns: int) -> int:
    """How long one row stands for: the read step when known, else the rows' typical spacing,
    else the whole range (a GPU with one row in it)."""
    if step_s:
        return round(step_s * 1e9)
    return median_step_ns if median_step_ns > 0 else max(span_ns, 1)
