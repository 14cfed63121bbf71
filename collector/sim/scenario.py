"""Scenarios for the simulated cluster: its shape, the jobs it runs and the faults injected.

A scenario is a YAML file loaded through ``gpuwatt.yamlfile``, so every problem is a
``ConfigError(file, line, reason)`` that points at the offending line. Shipped scenarios live in
``collector/sim/scenarios/<name>.yaml`` and load by bare name (``load_scenario("demo")``).

Schema (times are durations from the start of the scenario: a number of seconds or ``90s``/``5m``)::

    name: demo                      # required
    description: free text          # optional
    seed: 42                        # optional, default 0: same seed, same numbers
    duration: 1h                    # optional: how long the scenario is meant to run
    cluster:
      nodes: 4                      # required
      gpus_per_node: 8              # required
      model: H100 SXM               # required, a key of gpuwatt.gpu_specs.SPECS
      host_prefix: node-            # optional, default "node-": hosts node-0 .. node-3
      inlet_temp_c: 30              # optional, default 30: cold-aisle air temperature
      power_limit_w: 700            # optional, default the model's TDP
      models: {"node-[2-3]": A100 SXM}        # optional: other models on some nodes
      node_inlet_temp_c: {node-1: 38}         # optional: per-node inlet air temperature
      gpu_power_limit_w: {"node-0:3": 450}    # optional: per-GPU enforced power limits
    jobs:
      - id: llm-pretrain            # required, unique
        kind: training              # training | inference | idle
        gpus: ["node-0:*", "node-[1-2]:0-7"]   # selectors, see below
        start: 0                    # optional, default 0
        end: 2h                     # optional, default: runs to the end
        intensity: 0.9              # HMMA (bf16 tensor) activity while computing, 0..1
        step_time: 1.2s             # training only: healthy step time incl. the all-reduce
        comm_fraction: 0.15         # training only: share of a healthy step spent in all-reduce
        load: 0.85                  # inference only: share of time busy when healthy, 0..1
        memory_gib: 60              # memory each process holds
        nccl_spin: true             # training only: ranks waiting at the all-reduce spin (high
                                    # utilisation, no tensor work), as NCCL kernels do
        stages: [1.0, 0.7, 0.85]    # training only: pipeline-parallel, ranks split evenly into
                                    # stages whose compute differs by design
        balancer: round_robin       # inference only: latency_aware (default) | round_robin
    faults:
      - kind: thermal_slowdown      # see FAULT_PARAMS for every kind and its parameters
        gpu: node-2:5
        start: 4m
        end: 50m                    # optional: default lasts to the end
        period: 3m                  # optional (dynamic faults): on for duty x period, then off
        duty: 0.66                  # optional, default 1 (always on while active)
        ramp: 2m                    # optional: severity grows linearly from 0 over this long
    mig: [...]                      # optional: GPUs in MIG mode, see mig_scenario.py
    mig_jobs: [...]                 # optional: jobs on their MIG devices, see mig_scenario.py

GPU selectors are ``HOST:INDICES``. ``HOST`` is a host name, ``*`` (every host) or a Slurm-style
range ``node-[0-2]``; ``INDICES`` is ``*``, ``5``, ``0-6`` or a comma list ``0,2,4-5``. A GPU may
belong to at most one job at any time.

Ground truth (``Scenario.ground_truth()``) is what the analytics' detection benchmark scores
against; see ``GroundTruth`` for exactly what each record means.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatt.collector.sim.mig_scenario import MigPlan, parse_mig
from gpuwatt.errors import ConfigError
from gpuwatt.gpu_specs import SPECS, GpuSpec
from gpuwatt.yamlfile import Located, load_file, load_text

SCENARIO_DIR = Path(__file__).parent / "scenarios"

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


# --- loading ------------------------------------------------------------------------------------


def list_shipped_scenarios() -> list[str]:
    """Names of the scenarios shipped with gpuwatt (``load_scenario`` takes them bare)."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def scenario_path(name_or_path: str | Path) -> Path:
    """A bare name (``demo``) is a shipped scenario; anything else is a file path."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith((".yaml", ".yml")):
        return Path(name_or_path)
    path = SCENARIO_DIR / f"{text}.yaml"
    if not path.is_file():
        shipped = ", ".join(list_shipped_scenarios())
        raise ConfigError(text, None, f"no shipped scenario named {text!r} (shipped: {shipped})")
    return path


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load and validate a scenario by shipped name (``"demo"``) or path."""
    path = scenario_path(name_or_path)
    return parse_scenario(load_file(path))


