"""What faults and jobs write into the published states besides the dynamics: processes and
their memory (a leak grows linearly to ``max_fraction`` of the total and is released at its end:
the process restarts), a lost GPU, XIDs (raised once when time reaches the fault's start), ECC
counts and pending row remaps, and energy-counter resets (the counter restarts from 0 at start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpuwatt.collector.sim.scenario import FaultSpec, Scenario
from gpuwatt.collector.sim.state import SimCluster, SimGpuState
from gpuwatt.collector.sim.step_kernels import CompiledJob

GIB = 1024**3


class FaultEffects:
    """The process lists and fault-driven fields of a scenario's GPUs at a time."""

    def __init__(
        self,
        scenario: Scenario,
        pos: Mapping[tuple[str, int], int],
        mem_base_bytes: np.ndarray,
        mem_total_bytes: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        self._scenario = scenario
        self._pos = pos
        self._mem_base = mem_base_bytes
        self._mem_total = mem_total_bytes
        faults = scenario.faults
        self._orphan_pids = {id(f): int(rng.integers(2000, 400000)) for f in faults}
        self._leak_rates = {id(f): self._leak_rate_bytes_per_s(f) for f in faults}
        self._energy_reset_j: dict[int, float] = {}
        self._xids_fired: set[int] = set()
        self.resets = [f for f in faults if f.kind == "energy_counter_reset"]

    def _leak_rate_bytes_per_s(self, fault: FaultSpec) -> float:
        if fault.kind != "memory_leak":
            return 0.0
        if fault.params["rate_gib_per_h"] > 0:
            return fault.params["rate_gib_per_h"] * GIB / 3600.0
        duration = (fault.end_s - fault.start_s) if fault.end_s is not None else 3600.0
        held = self._memory_held(fault.gpu, fault.start_s)
        headroom = fault.params["max_fraction"] * self._mem_total[self._pos[fault.gpu]] - held
        return max(headroom, 0.0) / duration

    def _memory_held(self, gpu: tuple[str, int], t_s: float) -> float:
        job = self._scenario.job_at(*gpu, t_s)
        base = int(self._mem_base[self._pos[gpu]])
        return base + (job.memory_gib * GIB if job is not None else 0.0)

    def _leaked_bytes(self, f: FaultSpec, t_s: float, procs: list[tuple[int, int]]) -> int:
        k = self._pos[f.gpu]
        held = int(self._mem_base[k]) + sum(b for _, b in procs)
        ceiling = f.params["max_fraction"] * self._mem_total[k] - held
        grown = self._leak_rates[id(f)] * (t_s - f.start_s)
        return int(max(0.0, min(grown, ceiling)))

    def record_energy_resets(
        self, t0: float, t1: float, step_s: float, energy_j: np.ndarray, power_w: np.ndarray
    ) -> None:
        """Remember the true energy at each reset instant inside (t0, t1] (the counter's new 0);
        ``energy_j`` is the energy at ``t1 - step_s`` and ``power_w`` the step's power."""
        for f in self.resets:
            if t0 < f.start_s <= t1:
                k = self._pos[f.gpu]
                into = f.start_s - (t1 - step_s) if t1 > 0 else 0.0
                self._energy_reset_j[id(f)] = float(energy_j[k] + power_w[k] * into)

    def publish_processes(
        self, gpus: Sequence[SimGpuState], jobs: Sequence[CompiledJob], t_s: float
    ) -> None:
        procs: dict[int, list[tuple[int, int]]] = {}
        for job in jobs:
            if job.spec.active_at(t_s):
                used = int(job.spec.memory_gib * GIB)
                for k, pid in zip(job.idx.tolist(), job.pids, strict=True):
                    procs.setdefault(k, []).append((pid, used))
        for f in self._scenario.faults:
            k = self._pos[f.gpu]
            if f.kind == "idle_allocated" and f.active_at(t_s) and k not in procs:
                procs[k] = [(self._orphan_pids[id(f)], int(f.params["memory_gib"] * GIB))]
            elif f.kind == "memory_leak" and f.active_at(t_s):
                leak = self._leaked_bytes(f, t_s, procs.get(k, []))
                first = procs.get(k) or [(self._orphan_pids[id(f)], 0)]
                procs[k] = [(first[0][0], first[0][1] + leak), *first[1:]]
        for k, g in enumerate(gpus):
            g.processes = procs.get(k, [])
            g.memory_used_bytes = sum(b for _, b in g.processes)

    def publish_faults(self, cluster: SimCluster, t_s: float, energy_j: list[float]) -> None:
        """Fault-driven fields; only GPUs with such a fault are touched (tests script others)."""
        gpus = cluster.gpus
        faults = self._scenario.faults
        for f in faults:
            g = gpus[self._pos[f.gpu]]
            if f.kind == "gpu_lost":
                g.lost = False
            elif f.kind == "ecc_errors":
                g.ecc_sbe_volatile = g.ecc_dbe_volatile = g.remapped_rows_uncorrectable = 0
                g.remapped_rows_pending = False
        for f in faults:
            g = gpus[self._pos[f.gpu]]
            if f.start_s > t_s:
                continue
            if f.kind == "gpu_lost" and f.active_at(t_s):
                g.lost = True
            elif f.kind == "xid" and id(f) not in self._xids_fired:
                self._xids_fired.add(id(f))
                cluster.raise_xid(g, int(f.params["code"]))
            elif f.kind == "ecc_errors":
                until = t_s if f.end_s is None else min(t_s, f.end_s)
                g.ecc_sbe_volatile += int(f.params["sbe_per_h"] * (until - f.start_s) / 3600.0)
                g.ecc_dbe_volatile += f.params["dbe_count"]
                g.remapped_rows_uncorrectable += f.params["dbe_count"]
                g.remapped_rows_pending = g.remapped_rows_pending or f.params["dbe_count"] > 0
        self._publish_energy_resets(gpus, t_s, energy_j)

    def energy_zero_j(self, t_s: float) -> dict[int, float]:
        """The true energy at which each GPU's counter last read 0 (its newest reset at or
        before ``t_s``), by position; GPUs never reset are absent."""
        latest: dict[int, tuple[float, float]] = {}
        for f in self.resets:
            if f.start_s <= t_s:
                k = self._pos[f.gpu]
                if k not in latest or f.start_s >= latest[k][0]:
                    latest[k] = (f.start_s, self._energy_reset_j[id(f)])
        return {k: zero_j for k, (_, zero_j) in latest.items()}

    def _publish_energy_resets(
        self, gpus: Sequence[SimGpuState], t_s: float, energy_j: list[float]
    ) -> None:
        for k, zero_j in self.energy_zero_j(t_s).items():
            gpus[k].energy_mj = round((energy_j[k] - zero_j) * 1000.0)
