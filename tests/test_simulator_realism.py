"""Issue 15's simulator additions, each with its ground truth: per-GPU limits and inlets, mixed
models, faults that end, cycle and ramp, clock-only faults, NCCL spin, pipeline stages,
round-robin balancing and slowdowns that clocks do not show."""

from __future__ import annotations

import statistics

import pytest

from gpuwatt.collector.sim.scenario import STRAGGLER_FAULTS, load_scenario_text
from gpuwatt.collector.sim.simulator import Simulator
from gpuwatt.errors import ConfigError
from gpuwatt.schema import (
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_THERMAL,
)

CLUSTER = "cluster: {nodes: 2, gpus_per_node: 4, model: H100 SXM}\n"


def sim(body: str, cluster: str = CLUSTER, seed: int = 3) -> Simulator:
    return Simulator(load_scenario_text(f"name: t\nseed: {seed}\n{cluster}{body}", "t.yaml"))


def mean_over(s: Simulator, host: str, idx: int, attr: str, t0: float, t1: float) -> float:
    vals = []
    t = t0
    while t < t1:
        s.advance_to(t)
        vals.append(getattr(s.gpu(host, idx), attr))
        t += 1.0
    return statistics.fmean(vals)


TRAIN8 = "jobs:\n  - {id: j, kind: training, gpus: '*:*', intensity: 0.8}\n"


def test_per_gpu_power_limits_node_inlets_and_mixed_models() -> None:
    cluster = (
        "cluster:\n  nodes: 2\n  gpus_per_node: 4\n  model: H100 SXM\n"
        "  models: {node-1: A100 SXM}\n  node_inlet_temp_c: {node-0: 40}\n"
        "  gpu_power_limit_w: {'node-0:2': 450}\n"
    )
    s = sim(TRAIN8, cluster)
    assert s.gpu("node-0", 2).power_limit_w == 450.0
    assert s.gpu("node-0", 1).power_limit_w == 700.0
    assert s.gpu("node-1", 0).power_limit_w == 400.0  # the A100's TDP
    assert s.gpu("node-1", 0).name == "NVIDIA A100-SXM4-80GB"
    assert s.gpu("node-1", 0).sm_clock_max_mhz == 1410.0
    s.advance_to(600)
    assert s.gpu("node-0", 2).power_w <= 450.0 + 1e-6
    assert s.gpu("node-1", 1).sm_clock_mhz <= 1410.0
    # an idle cluster: the 40 C node is about 10 K warmer than the 30 C one
    idle = sim("", cluster)
    idle.advance_to(300)
    assert idle.gpu("node-0", 1).temperature_c - idle.gpu("node-1", 1).temperature_c > 7.0


def test_a_fault_with_an_end_stops() -> None:
    s = sim(TRAIN8 + "faults:\n  - {kind: power_brake, gpu: 'node-0:1', start: 60, end: 180}\n")
    s.advance_to(120)
    assert s.gpu("node-0", 1).clock_event_reasons & REASON_HW_POWER_BRAKE
    s.advance_to(240)
    assert not s.gpu("node-0", 1).clock_event_reasons & REASON_HW_POWER_BRAKE
    (truth,) = s.scenario.ground_truth()
    assert (truth.start_s, truth.end_s) == (60.0, 180.0)


def test_a_duty_cycle_turns_the_fault_on_and_off() -> None:
    s = sim(
        TRAIN8 + "faults:\n  - {kind: power_brake, gpu: 'node-0:1', start: 60, "
        "period: 90s, duty: 0.67}\n"
    )
    on = []
    for t in range(61, 60 + 3 * 90, 1):
        s.advance_to(t + 0.5)
        on.append(bool(s.gpu("node-0", 1).clock_event_reasons & REASON_HW_POWER_BRAKE))
    assert 0.6 <= sum(on) / len(on) <= 0.72
    assert on[:55] == [True] * 55 and not any(on[62:88])
    (truth,) = s.scenario.ground_truth()
    assert truth.params["period"] == 90.0 and truth.params["duty"] == 0.67


def test_a_gradual_onset_lowers_the_clock_step_by_step() -> None:
    s = sim(TRAIN8 + "faults:\n  - {kind: hw_slowdown, gpu: 'node-0:0', start: 60, ramp: 100s}\n")
    clocks = []
    for t in (70, 110, 150, 200):
        s.advance_to(t)
        clocks.append(s.gpu("node-0", 0).sm_clock_mhz)
    assert clocks[0] > clocks[1] > clocks[2] > clocks[3]
    assert clocks[3] <= 0.5 * 1980 + 15
    assert s.scenario.ground_truth()[0].params["ramp"] == 100.0


@pytest.mark.parametrize(
    ("fault", "bits", "absent", "clock_max"),
    [
        ("{kind: hw_slowdown, clock_ratio: 0.5", REASON_HW_SLOWDOWN, REASON_HW_THERMAL, 990),
        ("{kind: sw_thermal, clock_ratio: 0.7", REASON_SW_THERMAL, REASON_HW_SLOWDOWN, 1386),
        ("{kind: clock_lock, clock_mhz: 1050", 0x2, REASON_HW_SLOWDOWN, 1050),
    ],
)
def test_clock_only_faults_show_their_own_reason(
    fault: str, bits: int, absent: int, clock_max: float
) -> None:
    s = sim(TRAIN8 + f"faults:\n  - {fault}, gpu: 'node-1:2', start: 30}}\n")
    s.advance_to(120)
    g = s.gpu("node-1", 2)
    assert g.clock_event_reasons & bits == bits
    assert not g.clock_event_reasons & absent
    assert g.sm_clock_mhz <= clock_max
    assert s.gpu("node-1", 1).sm_clock_mhz > 1500