def load_scenario_text(text: str, path: str = "<scenario>") -> Scenario:
    """Load and validate a scenario from YAML text (``path`` names it in errors)."""
    return parse_scenario(load_text(text, path))


_TOP_KEYS = frozenset(
    {"name", "description", "seed", "duration", "cluster", "jobs", "faults", "mig", "mig_jobs"}
)
_CLUSTER_KEYS = frozenset(
    {
        "nodes",
        "gpus_per_node",
        "model",
        "host_prefix",
        "inlet_temp_c",
        "power_limit_w",
        "models",
        "node_inlet_temp_c",
        "gpu_power_limit_w",
    }
)
_JOB_KEYS = frozenset(
    {
        "id",
        "kind",
        "gpus",
        "start",
        "end",
        "intensity",
        "step_time",
        "comm_fraction",
        "load",
        "memory_gib",
        "nccl_spin",
        "stages",
        "balancer",
    }
)
_JOB_KIND_ONLY = {
    "step_time": "training",
    "comm_fraction": "training",
    "load": "inference",
    "nccl_spin": "training",
    "stages": "training",
    "balancer": "inference",
}
_FAULT_BASE_KEYS = frozenset({"kind", "gpu", "start", "end"})


def parse_scenario(root: Located) -> Scenario:
    """Validate a loaded YAML document into a ``Scenario``; problems raise ``ConfigError``."""
    root.mapping("a scenario (a mapping with name, cluster, jobs, faults)")
    root.check_keys(_TOP_KEYS, required={"name", "cluster"})
    cluster = _parse_cluster(_req(root, "cluster"))
    jobs = tuple(_parse_job(n, cluster) for n in _opt_list(root, "jobs"))
    _check_jobs(root, jobs)
    faults = tuple(_parse_fault(n, cluster) for n in _opt_list(root, "faults"))
    mig = parse_mig(
        root.get("mig"),
        root.get("mig_jobs"),
        select=lambda n: parse_selector(n, cluster),
        model_of=cluster.model_of,
        window=_window,
        whole_gpu_jobs={ref: j.id for j in jobs for ref in j.gpus},
    )
    return Scenario(
        name=_req(root, "name").string(),
        cluster=cluster,
        jobs=jobs,
        faults=faults,
        seed=_opt(root, "seed", lambda n: n.integer(minimum=0), 0),
        description=_opt(root, "description", lambda n: n.string(), ""),
        duration_s=_opt(root, "duration", lambda n: n.duration_s(minimum=1.0), None),
        path=root.path,
        mig=mig,
    )


def _req(node: Located, key: str) -> Located:
    child = node.get(key)
    if child is None:
        raise node.error(f"missing required field {key!r}")
    return child


def _opt(node: Located, key: str, convert: Any, default: Any) -> Any:
    child = node.get(key)
    return default if child is None else convert(child)


def _opt_list(node: Located, key: str) -> list[Located]:
    child = node.get(key)
    if child is None or child.value is None:
        return []
    return child.sequence(f"a list of {key}")


