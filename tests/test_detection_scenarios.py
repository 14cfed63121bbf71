"""The detector on simulated clusters it was not tuned on (``bench/scenarios``): each straggler
found on the right GPU with the right cause, healthy-but-tricky clusters left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatt.analytics import AnalysisSummary, analyze
from gpuwatt.collector.sim.frame import NS, attach_jobs, sample_frame
from gpuwatt.collector.sim.scenario import STRAGGLER_FAULTS, load_scenario, load_scenario_text

SCENARIOS = Path(__file__).resolve().parents[1] / "bench" / "scenarios"
START_NS = 1_700_000_040 * NS + 23 * NS  # off the minute


def run(name: str, minutes: float = 15) -> tuple[AnalysisSummary, list]:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    duration_s = min(scenario.duration_s or 900.0, minutes * 60)
    frame = attach_jobs(sample_frame(scenario, duration_s, START_NS), scenario, START_NS)
    summary = analyze(frame, now_ns=START_NS + int(duration_s * NS), window_s=60)
    truth = [g for g in scenario.ground_truth() if g.cause in STRAGGLER_FAULTS]
    return summary, truth


@pytest.mark.parametrize(
    "name",
    [
        "small_job_brake",
        "two_gpu_cluster",
        "single_gpu_jobs",
        "starved_replica",
        "intermittent_brake",
        "sw_thermal",
        "clock_lock",
        "slow_host",
        "slow_link",
        "round_robin_replica",
        "mixed_models_job",
    ],
)
def test_each_injected_straggler_is_found_with_its_cause(name: str) -> None:
    s, truth = run(name)
    got = sorted((x.host, x.gpu_index, x.cause) for x in s.stragglers)
    assert got == sorted((g.host, g.gpu_index, STRAGGLER_FAULTS[g.cause]) for g in truth)
    assert all(x.active for x in s.stragglers)


def test_explanations_name_the_peers_and_the_invisible_cause() -> None:
    (small,) = run("small_job_brake")[0].stragglers
    assert "across the cluster doing similar work" in small.explanation
    (link,) = run("slow_link")[0].stragglers
    assert "slow, cause not visible in GPU counters" in link.explanation
    assert "busiest of job train" in link.explanation  # the evidence: peers wait for it
    (host,) = run("slow_host")[0].stragglers
    assert "waits on its host" in host.explanation


def test_an_intermittent_brake_is_reported_with_its_duty_cycle() -> None:
    (st,) = run("intermittent_brake", minutes=20)[0].stragglers
    assert st.intermittent and 0.55 <= st.duty_cycle <= 0.75
    assert "duty cycle" in st.explanation


def test_a_fault_that_ended_is_reported_ended() -> None:
    (st,) = run("brake_that_ends", minutes=20)[0].stragglers
    assert (st.cause, st.active, st.intermittent) == ("power_brake", False, False)


@pytest.mark.parametrize(
    "name",
    [
        "healthy_pipeline",
        "healthy_bursty",
        "healthy_mixed_models",
        "healthy_nccl_spin",
        "healthy_limits_inlets",
        "healthy_small_jobs",
    ],
)
def test_healthy_but_tricky_clusters_raise_nothing(name: str) -> None:
    s, truth = run(name)
    assert truth == []
    assert s.stragglers == []
    assert [i for i in s.idle if i.idle_class != "free"] == []


def test_a_process_without_a_job_is_told_apart_from_a_free_gpu() -> None:
    s, _ = run("orphan_process")
    by = {i.gpu_index: i.idle_class for i in s.idle}
    assert by == {6: "free", 7: "held_no_job"}


@pytest.mark.parametrize("load", [0.45, 0.6])
def test_a_starved_replica_near_the_busy_cut_off_stays_active(load: float) -> None:
    # utilisation wobbles around 20 %: found, and never reported "ended" while braked
    text = (SCENARIOS / "starved_replica.yaml").read_text().replace("load: 0.3", f"load: {load}")
    scenario = load_scenario_text(text, "starved.yaml")
    frame = attach_jobs(sample_frame(scenario, 1200.0, START_NS), scenario, START_NS)
    s = analyze(frame, now_ns=START_NS + 1200 * NS, window_s=60)
    assert [(x.gpu_index, x.cause, x.active, x.intermittent) for x in s.stragglers] == [
        (3, "power_brake", True, False)
    ]
    assert 10 <= s.stragglers[0].evidence["utilization_gpu_pct"] <= 30
