"""Energy from energy-counter deltas, with power integration as the flagged fallback.

Per row, ``energy_delta_j`` is the energy spent since the GPU's previous row:

* counter: ``energy_j[i] - energy_j[i-1]``. A negative delta means the counter restarted (driver
  reload, collector restart with an integrating fallback); the new value is then the energy since
  the restart and is taken as the delta. The first row of a GPU (or the first after a gap of more
  than three sampling steps, which ends a run of the counter) has no predecessor: its interval is
  filled with ``power_w`` x one sampling step, so that a read of 1-minute rollups (counter = last
  value of each bucket) does not lose its first bucket. That is at most one step of the range,
  and the figure keeps the counter's quality.
* integrated: where the row has no counter value, ``power_w`` times the time to the GPU's next row
  (capped at three sampling steps so an outage is not integrated). With 1-minute rollups the row's
  power is the bucket's mean, so this is exact up to sampling.

On A100/H100 the power sensor covers only part of the runtime, so counter deltas are the honest
figure and integration is always flagged as such.

A counter step the GPU could not have drawn (more than ``PLAUSIBLE_POWER_FACTOR`` x its TDP, or
``FALLBACK_MAX_POWER_W`` for a model the GPU table does not know, over the time between the two
samples) is not energy: it is a counter reset seen late, or two writers of one GPU whose counters
interleave (two collectors, a demo restarted over stored data). Such a row is marked
``energy_conflict`` and its interval is filled from its power reading, flagged as integrated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.analytics.quality import Figure, Quality, not_available
from gpuwatt.analytics.windows import model_codes

J_PER_KWH = 3.6e6

#: A counter may not rise faster than this many times the GPU's TDP (short boosts stay below
#: ~1.2x; the margin also absorbs timestamp jitter between samples).
PLAUSIBLE_POWER_FACTOR = 1.5
#: The ceiling for a GPU whose model the table does not know (above any current GPU's TDP).
FALLBACK_MAX_POWER_W = 2000.0
#: Joules of slack on top (counter granularity, a sample a little early or late).
PLAUSIBLE_SLACK_J = 50.0

#: This many implausible counter steps in one GPU's range are two writers, not a reset.
WRITERS_CONFLICTS = 3

SRC_NONE = 0
SRC_COUNTER = 1
SRC_INTEGRATED = 2


def median_step_ns(rows: pd.DataFrame) -> int:
    """The typical spacing of one GPU's rows (0 when no GPU has two rows)."""
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    g = rows["gpu_code"].to_numpy()
    if len(t) < 2:
        return 0
    same = g[1:] == g[:-1]
    d = (t[1:] - t[:-1])[same]
    d = d[d > 0]
    return int(np.median(d)) if len(d) else 0


