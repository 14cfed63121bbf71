"""NVML clock-event (throttle) reasons: which bits are faults and how often each was active.

HW slowdown (0x8), HW thermal slowdown (0x40) and HW power brake (0x80) are faults. SW power cap
(0x4) is what a GPU at full load normally shows and is NOT a fault; SW thermal slowdown (0x20) is
the driver keeping the GPU under its target temperature and is reported as evidence only.

Raw samples decode exactly, and a window's fraction is the share of its samples with the bit set.
The SQLite store's rollups keep the *last* bitmask of each bucket: the fraction is then over those
sampled instants (one per minute), which the explanations say. A store that averaged the bitmask
would yield non-integers that cannot be decoded: such rows are "unknown" (NaN), never guessed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwatt.schema import REASON_HW_POWER_BRAKE as HW_POWER_BRAKE
from gpuwatt.schema import REASON_HW_SLOWDOWN as HW_SLOWDOWN
from gpuwatt.schema import REASON_HW_THERMAL as HW_THERMAL
from gpuwatt.schema import REASON_SW_POWER_CAP as SW_POWER_CAP
from gpuwatt.schema import REASON_SW_THERMAL as SW_THERMAL

#: Fraction column name -> bit. Columns are 0/1 per sample, NaN where the mask is unknown.
BITS: dict[str, int] = {
    "frac_hw_slowdown": HW_SLOWDOWN,
    "frac_hw_thermal": HW_THERMAL,
    "frac_power_brake": HW_POWER_BRAKE,
    "frac_sw_power_cap": SW_POWER_CAP,
    "frac_sw_thermal": SW_THERMAL,
}
FAULT_FRACTIONS: tuple[str, ...] = ("frac_hw_slowdown", "frac_hw_thermal", "frac_power_brake")

LABELS: dict[str, str] = {
    "frac_hw_slowdown": "hardware slowdown",
    "frac_hw_thermal": "hardware thermal slowdown",
    "frac_power_brake": "hardware power brake",
    "frac_sw_power_cap": "software power cap",
    "frac_sw_thermal": "software thermal slowdown",
}


def add_bit_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """Add one ``frac_*`` column per bit of ``clock_event_reasons`` (in place, returned)."""
    if "clock_event_reasons" not in rows.columns:
        for name in BITS:
            rows[name] = np.nan
        return rows
    v = pd.to_numeric(rows["clock_event_reasons"], errors="coerce").to_numpy(dtype=float)
    decodable = np.isfinite(v) & (v == np.round(v)) & (v >= 0)
    ints = np.where(decodable, v, 0).astype(np.int64)
    for name, bit in BITS.items():
        rows[name] = np.where(decodable, ((ints & bit) != 0).astype(float), np.nan)
    return rows
