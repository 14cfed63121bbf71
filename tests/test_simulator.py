"""The simulator's physics and faults, checked against what real GPUs do."""

from __future__ import annotations

import itertools
import re
import statistics

import pytest

from gpuwatt.collector.nvml_source import NvmlSampler
from gpuwatt.collector.sim.fake_nvml import FakeNvml
from gpuwatt.collector.sim.scenario import load_scenario, load_scenario_text
from gpuwatt.collector.sim.simulator import Simulator
from gpuwatt.collector.sim.state import SimGpuState
from gpuwatt.gpu_specs import by_pci_device_id, lookup
from gpuwatt.schema import (
    REASON_GPU_IDLE,
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
)

GIB = 1024**3
FAULT_BITS = REASON_HW_SLOWDOWN | REASON_HW_THERMAL | REASON_HW_POWER_BRAKE


def small(jobs: str = "", faults: str = "", seed: int = 1) -> Simulator:
    """A 2 x 4 H100 cluster with the given jobs and faults (YAML list bodies)."""
    text = f"name: small\nseed: {seed}\ncluster: {{nodes: 2, gpus_per_node: 4, model: H100 SXM}}\n"
    if jobs:
        text += "jobs:\n" + jobs
    if faults:
        text += "faults:\n" + faults
    return Simulator(load_scenario_text(text, "small.yaml"))


def snapshot(sim: Simulator) -> list[tuple]:
    return [
        (
            g.power_w,
            g.temperature_c,
            g.energy_mj,
            g.sm_clock_mhz,
            g.utilization_gpu_pct,
            g.tensor_hmma_active_s,
            g.clock_event_reasons,
            g.memory_used_bytes,
            g.nvlink_tx_bytes,
        )
        for g in sim.gpus
    ]


def activity(sim: Simulator, t0_s: float, t1_s: float) -> dict[tuple[str, int], dict[str, float]]:
    """Interval averages from the cumulative counters, as the fake NVML computes GPM metrics."""
    sim.advance_to(t0_s)
    before = {(g.host, g.index): (g.tensor_hmma_active_s, g.energy_mj) for g in sim.gpus}
    util: dict[tuple[str, int], list[float]] = {k: [] for k in before}
    t = t0_s
    while t < t1_s:
        t += 1.0
        sim.advance_to(t)
        for g in sim.gpus:
            util[(g.host, g.index)].append(g.utilization_gpu_pct)
    dt = t1_s - t0_s
    return {
        (g.host, g.index): {
            "tensor": (g.tensor_hmma_active_s - before[(g.host, g.index)][0]) / dt,
            "power_w": (g.energy_mj - before[(g.host, g.index)][1]) / 1000.0 / dt,
            "util": statistics.fmean(util[(g.host, g.index)]),
        }
        for g in sim.gpus
    }


# --- static facts -------------------------------------------------------------------------------


def test_static_facts_look_like_nvml() -> None:
    sim = Simulator(load_scenario("demo"))
    gpus = sim.gpus
    assert len(gpus) == 32
    assert sim.cluster.hosts() == ["node-0", "node-1", "node-2", "node-3"]
    g = sim.gpu("node-2", 5)
    assert (g.host, g.index) == ("node-2", 5)
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert lookup(g.name).model == "H100 SXM"
    assert g.power_limit_w == 700.0
    assert (g.slowdown_temp_c, g.shutdown_temp_c) == (87.0, 92.0)
    assert g.sm_clock_max_mhz == 1980.0
    assert g.memory_total_bytes == 81559 * 1024**2
    uuid = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    assert all(uuid.match(x.uuid) for x in gpus)
    assert len({x.uuid for x in gpus}) == 32
    assert [x.pci_bus_id for x in sim.cluster.on_host("node-0")][:2] == [
        "00000000:18:00.0",
        "00000000:2A:00.0",
    ]
    # idle at the start: idle power, cool, idle clock, reason "GPU idle"
    idle = sim.gpu("node-0", 0)
    assert 60 <= idle.power_w <= 90
    assert idle.temperature_c < 45
    assert idle.clock_event_reasons == REASON_GPU_IDLE


def test_uuids_are_stable_for_a_seed() -> None:
    a = Simulator(load_scenario("demo"))
    b = Simulator(load_scenario("demo"))
    c = Simulator(load_scenario("healthy"))
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    assert [g.uuid for g in a.gpus] != [g.uuid for g in c.gpus]


# --- determinism and time -----------------------------------------------------------------------


