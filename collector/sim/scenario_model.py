"""The scenario as data: the cluster's shape, the jobs, the injected faults and the ground truth
the detection benchmark scores against. ``scenario`` reads these from YAML (its docstring has
the schema); the simulator and the fake NVML read them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatt.collector.sim.mig_scenario import MigPlan
from gpuwatt.gpu_specs import SPECS, GpuSpec

JOB_KINDS: tuple[str, ...] = ("training", "inference", "idle")
BALANCERS: tuple[str, ...] = ("latency_aware", "round_robin")

GpuRef = tuple[str, int]  # (host, gpu index)

#: Fault kind -> {parameter: default}. ``None`` as default means the parameter is required.
FAULT_PARAMS: dict[str, dict[str, Any]] = {
    # cooling loss (failed fan, blocked airflow): thermal resistance x cooling_factor, so the GPU
    # heats past its slowdown threshold and the hardware cuts its clock (reasons 0x8 + 0x40)
    "thermal_slowdown": {"cooling_factor": 2.5},
    # external power-brake signal (PSU/BMC): reasons 0x8 + 0x80, clock pinned at clock_mhz
    # (default: 35 % of the maximum SM clock)
    "power_brake": {"clock_mhz": 0.0},
    # the GPU falls off the bus: every NVML call on it raises GpuIsLost until end (if any)
    "gpu_lost": {},
    # one XID event delivered at start
    "xid": {"code": None},
    # single-bit ECC errors at sbe_per_h (volatile counter) from start to end, plus dbe_count
    # double-bit errors at start
    "ecc_errors": {"sbe_per_h": 60.0, "dbe_count": 0},
    # the GPU is allocated but its process does no work (a job that asked for 8 GPUs and uses 7;
    # or, on a GPU without a job, a process that holds memory_gib and sits idle)
    "idle_allocated": {"memory_gib": 2.0},
    # a process leaks memory linearly to max_fraction of the total; default rate fills it by end
    # (or within an hour when the fault has no end)
    "memory_leak": {"rate_gib_per_h": 0.0, "max_fraction": 0.98},
    # the driver reloads: the energy counter restarts from 0 at start (an instant)
    "energy_counter_reset": {},
    # HW slowdown alone (reason 0x8, e.g. a sensor or PSU event): clock at clock_ratio of max
    "hw_slowdown": {"clock_ratio": 0.5},
    # the driver's SW thermal slowdown (reason 0x20): clock at clock_ratio of max
    "sw_thermal": {"clock_ratio": 0.7},
    # application clocks locked low (no reason bit but 0x2): clock at clock_mhz (default 60 %)
    "clock_lock": {"clock_mhz": 0.0},
    # a slow host / data loader: each step the rank waits wait_fraction x its compute time for
    # input, with normal clocks and an idle GPU
    "slow_host": {"wait_fraction": 0.4},
    # a degraded NVLink/PCIe link: this rank's all-reduce takes factor x longer
    "slow_link": {"factor": 3.0},
}

#: Parameters every dynamic (not instant) fault takes: an on/off duty cycle and a gradual onset.
#: ``period`` 0 means no cycle; ``ramp`` 0 means full severity at once.
COMMON_FAULT_PARAMS: dict[str, float] = {"period": 0.0, "duty": 1.0, "ramp": 0.0}

#: Fault kinds that make a GPU a straggler, and the detector's cause for each (ground truth for
#: the detection benchmark). ``slow_unknown``: the cause is not visible in GPU counters.
STRAGGLER_FAULTS: dict[str, str] = {
    "thermal_slowdown": "thermal",
    "power_brake": "power_brake",
    "hw_slowdown": "hw_slowdown",
    "sw_thermal": "sw_thermal",
    "clock_lock": "clock",
    "slow_host": "host_wait",
    "slow_link": "slow_unknown",
}

#: Fault kinds that happen at one instant: ``end`` is not allowed and ground truth has end == start.
INSTANT_FAULTS: frozenset[str] = frozenset({"xid", "energy_counter_reset"})


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """What NVML reports about a model that the spec table does not hold (typical values)."""

    nvml_name: str  # nvmlDeviceGetName
    memory_total_mib: int
    idle_power_w: float  # P0 with no work, SXM boards at nominal inlet temperature
    power_min_w: float  # lowest settable power limit
    memory_clock_max_mhz: float
    idle_sm_clock_mhz: float
    slowdown_temp_c: float
    shutdown_temp_c: float
    full_load_rise_c: float  # GPU temperature above inlet air at TDP with healthy cooling
    pci_device: int | None = None  # 16-bit PCI device id; None: the spec's first


_PROFILES: dict[str, GpuProfile] = {
    "H100 SXM": GpuProfile("NVIDIA H100 80GB HBM3", 81559, 70, 200, 2619, 345, 87, 92, 40),
    "H100 PCIe": GpuProfile("NVIDIA H100 PCIe", 81559, 48, 200, 1593, 345, 87, 92, 42),
    "H100 NVL": GpuProfile("NVIDIA H100 NVL", 95830, 60, 200, 2619, 345, 87, 92, 42),
    "GH200": GpuProfile("NVIDIA GH200 480GB", 97871, 90, 450, 2619, 345, 87, 92, 40),
    "H200 SXM": GpuProfile("NVIDIA H200", 143771, 75, 200, 3201, 345, 87, 92, 40),
    "B200": GpuProfile("NVIDIA B200", 183359, 140, 200, 3996, 345, 87, 92, 42),
    "A100 PCIe": GpuProfile("NVIDIA A100 80GB PCIe", 81920, 45, 150, 1512, 210, 89, 94, 45),
    "A100 SXM": GpuProfile("NVIDIA A100-SXM4-80GB", 81920, 55, 100, 1593, 210, 89, 94, 40),
    "L40S": GpuProfile("NVIDIA L40S", 46068, 35, 100, 9001, 210, 88, 93, 45),
    "L4": GpuProfile("NVIDIA L4", 23034, 16, 40, 6251, 210, 88, 93, 45),
    "A10": GpuProfile("NVIDIA A10", 23028, 20, 100, 6251, 210, 88, 93, 45),
    "GeForce RTX 4090": GpuProfile(
        "NVIDIA GeForce RTX 4090", 24564, 20, 150, 10501, 210, 87, 92, 40
    ),
    "V100 SXM2": GpuProfile("Tesla V100-SXM2-32GB", 32768, 40, 150, 877, 135, 87, 92, 40, 0x1DB5),
}


def gpu_profile(model: str) -> GpuProfile:
    """The simulated hardware facts of ``model`` (a key of SPECS); a generic guess if unlisted."""
    known = _PROFILES.get(model)
    if known is not None:
        return known
    tdp = SPECS[model].tdp_w
    return GpuProfile(f"NVIDIA {model}", 81920, 0.1 * tdp, 0.3 * tdp, 2000, 345, 87, 92, 40)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int
    model: str  # a key of gpuwatt.gpu_specs.SPECS
    host_prefix: str = "node-"
    inlet_temp_c: float = 30.0
    power_limit_w: float | None = None  # None: the model's TDP
    node_models: tuple[tuple[str, str], ...] = ()  # (host, model) where not ``model``
    node_inlet_temp_c: tuple[tuple[str, float], ...] = ()  # (host, inlet C) where not the default
    gpu_power_limit_w: tuple[tuple[GpuRef, float], ...] = ()  # per-GPU enforced limits

    @property
    def spec(self) -> GpuSpec:
        return SPECS[self.model]

    def model_of(self, host: str) -> str:
        return dict(self.node_models).get(host, self.model)

    def inlet_of(self, host: str) -> float:
        return dict(self.node_inlet_temp_c).get(host, self.inlet_temp_c)

    def power_limit_of(self, ref: GpuRef) -> float:
        """The enforced power limit of one GPU: its own, else the cluster's, else its TDP."""
        own = dict(self.gpu_power_limit_w).get(ref)
        if own is not None:
            return own
        model = self.model_of(ref[0])
        if self.power_limit_w is not None and model == self.model:
            return self.power_limit_w
        return SPECS[model].tdp_w

    @property
    def gpu_count(self) -> int:
        return self.nodes * self.gpus_per_node

    def hosts(self) -> list[str]:
        return [f"{self.host_prefix}{n}" for n in range(self.nodes)]

    def gpus(self) -> list[GpuRef]:
        """Every GPU, host by host, index by index (the simulator's GPU order)."""
        return [(h, i) for h in self.hosts() for i in range(self.gpus_per_node)]


