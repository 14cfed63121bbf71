"""A simulated cluster as a sample source: the simulator behind one fake NVML per node.

Every simulated node is sampled by the very ``NvmlSampler`` that samples real GPUs, through
``FakeNvml``; only the module passed in differs. Simulated time is wall time since ``start_ns``
(plus the scenario time the cluster starts at), so a cluster can start in the past and
``backfill`` history faster than real time, then carry on live.
Each sample carries the job its GPU belongs to, as the simulator's own job resolver.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from gpuwatt.collector.nvml_source import NvmlSampler
from gpuwatt.collector.sim.fake_nvml import FakeNvml
from gpuwatt.collector.sim.scenario import Scenario
from gpuwatt.collector.sim.simulator import Simulator
from gpuwatt.model import GpuSample

NS_PER_S = 1_000_000_000
#: The most scenario time a source runs through before its first sample (about a second of
#: work for the demo's 32 GPUs); a scenario's events past it are not reached by carrying on.
MAX_FAST_FORWARD_S = 6 * 3600.0


class SimulatedClusterSource:
    def __init__(
        self,
        scenario: Scenario,
        *,
        start_ns: int | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        tensor_precision: str = "bf16",
        scenario_time_s: float = 0.0,
    ) -> None:
        """``scenario_time_s``: where in the scenario the cluster is at ``start_ns`` (a demo
        carrying on where it stopped); the simulation runs there first, at most
        ``MAX_FAST_FORWARD_S`` of it (nothing changes after a scenario's last event anyway)."""
        self.scenario = scenario
        self._clock_ns = clock_ns
        self.start_ns = clock_ns() if start_ns is None else start_ns
        self.simulator = Simulator(scenario)
        self.scenario_start_s = min(max(scenario_time_s, 0.0), MAX_FAST_FORWARD_S)
        if self.scenario_start_s:
            self.simulator.advance_to(self.scenario_start_s)
        self._now_ns = self.start_ns
        #: called after every snapshot, with the simulation at that instant (e.g. so that the
        #: simulated jobs report their steps); it must not raise
        self.after_sample: Callable[[], None] | None = None
        self.samplers = [
            NvmlSampler(
                FakeNvml(self.simulator.cluster, host),
                host,
                clock_ns=self._sample_time_ns,
                monotonic_s=self._sim_time_s,
                tensor_precision=tensor_precision,
            )
            for host in self.simulator.cluster.hosts()
        ]

    def carry_on_from(self, newest: Sequence[GpuSample]) -> None:
        """Carry every GPU's energy counter on from its newest stored sample (``newest``, the
        store's latest): its counter then, plus its power until ``start_ns``, as a real GPU's
        counter goes on while its collector is restarted (``Simulator.carry_energy_counters``)."""
        energy_j = {
            (s.host, s.gpu_index): s.energy_j
            + (s.power_w or 0.0) * max(0, self.start_ns - s.time_ns) / NS_PER_S
            for s in newest
            if s.energy_j is not None and s.parent_uuid is None and not s.lost
        }
        self.simulator.carry_energy_counters(energy_j)

    @property
    def gpu_count(self) -> int:
        return len(self.simulator.cluster.gpus)

    def _sample_time_ns(self) -> int:
        return self._now_ns

    @property
    def scenario_zero_ns(self) -> int:
        """The wall time at which the scenario's time is 0 (``start_ns`` when it starts there)."""
        return self.start_ns - round(self.scenario_start_s * NS_PER_S)

    def _sim_time_s(self) -> float:
        return self.scenario_start_s + (self._now_ns - self.start_ns) / NS_PER_S

    def open(self) -> None:
        for sampler in self.samplers:
            sampler.open()

    def close(self) -> None:
        for sampler in self.samplers:
            sampler.close()

    def sample_at(self, time_ns: int, *, include_slow: bool) -> list[GpuSample]:
        """Advance the simulation to ``time_ns`` and take one snapshot of every GPU."""
        self._now_ns = max(time_ns, self._now_ns)
        self.simulator.advance_to(self._sim_time_s())
        out: list[GpuSample] = []
        job_of, mig_job_of = self.simulator.job_of, self.simulator.mig_job_of
        for sampler in self.samplers:
            for s in sampler.sample(include_slow=include_slow):
                if s.lost:
                    job_id = None
                elif s.parent_uuid is not None:  # a MIG device
                    job_id = mig_job_of(s.uuid)
                else:
                    job_id = job_of(s.host, s.gpu_index)
                if job_id is None:
                    out.append(s)
                    continue
                user = simulated_user(job_id)
                procs = tuple(p if p.user else replace(p, user=user) for p in s.processes or ())
                out.append(replace(s, job_id=job_id, processes=procs or s.processes))
        if self.after_sample is not None:
            self.after_sample()
        return out

    def sample(self, *, include_slow: bool) -> list[GpuSample]:
        return self.sample_at(self._clock_ns(), include_slow=include_slow)

    def backfill(
        self, until_ns: int, *, interval_s: float, slow_interval_s: float
    ) -> Iterator[list[GpuSample]]:
        """Snapshots from ``start_ns`` up to ``until_ns`` at ``interval_s``, as fast as possible."""
        step_ns = round(interval_s * NS_PER_S)
        slow_every = max(1, round(slow_interval_s / interval_s))
        t, k = self.start_ns, 0
        while t < until_ns:
            yield self.sample_at(t, include_slow=k % slow_every == 0)
            t += step_ns
            k += 1


#: The simulated cluster's users: a job's processes run as one of them (a real collector reads
#: the user from the host's /proc: ``collector.jobs.attach_users``).
SIMULATED_USERS = ("alice", "bob", "chen", "dana", "emeka", "farah", "gita", "hugo")


def simulated_user(job_id: str) -> str:
    """The same user for a job on every GPU and run (not Python's salted ``hash``)."""
    return SIMULATED_USERS[zlib.crc32(job_id.encode()) % len(SIMULATED_USERS)]
