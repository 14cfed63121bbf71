"""The precision every figure is shown and compared with: 10 significant digits.

The stores keep values with different precision: the embedded store and InfluxDB keep float64
(~16 significant digits), VictoriaMetrics writes ~12 (its decimal form). The same samples then
give figures that differ around their 12th digit, and a figure at a rounding tie (a mean of
54.615 shown with two decimals, a utilisation of 69.5 % shown whole) was shown one unit apart on
two stores, or compared with an alert's threshold from either side of it. So every figure is
*settled* to 10 significant digits before it is rounded for display or compared with a
threshold: two stores that agree to 10 digits then show, export and alert the same.

One implementation for single numbers and arrays (``settled`` is ``settled_array`` of one), so
a KPI and the chart point of the same value never disagree either. A display tie (54.615) lies
in the middle of its 10-digit step, never at its edge, so the two roundings do not interfere.
"""

from __future__ import annotations

import math

import numpy as np

SIGNIFICANT_DIGITS = 10
#: Powers of ten up to this exponent are exact doubles: a value is scaled by one exactly.
_EXACT_POWER = 22


def settled_array(values: np.ndarray | list[float]) -> np.ndarray:
    """``values`` (float64) rounded to ``SIGNIFICANT_DIGITS`` significant digits; NaN, infinities,
    zeros and magnitudes below ~1e-13 or from ~1e32 as they are. Half to even on the scaled
    double, as ``numpy.rint``."""
    v = np.array(values, dtype=np.float64)
    ok = np.isfinite(v) & (v != 0)
    if not ok.any():
        return v
    with np.errstate(divide="ignore"):
        magnitude = np.floor(np.log10(np.abs(np.where(ok, v, 1.0)))).astype(np.int64)
    decimals = SIGNIFICANT_DIGITS - 1 - magnitude
    # a value no exact power of ten scales (below ~1e-13, from ~1e32: no figure of ours) stays
    ok &= np.abs(decimals) <= _EXACT_POWER
    x, d = v[ok], decimals[ok]
    power = 10.0 ** np.abs(d)  # exact
    with np.errstate(over="ignore", invalid="ignore"):
        v[ok] = np.where(d >= 0, np.rint(x * power) / power, np.rint(x / power) * power)
    return v


def settled(value: float) -> float:
    """One number rounded as ``settled_array`` rounds it (the same double)."""
    if not math.isfinite(value) or value == 0:
        return value
    return float(settled_array(np.array([value], dtype=np.float64))[0])


def fixed(value: float, decimals: int = 0) -> str:
    """A settled number with ``decimals`` decimals, as ``f"{x:.{decimals}f}"`` writes it."""
    return f"{settled(value):.{decimals}f}"
