"""MIG in scenarios: which GPUs are split into which MIG devices, and the jobs on those devices.

Two optional top-level sections of a scenario (``scenario.py``)::

    mig:                                  # GPUs in MIG mode and their MIG devices, in order
      - gpus: "node-0:0-1"                # a GPU selector (see scenario.py)
        instances: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]
    mig_jobs:                             # work on MIG devices: independent replicas
      - id: chat-small                    # required, unique among jobs and mig_jobs
        instances: ["node-0:0/2", "node-0:1/2"]   # HOST:GPU/MIG-INDEX (its place in ``instances``)
        start: 0                          # optional, as for jobs
        end: 30m
        load: 0.7                         # busy share of the device's time, 0..1
        intensity: 0.6                    # HMMA tensor activity while busy, 0..1
        memory_gib: 8                     # memory each process holds (at most the device's)

A GPU in MIG mode runs no whole-GPU job. Profiles (``MIG_PROFILES``) are those of the A100 and
H100 families; their compute slices add up to at most 7 per GPU. Each MIG device is GPU instance
``k + 1`` (``k`` its place in ``instances``) with compute instance 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatt.yamlfile import Located

GpuRef = tuple[str, int]
Selector = Callable[[Located], list[GpuRef]]  # a GPU selector node -> the GPUs it names
Window = Callable[[Located], tuple[float, float | None]]  # a node's start and end
MigRef = tuple[str, int, int]  # (host, GPU index, MIG device index)

#: SMs of a MIG device by compute slices, and of the whole GPU, per family; memory by profile.
_FAMILY_SMS: dict[str, tuple[dict[int, int], int]] = {
    "ampere": ({1: 14, 2: 28, 3: 42, 4: 56, 7: 98}, 108),
    "hopper": ({1: 16, 2: 32, 3: 60, 4: 64, 7: 132}, 132),
}
#: The models MIG is simulated for, by family.
MIG_MODELS: dict[str, str] = {
    "A100 SXM": "ampere",
    "A100 PCIe": "ampere",
    "H100 SXM": "hopper",
    "H100 PCIe": "hopper",
    "H100 NVL": "hopper",
    "H200 SXM": "hopper",
    "GH200": "hopper",
}
#: Profile -> (compute slices, memory MiB as nvidia-smi reports it on an 80 GB part).
MIG_PROFILES: dict[str, tuple[int, int]] = {
    "1g.10gb": (1, 9728),
    "1g.20gb": (1, 19968),
    "2g.20gb": (2, 19968),
    "3g.40gb": (3, 40192),
    "4g.40gb": (4, 40192),
    "7g.80gb": (7, 80384),
}
SLICES_PER_GPU = 7
_MIG_REF = re.compile(r"^(?P<gpu>[^/\s]+)/(?P<mig>\d+)$")


@dataclass(frozen=True, slots=True)
class MigGpuSpec:
    """One GPU in MIG mode and its MIG devices' profiles, by MIG device index."""

    gpu: GpuRef
    profiles: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MigJobSpec:
    id: str
    instances: tuple[MigRef, ...]
    start_s: float = 0.0
    end_s: float | None = None
    load: float = 0.7
    intensity: float = 0.6
    memory_gib: float = 8.0

    def active_at(self, t_s: float) -> bool:
        return self.start_s <= t_s and (self.end_s is None or t_s < self.end_s)


@dataclass(frozen=True, slots=True)
class MigPlan:
    """A scenario's MIG layout and the jobs on its MIG devices."""

    gpus: tuple[MigGpuSpec, ...] = ()
    jobs: tuple[MigJobSpec, ...] = ()

    def profiles_of(self, gpu: GpuRef) -> tuple[str, ...] | None:
        for g in self.gpus:
            if g.gpu == gpu:
                return g.profiles
        return None

    def job_at(self, ref: MigRef, t_s: float) -> MigJobSpec | None:
        for j in self.jobs:
            if ref in j.instances and j.active_at(t_s):
                return j
        return None


def sm_counts(model: str, profile: str) -> tuple[int, int]:
    """(SMs of a MIG device of ``profile``, SMs of the whole GPU) on ``model``."""
    per_slices, whole = _FAMILY_SMS[MIG_MODELS[model]]
    return per_slices[MIG_PROFILES[profile][0]], whole


def profile_sms(model: str) -> dict[int, int]:
    """SMs of a GPU instance of ``model`` by its compute slices (empty where MIG is not
    simulated for it)."""
    family = MIG_MODELS.get(model)
    return dict(_FAMILY_SMS[family][0]) if family is not None else {}


def architecture_profile_sms(architecture: str | None) -> dict[int, int]:
    """As ``profile_sms``, by NVML's architecture name (``Ampere``: the A100's; ``Hopper``)."""
    family = {"Ampere": "ampere", "Hopper": "hopper"}.get(architecture or "")
    return dict(_FAMILY_SMS[family][0]) if family is not None else {}


# --- parsing ------------------------------------------------------------------------------------

_GPU_KEYS = frozenset({"gpus", "instances"})
_JOB_KEYS = frozenset({"id", "instances", "start", "end", "load", "intensity", "memory_gib"})