def test_same_seed_same_numbers_however_time_is_chunked() -> None:
    demo = load_scenario("demo")
    one = Simulator(demo)
    one.advance_to(600.0)
    steps = Simulator(demo)
    for t in range(1, 601):
        steps.advance_to(float(t))
    odd = Simulator(demo)
    t = 0.0
    while t < 600.0:
        t = min(t + 7.3, 600.0)
        odd.advance_to(t)
    assert snapshot(one) == snapshot(steps) == snapshot(odd)


def test_another_seed_gives_other_numbers() -> None:
    a = small(jobs="  - {id: t, kind: training, gpus: ['*:*']}\n", seed=1)
    b = small(jobs="  - {id: t, kind: training, gpus: ['*:*']}\n", seed=2)
    a.advance_to(120)
    b.advance_to(120)
    assert snapshot(a) != snapshot(b)


def test_start_time_offsets_the_callers_clock() -> None:
    sim = Simulator(load_scenario("demo"), start_time_s=1_700_000_000.0)
    sim.advance_to(1_700_000_060.0)
    assert sim.scenario_time_s == 60.0
    assert sim.time_s == 1_700_000_060.0
    assert all(g.time_s == 60.0 for g in sim.gpus)
    with pytest.raises(ValueError, match="back in time"):
        sim.advance_to(1_700_000_059.0)


# --- energy, power, temperature -----------------------------------------------------------------


def test_energy_counter_is_the_integral_of_power() -> None:
    sim = Simulator(load_scenario("demo"))
    start_mj = [g.energy_mj for g in sim.gpus]
    integral_j = [0.0] * len(sim.gpus)
    t = 0.0
    while t < 900.0:
        t += 0.5
        sim.advance_to(t)
        for k, g in enumerate(sim.gpus):
            integral_j[k] += g.power_w * 0.5
    for k, g in enumerate(sim.gpus):
        counted_j = (g.energy_mj - start_mj[k]) / 1000.0
        assert counted_j == pytest.approx(integral_j[k], rel=1e-3)


def test_energy_counters_carried_on_read_the_carried_value_at_once_and_count_on() -> None:
    sim = small(faults="  - {kind: energy_counter_reset, gpu: 'node-1:2', start: 5}\n")
    sim.carry_energy_counters({("node-0", 1): 5_000_000.0, ("node-9", 0): 1.0})  # no node-9
    g = sim.gpu("node-0", 1)
    assert g.energy_mj == 5_000_000_000  # published at once, before the first step
    sim.advance_to(10.0)
    counted_j = (g.energy_mj - 5_000_000_000) / 1000.0
    assert 0 < counted_j <= 10.0 * g.power_limit_w  # it counts on from there
    # carried on after the simulation has moved (mid-step), and on a GPU its reset zeroed
    reset = sim.gpu("node-1", 2)
    assert reset.energy_mj < 10.0 * reset.power_limit_w * 1000  # counting from its reset at 5 s
    sim.advance_to(12.5)
    sim.carry_energy_counters({("node-0", 1): 7_000_000.0, ("node-1", 2): 3_000_000.0})
    assert (g.energy_mj, reset.energy_mj) == (7_000_000_000, 3_000_000_000)
    sim.advance_to(20.0)
    for gpu, carried_mj in ((g, 7_000_000_000), (reset, 3_000_000_000)):
        assert 0 < gpu.energy_mj - carried_mj <= 7.5 * gpu.power_limit_w * 1000


def test_power_follows_load_and_temperature_lags_it() -> None:
    sim = small(jobs="  - {id: t, kind: training, gpus: ['node-0:*'], start: 60, intensity: 0.9}\n")
    sim.advance_to(60)
    g = sim.gpu("node-0", 0)
    idle_power_w, idle_temp_c = g.power_w, g.temperature_c
    sim.advance_to(63)
    assert g.power_w > 500  # power jumps with the load
    early_rise_c = g.temperature_c - idle_temp_c
    sim.advance_to(400)  # > 10 time constants: settled
    final_rise_c = g.temperature_c - idle_temp_c
    assert final_rise_c > 20
    assert early_rise_c < 0.2 * final_rise_c  # ... the temperature follows slowly
    assert 60 < g.temperature_c < g.slowdown_temp_c
    assert g.power_w > idle_power_w + 400
    assert g.clock_event_reasons & FAULT_BITS == 0
    assert sim.gpu("node-1", 0).temperature_c < 45  # no job there: still idle


def test_full_load_hits_the_power_cap_which_is_not_a_fault() -> None:
    sim = Simulator(load_scenario("healthy"))
    capped = 0
    for t in range(300, 420):
        sim.advance_to(t)
        for g in sim.gpus:
            assert g.power_w <= g.power_limit_w + 1e-9
            assert g.clock_event_reasons & FAULT_BITS == 0
            assert g.temperature_c < g.slowdown_temp_c
            capped += bool(g.clock_event_reasons & REASON_SW_POWER_CAP)
    assert capped > 0