def _parse_cluster(node: Located) -> ClusterSpec:
    node.mapping("the cluster's shape (nodes, gpus_per_node, model)")
    node.check_keys(_CLUSTER_KEYS, required={"nodes", "gpus_per_node", "model"})
    model_node = _req(node, "model")
    model = model_node.string()
    if model not in SPECS:
        raise model_node.error(f"unknown GPU model {model!r} (known: {', '.join(SPECS)})")
    prefix = _opt(node, "host_prefix", lambda n: n.string(), "node-")
    if any(c in prefix for c in ":[]*,"):
        raise _req(node, "host_prefix").error("host_prefix may not contain any of : [ ] * ,")
    base = ClusterSpec(
        nodes=_req(node, "nodes").integer(minimum=1, maximum=4096),
        gpus_per_node=_req(node, "gpus_per_node").integer(minimum=1, maximum=64),
        model=model,
        host_prefix=prefix,
        inlet_temp_c=_opt(node, "inlet_temp_c", lambda n: n.number(-10.0, 60.0), 30.0),
        power_limit_w=_opt(node, "power_limit_w", lambda n: n.number(1.0, 5000.0), None),
    )
    models: dict[str, str] = {}
    for sel, value in _opt_map(node, "models"):
        name = value.string()
        if name not in SPECS:
            raise value.error(f"unknown GPU model {name!r} (known: {', '.join(SPECS)})")
        for host in _select_hosts(value, sel, base):
            models[host] = name
    inlets: dict[str, float] = {}
    for sel, value in _opt_map(node, "node_inlet_temp_c"):
        for host in _select_hosts(value, sel, base):
            inlets[host] = value.number(-10.0, 60.0)
    limits: dict[GpuRef, float] = {}
    for sel, value in _opt_map(node, "gpu_power_limit_w"):
        for ref in parse_selector(Located(sel, value.path, value.line), base):
            limits[ref] = value.number(1.0, 5000.0)
    return ClusterSpec(
        nodes=base.nodes,
        gpus_per_node=base.gpus_per_node,
        model=model,
        host_prefix=prefix,
        inlet_temp_c=base.inlet_temp_c,
        power_limit_w=base.power_limit_w,
        node_models=tuple(models.items()),
        node_inlet_temp_c=tuple(inlets.items()),
        gpu_power_limit_w=tuple(limits.items()),
    )


def _opt_map(node: Located, key: str) -> list[tuple[str, Located]]:
    """The (selector, value) pairs of an optional mapping field."""
    child = node.get(key)
    if child is None or child.value is None:
        return []
    child.mapping(f"a mapping of {key} by selector")
    return list(child.items())


def _window(node: Located) -> tuple[float, float | None]:
    start = _opt(node, "start", lambda n: n.duration_s(), 0.0)
    end_node = node.get("end")
    if end_node is None:
        return start, None
    end = end_node.duration_s()
    if end <= start:
        raise end_node.error(f"end ({end:g} s) must be after start ({start:g} s)")
    return start, end


def _parse_job(node: Located, cluster: ClusterSpec) -> JobSpec:
    node.mapping("a job (a mapping with id, kind, gpus)")
    node.check_keys(_JOB_KEYS, required={"id", "kind", "gpus"})
    kind = _req(node, "kind").choice(JOB_KINDS)
    for key, only in _JOB_KIND_ONLY.items():
        if key in node.mapping() and kind != only:
            raise _req(node, key).error(f"{key!r} applies only to {only} jobs, not {kind}")
    gpus_node = _req(node, "gpus")
    if isinstance(gpus_node.value, str):
        selectors = [gpus_node]
    else:
        selectors = gpus_node.sequence("a list of GPU selectors like node-0:0-7")
    gpus: list[GpuRef] = []
    for sel in selectors:
        for ref in parse_selector(sel, cluster):
            if ref in gpus:
                raise sel.error(f"GPU {ref[0]}:{ref[1]} is listed twice in this job")
            gpus.append(ref)
    if not gpus:
        raise gpus_node.error("a job needs at least one GPU")
    start, end = _window(node)
    return JobSpec(
        id=_req(node, "id").string(),
        kind=kind,
        gpus=tuple(gpus),
        start_s=start,
        end_s=end,
        intensity=_opt(node, "intensity", lambda n: n.number(0.0, 1.0), 0.8),
        step_time_s=_opt(node, "step_time", lambda n: n.duration_s(minimum=0.01), 1.0),
        comm_fraction=_opt(node, "comm_fraction", lambda n: n.number(0.0, 0.9), 0.15),
        load=_opt(node, "load", lambda n: n.number(0.0, 1.0), 0.85),
        memory_gib=_memory_gib(node, cluster),
        nccl_spin=_opt(node, "nccl_spin", lambda n: n.boolean(), False),
        stages=_opt(node, "stages", _stages, ()),
        balancer=_opt(node, "balancer", lambda n: n.choice(BALANCERS), "latency_aware"),
    )


