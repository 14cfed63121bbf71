"""The seeded simulator: advances a scenario's GPUs through time and publishes ``SimGpuState``.

Time
    ``Simulator(scenario, start_time_s=T0)`` maps scenario time 0 to ``T0`` on the caller's clock
    (e.g. Unix time for a live demo, 0 for tests). ``advance_to(t_s)`` takes that clock;
    ``SimGpuState.time_s`` holds scenario seconds. Internally the dynamics run on a fixed grid of
    1-s steps from scenario time 0; a time between grid points is published by interpolating within
    the current step (rates are constant over a step). The numbers at time t therefore depend only
    on the seed and t, never on how the ``advance_to`` calls were chunked.

Dynamics (per GPU, vectorised over all GPUs in numpy arrays; published into the states at the end
of ``advance_to``)
    - Clock ratio r = SM clock / max SM clock is the minimum of: thermal slowdown
      (``1 - (T - T_slowdown) / 8 K`` above the slowdown threshold, floor 0.45: reasons
      0x8 HW slowdown + 0x40 HW thermal), power brake (pinned clock, reasons 0x8 + 0x80) and the
      power-cap controller (reason 0x4 SW power cap, normal at full load). A GPU without work
      sits at its idle clock (reason 0x1).
    - Work. Synchronous data-parallel training: each step every rank computes
      ``step_time x (1 - comm_fraction) / r`` (with 1 % jitter) and then all-reduces; the step
      lasts ``max(compute) + all-reduce``, so the slowest rank sets the pace. The straggler is busy
      (highest utilisation and tensor activity) while its peers finish early and wait at the
      barrier (their utilisation, tensor activity and power drop). The wait is modelled as the rank
      blocked on the host, so utilization.gpu drops too (with NCCL spin kernels it may not on real
      hardware; tensor activity and power drop either way). Inference replicas are independent
      behind a latency-aware balancer (least-request / EWMA): traffic share goes as r², busy
      fraction as ``load x share / r``, so a throttled replica does less work and shows the
      lowest tensor activity. ``idle`` jobs and ``idle_allocated`` faults hold memory and a
      process but do no work.
    - Activities while computing: HMMA (bf16 tensor) = intensity, SM active 0.95, occupancy 0.45,
      FP32 0.06, FP16 0.02, DRAM 0.35 (training) / 0.55 (inference); during the all-reduce: SM 0.3,
      DRAM 0.2, NVLink 270 GB/s each way, PCIe (GPUDirect to the NIC) 20 GB/s. GPM cumulative
      counters (``*_active_s``) integrate activity x dt.
    - Power = idle + (TDP - idle) x demand x r², demand = compute x (0.3 + 0.9 x intensity) +
      all-reduce x 0.3 (3 % noise), capped at the enforced limit. The power-cap controller picks
      the r that would put the last step's demand at the limit (a one-step lag, as in hardware).
    - Temperature: first order towards ``inlet + R x cooling x power`` (R from the model's rise at
      TDP, +-5 % per GPU, slot-dependent inlet), time constant 25 s (HBM 40 s, a few K hotter).
    - Energy: ``energy_mj`` integrates the published power exactly (power is constant over a
      step), starting from a seeded "since driver load" value.
    - Faults: thermal_slowdown multiplies R by ``cooling_factor``; power_brake pins the clock;
      gpu_lost sets ``lost``; xid calls ``cluster.raise_xid`` once when time reaches start;
      ecc_errors raises the volatile SBE count at ``sbe_per_h`` and adds ``dbe_count`` DBEs (and as
      many pending row remaps); memory_leak grows the process's memory linearly to
      ``max_fraction`` of the total (released at end: the process restarts); energy_counter_reset
      restarts the counter from 0 at start. A lost or idle GPU drops out of its job's barrier (the
      crash that would follow is not modelled).
    - Clock-only faults: hw_slowdown (reason 0x8 alone), sw_thermal (0x20) and clock_lock
      (application clocks, 0x2) cap r. Slowdowns clocks do not show: slow_host makes a rank wait
      ``wait_fraction`` x its compute time for input each step (GPU idle, clocks normal); slow_link
      makes its all-reduce ``factor`` x longer (the all-reduce starts when the last rank is ready
      and lasts as long as the slowest link). With ``nccl_spin`` the ranks that wait spin in NCCL
      kernels: utilisation stays high, tensor activity does not, SM activity 0.3, demand 0.15.
      Pipeline ``stages`` scale each rank's compute by its stage's load. A ``round_robin``
      balancer gives every replica its share whatever its speed (a slow one saturates).
    - Every dynamic fault may cycle (``period``/``duty``: ``FaultSpec.active_at``) and ramp up
      (``ramp``: severity in tenths, ``FaultSpec.severity_at``); both switch at regime boundaries.
      Models, inlet temperatures and power limits may differ by node or GPU (``ClusterSpec``).

Memory: ``memory_used_bytes`` is NVML v2 "used" (the processes' memory); the driver's reserve
(0.65 % of the total) is ``memory_reserved_bytes``.

Speed (best of 3 on the shared 2-core development VM, numpy 2.4, load ~3): backfilling 1 h of the
32-GPU demo (3,600 steps) takes 0.46 s; 1,024 GPUs (13 jobs) x 1 h takes 1.2 s. Per step the cost
is a fixed ~25 numpy calls whatever the number of jobs: job and fault activity is resolved once per
interval between boundaries, and published outputs (utilisation, clocks, reasons, PCIe) are
derived only for the step that is published.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpuwatt.collector.sim.fault_effects import FaultEffects
from gpuwatt.collector.sim.hardware import build_states
from gpuwatt.collector.sim.mig_sim import MigSimulation
from gpuwatt.collector.sim.regimes import (
    C_DRAM,
    C_ENERGY_J,
    C_FP16,
    C_FP32,
    C_HMMA,
    C_NVL,
    C_OCC,
    C_SM,
    N_COUNTERS,
    boundaries,
    build_regime,
)
from gpuwatt.collector.sim.scenario import JobSpec, Scenario, gpu_profile
from gpuwatt.collector.sim.state import SimCluster, SimGpuState
from gpuwatt.collector.sim.step_kernels import (
    CompiledJob,
    Regime,
    clock_reasons,
    extra_reasons,
    pcie_bytes_per_s,
    quantise_mhz,
    serve_step,
    train_step,
)

STEP_S = 1.0
THERMAL_TAU_S = 25.0
MEMORY_THERMAL_TAU_S = 40.0
THERMAL_SPAN_C = 8.0  # the clock falls linearly to the floor over this many K past slowdown
THERMAL_FLOOR = 0.45
POWER_CAP_FLOOR = 0.5


@dataclass(frozen=True, slots=True)
class _Last:
    """What the latest step left behind for publishing (derived outputs are computed lazily)."""

    working: np.ndarray
    compute: np.ndarray
    comm: np.ndarray
    r: np.ndarray
    power_limited: np.ndarray
    hot: np.ndarray
    braked: np.ndarray
    util_noise: np.ndarray
    train_jobs: tuple[JobSpec, ...] = ()
    step_s: np.ndarray | None = None
    spin: np.ndarray | None = None
    extra_reasons: np.ndarray | None = None


class Simulator:
    """Seeded dynamics for every GPU of a scenario; ``cluster`` is what the fake NVML reads."""

    def __init__(self, scenario: Scenario, *, start_time_s: float = 0.0) -> None:
        self.scenario = scenario
        self.start_time_s = float(start_time_s)
        cluster = scenario.cluster
        self._refs = cluster.gpus()
        self._pos = {ref: k for k, ref in enumerate(self._refs)}
        n = len(self._refs)
        static_rng = np.random.default_rng([scenario.seed, 0])
        self._rng = np.random.default_rng([scenario.seed, 1])
        self.cluster = SimCluster(build_states(scenario.cluster, self._refs, static_rng))
        self._init_arrays(static_rng, n)
        self._mig: MigSimulation | None = None
        hidden: list[JobSpec] = []
        if scenario.mig.gpus:  # GPUs in MIG mode: their devices, and their parents' hidden jobs
            models = {ref: cluster.model_of(ref[0]) for ref in self._refs}
            self._mig = MigSimulation(
                scenario.mig, self.cluster.gpus, self._pos, models, scenario.seed
            )
            hidden = self._mig.parent_jobs()
        self._jobs = [self._compile_job(j, static_rng) for j in (*scenario.jobs, *hidden)]
        self._effects = FaultEffects(
            scenario, self._pos, self._mem_base, self._mem_total, static_rng
        )
        self._boundaries = boundaries(scenario)
        if self._mig is not None:
            self._boundaries = sorted({*self._boundaries, *self._mig.boundaries()})
        self._regimes: dict[int, Regime] = {}
        zeros = np.zeros(n)
        off = np.zeros(n, dtype=bool)
        self._last = _Last(off, zeros, zeros, np.ones(n), off, off, off, zeros)
        self._t_s = 0.0
        self._record_energy_resets(-1.0, 0.0)
        self._publish(0.0)

    # --- public API ---------------------------------------------------------------------------
    @property
    def time_s(self) -> float:
        """Current time on the caller's clock (``start_time_s`` + scenario time)."""
        return self.start_time_s + self._t_s

    @property
    def scenario_time_s(self) -> float:
        return self._t_s

    @property
    def gpus(self) -> list[SimGpuState]:
        return self.cluster.gpus

    def gpu(self, host: str, index: int) -> SimGpuState:
        return self.cluster.gpus[self._pos[(host, index)]]

    def advance_to(self, t_s: float) -> None:
        """Run the dynamics up to ``t_s`` (caller's clock) and publish every GPU's state."""
        target = t_s - self.start_time_s
        if target < self._t_s - 1e-9:
            raise ValueError(f"cannot go back in time: at {self.time_s} s, asked for {t_s} s")
        target = max(target, self._t_s)
        while self._grid < target - 1e-9:
            self._step()
        self._t_s = target
        self._publish(target)

    def carry_energy_counters(self, energy_j: Mapping[tuple[str, int], float]) -> None:
        """Set the energy counters of these GPUs ((host, index) -> joules) to these values now,
        from where they go on at the GPUs' power: NVML counts since the driver was loaded, so
        a real GPU's counter goes on across a collector's restart, and a demo started again on
        the store it wrote must not look like a reset (or, done a few times, like two
        writers)."""
        now_j = self._cum_prev[C_ENERGY_J] + self._rate[C_ENERGY_J] * self._into_step(self._t_s)
        zero_j = self._effects.energy_zero_j(self._t_s)  # what a reset took off the counter
        for ref, joules in energy_j.items():
            k = self._pos.get(ref)
            if k is not None and math.isfinite(joules) and joules >= 0:
                shift_j = joules - (now_j[k] - zero_j.get(k, 0.0))
                self._cum[C_ENERGY_J][k] += shift_j
                self._cum_prev[C_ENERGY_J][k] += shift_j
        self._publish(self._t_s)

    def advance_by(self, dt_s: float) -> None:
        self.advance_to(self.time_s + dt_s)

    def job_of(self, host: str, index: int) -> str | None:
        """The id of the job running on ``host:index`` now, or None."""
        job = self.scenario.job_at(host, index, self._t_s)
        return job.id if job is not None else None

    def mig_job_of(self, uuid: str) -> str | None:
        """The id of the job running on the MIG device ``uuid`` now, or None."""
        return self._mig.job_of(uuid) if self._mig is not None else None

    def pids_of(self, job_id: str) -> dict[tuple[str, int], int]:
        """The stable fake pid of each of a job's processes, by GPU."""
        for job in self._jobs:
            if job.spec.id == job_id:
                return dict(zip(job.spec.gpus, job.pids, strict=True))
        raise KeyError(job_id)

    def step_time_s(self, job_id: str) -> float | None:
        """A training job's current step time (what the job would report), else None."""
        last = self._last
        for k, job in enumerate(last.train_jobs):
            if job.id == job_id and last.step_s is not None:
                return float(last.step_s[k])
        return None

    # --- construction -------------------------------------------------------------------------
    def _init_arrays(self, rng: np.random.Generator, n: int) -> None:
        cluster = self.scenario.cluster
        gpus = self.cluster.gpus
        profiles = [gpu_profile(cluster.model_of(h)) for h, _ in self._refs]
        self._idle_w = np.array([g.idle_power_w for g in gpus])
        self._dyn_w = np.array([g.spec.tdp_w for g in gpus]) - self._idle_w
        self._limit_w = np.array([g.power_limit_w for g in gpus])
        slot = np.array([i for _, i in self._refs], dtype=float)
        # GPUs further down the airflow breathe warmer air
        inlet = np.array([cluster.inlet_of(h) for h, _ in self._refs])
        self._inlet_c = inlet + 3.0 * slot / max(cluster.gpus_per_node - 1, 1)
        self._inlet_c += rng.normal(0.0, 0.5, n)
        rise = np.array([p.full_load_rise_c for p in profiles])
        tdp = np.array([g.spec.tdp_w for g in gpus])
        self._r_c_per_w = rise / tdp * rng.normal(1.0, 0.05, n)
        self._slowdown_c = np.array([g.slowdown_temp_c for g in gpus])
        self._max_clock = np.array([g.sm_clock_max_mhz for g in gpus])
        self._idle_clock = np.array([p.idle_sm_clock_mhz for p in profiles])
        self._mem_total = np.array([g.memory_total_bytes for g in gpus], dtype=float)
        # driver/context reservation
        self._mem_base = (0.0065 * self._mem_total).astype(np.int64)
        for g, base in zip(gpus, self._mem_base.tolist(), strict=True):
            g.memory_reserved_bytes = base
        self._mem_clock = [g.memory_clock_max_mhz for g in gpus]
        # dynamic state at the grid point self._grid, and the step (grid-1, grid] before it
        self._grid = 0
        self._temp_c = self._inlet_c + self._r_c_per_w * self._idle_w
        self._temp_prev_c = self._temp_c.copy()
        self._mem_temp_c = self._temp_c + 3.0
        self._mem_temp_prev_c = self._mem_temp_c.copy()
        self._pc_ratio = np.ones(n)
        self._cum = np.zeros((N_COUNTERS, n))
        days = rng.uniform(1.0, 30.0, n)
        self._cum[C_ENERGY_J] = days * 86400.0 * self._idle_w
        self._cum_prev = self._cum.copy()
        self._rate = np.zeros((N_COUNTERS, n))
        self._rate[C_ENERGY_J] = self._idle_w
        self._power_w = self._idle_w.copy()
        self._headroom_w = self._limit_w - self._idle_w

    def _compile_job(self, job: JobSpec, rng: np.random.Generator) -> CompiledJob:
        idx = np.array([self._pos[g] for g in job.gpus], dtype=np.intp)
        base = int(rng.integers(2000, 400000))
        return CompiledJob(job, idx, tuple(base + 3 * rank for rank in range(len(job.gpus))))

    # --- the dynamics -------------------------------------------------------------------------
    def _step(self) -> None:
        """Advance the grid by one step (grid, grid + 1]."""
        t0 = float(self._grid)
        reg = self._regime(t0 + 0.5 * STEP_S)
        n = len(self._refs)
        noise = self._rng.standard_normal((3, n))

        over_c = self._temp_c - self._slowdown_c
        r_th = np.minimum(np.maximum(1.0 - over_c / THERMAL_SPAN_C, THERMAL_FLOOR), 1.0)
        r_hw = np.minimum(np.minimum(r_th, reg.brake), reg.hw_slow)
        r_hw = np.minimum(np.minimum(r_hw, reg.sw_thermal), reg.locked)
        pc_ratio = self._pc_ratio
        r = np.minimum(r_hw, pc_ratio)

        compute = np.zeros(n)
        comm = np.zeros(n)
        spin = np.zeros(n)
        step_s = train_step(reg.training, r, noise[0], compute, comm, spin, reg)
        serve_step(reg.inference, r, compute)
        demand = compute * reg.power_a + comm * 0.3 + spin * 0.15
        demand = np.where(
            reg.working, np.maximum(demand * (1.0 + 0.03 * noise[1]), 0.0), reg.rest_demand
        )
        power_raw = self._idle_w + self._dyn_w * demand * (r * r)
        power = np.minimum(power_raw, self._limit_w)
        # the power-cap controller: next step's clock puts this step's demand at the limit
        target = np.sqrt(self._headroom_w / np.maximum(self._dyn_w * demand, 1e-9))
        self._pc_ratio = np.minimum(np.maximum(target, POWER_CAP_FLOOR), 1.0)

        rate = reg.coef_compute * compute + reg.coef_comm * comm
        rate[C_SM] += 0.3 * spin  # NCCL spin kernels occupy some SMs, no tensor work
        rate[C_ENERGY_J] = power
        self._rate = rate
        self._power_w = power
        self._cool(power, reg.r_c_per_w)
        self._cum_prev = self._cum
        self._cum = self._cum + rate * STEP_S
        limited = (pc_ratio < r_hw) | (power_raw > self._limit_w)
        self._last = _Last(
            reg.working,
            compute,
            comm,
            r,
            limited,
            over_c > 0,
            reg.brake < 1.0,
            noise[2],
            reg.training.jobs,
            step_s,
            spin,
            extra_reasons(reg),
        )
        self._grid += 1
        if self._effects.resets:
            self._record_energy_resets(t0, float(self._grid))

    def _regime(self, t_s: float) -> Regime:
        key = bisect.bisect_right(self._boundaries, t_s)
        reg = self._regimes.get(key)
        if reg is None:
            reg = self._regimes[key] = self._build_regime(t_s)
        return reg

    def _build_regime(self, t_s: float) -> Regime:
        return build_regime(
            t_s, self.scenario.faults, self._jobs, self._pos, self._max_clock, self._r_c_per_w
        )

    def _cool(self, power: np.ndarray, r_c_per_w: np.ndarray) -> None:
        """First-order thermal lag, integrated exactly over the step."""
        rise = r_c_per_w * power
        self._temp_prev_c = self._temp_c
        self._mem_temp_prev_c = self._mem_temp_c
        a = 1.0 - math.exp(-STEP_S / THERMAL_TAU_S)
        a_mem = 1.0 - math.exp(-STEP_S / MEMORY_THERMAL_TAU_S)
        self._temp_c = self._temp_c + a * (self._inlet_c + rise - self._temp_c)
        self._mem_temp_c = self._mem_temp_c + a_mem * (
            self._inlet_c + 1.1 * rise + 3.0 - self._mem_temp_c
        )

    def _record_energy_resets(self, t0: float, t1: float) -> None:
        cum_prev, rate = self._cum_prev[C_ENERGY_J], self._rate[C_ENERGY_J]
        self._effects.record_energy_resets(t0, t1, STEP_S, cum_prev, rate)

    # --- publishing -----------------------------------------------------------------------------
    def _publish(self, t_s: float) -> None:
        """Write the state at scenario time ``t_s`` into every SimGpuState.

        Holds ``cluster.condition`` meanwhile: a reader that takes it sees one consistent instant.
        """
        with self.cluster.condition:
            self._publish_locked(t_s)

    def _into_step(self, t_s: float) -> float:
        """How far scenario time ``t_s`` is into the step (grid-1, grid] (0 before the first):
        a counter reads its value at the step's start plus its rate times this."""
        return 0.0 if self._grid == 0 else t_s - (self._grid - STEP_S)

    def _publish_locked(self, t_s: float) -> None:
        frac = self._into_step(t_s)
        cum = (self._cum_prev + self._rate * frac).tolist()
        temp = (self._temp_prev_c + (self._temp_c - self._temp_prev_c) * frac).tolist()
        mem_temp = self._mem_temp_prev_c + (self._mem_temp_c - self._mem_temp_prev_c) * frac
        fan = np.clip(30.0 + 1.5 * (np.asarray(temp) - 40.0), 30.0, 100.0).tolist()
        power = self._power_w.tolist()
        last = self._last
        spin = last.spin if last.spin is not None else 0.0
        busy_pct = 100.0 * (last.compute + last.comm + spin) + 1.0 * last.util_noise
        util = np.where(last.working, np.minimum(np.maximum(busy_pct, 0.0), 100.0), 0.0).tolist()
        util_mem = (100.0 * self._rate[C_DRAM]).tolist()
        clock_mhz = self._max_clock * last.r
        idle_mhz = np.minimum(self._idle_clock, clock_mhz)
        clock = np.where(last.working, quantise_mhz(clock_mhz), idle_mhz).tolist()
        reasons = clock_reasons(last.working, last.power_limited, last.hot, last.braked)
        if last.extra_reasons is not None:
            reasons = reasons | np.where(last.working, last.extra_reasons, 0)
        reasons = reasons.tolist()
        tx_b, rx_b = pcie_bytes_per_s(last.compute, last.comm)
        tx = (tx_b / 1024.0).tolist()
        rx = (rx_b / 1024.0).tolist()
        mem_temp_l = mem_temp.tolist()
        for k, g in enumerate(self.cluster.gpus):
            g.time_s = t_s
            g.utilization_gpu_pct = util[k]
            g.utilization_memory_pct = util_mem[k]
            g.temperature_c = temp[k]
            g.memory_temperature_c = mem_temp_l[k]
            g.fan_speed_pct = fan[k]
            g.power_w = power[k]
            g.energy_mj = round(cum[C_ENERGY_J][k] * 1000.0)
            g.sm_clock_mhz = clock[k]
            g.graphics_clock_mhz = clock[k]
            g.memory_clock_mhz = self._mem_clock[k]
            g.clock_event_reasons = reasons[k]
            g.pcie_tx_kib_per_s = tx[k]
            g.pcie_rx_kib_per_s = rx[k]
            g.sm_active_s = cum[C_SM][k]
            g.sm_occupancy_s = cum[C_OCC][k]
            g.tensor_hmma_active_s = cum[C_HMMA][k]
            g.tensor_any_active_s = cum[C_HMMA][k]
            g.fp32_active_s = cum[C_FP32][k]
            g.fp16_active_s = cum[C_FP16][k]
            g.dram_active_s = cum[C_DRAM][k]
            g.nvlink_tx_bytes = int(cum[C_NVL][k])
            g.nvlink_rx_bytes = int(cum[C_NVL][k])
        self._effects.publish_processes(self.cluster.gpus, self._jobs, t_s)
        self._effects.publish_faults(self.cluster, t_s, cum[C_ENERGY_J])
        if self._mig is not None:
            self._mig.publish(t_s)