def parse_mig(
    gpus_node: Located | None,
    jobs_node: Located | None,
    *,
    select: Selector,
    model_of: Callable[[str], str],
    window: Window,
    whole_gpu_jobs: dict[GpuRef, str],
) -> MigPlan:
    """The ``mig`` and ``mig_jobs`` sections. ``select(node)`` expands a GPU selector,
    ``model_of(host)`` names a host's model, ``window(node)`` reads start/end, and
    ``whole_gpu_jobs`` maps each GPU of a whole-GPU job to that job's id."""
    specs: list[MigGpuSpec] = []
    seen: set[GpuRef] = set()
    for node in _sequence(gpus_node, "mig"):
        node.mapping("a MIG layout (a mapping with gpus and instances)")
        node.check_keys(_GPU_KEYS, required=set(_GPU_KEYS))
        sel = node.get("gpus")
        inst = node.get("instances")
        assert sel is not None and inst is not None
        profiles = tuple(p.choice(list(MIG_PROFILES)) for p in inst.sequence("a list of profiles"))
        if not profiles:
            raise inst.error("a GPU in MIG mode needs at least one instance")
        slices = sum(MIG_PROFILES[p][0] for p in profiles)
        if slices > SLICES_PER_GPU:
            raise inst.error(f"these profiles need {slices} compute slices; a GPU has 7")
        for ref in select(sel):
            model = model_of(ref[0])
            if model not in MIG_MODELS:
                raise sel.error(f"{model} is not simulated in MIG mode ({', '.join(MIG_MODELS)})")
            if ref in seen:
                raise sel.error(f"GPU {ref[0]}:{ref[1]} is given a MIG layout twice")
            if ref in whole_gpu_jobs:
                raise sel.error(
                    f"GPU {ref[0]}:{ref[1]} is in MIG mode but job "
                    f"{whole_gpu_jobs[ref]!r} runs on the whole GPU"
                )
            seen.add(ref)
            specs.append(MigGpuSpec(ref, profiles))
    plan = MigPlan(tuple(specs))
    jobs: list[MigJobSpec] = []
    for node in _sequence(jobs_node, "mig_jobs"):
        jobs.append(_parse_job(node, plan, select, window, whole_gpu_jobs, jobs))
    return MigPlan(plan.gpus, tuple(jobs))


def _sequence(node: Located | None, key: str) -> list[Located]:
    if node is None or node.value is None:
        return []
    return node.sequence(f"a list of {key}")


def _parse_job(
    node: Located,
    plan: MigPlan,
    select: Selector,
    window: Window,
    whole_gpu_jobs: dict[GpuRef, str],
    earlier: list[MigJobSpec],
) -> MigJobSpec:
    node.mapping("a MIG job (a mapping with id and instances)")
    node.check_keys(_JOB_KEYS, required={"id", "instances"})
    id_node, inst_node = node.get("id"), node.get("instances")
    assert id_node is not None and inst_node is not None
    job_id = id_node.string()
    if job_id in whole_gpu_jobs.values() or any(j.id == job_id for j in earlier):
        raise id_node.error(f"duplicate job id {job_id!r}")
    refs: list[MigRef] = []
    for item in inst_node.sequence("a list of MIG devices like node-0:0/1"):
        m = _MIG_REF.match(str(item.value).strip()) if isinstance(item.value, str) else None
        if m is None:
            raise item.error(f"bad MIG device {item.value!r} (use HOST:GPU/INDEX, e.g. node-0:0/1)")
        gpus = select(Located(m["gpu"], item.path, item.line))
        if len(gpus) != 1:
            raise item.error("a MIG device names one GPU (like node-0:0/1)")
        (gpu,) = gpus
        profiles = plan.profiles_of(gpu)
        if profiles is None:
            raise item.error(f"GPU {gpu[0]}:{gpu[1]} is not in MIG mode (see mig:)")
        index = int(m["mig"])
        if index >= len(profiles):
            raise item.error(f"GPU {gpu[0]}:{gpu[1]} has MIG devices 0-{len(profiles) - 1}")
        ref = (gpu[0], gpu[1], index)
        if ref in refs:
            raise item.error(f"MIG device {item.value} is listed twice in this job")
        refs.append(ref)
    start, end = window(node)
    job = MigJobSpec(
        id=job_id,
        instances=tuple(refs),
        start_s=start,
        end_s=end,
        load=_number(node, "load", 0.7, 0.0, 1.0),
        intensity=_number(node, "intensity", 0.6, 0.0, 1.0),
        memory_gib=_number(node, "memory_gib", 8.0, 0.0, 1024.0),
    )
    for ref in refs:
        profile = plan.profiles_of(ref[:2])
        assert profile is not None
        if job.memory_gib * 1024 > MIG_PROFILES[profile[ref[2]]][1]:
            raise node.error(f"memory_gib {job.memory_gib:g} is more than {profile[ref[2]]} has")
        for other in earlier:
            if ref in other.instances and _overlap(job, other):
                raise inst_node.error(
                    f"MIG device {ref[0]}:{ref[1]}/{ref[2]} is already in job {other.id!r}"
                )
    return job


def _number(node: Located, key: str, default: float, lo: float, hi: float) -> float:
    child = node.get(key)
    return default if child is None else child.number(lo, hi)


def _overlap(a: MigJobSpec, b: MigJobSpec) -> bool:
    a_end = a.end_s if a.end_s is not None else float("inf")
    b_end = b.end_s if b.end_s is not None else float("inf")
    return a.start_s < b_end and b.start_s < a_end