def add_row_energy(
    rows: pd.DataFrame,
    *,
    step_ns: int,
    slot_end_ns: np.ndarray | None = None,
    fill_s: np.ndarray | None = None,
) -> pd.DataFrame:
    """Add ``energy_delta_j`` and ``energy_src`` (SRC_*) to rows sorted by GPU then time.

    ``slot_end_ns`` (``analytics.accounting.slot_ends_ns``): where each row's slot ends. With
    it, a row that starts a run (or has no counter) is filled with its power over its slot,
    and a counter step is checked against the time from the previous row to this row's slot
    end (a bucket's counter is its newest sample's, anywhere in the bucket). ``fill_s``: per
    row, the time it was seen (the store's seen time; NaN: not known): where known, a row
    filled from power is filled over that time rather than its slot (a bucket in which a run
    starts, after a gap inside it, was seen only for the part after the gap)."""
    n = len(rows)
    g = rows["gpu_code"].to_numpy()
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    same_prev = np.zeros(n, dtype=bool)
    same_prev[1:] = g[1:] == g[:-1]
    delta = np.full(n, np.nan)
    src = np.full(n, SRC_NONE, dtype=np.int8)
    conflict = np.zeros(n, dtype=bool)
    dt_prev_s = np.zeros(n)
    dt_prev_s[1:] = (t[1:] - t[:-1]) / 1e9

    has_counter = np.zeros(n, dtype=bool)
    if "energy_j" in rows.columns:
        e = pd.to_numeric(rows["energy_j"], errors="coerce").to_numpy(dtype=float)
        has_counter = np.isfinite(e)
        prev = np.empty(n)
        prev[0] = np.nan
        prev[1:] = e[:-1]
        ok = has_counter & same_prev & np.isfinite(prev)
        d = e - prev
        d = np.where(d < 0, e, d)  # counter restarted: energy since the restart
        covered_s = dt_prev_s
        if slot_end_ns is not None:
            covered_s = np.zeros(n)
            covered_s[1:] = (slot_end_ns[1:] - t[:-1]) / 1e9
        ceiling_j = _max_power_w(rows) * np.maximum(covered_s, 0.0) * PLAUSIBLE_POWER_FACTOR
        conflict = ok & (d > ceiling_j + PLAUSIBLE_SLACK_J)
        # A run of one counter ends at a gap of more than three sampling steps: the time the GPU
        # was not seen is not energy (docs/accounting.md, rule 3).
        across_gap = ok & (dt_prev_s * 1e9 > 3 * step_ns) if step_ns > 0 else np.zeros(n, bool)
        delta = np.where(ok & ~conflict & ~across_gap, d, np.nan)
        if slot_end_ns is not None and "power_w" in rows.columns:
            # A restart starts a new run: its first row is filled from power over its slot,
            # like any run's first row. The counter's new value holds only the energy since the
            # restart, and how much of the row's time that is depends on how the rows were
            # bucketed (a 1-hour bucket's newest sample may be an hour after its previous one).
            restarted = ok & (e < prev) & np.isfinite(rows["power_w"].to_numpy(dtype=float))
            delta = np.where(restarted, np.nan, delta)
        src[has_counter] = SRC_COUNTER
        src[conflict] = SRC_INTEGRATED
        if "energy_method" in rows.columns:
            integ = (rows["energy_method"].astype(str) == "integrated").to_numpy()
            src[has_counter & integ] = SRC_INTEGRATED

    if "power_w" in rows.columns:
        p = rows["power_w"].to_numpy(dtype=float)
        same_next = np.zeros(n, dtype=bool)
        same_next[:-1] = same_prev[1:]
        nxt = np.empty(n, dtype=np.int64)
        nxt[:-1] = t[1:]
        nxt[-1:] = 0
        dt_ns = np.where(same_next, nxt - t, step_ns)
        if step_ns > 0:
            dt_ns = np.minimum(dt_ns, 3 * step_ns)
        slot_ns = None if slot_end_ns is None else np.maximum(slot_end_ns - t, 0)
        if slot_ns is not None and fill_s is not None:
            slot_ns = np.where(np.isfinite(fill_s), np.nan_to_num(fill_s) * 1e9, slot_ns)
        if slot_ns is not None:
            dt_ns = slot_ns
        use = ~has_counter & np.isfinite(p)
        delta = np.where(use, p * dt_ns / 1e9, delta)
        src[use] = SRC_INTEGRATED
        head = has_counter & ~np.isfinite(delta) & np.isfinite(p) & ~conflict
        # a run's first row: the time since the previous row (a reset or a gap), or, for a GPU's
        # first row, up to its next row (a bucket cut by the range's start is shorter than a step)
        head_ns = np.where(
            same_prev,
            np.minimum(dt_prev_s * 1e9, step_ns),
            np.where(same_next, np.minimum(nxt - t, step_ns), step_ns),
        )
        if slot_ns is not None:
            head_ns = slot_ns
        delta = np.where(head, p * head_ns / 1e9, delta)
        # an implausible counter step: the row's power over the time since the previous row
        dt_conflict_ns = np.minimum(dt_prev_s * 1e9, 3 * step_ns if step_ns > 0 else np.inf)
        if slot_ns is not None:
            dt_conflict_ns = slot_ns
        delta = np.where(conflict & np.isfinite(p), p * dt_conflict_ns / 1e9, delta)

    rows["energy_delta_j"] = delta
    rows["energy_src"] = src
    rows["energy_conflict"] = conflict
    return rows


