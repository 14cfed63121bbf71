"""Numbers as people read them: SI prefixes and units ("15.9 kW", "549 PFLOPS"), never e-notation.

The figures use the same convention through plotly's d3 format ``~s`` (see
``figures.base.value_axis``); this module formats the text of KPIs and tables. A missing or
non-finite value reads "n/a".
"""

from __future__ import annotations

import math
from typing import Any

from gpuwatt.precision import settled

#: SI prefixes from 10^-3 to 10^18 (kilo... exa); larger or smaller stay in the edge prefix.
_PREFIXES: tuple[tuple[int, str], ...] = (
    (-3, "m"),
    (0, ""),
    (3, "k"),
    (6, "M"),
    (9, "G"),
    (12, "T"),
    (15, "P"),
    (18, "E"),
)
NA = "n/a"


def _number(value: Any) -> float | None:
    """``value`` as a settled float (``gpuwatt.precision``: every store shows the same digits),
    None where it is missing or not finite."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return settled(v) if math.isfinite(v) else None


def plain(value: Any, digits: int = 3) -> str:
    """A number without prefix, ``digits`` significant digits, no e-notation ("1.07", "0.0042",
    "12300")."""
    v = _number(value)
    if v is None:
        return NA
    if v == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(v)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{v:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def si(value: Any, unit: str = "", digits: int = 3) -> str:
    """``value`` in base units with an SI prefix: si(15900, "W") == "15.9 kW"."""
    v = _number(value)
    if v is None:
        return NA
    if v == 0:
        return f"0 {unit}".strip()
    exp = math.floor(math.log10(abs(v)))
    power, prefix = _PREFIXES[0]
    for p, name in _PREFIXES:
        if exp >= p:
            power, prefix = p, name
    scaled = v / 10.0**power
    # rounding can carry into the next prefix (999.96 kW -> 1000 kW): move up once
    if abs(float(plain(scaled, digits))) >= 1000 and power < _PREFIXES[-1][0]:
        power, prefix = next((p, n) for p, n in _PREFIXES if p == power + 3)
        scaled = v / 10.0**power
    return f"{plain(scaled, digits)} {prefix}{unit}".strip()


def watts(value_w: Any) -> str:
    return si(value_w, "W")


def energy_kwh(value_kwh: Any) -> str:
    """Energy given in kWh: "3.2 kWh", "15.1 MWh", "420 Wh"."""
    v = _number(value_kwh)
    return NA if v is None else si(v * 1000.0, "Wh")


def tflops(value_tflops: Any) -> str:
    """Throughput given in TFLOPS: "480 TFLOPS", "549 PFLOPS"."""
    v = _number(value_tflops)
    return NA if v is None else si(v * 1e12, "FLOPS")


def tflops_per_w(value: Any) -> str:
    v = _number(value)
    return NA if v is None else f"{plain(v)} TFLOPS/W"


def byte_size(value_bytes: Any) -> str:
    """Bytes in binary units ("68.0 GiB"): memory is sized in powers of two."""
    v = _number(value_bytes)
    if v is None:
        return NA
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{plain(v)} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024.0
    return NA  # pragma: no cover - the loop always returns


def byte_rate(value_bytes_per_s: Any) -> str:
    return si(value_bytes_per_s, "B/s")


def money(value: Any, currency: str) -> str:
    v = _number(value)
    if v is None:
        return NA
    text = f"{v:,.2f}" if abs(v) < 1e6 else si(v, "")
    return f"{text} {currency}".strip()


def mass_kg(value_kg: Any) -> str:
    """CO2 mass given in kg: "12.4 kg", "3.1 t"."""
    v = _number(value_kg)
    if v is None:
        return NA
    if abs(v) >= 1000:
        return f"{plain(v / 1000.0)} t"
    return f"{plain(v)} kg"


def percent(value: Any, digits: int = 0) -> str:
    v = _number(value)
    return NA if v is None else f"{v:.{digits}f} %"


def hours(value_h: Any) -> str:
    """GPU-hours: "1.25 h", "1,024 h"."""
    v = _number(value_h)
    if v is None:
        return NA
    return f"{v:,.0f} h" if abs(v) >= 1000 else f"{plain(v)} h"


def minutes(value_min: Any) -> str:
    v = _number(value_min)
    if v is None:
        return NA
    if abs(v) >= 120:
        return f"{plain(v / 60.0)} h"
    return f"{v:.0f} min"
