"""The simulated MIG devices of a scenario's GPUs in MIG mode (``mig_scenario.MigPlan``).

Each MIG device gets a ``SimMigState`` on its parent GPU (``mig_devices``), with a seeded
``MIG-...`` uuid and NVML's name (``<GPU name> MIG <profile>``). A job on a MIG device is an
independent replica: while it runs, the device is busy ``load`` of the time, and its GPM
counters integrate the same activities as a whole GPU's inference work (graphics engine 1, SM
0.95, occupancy 0.45, HMMA ``intensity``, FP32 0.06, FP16 0.02, DRAM 0.55, per busy second).
The counters are exact integrals of the job windows, so they depend only on the time, never on
how it was stepped.

The parent's own dynamics (power, clocks, temperature, energy) come from the simulator: for each
interval between MIG job boundaries the parent runs a hidden inference job whose load is its MIG
devices' busy share weighted by their compute slices (``parent_jobs``). Those jobs are not in
``Scenario.jobs``: the parent of MIG devices belongs to no job of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuwatt.collector.sim.mig_scenario import (
    MIG_PROFILES,
    SLICES_PER_GPU,
    GpuRef,
    MigJobSpec,
    MigPlan,
    MigRef,
    profile_sms,
    sm_counts,
)
from gpuwatt.collector.sim.scenario import JobSpec
from gpuwatt.collector.sim.state import SimGpuState, SimMigState

GIB = 1024**3
MIB = 1024**2
#: GPM counters per busy second of a MIG device's job (as a whole GPU's inference work).
_ACTIVITY: tuple[tuple[str, float | None], ...] = (
    ("graphics_active_s", 1.0),  # a kernel runs whenever the job is busy
    ("sm_active_s", 0.95),
    ("sm_occupancy_s", 0.45),
    ("tensor_hmma_active_s", None),  # the job's intensity
    ("tensor_any_active_s", None),
    ("fp32_active_s", 0.06),
    ("fp16_active_s", 0.02),
    ("dram_active_s", 0.55),
)
_HIDDEN_JOB = "mig-parent:"  # prefix of the parents' hidden jobs


class MigSimulation:
    """Builds the MIG devices on their parents' states and publishes them at each instant."""

    def __init__(
        self,
        plan: MigPlan,
        states: Sequence[SimGpuState],
        pos: dict[GpuRef, int],
        model_of: dict[GpuRef, str],
        seed: int,
    ) -> None:
        rng = np.random.default_rng([seed, 2])  # its own stream: other draws stay as they were
        self.plan = plan
        self._devices: dict[MigRef, SimMigState] = {}
        self._parents: list[SimGpuState] = []
        for spec in plan.gpus:
            g = states[pos[spec.gpu]]
            model = model_of[spec.gpu]
            g.mig_enabled = True
            g.mig_profile_sms = profile_sms(model)
            g.mig_devices = []
            for k, profile in enumerate(spec.profiles):
                slices, mib = MIG_PROFILES[profile]
                sms, _ = sm_counts(model, profile)
                m = SimMigState(
                    parent=g,
                    index=k,
                    uuid=_mig_uuid(rng),
                    name=f"{g.name} MIG {profile}",
                    profile=profile,
                    gpu_instance_id=k + 1,
                    compute_instance_id=0,
                    slices=slices,
                    multiprocessor_count=sms,
                    memory_total_bytes=mib * MIB,
                )
                g.mig_devices.append(m)
                self._devices[(*spec.gpu, k)] = m
            self._parents.append(g)
        self._pids = {
            (j.id, ref): int(rng.integers(2000, 400000)) for j in plan.jobs for ref in j.instances
        }
        self._job_by_uuid_cache: dict[str, MigRef] = {m.uuid: r for r, m in self._devices.items()}

    # --- what the simulator asks ----------------------------------------------------------------

    def boundaries(self) -> list[float]:
        """Every time a MIG job starts or ends."""
        times = {j.start_s for j in self.plan.jobs}
        times |= {j.end_s for j in self.plan.jobs if j.end_s is not None}
        return sorted(times)

    def parent_jobs(self) -> list[JobSpec]:
        """The hidden whole-GPU jobs that give each parent its MIG devices' load."""
        cuts = [0.0, *(t for t in self.boundaries() if t > 0)]
        out = []
        for spec in self.plan.gpus:
            for n, start in enumerate(cuts):
                end = cuts[n + 1] if n + 1 < len(cuts) else None
                mid = start + 0.5 * ((end - start) if end is not None else 1.0)
                load = weight = 0.0
                for k, profile in enumerate(spec.profiles):
                    job = self.plan.job_at((*spec.gpu, k), mid)
                    if job is not None:
                        share = MIG_PROFILES[profile][0] / SLICES_PER_GPU * job.load
                        load += share
                        weight += share * job.intensity
                if load > 0:
                    out.append(
                        JobSpec(
                            id=f"{_HIDDEN_JOB}{spec.gpu[0]}:{spec.gpu[1]}#{n}",
                            kind="inference",
                            gpus=(spec.gpu,),
                            start_s=start,
                            end_s=end,
                            intensity=weight / load,
                            load=min(load, 1.0),
                            memory_gib=0.0,
                        )
                    )
        return out

    def job_of(self, uuid: str) -> str | None:
        """The MIG job on the MIG device ``uuid`` at the last published time, or None."""
        ref = self._job_by_uuid_cache.get(uuid)
        if ref is None:
            return None
        job = self.plan.job_at(ref, self._devices[ref].time_s)
        return job.id if job is not None else None

    # --- publishing -----------------------------------------------------------------------------

    def publish(self, t_s: float) -> None:
        """Every MIG device's state at scenario time ``t_s``, and its parent's memory."""
        for ref, m in self._devices.items():
            m.time_s = t_s
            job = self.plan.job_at(ref, t_s)
            if job is None:
                m.processes = []
            else:
                used = min(int(job.memory_gib * GIB), m.memory_total_bytes)
                m.processes = [(self._pids[(job.id, ref)], used)]
            m.memory_used_bytes = sum(b for _, b in m.processes)
            for counter, busy_s in self._busy_s(ref, t_s).items():
                setattr(m, counter, busy_s)
        for g in self._parents:
            g.processes = []  # the fake lists the MIG devices' processes on a GPU in MIG mode
            g.memory_used_bytes = sum(m.memory_used_bytes for m in g.mig_devices if m is not None)

    def _busy_s(self, ref: MigRef, t_s: float) -> dict[str, float]:
        """Each GPM counter of ``ref`` at ``t_s``: the integral of its jobs' activity."""
        out = dict.fromkeys((c for c, _ in _ACTIVITY), 0.0)
        for job in self.plan.jobs:
            if ref not in job.instances:
                continue
            busy = job.load * _overlap_s(job, t_s)
            for counter, rate in _ACTIVITY:
                out[counter] += busy * (job.intensity if rate is None else rate)
        return out


def _overlap_s(job: MigJobSpec, t_s: float) -> float:
    """Seconds of [start, end) that lie before ``t_s``."""
    end = t_s if job.end_s is None else min(t_s, job.end_s)
    return max(0.0, end - job.start_s)


def is_hidden_job(job_id: str) -> bool:
    """A parent's hidden job (``parent_jobs``), not a job of the scenario."""
    return job_id.startswith(_HIDDEN_JOB)


def _mig_uuid(rng: np.random.Generator) -> str:
    h = "".join(f"{b:02x}" for b in rng.integers(0, 256, 16).tolist())
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
