"""Terminal views of samples: the ``gpuwatt status`` table and the demo's live summary line."""

from __future__ import annotations

import fnmatch
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from gpuwatt.mig import is_mig_device, mig_profile
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


#: A GPU at or above this temperature is "hot" when no clock-event reason says more.
HOT_C = 85.0

#: The states ``gpuwatt status`` shows, most urgent first; anything but "ok" is a problem.
STATES: tuple[str, ...] = ("lost", "stale", "throttled", "hot", "ok")


def gpu_state(s: GpuSample, *, now_ns: int, stale_after_s: float = 30, hot_c: float = HOT_C) -> str:
    """The one word a person scanning a terminal needs: lost, stale, throttled, hot or ok.

    "throttled" means a fault reason is active (HW slowdown, HW thermal, HW power brake, SW
    thermal); the SW power cap is normal at full load and is not a problem.
    """
    if s.lost:
        return "lost"
    if (now_ns - s.time_ns) / 1e9 > stale_after_s:
        return "stale"
    if s.clock_event_reasons is not None and s.clock_event_reasons & sum(FAULT_REASONS):
        return "throttled"
    if s.temperature_gpu_c is not None and s.temperature_gpu_c >= hot_c:
        return "hot"
    return "ok"


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders ``gpu-2`` before ``gpu-10`` (numbers compared as numbers)."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part
    )


def select_samples(
    samples: Sequence[GpuSample],
    *,
    now_ns: int,
    host: str | None = None,
    job: str | None = None,
    problems: bool = False,
    stale_after_s: float = 30,
    hot_c: float = HOT_C,
) -> list[GpuSample]:
    """The samples ``gpuwatt status`` shows: ``host`` is a shell pattern (``node-1*``), ``job``
    an exact job id, ``problems`` keeps only GPUs whose state is not "ok"."""
    chosen = []
    for s in samples:
        if host is not None and not fnmatch.fnmatchcase(s.host, host):
            continue
        if job is not None and s.job_id != job:
            continue
        state = gpu_state(s, now_ns=now_ns, stale_after_s=stale_after_s, hot_c=hot_c)
        if problems and state == "ok":
            continue
        chosen.append(s)
    return chosen


def render_status(
    samples: Sequence[GpuSample],
    *,
    now_ns: int,
    stale_after_s: float = 30,
    hot_c: float = HOT_C,
    total: int | None = None,
) -> str:
    """One row per GPU, in natural host order then index; the last line counts each state.

    ``total`` is the number of GPUs before any filter (the footer then says how many are shown).
    """
    header = (
        f"{'HOST':<12} {'GPU':>3} {'NAME':<24} {'STATE':<9} {'UTIL%':>5} {'MEM GiB':>13} "
        f"{'TEMP':>5} {'POWER W':>13} {'SM MHz':>6} {'TFLOPS':>7} {'CLOCKS':<18} {'JOB':<12} "
        f"{'AGE':>5}"
    )
    rows = [header]
    counts = dict.fromkeys(STATES, 0)
    for s in sorted(samples, key=_row_order):
        age_s = (now_ns - s.time_ns) / 1e9
        state = gpu_state(s, now_ns=now_ns, stale_after_s=stale_after_s, hot_c=hot_c)
        counts[state] += 1
        mem = (
            f"{_fmt(s.memory_used_bytes and s.memory_used_bytes / GIB, '.1f')}/"
            f"{_fmt(s.memory_total_bytes and s.memory_total_bytes / GIB, '.0f')}"
        )
        power = f"{_fmt(s.power_w, '.0f')}/{_fmt(s.power_limit_w, '.0f')}"
        job = (s.job_id or "-").replace("\n", " ")[:12]
        rows.append(
            f"{s.host[:12]:<12} {s.gpu_index:>3} {_name(s)[:24]:<24} {state:<9} "
            f"{_fmt(s.utilization_gpu_pct, '.0f'):>5} {mem:>13} "
            f"{_fmt(s.temperature_gpu_c, '.0f'):>5} {power:>13} "
            f"{_fmt(s.sm_clock_mhz, '.0f'):>6} {_fmt(s.tflops_estimate, '.1f'):>7} "
            f"{reasons_text(s.clock_event_reasons):<18} {job:<12} {age_s:>4.0f}s"
        )
    migs = sum(1 for s in samples if is_mig_device(s))
    footer = f"{len(samples) - migs} GPUs" + (f" and {migs} MIG devices, " if migs else ", ")
    footer += ", ".join(f"{counts[k]} {k}" for k in STATES)
    if total is not None and total != len(samples):
        footer += f" (showing {len(samples)} of {total})"
    rows.append(footer)
    return "\n".join(rows)


