"""The simulated cluster's inference jobs reporting the requests they serve, as a real server
does with ``gpuwatt.work.WorkReporter.request``.

``SimulatedServingReporter(simulator, start_ns=...)`` follows the simulator like
``SimulatedWorkReporter``: each ``poll()`` returns one ``JobStep`` per request that ended since
the previous poll, one rank per replica (GPU) of every inference job. A replica serves
``requests_per_s`` x the job's ``load`` requests a second; a request's tokens are drawn around
``tokens_per_request`` and its latency is tokens / the replica's decode rate, slowed in
proportion when the GPU's SM clock is below its maximum (a throttled replica answers slower).
Seeded from the scenario: the same scenario gives the same requests.
"""

from __future__ import annotations

import numpy as np

from gpuwatt.collector.sim.simulator import Simulator
from gpuwatt.job_step_format import JobStep

NS_PER_S = 1_000_000_000


class SimulatedServingReporter:
    def __init__(
        self,
        simulator: Simulator,
        *,
        start_ns: int,
        requests_per_s: float = 1.0,
        tokens_per_request: float = 300.0,
        tokens_per_s: float = 400.0,
    ) -> None:
        self.simulator = simulator
        self.start_ns = int(start_ns)
        self.requests_per_s = float(requests_per_s)
        self.tokens_per_request = float(tokens_per_request)
        self.tokens_per_s = float(tokens_per_s)
        self._jobs = [j for j in simulator.scenario.jobs if j.kind == "inference"]
        self._rng = np.random.default_rng(simulator.scenario.seed + 1)
        self._last_s: float | None = None
        self._served: dict[tuple[str, int], int] = {}

    def poll(self) -> list[JobStep]:
        """The requests that ended since the previous poll, oldest first."""
        now_s = self.simulator.scenario_time_s
        since_s, self._last_s = self._last_s, now_s
        if since_s is None or now_s <= since_s:
            return []
        out: list[JobStep] = []
        for job in self._jobs:
            if not job.active_at(now_s):
                continue
            rate = self.requests_per_s * job.load
            for rank, (host, index) in enumerate(job.gpus):
                gpu = self.simulator.gpu(host, index)
                if gpu.sm_clock_mhz <= 0:
                    continue  # lost or off: serves nothing
                n = int(self._rng.poisson(rate * (now_s - since_s)))
                if not n:
                    continue
                slow = gpu.sm_clock_max_mhz / gpu.sm_clock_mhz
                ends = np.sort(self._rng.uniform(since_s, now_s, n))
                tokens = np.maximum(
                    1.0, self._rng.gamma(4.0, self.tokens_per_request / 4.0, n).round()
                )
                latency = tokens / self.tokens_per_s * slow + self._rng.exponential(0.05, n)
                first = self._served.get((host, index), 0)
                self._served[(host, index)] = first + n
                out.extend(
                    JobStep(
                        time_ns=self.start_ns + round(float(t) * NS_PER_S),
                        job_id=job.id,
                        rank=rank,
                        step=first + k,
                        step_time_s=float(lat),
                        tokens_per_step=float(tok),
                        gpu_uuids=(gpu.uuid,),
                        host=host,
                    )
                    for k, (t, tok, lat) in enumerate(zip(ends, tokens, latency, strict=True))
                )
        out.sort(key=lambda s: s.time_ns)
        return out
