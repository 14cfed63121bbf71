"""The simulated cluster's training jobs reporting their work, as ``gpuwatt.work`` lets real ones.

``SimulatedWorkReporter(simulator, start_ns=...)`` follows the simulator: each ``poll()`` returns
the ``JobStep`` records of every training step that ended since the previous poll, one per job
(from rank 0) or one per rank (``all_ranks=True``), timed at the step's end on the caller's clock
(``start_ns`` + scenario time) with the simulator's current step time (``step_time_s(job_id)``).
Call it after each advance of the simulator (e.g. after every ``sample_at``); between polls the
step time is taken as constant, as the simulator's own rates are over a 1-s step.

FLOPs are consistent with the simulated tensor activity. While computing, a rank's HMMA pipe is
active ``intensity`` of the time and its clock runs at ``r`` of the maximum; it computes for
``step_time x (1 - comm_fraction) / r``. The FLOPs it does per step are therefore
``intensity x tensor peak x step_time x (1 - comm_fraction)``, whatever its clock (a throttled
rank takes longer, it does not do less). ``model_flops_per_step`` is that times the number of
ranks, times ``model_flops_fraction`` (the share of tensor work that counts as *model* FLOPs;
e.g. 0.75 mimics full activation recomputation), so a healthy job's counter estimate comes out at
about 1 / ``model_flops_fraction`` of its reported TFLOPS (plus the small FP32/FP16 pipe work).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuwatt.collector.sim.scenario import JobSpec
from gpuwatt.collector.sim.simulator import Simulator
from gpuwatt.job_step_format import JobStep

NS_PER_S = 1_000_000_000


@dataclass(slots=True)
class _Progress:
    step: int = 0
    last_end_s: float | None = None  # scenario time the last reported step ended


class SimulatedWorkReporter:
    def __init__(
        self,
        simulator: Simulator,
        *,
        start_ns: int,
        precision: str = "bf16",
        model_flops_fraction: float = 1.0,
        all_ranks: bool = False,
    ) -> None:
        self.simulator = simulator
        self.start_ns = int(start_ns)
        self.precision = precision
        self.model_flops_fraction = float(model_flops_fraction)
        self.all_ranks = all_ranks
        self._jobs = [j for j in simulator.scenario.jobs if j.kind == "training"]
        self._progress = {j.id: _Progress() for j in self._jobs}

    @property
    def job_ids(self) -> list[str]:
        """The training jobs this reporter reports."""
        return [j.id for j in self._jobs]

    def carry_on_after(self, newest_steps: Mapping[str, int]) -> None:
        """Number each job's next steps after its newest step already recorded (job id ->
        step): a restarted demo carries its scenario on, and its jobs go on counting as a real
        job resumed from its checkpoint does, instead of from 0 again."""
        for job_id, step in newest_steps.items():
            if job_id in self._progress:
                self._progress[job_id].step = max(self._progress[job_id].step, int(step) + 1)

    def model_flops_per_step(self, job: JobSpec) -> float:
        """The job's total model FLOPs per step (all ranks), from its simulated tensor work."""
        # each rank at its own GPU's peak: a cluster may mix models (``cluster.models``)
        peaks = sum(
            self.simulator.gpu(host, index).spec.tensor_peak_tflops(self.precision) or 0.0
            for host, index in job.gpus
        )
        per_peak = job.intensity * 1e12 * job.step_time_s * (1.0 - job.comm_fraction)
        return per_peak * peaks * self.model_flops_fraction

    def poll(self) -> list[JobStep]:
        """The steps that ended since the previous poll, oldest first."""
        now_s = self.simulator.scenario_time_s
        out: list[JobStep] = []
        for job in self._jobs:
            p = self._progress[job.id]
            step_s = self.simulator.step_time_s(job.id)
            if step_s is None or step_s <= 0 or not job.active_at(now_s):
                p.last_end_s = None  # not running: restart the step clock when it runs again
                continue
            if p.last_end_s is None:
                p.last_end_s = max(job.start_s, now_s - step_s)
            while p.last_end_s + step_s <= now_s:
                p.last_end_s += step_s
                out.extend(self._records(job, p.step, step_s, p.last_end_s))
                p.step += 1
        out.sort(key=lambda s: s.time_ns)
        return out

    def _records(self, job: JobSpec, step: int, step_s: float, end_s: float) -> list[JobStep]:
        time_ns = self.start_ns + round(end_s * NS_PER_S)
        flops = self.model_flops_per_step(job)
        ranks = enumerate(job.gpus) if self.all_ranks else [(0, job.gpus[0])]
        return [
            JobStep(
                time_ns=time_ns,
                job_id=job.id,
                rank=rank,
                step=step,
                step_time_s=step_s,
                model_flops_per_step=flops,
                gpu_uuids=(self.simulator.gpu(host, index).uuid,),
                precision=self.precision,
                host=host,
            )
            for rank, (host, index) in ranks
        ]