def _row_order(s: GpuSample) -> tuple[object, ...]:
    """Host (natural order), index, then a GPU's MIG devices right after it."""
    mig = is_mig_device(s)
    return (natural_key(s.host), s.gpu_index, mig, s.gpu_instance_id or 0, s.name, s.uuid)


def _name(s: GpuSample) -> str:
    """A whole GPU's name; a MIG device's profile under its parent (``  MIG 1g.10gb``)."""
    if not is_mig_device(s):
        return s.name
    gi = f" gi{s.gpu_instance_id}" if s.gpu_instance_id is not None else ""
    return f"  MIG {mig_profile(s.name) or s.uuid}{gi}"


def watch(
    frame: Callable[[], str],
    *,
    every_s: float,
    out: TextIO = sys.stdout,
    sleep_s: Callable[[float], None] = time.sleep,
    iterations: int | None = None,
) -> None:
    """Redraw ``frame()`` every ``every_s`` seconds until interrupted (``gpuwatt status --watch``).

    On a terminal the screen is cleared before each frame; piped output gets the frames one
    after another. ``iterations`` bounds the loop (tests); Ctrl-C ends it quietly.
    """
    clear = "\x1b[H\x1b[2J" if out.isatty() else ""
    done = 0
    try:
        while iterations is None or done < iterations:
            out.write(clear + frame() + "\n")
            out.flush()
            done += 1
            if iterations is None or done < iterations:
                sleep_s(every_s)
    except KeyboardInterrupt:
        pass


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
    migs = sum(1 for s in samples if is_mig_device(s))
    tflops = [s.tflops_estimate for s in samples if not s.lost and s.tflops_estimate is not None]
    samples = [s for s in samples if not is_mig_device(s)]  # GPUs; MIG devices counted apart
    live = [s for s in samples if not s.lost]
    util = [s.utilization_gpu_pct for s in live if s.utilization_gpu_pct is not None]
    power = [s.power_w for s in live if s.power_w is not None]
    faults = [
        f"{s.host}/{s.gpu_index} {reasons_text(s.clock_event_reasons)} "
        f"{_fmt(s.temperature_gpu_c, '.0f')}°C"
        for s in live
        if s.clock_event_reasons and s.clock_event_reasons & sum(FAULT_REASONS)
    ]
    idle = sum(1 for u in util if u < 5)
    parts = [
        time.strftime("%H:%M:%S", time.localtime(samples[0].time_ns / 1e9)) if samples else "--",
        f"{len(live)}/{len(samples)} GPUs up" + (f" (+{migs} MIG)" if migs else ""),
        f"util {sum(util) / len(util):.0f}%" if util else "util -",
        f"power {sum(power) / 1000:.1f} kW" if power else "power -",
        _flops_text(sum(tflops)) if tflops else "TFLOPS -",
        f"{idle} idle",
    ]
    if faults:
        parts.append("throttled: " + "; ".join(faults[:3]))
    return "  ".join(parts)


def _flops_text(tflops: float) -> str:
    """A cluster's TFLOPS as the dashboard writes it: PFLOPS from a thousand TFLOPS up."""
    return f"{tflops / 1000:.1f} PFLOPS" if tflops >= 1000 else f"{tflops:.0f} TFLOPS"