# --- the thermal straggler in synchronous training ----------------------------------------------


@pytest.fixture(scope="module")
def demo_window() -> tuple[Simulator, dict]:
    sim = Simulator(load_scenario("demo"))
    return sim, activity(sim, 600.0, 720.0)


def test_thermal_straggler_heats_past_slowdown_and_loses_clock(demo_window) -> None:
    sim, _ = demo_window
    straggler = sim.gpu("node-2", 5)
    assert straggler.temperature_c > straggler.slowdown_temp_c
    assert straggler.temperature_c < straggler.shutdown_temp_c
    assert straggler.clock_event_reasons & REASON_HW_THERMAL
    assert straggler.clock_event_reasons & REASON_HW_SLOWDOWN
    assert 1200 <= straggler.sm_clock_mhz <= 1500
    peers = [g for g in sim.gpus if g.host != "node-3" and g is not straggler]
    assert all(p.sm_clock_mhz >= 1900 for p in peers)
    assert all(p.clock_event_reasons & FAULT_BITS == 0 for p in peers)


def test_sync_training_straggler_is_the_busiest_not_the_idlest(demo_window) -> None:
    sim, window = demo_window
    job = load_scenario("demo").job("llm-pretrain")
    ranks = {gpu: window[gpu] for gpu in job.gpus}
    straggler = ranks.pop(("node-2", 5))
    for peer in ranks.values():
        assert peer["util"] < straggler["util"] - 15
        assert peer["tensor"] < straggler["tensor"] - 0.1
    # "lowest utilisation = straggler" is wrong here; the highest is
    every = {gpu: window[gpu] for gpu in job.gpus}
    assert max(every, key=lambda k: every[k]["util"]) == ("node-2", 5)
    assert min(every, key=lambda k: every[k]["util"]) != ("node-2", 5)
    # the whole job slowed down
    assert sim.step_time_s("llm-pretrain") > 1.2 * 1.3


def test_sync_training_peers_drop_power_while_they_wait() -> None:
    healthy = Simulator(load_scenario("demo"))
    before = activity(healthy, 120.0, 200.0)  # before the fault: everyone at full power
    after = activity(healthy, 600.0, 680.0)
    peer = ("node-0", 3)
    assert after[peer]["power_w"] < before[peer]["power_w"] - 100
    assert healthy.step_time_s("chat-serving") is None  # inference has no step


def test_inference_throttled_replica_does_the_least_work() -> None:
    sim = small(
        jobs="  - {id: serve, kind: inference, gpus: ['node-0:*'], load: 0.8, intensity: 0.6}\n",
        faults="  - {kind: thermal_slowdown, gpu: 'node-0:2', start: 60}\n",
    )
    window = activity(sim, 400.0, 500.0)
    replicas = {k: v for k, v in window.items() if k[0] == "node-0"}
    slow = ("node-0", 2)
    assert min(replicas, key=lambda k: replicas[k]["tensor"]) == slow
    assert sim.gpu(*slow).clock_event_reasons & REASON_HW_THERMAL
    others = [v["tensor"] for k, v in replicas.items() if k != slow]
    assert replicas[slow]["tensor"] < min(others) - 0.05


def test_healthy_training_ranks_are_even() -> None:
    sim = Simulator(load_scenario("healthy"))
    window = activity(sim, 300.0, 400.0)
    job = load_scenario("healthy").job("llm-pretrain")
    tensors = [window[g]["tensor"] for g in job.gpus]
    assert max(tensors) - min(tensors) < 0.03
    assert statistics.fmean(window[g]["util"] for g in job.gpus) > 90


# --- jobs, processes, idle allocation -----------------------------------------------------------


def test_idle_job_holds_memory_and_a_process_but_does_nothing(demo_window) -> None:
    sim, window = demo_window
    g = sim.gpu("node-3", 7)
    assert sim.job_of("node-3", 7) == "notebook-17"
    assert window[("node-3", 7)]["util"] == 0.0
    assert window[("node-3", 7)]["tensor"] == 0.0
    assert g.memory_used_bytes == 24 * GIB  # NVML v2 "used"; the driver reserve is apart
    assert g.memory_reserved_bytes > 0
    assert [pid for pid, _ in g.processes] == [sim.pids_of("notebook-17")[("node-3", 7)]]
    assert g.clock_event_reasons & REASON_GPU_IDLE


