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
from dataclasses import dataclass

import numpy as np

from gpuwatt.collector.sim.hardware import build_states
from gpuwatt.collector.sim.mig_sim import MigSimulation
from gpuwatt.collector.sim.scenario import (
    FaultSpec,
    JobSpec,
    Scenario,
    gpu_profile,
)
from gpuwatt.collector.sim.state import SimCluster, SimGpuState
from gpuwatt.collector.sim.step_kernels import (
    CompiledJob,
    Regime,
    Slots,
    clock_reasons,
    extra_reasons,
    pcie_bytes_per_s,
    quantise_mhz,
    serve_step,
    train_step,
)

GIB = 1024**3

STEP_S = 1.0
THERMAL_TAU_S = 25.0
MEMORY_THERMAL_TAU_S = 40.0
THERMAL_SPAN_C = 8.0  # the clock falls linearly to the floor over this many K past slowdown
THERMAL_FLOOR = 0.45
POWER_CAP_FLOOR = 0.5
BRAKE_DEFAULT_RATIO = 0.35
LOCK_DEFAULT_RATIO = 0.6

NVLINK_BYTES_PER_S = 270e9

# rows of the cumulative-counter matrix
_C_ENERGY_J, _C_SM, _C_OCC, _C_HMMA, _C_FP32, _C_FP16, _C_DRAM, _C_NVL = range(8)
_N_COUNTERS = 8


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
        self._orphan_pids = {id(f): int(static_rng.integers(2000, 400000)) for f in scenario.faults}
        self._leak_rates = {id(f): self._leak_rate_bytes_per_s(f) for f in scenario.faults}
        self._energy_reset_j: dict[int, float] = {}
        self._xids_fired: set[int] = set()
        self._boundaries = _boundaries(scenario)
        if self._mig is not None:
            self._boundaries = sorted({*self._boundaries, *self._mig.boundaries()})
        self._regimes: dict[int, Regime] = {}
        self._resets = [f for f in scenario.faults if f.kind == "energy_counter_reset"]
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
        self._cum = np.zeros((_N_COUNTERS, n))
        days = rng.uniform(1.0, 30.0, n)
        self._cum[_C_ENERGY_J] = days * 86400.0 * self._idle_w
        self._cum_prev = self._cum.copy()
        self._rate = np.zeros((_N_COUNTERS, n))
        self._rate[_C_ENERGY_J] = self._idle_w
        self._power_w = self._idle_w.copy()
        self._headroom_w = self._limit_w - self._idle_w

    def _compile_job(self, job: JobSpec, rng: np.random.Generator) -> CompiledJob:
        idx = np.array([self._pos[g] for g in job.gpus], dtype=np.intp)
        base = int(rng.integers(2000, 400000))
        return CompiledJob(job, idx, tuple(base + 3 * rank for rank in range(len(job.gpus))))

    def _leak_rate_bytes_per_s(self, fault: FaultSpec) -> float:
        if fault.kind != "memory_leak":
            return 0.0
        if fault.params["rate_gib_per_h"] > 0:
            return fault.params["rate_gib_per_h"] * GIB / 3600.0
        duration = (fault.end_s - fault.start_s) if fault.end_s is not None else 3600.0
        held = self._memory_held(fault.gpu, fault.start_s)
        headroom = fault.params["max_fraction"] * self._mem_total[self._pos[fault.gpu]] - held
        return max(headroom, 0.0) / duration

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
        rate[_C_SM] += 0.3 * spin  # NCCL spin kernels occupy some SMs, no tensor work
        rate[_C_ENERGY_J] = power
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
        if self._resets:
            self._record_energy_resets(t0, float(self._grid))

    def _regime(self, t_s: float) -> Regime:
        key = bisect.bisect_right(self._boundaries, t_s)
        reg = self._regimes.get(key)
        if reg is None:
            reg = self._regimes[key] = self._build_regime(t_s)
        return reg

    def _build_regime(self, t_s: float) -> Regime:
        n = len(self._refs)
        lost = np.zeros(n, dtype=bool)
        idle = np.zeros(n, dtype=bool)
        cooling = np.ones(n)
        brake = np.ones(n)
        ratios = {kind: np.ones(n) for kind in ("hw_slowdown", "sw_thermal", "clock_lock")}
        host_wait = np.zeros(n)
        link = np.ones(n)
        for f in self.scenario.faults:
            if not f.active_at(t_s):
                continue
            k = self._pos[f.gpu]
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
                ratio = mhz / self._max_clock[k] if mhz > 0 else BRAKE_DEFAULT_RATIO
                brake[k] = min(brake[k], eased(ratio), 1.0)
            elif f.kind in ("hw_slowdown", "sw_thermal"):
                ratios[f.kind][k] = min(ratios[f.kind][k], eased(f.params["clock_ratio"]))
            elif f.kind == "clock_lock":
                mhz = f.params["clock_mhz"]
                ratio = mhz / self._max_clock[k] if mhz > 0 else LOCK_DEFAULT_RATIO
                ratios["clock_lock"][k] = min(ratios["clock_lock"][k], eased(ratio))
            elif f.kind == "slow_host":
                host_wait[k] = sev * f.params["wait_fraction"]
            elif f.kind == "slow_link":
                link[k] = 1.0 + sev * (f.params["factor"] - 1.0)
        out = lost | idle
        running = [j for j in self._jobs if j.spec.active_at(t_s)]
        training = Slots.build([j for j in running if j.spec.kind == "training"], out)
        inference = Slots.build([j for j in running if j.spec.kind == "inference"], out)
        intens = np.zeros(n)
        dram_k = np.zeros(n)
        working = np.zeros(n, dtype=bool)
        for slots, dram in ((training, 0.35), (inference, 0.55)):
            working[slots.gpus] = True
            intens[slots.gpus] = np.repeat(
                [j.intensity for j in slots.jobs], slots.sizes.astype(int)
            )
            dram_k[slots.gpus] = dram
        coef_compute = np.zeros((_N_COUNTERS, n))
        coef_comm = np.zeros((_N_COUNTERS, n))
        coef_compute[_C_SM], coef_comm[_C_SM] = 0.95, 0.3
        coef_compute[_C_OCC], coef_comm[_C_OCC] = 0.45, 0.1
        coef_compute[_C_HMMA] = intens
        coef_compute[_C_FP32] = 0.06
        coef_compute[_C_FP16] = 0.02
        coef_compute[_C_DRAM], coef_comm[_C_DRAM] = dram_k, 0.2
        coef_comm[_C_NVL] = NVLINK_BYTES_PER_S / link  # a degraded link: same bytes, longer
        return Regime(
            lost=lost,
            working=working,
            brake=brake,
            hw_slow=ratios["hw_slowdown"],
            sw_thermal=ratios["sw_thermal"],
            locked=ratios["clock_lock"],
            host_wait=host_wait,
            link=link,
            r_c_per_w=self._r_c_per_w * cooling,
            power_a=0.3 + 0.9 * intens,
            rest_demand=np.where(lost, 0.0, 0.005),
            coef_compute=coef_compute,
            coef_comm=coef_comm,
            training=training,
            inference=inference,
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
        """Remember the true energy at each reset instant inside (t0, t1] (the counter's new 0)."""
        for f in self.scenario.faults:
            if f.kind == "energy_counter_reset" and t0 < f.start_s <= t1:
                k = self._pos[f.gpu]
                into = f.start_s - (t1 - STEP_S) if t1 > 0 else 0.0
                self._energy_reset_j[id(f)] = float(
                    self._cum_prev[_C_ENERGY_J, k] + self._rate[_C_ENERGY_J, k] * into
                )

    # --- publishing -----------------------------------------------------------------------------
    def _publish(self, t_s: float) -> None:
        """Write the state at scenario time ``t_s`` into every SimGpuState.

        Holds ``cluster.condition`` meanwhile: a reader that takes it sees one consistent instant.
        """
        with self.cluster.condition:
            self._publish_locked(t_s)

    def _publish_locked(self, t_s: float) -> None:
        frac = 0.0 if self._grid == 0 else t_s - (self._grid - STEP_S)
        cum = (self._cum_prev + self._rate * frac).tolist()
        temp = (self._temp_prev_c + (self._temp_c - self._temp_prev_c) * frac).tolist()
        mem_temp = self._mem_temp_prev_c + (self._mem_temp_c - self._mem_temp_prev_c) * frac
        fan = np.clip(30.0 + 1.5 * (np.asarray(temp) - 40.0), 30.0, 100.0).tolist()
        power = self._power_w.tolist()
        last = self._last
        spin = last.spin if last.spin is not None else 0.0
        busy_pct = 100.0 * (last.compute + last.comm + spin) + 1.0 * last.util_noise
        util = np.where(last.working, np.minimum(np.maximum(busy_pct, 0.0), 100.0), 0.0).tolist()
        util_mem = (100.0 * self._rate[_C_DRAM]).tolist()
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
            g.energy_mj = round(cum[_C_ENERGY_J][k] * 1000.0)
            g.sm_clock_mhz = clock[k]
            g.graphics_clock_mhz = clock[k]
            g.memory_clock_mhz = self._mem_clock[k]
            g.clock_event_reasons = reasons[k]
            g.pcie_tx_kib_per_s = tx[k]
            g.pcie_rx_kib_per_s = rx[k]
            g.sm_active_s = cum[_C_SM][k]
            g.sm_occupancy_s = cum[_C_OCC][k]
            g.tensor_hmma_active_s = cum[_C_HMMA][k]
            g.tensor_any_active_s = cum[_C_HMMA][k]
            g.fp32_active_s = cum[_C_FP32][k]
            g.fp16_active_s = cum[_C_FP16][k]
            g.dram_active_s = cum[_C_DRAM][k]
            g.nvlink_tx_bytes = int(cum[_C_NVL][k])
            g.nvlink_rx_bytes = int(cum[_C_NVL][k])
        self._publish_processes(t_s)
        self._publish_faults(t_s, cum[_C_ENERGY_J])
        if self._mig is not None:
            self._mig.publish(t_s)

    def _publish_processes(self, t_s: float) -> None:
        procs: dict[int, list[tuple[int, int]]] = {}
        for job in self._jobs:
            if job.spec.active_at(t_s):
                used = int(job.spec.memory_gib * GIB)
                for k, pid in zip(job.idx.tolist(), job.pids, strict=True):
                    procs.setdefault(k, []).append((pid, used))
        for f in self.scenario.faults:
            k = self._pos[f.gpu]
            if f.kind == "idle_allocated" and f.active_at(t_s) and k not in procs:
                procs[k] = [(self._orphan_pids[id(f)], int(f.params["memory_gib"] * GIB))]
            elif f.kind == "memory_leak" and f.active_at(t_s):
                leak = self._leaked_bytes(f, t_s, procs.get(k, []))
                first = procs.get(k) or [(self._orphan_pids[id(f)], 0)]
                procs[k] = [(first[0][0], first[0][1] + leak), *first[1:]]
        for k, g in enumerate(self.cluster.gpus):
            g.processes = procs.get(k, [])
            g.memory_used_bytes = sum(b for _, b in g.processes)

    def _leaked_bytes(self, f: FaultSpec, t_s: float, procs: list[tuple[int, int]]) -> int:
        k = self._pos[f.gpu]
        held = int(self._mem_base[k]) + sum(b for _, b in procs)
        ceiling = f.params["max_fraction"] * self._mem_total[k] - held
        grown = self._leak_rates[id(f)] * (t_s - f.start_s)
        return int(max(0.0, min(grown, ceiling)))

    def _memory_held(self, gpu: tuple[str, int], t_s: float) -> float:
        job = self.scenario.job_at(*gpu, t_s)
        base = int(self._mem_base[self._pos[gpu]])
        return base + (job.memory_gib * GIB if job is not None else 0.0)

    def _publish_faults(self, t_s: float, energy_j: list[float]) -> None:
        """Fault-driven fields; only GPUs with such a fault are touched (tests script others)."""
        gpus = self.cluster.gpus
        for f in self.scenario.faults:
            g = gpus[self._pos[f.gpu]]
            if f.kind == "gpu_lost":
                g.lost = False
            elif f.kind == "ecc_errors":
                g.ecc_sbe_volatile = g.ecc_dbe_volatile = g.remapped_rows_uncorrectable = 0
                g.remapped_rows_pending = False
        for f in self.scenario.faults:
            k = self._pos[f.gpu]
            g = gpus[k]
            if f.start_s > t_s:
                continue
            if f.kind == "gpu_lost" and f.active_at(t_s):
                g.lost = True
            elif f.kind == "xid" and id(f) not in self._xids_fired:
                self._xids_fired.add(id(f))
                self.cluster.raise_xid(g, int(f.params["code"]))
            elif f.kind == "ecc_errors":
                until = t_s if f.end_s is None else min(t_s, f.end_s)
                g.ecc_sbe_volatile += int(f.params["sbe_per_h"] * (until - f.start_s) / 3600.0)
                g.ecc_dbe_volatile += f.params["dbe_count"]
                g.remapped_rows_uncorrectable += f.params["dbe_count"]
                g.remapped_rows_pending = g.remapped_rows_pending or f.params["dbe_count"] > 0
        self._publish_energy_resets(t_s, energy_j)

    def _publish_energy_resets(self, t_s: float, energy_j: list[float]) -> None:
        latest: dict[int, tuple[float, float]] = {}
        for f in self.scenario.faults:
            if f.kind == "energy_counter_reset" and f.start_s <= t_s:
                k = self._pos[f.gpu]
                if k not in latest or f.start_s >= latest[k][0]:
                    latest[k] = (f.start_s, self._energy_reset_j[id(f)])
        for k, (_, zero_j) in latest.items():
            self.cluster.gpus[k].energy_mj = round((energy_j[k] - zero_j) * 1000.0)


#: how far ahead duty cycles and ramps are expanded into boundaries when a scenario has no duration
BOUNDARY_HORIZON_S = 48 * 3600.0


def _boundaries(scenario: Scenario) -> list[float]:
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
