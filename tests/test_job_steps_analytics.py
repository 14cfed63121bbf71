"""Application-reported work in the analytics: true MFU beside the counter estimate."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest
from test_analytics_support import NS, T0_NS, cluster_frame

from gpuwatt.analytics import analyze, render_text
from gpuwatt.collector.sim.scenario import load_scenario_text
from gpuwatt.collector.sim.simulator import Simulator
from gpuwatt.collector.sim.work import SimulatedWorkReporter
from gpuwatt.job_step_format import JobStep, job_steps_frame

FLOPS = 3.166e15  # per step, whole job: 3166 TFLOPS at 1 s per step = 40.0 % of 8 x 989.4


def _frame(jobs: list[str | None] | None = None, tensor_pct: float = 46.0) -> pd.DataFrame:
    """8 x H100 SXM on one node at the clock its tensor peak is quoted at (1830 MHz); hmma
    activity = tensor_pct x util (~95 %)."""
    jobs = ["train"] * 8 if jobs is None else jobs
    return cluster_frame(hosts=1, gpus=8, duration_s=600, jobs=jobs, tensor_pct=tensor_pct,
                         util_pct=100.0, clock_mhz=1830.0)  # fmt: skip


def _steps(
    *, ranks: int = 1, step_time_s: float = 1.0, flops: float | None = FLOPS, uuids: bool = False,
    precision: str | None = "bf16", duration_s: int = 600, job: str = "train",
) -> pd.DataFrame:  # fmt: skip
    rows = []
    n = int(duration_s / step_time_s)
    for k in range(n):
        for r in range(ranks):
            rows.append(
                JobStep(
                    time_ns=T0_NS + round((k + 0.5) * step_time_s * NS),
                    job_id=job,
                    rank=r,
                    step=k,
                    step_time_s=step_time_s,
                    model_flops_per_step=flops,
                    gpu_uuids=(f"GPU-00-{r:02d}",) if uuids else (),
                    precision=precision,
                    host="node-0",
                )
            )
    return job_steps_frame(rows)


def _expected_counter_tflops(frame: pd.DataFrame) -> float:
    return float(frame["tensor_hmma_active_pct"].mean() / 100 * 989.4 * 8)


NOW = T0_NS + 600 * NS


def test_mfu_on_a_known_case() -> None:
    frame = _frame()
    s = analyze(frame, now_ns=NOW, start_ns=T0_NS, job_steps=_steps())
    (w,) = s.job_work
    assert w.job_id == "train" and w.gpus == 8 and w.precision == "bf16"
    assert w.steps == 600 and w.step_time_mean_s == pytest.approx(1.0)
    assert w.reported_tflops.value == pytest.approx(3166.0)
    assert w.mfu_pct.value == pytest.approx(100 * 3166 / (8 * 989.4))
    assert round(w.mfu_pct.value, 1) == 40.0
    # counters: hmma 46 % x 989.4 x 8 ~ 3641 TFLOPS (clock at the quoted peak clock)
    counter = _expected_counter_tflops(frame)
    assert w.counter_tflops.value == pytest.approx(counter, rel=0.01)
    assert w.counter_ratio == pytest.approx(counter / 3166.0, rel=0.01)
    win = s.job_work_windows
    assert len(win) == 10 and np.allclose(win["mfu_pct"], 40.0, atol=0.005)
    assert np.allclose(win["peak_tflops"], 8 * 989.4)
    assert (win["gpus_source"] == "collector job attribution").all()


def test_render_line() -> None:
    frame = _frame()
    frame["tensor_hmma_active_pct"] = 44.0  # 8 x 989.4 x 0.44 = 3483 TFLOPS = 1.10 x 3166
    text = render_text(analyze(frame, now_ns=NOW, start_ns=T0_NS, job_steps=_steps()))
    assert "APPLICATION-REPORTED WORK" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("job train:"))
    assert line.strip() == (
        "job train: 3166 TFLOPS reported (MFU 40.0 %), counters estimate 3483 TFLOPS (x1.10)"
    )


def test_no_job_steps_no_change() -> None:
    frame = _frame()
    a = analyze(frame, now_ns=NOW, start_ns=T0_NS)
    b = analyze(frame, now_ns=NOW, start_ns=T0_NS, job_steps=_steps().iloc[0:0])
    assert a.job_work == [] and b.job_work == []
    assert render_text(a) == render_text(b)
    assert "APPLICATION-REPORTED" not in render_text(a)


def test_every_rank_reporting_counts_each_step_once() -> None:
    s = analyze(_frame(), now_ns=NOW, start_ns=T0_NS, job_steps=_steps(ranks=8))
    (w,) = s.job_work
    assert w.steps == 600
    assert w.mfu_pct.value == pytest.approx(40.0, abs=0.005)


def test_precision_picks_the_peak() -> None:
    s = analyze(_frame(), now_ns=NOW, start_ns=T0_NS, job_steps=_steps(precision="fp8"))
    assert s.job_work[0].mfu_pct.value == pytest.approx(3166.0 / (8 * 1978.9) * 100)
    s = analyze(_frame(), now_ns=NOW, start_ns=T0_NS, job_steps=_steps(precision=None),
                tensor_precision="fp16")  # fmt: skip
    assert s.job_work[0].precision == "fp16"


def test_reported_gpus_when_the_collector_knows_no_jobs() -> None:
    frame = _frame(jobs=[None] * 8)
    s = analyze(frame, now_ns=NOW, start_ns=T0_NS, job_steps=_steps(ranks=8, uuids=True))
    (w,) = s.job_work
    assert w.gpus_source == "GPUs reported by the job" and w.gpus == 8
    assert w.mfu_pct.value == pytest.approx(40.0, abs=0.005)
    # only rank 0 reports: one GPU known, an impossible MFU is refused, not shown
    s = analyze(frame, now_ns=NOW, start_ns=T0_NS, job_steps=_steps(ranks=1, uuids=True))
    (w,) = s.job_work
    assert w.mfu_pct.value is None and "impossible" in w.mfu_pct.reason
    assert "MFU n/a" in w.line()


def test_unknown_gpus_and_missing_flops_say_why() -> None:
    frame = _frame(jobs=[None] * 8)
    (w,) = analyze(frame, now_ns=NOW, start_ns=T0_NS, job_steps=_steps()).job_work
    assert w.reported_tflops.value == pytest.approx(3166.0)
    assert w.mfu_pct.value is None and "GPUs are unknown" in w.mfu_pct.reason
    assert w.counter_tflops.value is None
    (w,) = analyze(_frame(), now_ns=NOW, start_ns=T0_NS, job_steps=_steps(flops=None)).job_work
    assert w.reported_tflops.value is None and w.mfu_pct.value is None
    assert "no FLOPs" in w.line()


def test_job_filter_and_range() -> None:
    steps = pd.concat([_steps(), _steps(job="other")], ignore_index=True)
    s = analyze(_frame(), now_ns=NOW, start_ns=T0_NS, job="train", job_steps=steps)
    assert [w.job_id for w in s.job_work] == ["train"]
    s = analyze(_frame(), now_ns=T0_NS + 120 * NS, start_ns=T0_NS, job_steps=steps)
    assert {w.job_id: w.steps for w in s.job_work} == {"other": 120, "train": 120}


# --- the simulator's jobs report through the same path ---------------------------------------

_SCENARIO = textwrap.dedent(
    """\
    name: t
    seed: 3
    cluster: {nodes: 1, gpus_per_node: 4, model: H100 SXM}
    jobs:
      - {id: pre, kind: training, gpus: ["node-0:*"], start: 10s, intensity: 0.8,
         step_time: 1.5s, comm_fraction: 0.2}
    """
)


def test_simulated_reporter_steps_and_flops() -> None:
    sim = Simulator(load_scenario_text(_SCENARIO, "t.yaml"))
    rep = SimulatedWorkReporter(sim, start_ns=T0_NS, all_ranks=True)
    out: list[JobStep] = []
    for t in range(1, 61):
        sim.advance_to(float(t))
        out.extend(rep.poll())
    rank0 = [s for s in out if s.rank == 0]
    assert len({s.rank for s in out}) == 4 and len(out) == 4 * len(rank0)
    assert [s.step for s in rank0] == list(range(len(rank0)))
    assert 30 <= len(rank0) <= 34  # 50 s of a ~1.5 s step
    assert all(s.step_time_s == pytest.approx(1.5, rel=0.05) for s in rank0)
    assert rank0[0].time_ns >= T0_NS + 10 * NS
    expected = 0.8 * 989.4e12 * 1.5 * 0.8 * 4  # intensity x peak x compute time x ranks
    assert rank0[0].model_flops_per_step == pytest.approx(expected)
    assert rank0[0].gpu_uuids == (sim.gpu("node-0", 0).uuid,)
    assert [s.time_ns for s in out] == sorted(s.time_ns for s in out)