def _stages(node: Located) -> tuple[float, ...]:
    items = node.sequence("a list of stage loads like [1.0, 0.8]")
    if not items:
        raise node.error("stages needs at least one stage load")
    return tuple(n.number(0.05, 1.0) for n in items)


def _memory_gib(node: Located, cluster: ClusterSpec) -> float:
    total_gib = gpu_profile(cluster.model).memory_total_mib / 1024
    return _opt(node, "memory_gib", lambda n: n.number(0.0, total_gib), min(40.0, total_gib / 2))


def _check_jobs(root: Located, jobs: tuple[JobSpec, ...]) -> None:
    """Unique ids, and no GPU in two jobs at overlapping times."""
    nodes = _opt_list(root, "jobs")
    for k, job in enumerate(jobs):
        for other in jobs[:k]:
            if other.id == job.id:
                raise _req(nodes[k], "id").error(f"duplicate job id {job.id!r}")
            shared = set(job.gpus) & set(other.gpus)
            if shared and _overlap(job, other):
                h, i = sorted(shared)[0]
                raise _req(nodes[k], "gpus").error(
                    f"GPU {h}:{i} is already in job {other.id!r} at the same time"
                )


def _overlap(a: JobSpec, b: JobSpec) -> bool:
    a_end = a.end_s if a.end_s is not None else float("inf")
    b_end = b.end_s if b.end_s is not None else float("inf")
    return a.start_s < b_end and b.start_s < a_end


def _parse_fault(node: Located, cluster: ClusterSpec) -> FaultSpec:
    node.mapping("a fault (a mapping with kind, gpu, start)")
    kind = _req(node, "kind").choice(list(FAULT_PARAMS))
    defaults = FAULT_PARAMS[kind]
    instant = kind in INSTANT_FAULTS
    base = _FAULT_BASE_KEYS - {"end"} if instant else _FAULT_BASE_KEYS | set(COMMON_FAULT_PARAMS)
    required = {"kind", "gpu"} | {p for p, d in defaults.items() if d is None}
    node.check_keys(base | set(defaults), required=required)
    gpu_node = _req(node, "gpu")
    refs = parse_selector(gpu_node, cluster)
    if len(refs) != 1:
        raise gpu_node.error(f"a fault names one GPU (like node-2:5); this selects {len(refs)}")
    start, end = _window(node)
    params = {p: _fault_param(node, kind, p, d) for p, d in defaults.items()}
    if not instant:  # only where given: a plain fault's params stay its kind's defaults
        cycle = _cycle_params(node)
        params.update({k: v for k, v in cycle.items() if v != COMMON_FAULT_PARAMS[k]})
    return FaultSpec(kind=kind, gpu=refs[0], start_s=start, end_s=end, params=params)


def _cycle_params(node: Located) -> dict[str, float]:
    period = _opt(node, "period", lambda n: n.duration_s(minimum=1.0), 0.0)
    duty = _opt(node, "duty", lambda n: n.number(0.01, 1.0), 1.0)
    if node.get("duty") is not None and not period:
        raise _req(node, "duty").error("duty needs a period (e.g. period: 3m)")
    ramp = _opt(node, "ramp", lambda n: n.duration_s(), 0.0)
    return {"period": period, "duty": duty, "ramp": ramp}