@dataclass(frozen=True, slots=True)
class JobSpec:
    id: str
    kind: str  # one of JOB_KINDS
    gpus: tuple[GpuRef, ...]  # rank order
    start_s: float = 0.0
    end_s: float | None = None  # None: runs to the end
    intensity: float = 0.8
    step_time_s: float = 1.0  # training
    comm_fraction: float = 0.15  # training
    load: float = 0.85  # inference
    memory_gib: float = 40.0
    nccl_spin: bool = False  # training: waiting ranks spin (utilisation stays high)
    stages: tuple[float, ...] = ()  # training: pipeline stages' relative compute, rank-contiguous
    balancer: str = "latency_aware"  # inference: one of BALANCERS

    def stage_factors(self) -> list[float]:
        """Each rank's compute relative to the job's step (1.0 without stages)."""
        if not self.stages:
            return [1.0] * len(self.gpus)
        n = len(self.gpus)
        return [self.stages[min(r * len(self.stages) // n, len(self.stages) - 1)] for r in range(n)]

    def active_at(self, t_s: float) -> bool:
        return self.start_s <= t_s and (self.end_s is None or t_s < self.end_s)


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: str  # a key of FAULT_PARAMS
    gpu: GpuRef
    start_s: float
    end_s: float | None = None  # None: lasts to the end; instant faults: None
    params: dict[str, Any] = field(default_factory=dict)  # every parameter, defaults filled in

    def active_at(self, t_s: float) -> bool:
        """Within its window and, with a duty cycle, in an "on" part of it."""
        if not (self.start_s <= t_s and (self.end_s is None or t_s < self.end_s)):
            return False
        period = self.params.get("period", 0.0)
        if not period:
            return True
        return (t_s - self.start_s) % period < self.params.get("duty", 1.0) * period

    def severity_at(self, t_s: float) -> float:
        """0..1: how far the gradual onset (``ramp``) has come, in tenths."""
        ramp = self.params.get("ramp", 0.0)
        if not ramp:
            return 1.0
        return min(1.0, math.ceil(10.0 * max(t_s - self.start_s, 0.0) / ramp) / 10.0)

    def switch_times(self, horizon_s: float) -> list[float]:
        """Every time before ``horizon_s`` at which its duty cycle or ramp changes the fault."""
        end = min(self.end_s if self.end_s is not None else horizon_s, horizon_s)
        out: list[float] = []
        period, duty = self.params.get("period", 0.0), self.params.get("duty", 1.0)
        if period:
            t = self.start_s
            while t < end:
                out += [t, t + duty * period]
                t += period
        ramp = self.params.get("ramp", 0.0)
        if ramp:
            out += [self.start_s + ramp * k / 10.0 for k in range(1, 11)]
        return [t for t in out if t < end]


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """One injected problem on one GPU, as a detector should find it.

    - ``cause``: the fault kind (a key of ``FAULT_PARAMS``). GPUs of an ``idle``-kind job are
      reported too, as ``idle_allocated`` with ``source="job"``: they are wasted allocations.
    - ``start_s``/``end_s``: the injection window in scenario seconds; ``end_s`` None means it
      lasts until the scenario ends. Instant faults (xid, energy_counter_reset) have
      ``end_s == start_s``. Symptoms follow physics: a thermal slowdown shows (temperature past the
      slowdown threshold, reasons 0x40) some seconds after ``start_s``, once the GPU has heated up.
    - ``job_id``: the job on that GPU at ``start_s`` (None when none).
    - ``params``: the fault's parameters, with ``period``/``duty`` (on/off cycle) and ``ramp``
      (gradual onset) where the scenario gave them. ``STRAGGLER_FAULTS`` says which cause a
      detector should name for each straggler kind. Per-node models, inlet temperatures and
      per-GPU power limits are facts of the cluster (``ClusterSpec``), not problems.
    """

    host: str
    gpu_index: int
    cause: str
    start_s: float
    end_s: float | None
    job_id: str | None
    source: str = "fault"  # "fault" or "job"
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    cluster: ClusterSpec
    jobs: tuple[JobSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    seed: int = 0
    description: str = ""
    duration_s: float | None = None
    path: str = "<scenario>"
    mig: MigPlan = field(default_factory=MigPlan)  # GPUs in MIG mode, jobs on their devices

    def job(self, job_id: str) -> JobSpec:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)

    def job_at(self, host: str, index: int, t_s: float) -> JobSpec | None:
        """The job running on ``host:index`` at scenario time ``t_s``, if any."""
        for j in self.jobs:
            if (host, index) in j.gpus and j.active_at(t_s):
                return j
        return None

    def job_ids_at(
        self, hosts: Iterable[str], indices: Iterable[int], times_s: Iterable[float]
    ) -> list[str | None]:
        """The id of the job running on each (host, index, scenario time), None where none is:
        a job column for samples of this scenario."""
        out = []
        for host, index, t_s in zip(hosts, indices, times_s, strict=True):
            job = self.job_at(host, index, t_s)
            out.append(job.id if job is not None else None)
        return out

    def ground_truth(self) -> list[GroundTruth]:
        """Every injected problem, in scenario order (faults first, then idle jobs' GPUs)."""
        out = [
            GroundTruth(
                host=f.gpu[0],
                gpu_index=f.gpu[1],
                cause=f.kind,
                start_s=f.start_s,
                end_s=f.start_s if f.kind in INSTANT_FAULTS else f.end_s,
                job_id=_job_id(self.job_at(*f.gpu, f.start_s)),
                params=dict(f.params),
            )
            for f in self.faults
        ]
        for j in self.jobs:
            if j.kind == "idle":
                out.extend(
                    GroundTruth(h, i, "idle_allocated", j.start_s, j.end_s, j.id, source="job")
                    for h, i in j.gpus
                )
        return out


def _job_id(job: JobSpec | None) -> str | None:
    return job.id if job is not None else None
