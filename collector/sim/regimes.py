"""What is constant between two boundaries of a scenario: its *regime*.

Jobs and dynamic faults switch only at boundaries (a start, an end, a duty-cycle switch, a ramp
step: ``boundaries``). Between two boundaries every per-GPU factor the dynamics need (which GPUs
work, their clock caps, cooling, host waits, link slowdowns, activity coefficients) is constant,
so the simulator builds it once per interval (``build_regime``) and each 1-s step is a fixed
handful of numpy calls whatever the number of jobs and faults.

Fault effects on the clock ratio r (``FaultSpec.severity_at`` eases each one in):
thermal_slowdown multiplies the thermal resistance by ``cooling_factor``; power_brake pins the
clock (default ``BRAKE_DEFAULT_RATIO`` of max); hw_slowdown and sw_thermal cap r at
``clock_ratio``; clock_lock caps it at ``clock_mhz`` (default ``LOCK_DEFAULT_RATIO``); slow_host
makes a rank wait ``wait_fraction`` x its compute time; slow_link makes its all-reduce ``factor``
x longer; gpu_lost and idle_allocated take the GPU out of its job's barrier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpuwatt.collector.sim.scenario import FaultSpec, JobSpec, Scenario
from gpuwatt.collector.sim.step_kernels import CompiledJob, Regime, Slots

BRAKE_DEFAULT_RATIO = 0.35
LOCK_DEFAULT_RATIO = 0.6
NVLINK_BYTES_PER_S = 270e9

# rows of the cumulative-counter matrix (and of a regime's activity coefficients)
C_ENERGY_J, C_SM, C_OCC, C_HMMA, C_FP32, C_FP16, C_DRAM, C_NVL = range(8)
N_COUNTERS = 8

#: how far ahead duty cycles and ramps are expanded into boundaries when a scenario has no duration
BOUNDARY_HORIZON_S = 48 * 3600.0


def boundaries(scenario: Scenario) -> list[float]:
    """Every time at which a job or a dynamic fault starts or ends (or its duty cycle switches,
    or its ramp steps), sorted."""
    times: set[float] = set()
    items: list[JobSpec | FaultSpec] = [*scenario.jobs, *scenario.faults]
    for item in items:
        times.add(item.start_s)
        if item.end_s is not None:
            times.add(item.end_s)
    horizon = scenario.duration_s or BOUNDARY_HORIZON_S
    for f in scenario.faults:
        times.update(f.switch_times(horizon))
    return sorted(times)


def build_regime(
    t_s: float,
    faults: Sequence[FaultSpec],
    jobs: Sequence[CompiledJob],
    pos: Mapping[tuple[str, int], int],
    max_clock_mhz: np.ndarray,
    r_c_per_w: np.ndarray,
) -> Regime:
    """The regime in force at scenario time ``t_s`` for GPUs at positions ``pos``."""
    n = len(max_clock_mhz)
    lost = np.zeros(n, dtype=bool)
    idle = np.zeros(n, dtype=bool)
    cooling = np.ones(n)
    brake = np.ones(n)
    ratios = {kind: np.ones(n) for kind in ("hw_slowdown", "sw_thermal", "clock_lock")}
    host_wait = np.zeros(n)
    link = np.ones(n)
    for f in faults:
        if not f.active_at(t_s):
            continue
        k = pos[f.gpu]
        sev = f.severity_at(t_s)  # gradual onset: 0..1

        def eased(ratio: float, sev: float = sev) -> float:
            return 1.0 - sev * (1.0 - ratio)

        if f.kind == "gpu_lost":
            lost[k] = True
        elif f.kind == "idle_allocated":
            idle[k] = True
        elif f.kind == "thermal_slowdown":
            cooling[k] = 1.0 + sev * (f.params["cooling_factor"] - 1.0)
        elif f.kind == "power_brake":
            mhz = f.params["clock_mhz"]
            ratio = mhz / max_clock_mhz[k] if mhz > 0 else BRAKE_DEFAULT_RATIO
            brake[k] = min(brake[k], eased(ratio), 1.0)
        elif f.kind in ("hw_slowdown", "sw_thermal"):
            ratios[f.kind][k] = min(ratios[f.kind][k], eased(f.params["clock_ratio"]))
        elif f.kind == "clock_lock":
            mhz = f.params["clock_mhz"]
            ratio = mhz / max_clock_mhz[k] if mhz > 0 else LOCK_DEFAULT_RATIO
            ratios["clock_lock"][k] = min(ratios["clock_lock"][k], eased(ratio))
        elif f.kind == "slow_host":
            host_wait[k] = sev * f.params["wait_fraction"]
        elif f.kind == "slow_link":
            link[k] = 1.0 + sev * (f.params["factor"] - 1.0)
    out = lost | idle
    running = [j for j in jobs if j.spec.active_at(t_s)]
    training = Slots.build([j for j in running if j.spec.kind == "training"], out)
    inference = Slots.build([j for j in running if j.spec.kind == "inference"], out)
    intens = np.zeros(n)
    dram_k = np.zeros(n)
    working = np.zeros(n, dtype=bool)
    for slots, dram in ((training, 0.35), (inference, 0.55)):
        working[slots.gpus] = True
        intens[slots.gpus] = np.repeat([j.intensity for j in slots.jobs], slots.sizes.astype(int))
        dram_k[slots.gpus] = dram
    coef_compute = np.zeros((N_COUNTERS, n))
    coef_comm = np.zeros((N_COUNTERS, n))
    coef_compute[C_SM], coef_comm[C_SM] = 0.95, 0.3
    coef_compute[C_OCC], coef_comm[C_OCC] = 0.45, 0.1
    coef_compute[C_HMMA] = intens
    coef_compute[C_FP32] = 0.06
    coef_compute[C_FP16] = 0.02
    coef_compute[C_DRAM], coef_comm[C_DRAM] = dram_k, 0.2
    coef_comm[C_NVL] = NVLINK_BYTES_PER_S / link  # a degraded link: same bytes, longer
    return Regime(
        lost=lost,
        working=working,
        rest_demand=np.where(lost, 0.0, 0.005),
        brake=brake,
        hw_slow=ratios["hw_slowdown"],
        sw_thermal=ratios["sw_thermal"],
        locked=ratios["clock_lock"],
        r_c_per_w=r_c_per_w * cooling,
        power_a=0.3 + 0.9 * intens,
        host_wait=host_wait,
        link=link,
        coef_compute=coef_compute,
        coef_comm=coef_comm,
        training=training,
        inference=inference,
    )
