"""Energy from energy-counter deltas, with power integration as the flagged fallback.

Per row, ``energy_delta_j`` is the energy spent since the GPU's previous row:

* counter: ``energy_j[i] - energy_j[i-1]`` within one uninterrupted run of the counter
  (docs/accounting.md). A run ends where the counter goes backwards (driver reload, collector
  restart, a second writer), rises faster than the GPU could draw (more than its power limit, or
  ``DEFAULT_MAX_POWER_W`` without one, times the elapsed time times ``RISE_MARGIN``: a reset or a
  conflict between two writers) or the GPU was not seen for more than three sampling steps:
  such a delta is never energy. The first row of a run (of a GPU, or after a reset or a gap) has
  no usable predecessor: its interval is filled with ``power_w`` x the elapsed time (one
  sampling step at most), so that a read of 1-minute rollups (counter = last value of each
  bucket) does not lose its first bucket. That is at most one step per run, and the figure keeps
  the counter's quality.
* integrated: where the row has no counter value, ``power_w`` times the time to the GPU's next row
  (capped at three sampling steps so an outage is not integrated). With 1-minute rollups the row's
  power is the bucket's mean, so this is exact up to sampling.

On A100/H100 the power sensor covers only part of the runtime, so counter deltas are the honest
figure and integration is always flagged as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.analytics.quality import Figure, Quality, not_available

J_PER_KWH = 3.6e6

SRC_NONE = 0
SRC_COUNTER = 1
SRC_INTEGRATED = 2

#: The power assumed when a GPU reports no power limit: above any GPU sold today (B200: 1 kW).
DEFAULT_MAX_POWER_W = 1200.0
#: How much faster than its power limit a counter may rise before the rise is a reset/conflict.
RISE_MARGIN = 1.25


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


def add_row_energy(rows: pd.DataFrame, *, step_ns: int) -> pd.DataFrame:
    """Add ``energy_delta_j`` and ``energy_src`` (SRC_*) to rows sorted by GPU then time."""
    n = len(rows)
    g = rows["gpu_code"].to_numpy()
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    same_prev = np.zeros(n, dtype=bool)
    same_prev[1:] = g[1:] == g[:-1]
    delta = np.full(n, np.nan)
    src = np.full(n, SRC_NONE, dtype=np.int8)
    t_prev = np.empty(n, dtype=np.int64)
    t_prev[:1] = 0
    t_prev[1:] = t[:-1]
    elapsed_ns = np.where(same_prev, t - t_prev, 0)
    elapsed_s = elapsed_ns / 1e9

    has_counter = np.zeros(n, dtype=bool)
    if "energy_j" in rows.columns:
        e = pd.to_numeric(rows["energy_j"], errors="coerce").to_numpy(dtype=float)
        has_counter = np.isfinite(e)
        prev = np.empty(n)
        prev[0] = np.nan
        prev[1:] = e[:-1]
        limit_w = np.full(n, DEFAULT_MAX_POWER_W)
        if "power_limit_w" in rows.columns:
            lim = pd.to_numeric(rows["power_limit_w"], errors="coerce").to_numpy(dtype=float)
            limit_w = np.where(np.isfinite(lim) & (lim > 0), lim, limit_w)
        d = e - prev
        possible = (d >= 0) & (d <= limit_w * elapsed_s * RISE_MARGIN)
        if step_ns > 0:
            possible &= elapsed_ns <= 3 * step_ns  # not across a gap
        ok = has_counter & same_prev & np.isfinite(prev) & possible
        delta = np.where(ok, d, np.nan)
        src[has_counter] = SRC_COUNTER
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
        use = ~has_counter & np.isfinite(p)
        delta = np.where(use, p * dt_ns / 1e9, delta)
        src[use] = SRC_INTEGRATED
        head = has_counter & ~np.isfinite(delta) & np.isfinite(p)
        # a run's first row: the time since the previous row (a reset), or, for a GPU's first
        # row, up to its next row (a bucket cut by the range's start is shorter than a step)
        head_ns = np.where(
            same_prev,
            np.minimum(elapsed_ns, step_ns),
            np.where(same_next, np.minimum(nxt - t, step_ns), step_ns),
        )
        delta = np.where(head, p * head_ns / 1e9, delta)

    rows["energy_delta_j"] = delta
    rows["energy_src"] = src
    return rows


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
    reason = np.where(
        i & c,
        "energy counter missing on some samples: power integrated there",
        np.where(
            i,
            "no energy counter: power integrated over time",
            np.where(c, "", "no energy counter and no power readings"),
        ),
    )
    return pd.DataFrame(
        {"energy_quality": quality, "energy_reason": reason},
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
