"""Terminal views of samples: the ``gpuwatt status`` table and the demo's live summary line."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from gpuwatt.model import GpuSample
from gpuwatt.schema import (
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)

GIB = 1024**3

# NVML clocks-event reasons that mean something is wrong (SW power cap 0x4 is normal at load).
FAULT_REASONS: dict[int, str] = {
    REASON_HW_SLOWDOWN: "hw-slowdown",
    REASON_HW_THERMAL: "hw-thermal",
    REASON_HW_POWER_BRAKE: "power-brake",
    REASON_SW_THERMAL: "sw-thermal",
}


def reasons_text(mask: int | None) -> str:
    if mask is None:
        return "-"
    names = [name for bit, name in FAULT_REASONS.items() if mask & bit]
    if not names and mask & REASON_SW_POWER_CAP:
        return "power-cap"
    return ",".join(names) if names else "ok"


def _fmt(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def render_status(samples: Sequence[GpuSample], *, now_ns: int, stale_after_s: float = 30) -> str:
    """One row per GPU, sorted by host and index; lost and stale GPUs say so."""
    header = (
        f"{'HOST':<12} {'GPU':>3} {'NAME':<24} {'STATE':<6} {'UTIL%':>5} {'MEM GiB':>13} "
        f"{'TEMP':>5} {'POWER W':>13} {'SM MHz':>6} {'TFLOPS':>7} {'CLOCKS':<18} {'AGE':>5}"
    )
    rows = [header]
    for s in sorted(samples, key=lambda s: (s.host, s.gpu_index)):
        age_s = (now_ns - s.time_ns) / 1e9
        state = "LOST" if s.lost else ("stale" if age_s > stale_after_s else "ok")
        mem = (
            f"{_fmt(s.memory_used_bytes and s.memory_used_bytes / GIB, '.1f')}/"
            f"{_fmt(s.memory_total_bytes and s.memory_total_bytes / GIB, '.0f')}"
        )
        power = f"{_fmt(s.power_w, '.0f')}/{_fmt(s.power_limit_w, '.0f')}"
        rows.append(
            f"{s.host[:12]:<12} {s.gpu_index:>3} {s.name[:24]:<24} {state:<6} "
            f"{_fmt(s.utilization_gpu_pct, '.0f'):>5} {mem:>13} "
            f"{_fmt(s.temperature_gpu_c, '.0f'):>5} {power:>13} "
            f"{_fmt(s.sm_clock_mhz, '.0f'):>6} {_fmt(s.tflops_estimate, '.1f'):>7} "
            f"{reasons_text(s.clock_event_reasons):<18} {age_s:>4.0f}s"
        )
    lost = sum(1 for s in samples if s.lost)
    rows.append(f"{len(samples)} GPUs, {lost} lost")
    return "\n".join(rows)


class LiveSummary:
    """Prints one line about the cluster every ``every_s`` seconds (the demo's terminal view)."""

    def __init__(
        self,
        *,
        every_s: float = 5.0,
        out: TextIO = sys.stdout,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s = every_s
        self.out = out
        self._monotonic_s = monotonic_s
        self._last_s: float | None = None

    def update(self, samples: list[GpuSample]) -> None:
        now = self._monotonic_s()
        if self._last_s is not None and now - self._last_s < self.every_s:
            return
        self._last_s = now
        self.out.write(summary_line(samples) + "\n")
        self.out.flush()


def summary_line(samples: Sequence[GpuSample]) -> str:
    live = [s for s in samples if not s.lost]
    util = [s.utilization_gpu_pct for s in live if s.utilization_gpu_pct is not None]
    power = [s.power_w for s in live if s.power_w is not None]
    tflops = [s.tflops_estimate for s in live if s.tflops_estimate is not None]
    faults = [
        f"{s.host}/{s.gpu_index} {reasons_text(s.clock_event_reasons)} "
        f"{_fmt(s.temperature_gpu_c, '.0f')}°C"
        for s in live
        if s.clock_event_reasons and s.clock_event_reasons & sum(FAULT_REASONS)
    ]
    idle = sum(1 for u in util if u < 5)
    parts = [
        time.strftime("%H:%M:%S", time.localtime(samples[0].time_ns / 1e9)) if samples else "--",
        f"{len(live)}/{len(samples)} GPUs up",
        f"util {sum(util) / len(util):.0f}%" if util else "util -",
        f"power {sum(power) / 1000:.1f} kW" if power else "power -",
        f"{sum(tflops):.0f} TFLOPS" if tflops else "TFLOPS -",
        f"{idle} idle",
    ]
    if faults:
        parts.append("throttled: " + "; ".join(faults[:3]))
    return "  ".join(parts)