def test_jobs_and_pids_are_stable() -> None:
    sim = Simulator(load_scenario("demo"))
    assert sim.job_of("node-0", 0) is None  # training starts at 30 s
    sim.advance_to(45)
    assert sim.job_of("node-0", 0) == "llm-pretrain"
    pids = sim.pids_of("llm-pretrain")
    assert len(set(pids.values())) == 24
    first = [g.processes for g in sim.gpus]
    sim.advance_to(500)
    assert [g.processes for g in sim.gpus] == first
    assert sim.gpu("node-1", 2).processes == [(pids[("node-1", 2)], 68 * GIB)]
    assert Simulator(load_scenario("demo")).pids_of("llm-pretrain") == pids


def test_idle_allocated_fault_idles_one_rank_of_a_job() -> None:
    sim = small(
        jobs="  - {id: t, kind: training, gpus: ['node-0:*'], memory_gib: 30}\n",
        faults="  - {kind: idle_allocated, gpu: 'node-0:3', start: 100}\n"
        "  - {kind: idle_allocated, gpu: 'node-1:0', start: 100, memory_gib: 5}\n",
    )
    window = activity(sim, 150.0, 200.0)
    assert window[("node-0", 3)]["util"] == 0.0
    assert window[("node-0", 0)]["util"] > 90
    assert sim.gpu("node-0", 3).processes == [(sim.pids_of("t")[("node-0", 3)], 30 * GIB)]
    orphan = sim.gpu("node-1", 0)  # no job: an orphan process holding 5 GiB
    assert len(orphan.processes) == 1 and orphan.processes[0][1] == 5 * GIB
    assert window[("node-1", 0)]["util"] == 0.0


# --- faults -------------------------------------------------------------------------------------


def test_power_brake_pins_the_clock() -> None:
    sim = small(
        jobs="  - {id: t, kind: training, gpus: ['node-0:*']}\n",
        faults="  - {kind: power_brake, gpu: 'node-0:1', start: 100, end: 200}\n",
    )
    sim.advance_to(150)
    braked = sim.gpu("node-0", 1)
    assert braked.clock_event_reasons & REASON_HW_POWER_BRAKE
    assert braked.clock_event_reasons & REASON_HW_SLOWDOWN
    assert braked.sm_clock_mhz <= 0.4 * braked.sm_clock_max_mhz
    assert sim.gpu("node-0", 0).clock_event_reasons & FAULT_BITS == 0
    sim.advance_to(250)
    assert braked.clock_event_reasons & FAULT_BITS == 0
    assert braked.sm_clock_mhz > 1800


def test_gpu_lost_for_its_window() -> None:
    sim = small(faults="  - {kind: gpu_lost, gpu: 'node-1:3', start: 60, end: 120}\n")
    g = sim.gpu("node-1", 3)
    sim.advance_to(59.5)
    assert not g.lost
    sim.advance_to(60)
    assert g.lost
    assert not sim.gpu("node-1", 2).lost
    sim.advance_to(120)
    assert not g.lost


def test_xid_is_raised_once_at_its_time() -> None:
    sim = small(faults="  - {kind: xid, gpu: 'node-0:2', start: 30, code: 79}\n")
    g = sim.gpu("node-0", 2)
    sim.advance_to(29.9)
    assert list(g.pending_xids) == []
    sim.advance_to(30)
    assert list(g.pending_xids) == [79]
    sim.advance_to(300)
    assert list(g.pending_xids) == [79]


def test_ecc_errors_count_up() -> None:
    sim = small(
        faults="  - {kind: ecc_errors, gpu: 'node-0:1', start: 0, end: 1h, sbe_per_h: 120,"
        " dbe_count: 2}\n"
    )
    g = sim.gpu("node-0", 1)
    sim.advance_to(1800)
    assert g.ecc_sbe_volatile == 60
    assert g.ecc_dbe_volatile == 2
    assert g.remapped_rows_pending
    sim.advance_to(7200)
    assert g.ecc_sbe_volatile == 120  # stopped at end
    assert sim.gpu("node-0", 0).ecc_sbe_volatile == 0


def test_memory_leak_grows_linearly_to_near_total() -> None:
    sim = small(
        jobs="  - {id: t, kind: inference, gpus: ['node-0:0'], memory_gib: 20}\n",
        faults="  - {kind: memory_leak, gpu: 'node-0:0', start: 100, end: 1100}\n",
    )
    g = sim.gpu("node-0", 0)
    used: list[int] = []
    for t in (100, 350, 600, 850):
        sim.advance_to(t)
        used.append(g.memory_used_bytes)
    steps = [b - a for a, b in itertools.pairwise(used)]
    assert steps[0] > GIB
    assert max(steps) - min(steps) <= 2  # linear (to the byte, give or take rounding)
    sim.advance_to(1099)
    assert 0.95 * g.memory_total_bytes < g.memory_used_bytes <= 0.98 * g.memory_total_bytes
    assert g.processes[0][1] > 70 * GIB  # the leaking process holds it
    sim.advance_to(1100)  # end: the process restarted
    assert g.memory_used_bytes < 25 * GIB


