"""Measurement quality: every figure the analytics produce says how it was obtained.

A figure that could not be computed carries ``None`` and the reason, never a made-up number.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Quality(enum.StrEnum):
    MEASURED_COUNTER = "measured_counter"  # energy-counter deltas (NVML total energy)
    INTEGRATED_POWER = "integrated_power"  # power_w integrated over time (no counter)
    GPM_ESTIMATE = "gpm_estimate"  # pipe activity (GPM) x the GPU table's peaks x clock ratio
    MODEL_ESTIMATE = "model_estimate"  # derived from measured inputs by a model (e.g. waiting)
    UPPER_BOUND = "upper_bound"  # SM activity x tensor peak: an upper bound, not an estimate
    MEASURED = "measured"  # a gauge read as is (utilisation, power, temperature)
    REPORTED = "reported"  # reported by the application itself (step time, model FLOPs)
    NOT_AVAILABLE = "not_available"


#: Worst first: combining figures of different quality yields the worst one.
_RANK: dict[Quality, int] = {
    Quality.NOT_AVAILABLE: 0,
    Quality.UPPER_BOUND: 1,
    Quality.INTEGRATED_POWER: 2,
    Quality.GPM_ESTIMATE: 3,
    Quality.MODEL_ESTIMATE: 3,
    Quality.MEASURED_COUNTER: 4,
    Quality.REPORTED: 4,
    Quality.MEASURED: 5,
}


def worst(qualities: list[Quality] | tuple[Quality, ...]) -> Quality:
    """The weakest quality of several (NOT_AVAILABLE for an empty list)."""
    if not qualities:
        return Quality.NOT_AVAILABLE
    return min(qualities, key=_RANK.__getitem__)


@dataclass(frozen=True, slots=True)
class Figure:
    """A number with its unit, how it was obtained, and why it is absent or approximate."""

    value: float | None
    unit: str
    quality: Quality
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.value is not None

    def format(self, fmt: str = ".3g") -> str:
        if self.value is None:
            return f"n/a ({self.reason})" if self.reason else "n/a"
        text = f"{self.value:{fmt}} {self.unit}".rstrip()
        if self.quality not in (Quality.MEASURED, Quality.MEASURED_COUNTER):
            text += f" [{self.quality.value}]"
        return text


def not_available(unit: str, reason: str) -> Figure:
    return Figure(None, unit, Quality.NOT_AVAILABLE, reason)
