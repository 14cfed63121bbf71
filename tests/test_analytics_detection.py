"""Issue 15's detector: peers that always exist, HW evidence whatever the load, k-of-n
persistence with intermittent faults, and idle classes worded for action."""

from __future__ import annotations

import numpy as np
import pandas as pd
from test_analytics_support import NS, T0_NS, cluster_frame, straggle, with_energy_counter

from gpuwatt.analytics import analyze
from gpuwatt.analytics.idle import IDLE_CLASSES, idle_class

NOW = T0_NS + 900 * NS
BRAKE = 0x80 | 0x8


def test_a_two_gpu_job_is_compared_with_same_model_gpus_of_the_cluster() -> None:
    # job "pair" on node-0 GPUs 0-1; the other six GPUs run other work at full load
    jobs = ["pair", "pair", "a", "a", "b", "b", "b", "b"]
    f = cluster_frame(jobs=jobs, duration_s=900)
    f = straggle(f, "GPU-00-01", onset_s=300, clock_mhz=690.0, reasons=BRAKE, util_pct=99.0)
    s = analyze(f, now_ns=NOW)
    assert [(x.host, x.gpu_index, x.cause) for x in s.stragglers] == [("node-0", 1, "power_brake")]
    st = s.stragglers[0]
    assert st.peer_group.startswith("model:")
    assert "across the cluster doing similar work" in st.explanation
    assert "across the cluster" in st.peers_used


def test_job_peers_are_named_when_the_job_is_big_enough() -> None:
    f = cluster_frame(jobs=["train"] * 8, duration_s=900)
    f = straggle(f, "GPU-01-01", onset_s=300, clock_mhz=690.0, reasons=BRAKE)
    (st,) = analyze(f, now_ns=NOW).stragglers
    assert st.peer_group == "job:train"
    assert "the 8 busy GPUs of its job train" in st.explanation


def test_a_power_capped_single_gpu_job_is_not_a_straggler_against_lighter_jobs() -> None:
    jobs = ["solo", "a", "a", "a", "b", "b", "b", "b"]
    f = cluster_frame(jobs=jobs, duration_s=900)
    solo = f["uuid"] == "GPU-00-00"
    f.loc[solo, "sm_clock_mhz"] = 1300.0  # heavy load under its power cap: reason 0x4 only
    assert analyze(f, now_ns=NOW).stragglers == []


def test_a_starved_replica_with_its_brake_on_is_found_whatever_its_utilisation() -> None:
    f = cluster_frame(jobs=["serve"] * 8, duration_s=900, util_pct=60.0)
    # the balancer sends it little traffic: utilisation wobbles around 15 %, under the busy cut
    rng = np.random.default_rng(3)
    f = straggle(f, "GPU-01-02", onset_s=120, clock_mhz=690.0, reasons=BRAKE)
    me = (f["uuid"] == "GPU-01-02") & (f["time_ns"] >= T0_NS + 120 * NS)
    f.loc[me, "utilization_gpu_pct"] = np.clip(15 + rng.normal(0, 6, int(me.sum())), 0, 100)
    s = analyze(with_energy_counter(f), now_ns=NOW)
    assert [(x.gpu_index, x.cause, x.active) for x in s.stragglers] == [(2, "power_brake", True)]
    assert not s.stragglers[0].intermittent


def test_an_idle_gpu_with_a_brake_but_no_work_is_not_a_straggler() -> None:
    f = cluster_frame(jobs=[None] * 8, duration_s=900, util_pct=[0] + [95] * 7, memory_bytes=0.0)
    f.loc[f["uuid"] == "GPU-00-00", "sm_clock_mhz"] = 345.0
    f.loc[f["uuid"] == "GPU-00-00", "clock_event_reasons"] = float(BRAKE)
    assert analyze(f, now_ns=NOW).stragglers == []


def _duty(pattern: list[bool], onset_s: int = 120) -> pd.DataFrame:
    """A brake that is on in the windows of ``pattern`` (repeated) from ``onset_s``."""
    f = cluster_frame(jobs=["train"] * 8, duration_s=900)
    faulted = straggle(f, "GPU-00-03", onset_s=onset_s, clock_mhz=690.0, reasons=BRAKE)
    base = f.sort_values(["uuid", "time_ns"]).reset_index(drop=True)
    bad = faulted.sort_values(["uuid", "time_ns"]).reset_index(drop=True)
    w = (base["time_ns"].to_numpy() - T0_NS) // (60 * NS)
    on = np.array([pattern[int(k) % len(pattern)] for k in w]) & (w >= onset_s // 60)
    out = base.copy()
    out.loc[on] = bad.loc[on]
    return with_energy_counter(out)


def test_a_fault_two_windows_in_three_is_found_and_reported_intermittent() -> None:
    s = analyze(_duty([True, True, False]), now_ns=NOW)
    (st,) = s.stragglers
    assert (st.gpu_index, st.cause, st.intermittent, st.active) == (3, "power_brake", True, True)
    assert 0.55 <= st.duty_cycle <= 0.75
    assert "intermittent: anomalous in" in st.explanation
    assert "duty cycle" in st.explanation


def test_a_fault_one_window_in_three_is_not_persistent() -> None:
    assert analyze(_duty([True, False, False]), now_ns=NOW).stragglers == []


def test_a_steady_fault_is_not_intermittent() -> None:
    (st,) = analyze(_duty([True]), now_ns=NOW).stragglers
    assert not st.intermittent and st.duty_cycle == 1.0


def test_idle_classes_are_worded_for_action() -> None:
    # node-0 GPU 0: free; GPU 1: allocated to a job, idle; GPU 2: holds 30 GiB with no job
    jobs = [None, "lazy", None, "x", "x", "x", "x", "x"]
    f = cluster_frame(jobs=jobs, duration_s=900, util_pct=[0, 0, 0, 95, 95, 95, 95, 95])
    f.loc[f["uuid"] == "GPU-00-00", "memory_used_bytes"] = 0.0
    f.loc[f["uuid"] == "GPU-00-02", "memory_used_bytes"] = 30 * 2**30
    f["process_count"] = np.where(f["uuid"] == "GPU-00-00", 0.0, 1.0)
    s = analyze(f, now_ns=NOW)
    by = {i.gpu_index: i for i in s.idle if i.host == "node-0"}
    assert [by[k].idle_class for k in (0, 1, 2)] == ["free", "allocated_idle", "held_no_job"]
    assert "is free: no job, nothing held" in by[0].explanation
    assert "it can take work" in by[0].explanation
    assert "allocated to job lazy" in by[1].explanation
    assert "release the GPU" in by[1].explanation
    assert "has no job but holds 30.0 GiB, 1 process(es)" in by[2].explanation
    assert "a process no job accounts for" in by[2].explanation
    assert [i.gpu_index for i in s.idle_allocated] == [1]


def test_idle_class_from_job_memory_and_processes() -> None:
    assert idle_class("j", 0.0, 0.0) == "allocated_idle"
    assert idle_class(None, 0.0, 0.0) == "free"
    assert idle_class(None, 100 * 2**20, None) == "free"  # driver context only
    assert idle_class(None, 2 * 2**30, None) == "held_no_job"
    assert idle_class(None, None, 2.0) == "held_no_job"
    assert set(IDLE_CLASSES) == {"free", "allocated_idle", "held_no_job"}