def test_energy_counter_reset_restarts_from_zero() -> None:
    sim = small(
        jobs="  - {id: t, kind: training, gpus: ['node-0:*']}\n",
        faults="  - {kind: energy_counter_reset, gpu: 'node-0:1', start: 100.5}\n",
    )
    g = sim.gpu("node-0", 1)
    sim.advance_to(100)
    assert g.energy_mj > 10**9  # days since driver load
    sim.advance_to(101)
    assert 0 < g.energy_mj <= g.power_w * 0.5 * 1000 + 1
    before = g.energy_mj
    sim.advance_to(111)
    assert g.energy_mj - before == pytest.approx(g.power_w * 10_000, rel=0.2)
    assert sim.gpu("node-0", 0).energy_mj > 10**9


def test_ground_truth_matches_what_the_simulator_did(demo_window) -> None:
    sim, _ = demo_window
    for record in sim.scenario.ground_truth():
        g = sim.gpu(record.host, record.gpu_index)
        assert sim.job_of(record.host, record.gpu_index) == record.job_id
        if record.cause == "thermal_slowdown":
            assert g.clock_event_reasons & REASON_HW_THERMAL


# --- one step over a long span --------------------------------------------------------------


def test_backfilling_an_hour_of_the_demo_in_one_step() -> None:
    """An hour in one ``advance_to`` (the demo's backfill): every GPU at its end, the straggler's
    fault there. (How long it takes is the demo's start-up, not a test's business.)"""
    sim = Simulator(load_scenario("demo"))
    sim.advance_to(3600.0)
    assert all(isinstance(g, SimGpuState) and g.time_s == 3600.0 for g in sim.gpus)
    straggler = sim.gpu("node-2", 5)
    assert straggler.clock_event_reasons & REASON_HW_THERMAL


@pytest.mark.parametrize("model", ["H100 SXM", "A100 SXM", "L4", "V100 SXM2", "GeForce RTX 4090"])
def test_simulated_samples_carry_the_models_pci_device_id(model: str) -> None:
    text = f"name: one\nseed: 1\ncluster: {{nodes: 1, gpus_per_node: 2, model: {model}}}\n"
    sim = Simulator(load_scenario_text(text, "one.yaml"))
    host = sim.cluster.hosts()[0]
    with NvmlSampler(FakeNvml(sim.cluster, host), host, xid_events=False) as sampler:
        samples = sampler.sample(include_slow=True)
    assert len(samples) == 2
    for s in samples:
        assert s.pci_device_id is not None and s.pci_device_id & 0xFFFF == 0x10DE
        spec = by_pci_device_id(s.pci_device_id)
        assert spec is not None and spec.model == model
    # the fake answers the bus id as the simulator set it, in NVML's struct
    nv = FakeNvml(sim.cluster, host)
    nv.nvmlInit()
    info = nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(1))
    assert info.busId == sim.cluster.on_host(host)[1].pci_bus_id
    assert (info.domain, info.device) == (0, 0)
    nv.nvmlShutdown()


def test_a_source_started_later_in_its_scenario_runs_it_from_there() -> None:
    """A demo carrying on: the cluster at 300 s into the demo scenario, its training job (from
    30 s) running at the first sample; a scenario time past the most a source runs through
    first is cut to it."""
    from gpuwatt.collector.sim.source import MAX_FAST_FORWARD_S, SimulatedClusterSource

    start_ns = 1_800_000_000 * 10**9
    source = SimulatedClusterSource(
        load_scenario("demo"), start_ns=start_ns, clock_ns=lambda: start_ns, scenario_time_s=300.0
    )
    assert source.scenario_zero_ns == start_ns - 300 * 10**9
    source.open()
    jobs = {s.job_id for s in source.sample_at(start_ns, include_slow=False)}
    source.close()
    assert "llm-pretrain" in jobs
    assert source.simulator.scenario_time_s == 300.0
    far = SimulatedClusterSource(
        small().scenario, start_ns=start_ns, scenario_time_s=MAX_FAST_FORWARD_S + 3600
    )
    assert far.scenario_start_s == MAX_FAST_FORWARD_S