def _fault_param(node: Located, kind: str, name: str, default: Any) -> Any:
    child = node.get(name)
    if child is None:
        return default
    if name == "code":
        return child.integer(minimum=1, maximum=1000)
    if name == "dbe_count":
        return child.integer(minimum=0)
    if name == "cooling_factor":
        return child.number(minimum=1.0, maximum=10.0)
    if name in ("max_fraction", "wait_fraction"):
        return child.number(minimum=0.0, maximum=1.0 if name == "max_fraction" else 10.0)
    if name == "clock_ratio":
        return child.number(minimum=0.05, maximum=1.0)
    if name == "factor":
        return child.number(minimum=1.0, maximum=100.0)
    return child.number(minimum=0.0)


# --- GPU selectors ------------------------------------------------------------------------------

_SELECTOR = re.compile(r"^(?P<host>[^:\s]+):(?P<idx>[^:\s]+)$")
_HOST_RANGE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<a>\d+)-(?P<b>\d+)\]$")
_INDEX_PART = re.compile(r"^(?P<a>\d+)(?:-(?P<b>\d+))?$")


def parse_selector(node: Located, cluster: ClusterSpec) -> list[GpuRef]:
    """``node-0:0-7`` -> the GPUs it names, in order; errors point at the selector's line."""
    if isinstance(node.value, int) or not isinstance(node.value, str):
        raise node.error("expected a GPU selector like node-0:0-7, node-3:5 or node-[1-2]:*")
    m = _SELECTOR.match(node.value.strip())
    if not m:
        raise node.error(f"bad GPU selector {node.value!r} (use e.g. node-0:0-7, node-3:5, *:*)")
    hosts = _select_hosts(node, m["host"], cluster)
    indices = _select_indices(node, m["idx"], cluster.gpus_per_node)
    return [(h, i) for h in hosts for i in indices]


def _select_hosts(node: Located, text: str, cluster: ClusterSpec) -> list[str]:
    known = cluster.hosts()
    if text == "*":
        return known
    r = _HOST_RANGE.match(text)
    names = [text] if r is None else [f"{r['prefix']}{n}" for n in _span(node, r["a"], r["b"])]
    for name in names:
        if name not in known:
            raise node.error(f"no host {name!r} in this cluster ({known[0]} .. {known[-1]})")
    return names


def _select_indices(node: Located, text: str, gpus_per_node: int) -> list[int]:
    if text == "*":
        return list(range(gpus_per_node))
    out: list[int] = []
    for part in text.split(","):
        m = _INDEX_PART.match(part.strip())
        if not m:
            raise node.error(f"bad GPU index {part!r} (use e.g. 5, 0-7, 0,2,4-5 or *)")
        for i in _span(node, m["a"], m["b"] or m["a"]):
            if i >= gpus_per_node:
                raise node.error(
                    f"GPU index {i} is out of range: nodes have {gpus_per_node} GPUs "
                    f"(0-{gpus_per_node - 1})"
                )
            if i not in out:
                out.append(i)
    return out


#: No selector range spans more than this (a cluster's nodes are at most 4,096 here): checked
#: before a range is expanded, so ``node-[0-999999999]`` costs nothing.
MAX_RANGE = 4096


def _span(node: Located, a: str, b: str) -> range:
    if len(a) > 9 or len(b) > 9:
        raise node.error(f"range {a}-{b} is too large (at most {MAX_RANGE} in one range)")
    lo, hi = int(a), int(b)
    if hi < lo:
        raise node.error(f"range {lo}-{hi} runs backwards")
    if hi - lo + 1 > MAX_RANGE:
        raise node.error(f"range {lo}-{hi} is too large (at most {MAX_RANGE} in one range)")
    return range(lo, hi + 1)