def test_nccl_spin_keeps_waiting_ranks_busy_with_low_tensor_activity() -> None:
    fault = "faults:\n  - {kind: power_brake, gpu: 'node-0:0', start: 0}\n"
    job = "jobs:\n  - {id: j, kind: training, gpus: '*:*', intensity: 0.8%s}\n"
    spin, block = sim(job % ", nccl_spin: true" + fault), sim(job % "" + fault)
    u_spin = mean_over(spin, "node-1", 1, "utilization_gpu_pct", 60, 120)
    u_block = mean_over(block, "node-1", 1, "utilization_gpu_pct", 60, 120)
    assert u_spin > 95 and u_block < 60
    # tensor work per second is the same either way: the spin kernels do none
    t_spin = spin.gpu("node-1", 1).tensor_hmma_active_s
    t_block = block.gpu("node-1", 1).tensor_hmma_active_s
    assert t_spin == pytest.approx(t_block, rel=0.05)


def test_pipeline_stages_differ_in_load_by_design() -> None:
    s = sim("jobs:\n  - {id: p, kind: training, gpus: '*:*', stages: [1.0, 0.5]}\n")
    first = mean_over(s, "node-0", 1, "utilization_gpu_pct", 60, 90)
    second = mean_over(s, "node-1", 1, "utilization_gpu_pct", 90, 120)
    assert first > 90 and 40 < second < 75


def test_round_robin_keeps_the_slow_replicas_share_and_it_queues() -> None:
    job = "jobs:\n  - {id: s, kind: inference, gpus: '*:*', load: 0.5%s}\n"
    fault = "faults:\n  - {kind: power_brake, gpu: 'node-0:0', start: 0}\n"
    rr, la = sim(job % ", balancer: round_robin" + fault), sim(job % "" + fault)
    assert mean_over(rr, "node-0", 0, "utilization_gpu_pct", 60, 90) > 95  # saturated
    assert mean_over(la, "node-0", 0, "utilization_gpu_pct", 60, 90) < 30  # starved


def test_slow_host_idles_the_gpu_at_normal_clocks() -> None:
    s = sim(
        "jobs:\n  - {id: j, kind: training, gpus: '*:*', nccl_spin: true}\n"
        "faults:\n  - {kind: slow_host, gpu: 'node-0:3', start: 0, wait_fraction: 0.5}\n"
    )
    assert mean_over(s, "node-0", 3, "utilization_gpu_pct", 60, 90) < 75
    assert mean_over(s, "node-0", 2, "utilization_gpu_pct", 90, 120) > 95
    assert s.gpu("node-0", 3).sm_clock_mhz == s.gpu("node-0", 2).sm_clock_mhz
    assert s.gpu("node-0", 3).clock_event_reasons & 0xE8 == 0
    assert s.step_time_s("j") == pytest.approx(1.0 + 0.85 * 0.5, rel=0.05)


def test_slow_link_lengthens_one_ranks_all_reduce() -> None:
    s = sim(
        "jobs:\n  - {id: j, kind: training, gpus: '*:*', comm_fraction: 0.2}\n"
        "faults:\n  - {kind: slow_link, gpu: 'node-1:0', start: 0, factor: 4}\n"
    )
    assert mean_over(s, "node-1", 0, "utilization_gpu_pct", 60, 90) > 95
    assert mean_over(s, "node-1", 1, "utilization_gpu_pct", 90, 120) < 75
    assert s.gpu("node-1", 0).sm_clock_mhz == s.gpu("node-1", 1).sm_clock_mhz
    assert s.step_time_s("j") == pytest.approx(0.8 + 0.8, rel=0.05)


def test_every_straggler_fault_has_a_detector_cause() -> None:
    assert STRAGGLER_FAULTS["slow_link"] == "slow_unknown"
    assert STRAGGLER_FAULTS["slow_host"] == "host_wait"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("faults:\n  - {kind: power_brake, gpu: 'node-0:0', duty: 0.5}\n", "duty needs a period"),
        (
            "jobs:\n  - {id: s, kind: inference, gpus: '*:*', stages: [1.0]}\n",
            "applies only to training",
        ),
        (
            "jobs:\n  - {id: s, kind: inference, gpus: '*:*', balancer: random}\n",
            "'random' is not one of: latency_aware, round_robin",
        ),
        ("faults:\n  - {kind: xid, gpu: 'node-0:0', code: 79, period: 60}\n", "unknown field"),
    ],
)
def test_new_keys_are_validated(body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sim(body)


def test_an_unknown_model_for_a_node_is_refused_with_its_line() -> None:
    cluster = (
        "cluster:\n  nodes: 2\n  gpus_per_node: 4\n  model: H100 SXM\n  models: {node-1: X9}\n"
    )
    with pytest.raises(ConfigError, match="unknown GPU model 'X9'") as info:
        sim("", cluster)
    assert info.value.line == 7  # the models line


def test_a_degraded_link_moves_the_same_bytes_per_step_more_slowly() -> None:
    s = sim(
        "jobs:\n  - {id: j, kind: training, gpus: '*:*', comm_fraction: 0.2}\n"
        "faults:\n  - {kind: slow_link, gpu: 'node-1:0', start: 0, factor: 4}\n"
    )
    s.advance_to(300)
    slow, peer = s.gpu("node-1", 0).nvlink_tx_bytes, s.gpu("node-1", 1).nvlink_tx_bytes
    assert slow == pytest.approx(peer, rel=0.02)  # window averages cannot tell them apart
