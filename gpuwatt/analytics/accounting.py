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

from gpuwatt.store.base import SEEN_COLUMN
from gpuwatt.store.rollup_rule import sample_seen_ns

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


def slot_ends_ns(
    rows: pd.DataFrame, *, end_ns: int, slot_ns: int, bucket_ns: int | None
) -> np.ndarray:
    """Per row (sorted by GPU then time): where its slot ends. A bucket row's slot ends with
    its bucket (``bucket_ns``: the read step; a bucket cut by the range's start is keyed at the
    start but ends where its bucket does), a raw row's one ``slot_ns`` later; either ends at the
    GPU's next row and at ``end_ns``."""
    n = len(rows)
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    g = rows["gpu_code"].to_numpy(dtype=np.int64)
    nxt = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    if n > 1:
        nxt[:-1] = np.where(g[1:] == g[:-1], t[1:], nxt[:-1])
    own_end = t // bucket_ns * bucket_ns + bucket_ns if bucket_ns else t + max(slot_ns, 1)
    return np.minimum(np.minimum(own_end, nxt), end_ns)


def stored_seen_s(rows: pd.DataFrame) -> np.ndarray:
    """Per row, the seen time the store gave with it (``Store.series``: a raw sample's slot,
    a bucket's sum of them), NaN where it gave none (a store or a rollup without it)."""
    if SEEN_COLUMN not in rows.columns:
        return np.full(len(rows), np.nan)
    return pd.to_numeric(rows[SEEN_COLUMN], errors="coerce").to_numpy(dtype=float)


def add_sample_seen(rows: pd.DataFrame, measured_rows: np.ndarray) -> None:
    """Give raw samples (rows sorted by GPU then time, lost-GPU markers included) that came
    without a seen time their slot by the stores' rule (``rollup_rule.sample_seen_ns``): the
    rows of the range and the context rows before it are all the neighbours there are (the
    newest sample of a GPU counts one interval)."""
    stored = stored_seen_s(rows)
    if len(rows) == 0 or np.isfinite(stored).all():
        return
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    seen_ns = sample_seen_ns(t, rows["gpu_code"].to_numpy(dtype=np.int64), ~measured_rows)
    rows[SEEN_COLUMN] = np.where(np.isfinite(stored), stored, seen_ns / 1e9)


def add_row_seen(
    rows: pd.DataFrame,
    *,
    start_ns: int,
    slot_end_ns: np.ndarray,
    stored_s: np.ndarray | None = None,
) -> pd.DataFrame:
    """Add ``seen_s`` and ``carried`` to rows sorted by GPU then time.

    A row with a stored seen time (``stored_s`` finite) counts it whole where it lies in the
    range and nothing before it: each sample's slot counts in the range its sample lies in.
    Any other row counts the part of its slot inside ``[start_ns, slot end)``, and is
    ``carried`` when it is a context row whose slot reaches into the range (its GPU was seen
    from before the range's start into it)."""
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    seen_ns = np.maximum(slot_end_ns - np.maximum(t, start_ns), 0).astype(float)
    carried = (t < start_ns) & (seen_ns > 0)
    if stored_s is not None:
        known = np.isfinite(stored_s)
        seen_ns = np.where(known, np.where(t >= start_ns, stored_s * 1e9, 0.0), seen_ns)
        carried &= ~known
    rows["seen_s"] = seen_ns / 1e9
    rows["carried"] = carried
    return rows


def keep_in_range(rows: pd.DataFrame, start_ns: int) -> np.ndarray:
    """Rows that belong to the range: those from ``start_ns`` on, and the context rows whose
    slot reaches into it. Those are moved to ``start_ns`` (they stand for the range's first
    seconds) and keep no energy (their counter step is before the range)."""
    carried = rows["carried"].to_numpy(dtype=bool)
    if carried.any():
        idx = rows.index[carried]
        rows.loc[idx, "time_ns"] = start_ns
        for c in ("energy_delta_j",):
            if c in rows.columns:
                rows.loc[idx, c] = 0.0
    return (rows["time_ns"].to_numpy(dtype=np.int64) >= start_ns) | carried


def slot_ns_of(step_s: float | None, median_step_ns: int, span_ns: int) -> int:
    """How long one row stands for: the read step when known, else the rows' typical spacing,
    else the whole range (a GPU with one row in it)."""
    if step_s:
        return round(step_s * 1e9)
    return median_step_ns if median_step_ns > 0 else max(span_ns, 1)
