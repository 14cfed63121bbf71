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

import re
from pathlib import Path
from typing import Any

from gpuwatt.collector.sim.mig_scenario import parse_mig
from gpuwatt.collector.sim.scenario_model import (
    BALANCERS,
    COMMON_FAULT_PARAMS,
    FAULT_PARAMS,
    INSTANT_FAULTS,
    JOB_KINDS,
    STRAGGLER_FAULTS,
    ClusterSpec,
    FaultSpec,
    GpuProfile,
    GpuRef,
    GroundTruth,
    JobSpec,
    Scenario,
    gpu_profile,
)
from gpuwatt.errors import ConfigError
from gpuwatt.gpu_specs import SPECS
from gpuwatt.yamlfile import Located, load_file, load_text

SCENARIO_DIR = Path(__file__).parent / "scenarios"

#: Re-exported: the scenario's data types live in ``scenario_model``.
__all__ = [
    "BALANCERS",
    "COMMON_FAULT_PARAMS",
    "FAULT_PARAMS",
    "INSTANT_FAULTS",
    "JOB_KINDS",
    "SCENARIO_DIR",
    "STRAGGLER_FAULTS",
    "ClusterSpec",
    "FaultSpec",
    "GpuProfile",
    "GpuRef",
    "GroundTruth",
    "JobSpec",
    "Scenario",
    "gpu_profile",
    "list_shipped_scenarios",
    "load_scenario",
    "load_scenario_text",
    "parse_scenario",
    "parse_selector",
    "scenario_path",
]


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