def _max_power_w(rows: pd.DataFrame) -> np.ndarray:
    """Per row: the most power its GPU can draw (TDP from the GPU table, else the fallback)."""
    from gpuwatt.gpu_specs import lookup

    if "name" not in rows.columns:
        return np.full(len(rows), FALLBACK_MAX_POWER_W)
    # per distinct name, spread by code: ``Series.map`` of the strings was ~10 ms at 1,000 GPUs
    codes, names = model_codes(rows)
    tdp = np.full(len(names) + 1, FALLBACK_MAX_POWER_W)  # the last: rows without a name (-1)
    for k, name in enumerate(names):
        spec = lookup(name)
        if spec is not None:
            tdp[k] = spec.tdp_w
    return tdp[codes]


def gpu_energy_quality(rows: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: the quality of its energy figure and, when not a plain counter, why."""
    src = rows["energy_src"].to_numpy()
    codes = rows["gpu_code"].to_numpy()
    n = int(codes.max()) + 1 if len(codes) else 0
    c = np.bincount(codes, weights=src == SRC_COUNTER, minlength=n) > 0
    i = np.bincount(codes, weights=src == SRC_INTEGRATED, minlength=n) > 0
    quality = np.where(
        i,
        Quality.INTEGRATED_POWER.value,
        np.where(c, Quality.MEASURED_COUNTER.value, Quality.NOT_AVAILABLE.value),
    )
    conflicts = (
        np.bincount(codes, weights=rows["energy_conflict"].to_numpy(), minlength=n)
        if "energy_conflict" in rows.columns
        else np.zeros(n)
    )
    reason = np.where(
        conflicts >= WRITERS_CONFLICTS,
        "energy counter went back and forth (two writers of this GPU?): those steps not "
        "counted, power integrated there",
        np.where(
            conflicts > 0,
            "energy counter reset (driver reload, collector restart): power integrated over "
            "the reset",
            np.where(
                i & c,
                "energy counter missing on some samples: power integrated there",
                np.where(
                    i,
                    "no energy counter: power integrated over time",
                    np.where(c, "", "no energy counter and no power readings"),
                ),
            ),
        ),
    )
    return pd.DataFrame(
        {"energy_quality": quality, "energy_reason": reason, "energy_conflicts": conflicts},
        index=pd.Index(np.arange(n), name="gpu_code"),
    )


@dataclass(frozen=True, slots=True)
class Tariff:
    """Price and carbon intensity of electricity (None: not configured)."""

    price_per_kwh: float | None = None
    carbon_g_per_kwh: float | None = None
    currency: str = ""


def kwh(energy_j: float) -> float:
    return energy_j / J_PER_KWH


def energy_figures(
    energy_j: float | None, quality: Quality, reason: str, tariff: Tariff
) -> dict[str, Figure]:
    """kWh, cost and CO2 for one energy total, each carrying the energy's quality."""
    if energy_j is None or quality is Quality.NOT_AVAILABLE:
        why = reason or "no energy data"
        return {
            "energy_kwh": not_available("kWh", why),
            "cost": not_available(tariff.currency, why),
            "co2_kg": not_available("kg", why),
        }
    e_kwh = kwh(energy_j)
    cost = (
        Figure(e_kwh * tariff.price_per_kwh, tariff.currency, quality, reason)
        if tariff.price_per_kwh is not None
        else not_available(tariff.currency, "no electricity price configured")
    )
    co2 = (
        Figure(e_kwh * tariff.carbon_g_per_kwh / 1000.0, "kg", quality, reason)
        if tariff.carbon_g_per_kwh is not None
        else not_available("kg", "no carbon intensity configured")
    )
    return {"energy_kwh": Figure(e_kwh, "kWh", quality, reason), "cost": cost, "co2_kg": co2}


def add_cost_columns(table: pd.DataFrame, tariff: Tariff) -> pd.DataFrame:
    """Add ``energy_kwh``, ``cost`` and ``co2_kg`` to a table with an ``energy_j`` column."""
    table["energy_kwh"] = table["energy_j"] / J_PER_KWH
    table["cost"] = (
        table["energy_kwh"] * tariff.price_per_kwh if tariff.price_per_kwh is not None else np.nan
    )
    table["co2_kg"] = (
        table["energy_kwh"] * tariff.carbon_g_per_kwh / 1000.0
        if tariff.carbon_g_per_kwh is not None
        else np.nan
    )
    return table
