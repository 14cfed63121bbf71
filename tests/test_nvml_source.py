"""The sampler's real behaviour through the fake NVML, scripted per GPU (gpustat style)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from nvml_fixtures import (
    NV,
    Activity,
    make_cluster,
    run_all,
    run_for,
    scenario_failing_one_gpu,
    scenario_mig,
    scenario_no_energy_counter,
    scenario_no_fan,
    scenario_old_driver,
    scenario_unknown_error_one_gpu,
)

from gpuwatt.collector.nvml_fields import FieldQuery, pcie_queries, slow_queries, tick_queries
from gpuwatt.collector.nvml_source import NvmlSampler
from gpuwatt.collector.sim.fake_nvml import FakeNvml
from gpuwatt.collector.sim.state import SimCluster
from gpuwatt.gpu_specs import SPECS
from gpuwatt.line_protocol import LineEncoder, parse_line
from gpuwatt.model import EnergyMethod, GpuSample, TflopsMethod
from gpuwatt.tflops import estimate_tflops_from_pipes

HOST = "node-1"
BUSY = Activity()  # 500 W, 50 % HMMA at 1980 MHz
#: H100's tensor peaks are quoted at 1830 MHz: at 1980 MHz its tensor pipe does 1980/1830 of them
AT_1980 = 1980.0 / 1830.0


class Clock:
    """Side-effect roots as constructor arguments: a wall clock and a monotonic clock."""

    def __init__(self) -> None:
        self.mono_s = 100.0

    def ns(self) -> int:
        return int(self.mono_s * 1e9)

    def mono(self) -> float:
        return self.mono_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster() -> SimCluster:
    return make_cluster(4)


@pytest.fixture
def sampler(cluster: SimCluster, clock: Clock) -> Iterator[NvmlSampler]:
    s = NvmlSampler(
        FakeNvml(cluster, HOST), HOST, clock_ns=clock.ns, monotonic_s=clock.mono, xid_wait_ms=20
    )
    s.open()
    yield s
    s.close()


def tick(
    cluster: SimCluster,
    clock: Clock,
    sampler: NvmlSampler,
    seconds: float = 1.0,
    activity: Activity = BUSY,
    include_slow: bool = False,
) -> list[GpuSample]:
    run_all(cluster, seconds, activity)
    clock.mono_s += seconds
    return sampler.sample(include_slow)


def fields_of(sample: GpuSample) -> dict[str, object]:
    return parse_line(LineEncoder().encode(sample))[2]


# --- identity and the plain fields ------------------------------------------------------------


def test_one_sample_per_gpu_with_identity_and_units(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    samples = tick(cluster, clock, sampler, activity=Activity(power_w=412.5))
    assert [s.gpu_index for s in samples] == [0, 1, 2, 3]
    s = samples[0]
    g = cluster.gpus[0]
    assert (s.host, s.uuid, s.name) == (HOST, g.uuid, "NVIDIA H100 80GB HBM3")
    assert s.time_ns == clock.ns()
    assert s.power_w == 412.5  # mW -> W
    assert s.power_limit_w == 700.0
    assert s.memory_total_bytes == g.memory_total_bytes
    assert s.memory_used_bytes == g.memory_used_bytes
    assert s.memory_reserved_bytes == g.memory_reserved_bytes  # v2 answers
    assert s.sm_clock_mhz == 1980.0 and s.sm_clock_max_mhz == 1980.0
    assert s.temperature_gpu_c == 35.0
    assert s.mig_enabled is False
    assert s.energy_method is EnergyMethod.COUNTER


def test_pcie_kib_per_s_become_bytes_per_s_on_a_gpu_without_gpm(clock: Clock) -> None:
    cluster = make_cluster(1, model="A100 SXM")
    cluster.gpus[0].pcie_tx_kib_per_s = 1000.0
    s = NvmlSampler(FakeNvml(cluster, HOST), HOST, monotonic_s=clock.mono, xid_events=False)
    with s:
        (sample,) = tick(cluster, clock, s)
    assert sample.pcie_tx_bytes_per_s == 1000.0 * 1024


def test_process_list_with_pids_and_unknown_memory(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    # -1: the fake answers NVML_VALUE_NOT_AVAILABLE (pynvml: usedGpuMemory None) for it
    cluster.gpus[2].processes = [(4242, 3 * 1024**3), (4343, -1)]
    samples = tick(cluster, clock, sampler)
    procs = samples[2].processes
    assert procs is not None
    assert [(p.pid, p.used_memory_bytes) for p in procs] == [(4242, 3 * 1024**3), (4343, None)]
    assert samples[0].processes == ()
    f = fields_of(samples[2])
    assert f["process_count"] == 2 and f["processes"] == "4242:3221225472;4343:"


# --- failures: missing is not zero, logged once, lost GPUs isolated ----------------------------


def test_not_supported_field_is_none_absent_from_the_line_and_logged_once(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler, caplog: pytest.LogCaptureFixture
) -> None:
    scenario_no_fan(cluster)
    with caplog.at_level(logging.INFO, logger="gpuwatt.collector.nvml_source"):
        for _ in range(10):
            samples = tick(cluster, clock, sampler)
    assert all(s.fan_speed_pct is None for s in samples)
    f = fields_of(samples[0])
    assert "fan_speed" not in f and f["power_draw"] == 500.0
    fan_logs = [r for r in caplog.records if "fan_speed_pct" in r.getMessage()]
    assert len(fan_logs) == 4  # once per GPU, not once per tick
    assert sampler.unsupported_fields()["gpu0/fan_speed_pct"] == "NVMLError_NotSupported"


def test_a_transient_error_makes_the_field_none_for_that_tick_only(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.gpus[0].failing["nvmlDeviceGetPowerUsage"] = NV.NVML_ERROR_TIMEOUT
    with caplog.at_level(logging.INFO, logger="gpuwatt.collector.nvml_source"):
        assert tick(cluster, clock, sampler)[0].power_w is None
        assert tick(cluster, clock, sampler)[0].power_w is None
    assert len([r for r in caplog.records if "power_w" in r.getMessage()]) == 1
    del cluster.gpus[0].failing["nvmlDeviceGetPowerUsage"]
    assert tick(cluster, clock, sampler)[0].power_w == 500.0


def test_gpu_is_lost_marks_only_that_gpu(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler, caplog: pytest.LogCaptureFixture
) -> None:
    tick(cluster, clock, sampler)
    scenario_failing_one_gpu(cluster, index=1)
    with caplog.at_level(logging.WARNING, logger="gpuwatt.collector.nvml_source"):
        for _ in range(5):
            samples = tick(cluster, clock, sampler)
    lost = samples[1]
    assert lost.lost and lost.power_w is None and lost.uuid == cluster.gpus[1].uuid
    assert parse_line(LineEncoder().encode(lost))[2] == {"gpu_lost": True}
    for s in (samples[0], samples[2], samples[3]):
        assert not s.lost and s.power_w == 500.0 and s.tflops_estimate is not None
    assert len([r for r in caplog.records if "is lost" in r.getMessage()]) == 1
    cluster.gpus[1].lost = False  # reset: the GPU answers again
    assert not tick(cluster, clock, sampler)[1].lost


def test_unknown_error_also_marks_the_gpu_lost(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    scenario_unknown_error_one_gpu(cluster, index=3)
    samples = tick(cluster, clock, sampler)
    assert samples[3].lost and not samples[2].lost


def test_a_gpu_lost_at_open_is_reported_lost_and_the_rest_are_sampled(clock: Clock) -> None:
    cluster = make_cluster(2)
    cluster.gpus[0].lost = True
    with NvmlSampler(FakeNvml(cluster, HOST), HOST, monotonic_s=clock.mono) as s:
        samples = tick(cluster, clock, s)
        assert samples[0].lost and not samples[1].lost
        cluster.gpus[0].lost = False
        samples = tick(cluster, clock, s)
    assert not samples[0].lost and samples[0].uuid == cluster.gpus[0].uuid


# --- energy -------------------------------------------------------------------------------------


def test_energy_counter_reset_never_decreases_energy(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    def energy_j() -> float:
        e = tick(cluster, clock, sampler)[0].energy_j
        assert e is not None
        return e

    energies = [energy_j() for _ in range(3)]
    cluster.gpus[0].energy_mj = 0  # driver reload: the counter restarts
    energies += [energy_j() for _ in range(3)]
    assert energies == sorted(energies)
    # the counter restarted from 0 and then counted 1 s at 500 W: nothing lost, nothing doubled
    assert energies[3] == pytest.approx(energies[2] + 500.0)
    assert energies[-1] - energies[0] == pytest.approx(500.0 * 5)


def test_energy_integrates_power_when_the_counter_is_unsupported(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    scenario_no_energy_counter(cluster, index=0)
    first = tick(cluster, clock, sampler, activity=Activity(power_w=300.0))[0]
    assert first.energy_method is EnergyMethod.INTEGRATED and first.energy_j == 0.0
    second = tick(cluster, clock, sampler, seconds=2.0, activity=Activity(power_w=300.0))[0]
    assert second.energy_j == pytest.approx(600.0)
    assert tick(cluster, clock, sampler)[1].energy_method is EnergyMethod.COUNTER
    assert "gpu0/energy_counter" in sampler.unsupported_fields()
    assert fields_of(second)["energy_method"] == "integrated"


# --- versioned calls fall back ------------------------------------------------------------------


def test_memory_v2_and_temperature_v_fall_back(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    g = scenario_old_driver(cluster, index=0)
    for _ in range(3):
        s = tick(cluster, clock, sampler)[0]
        assert s.memory_reserved_bytes is None  # v1 has no reservation figure
        assert s.memory_used_bytes == g.memory_used_bytes + g.memory_reserved_bytes
        assert s.memory_total_bytes == g.memory_total_bytes
        assert s.temperature_gpu_c == 35.0
    assert "memory_reserved" not in fields_of(s)
    assert "gpu0/memory_reserved_bytes" in sampler.unsupported_fields()


def test_fallbacks_and_integrated_energy_are_logged_once_in_words(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatt.collector")
    scenario_old_driver(cluster, index=0)
    scenario_no_energy_counter(cluster, index=1)
    for _ in range(3):
        tick(cluster, clock, sampler)
    lines = [r.getMessage() for r in caplog.records]  # a bad format would raise here
    falling = [m for m in lines if "falling back to nvmlDeviceGetTemperature" in m]
    assert falling == [
        "GPU 0 temperature_gpu_c nvmlDeviceGetTemperatureV: NVMLError_NotSupported, "
        "falling back to nvmlDeviceGetTemperature"
    ]
    assert sum("integrating power" in m for m in lines) == 1


# --- GPM and the TFLOPS estimate ------------------------------------------------------------------


def test_gpm_metrics_and_tflops_on_h100(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    assert tick(cluster, clock, sampler)[0].tflops_estimate is None  # first GPM sample: no pair
    busy = Activity(
        sm_clock_mhz=1980.0,
        sm_active_pct=80.0,
        sm_occupancy_pct=35.0,
        tensor_any_pct=50.0,
        tensor_hmma_pct=50.0,
        dram_pct=40.0,
        nvlink_rx_bytes_per_s=2 * 1024**3,
        nvlink_tx_bytes_per_s=1024**3,
    )
    s = tick(cluster, clock, sampler, seconds=2.0, activity=busy)[0]
    assert s.sm_active_pct == pytest.approx(80.0)
    assert s.sm_occupancy_pct == pytest.approx(35.0)
    assert s.tensor_hmma_active_pct == pytest.approx(50.0)
    assert s.dram_active_pct == pytest.approx(40.0)
    assert s.nvlink_rx_bytes_per_s == pytest.approx(2 * 1024**3)
    assert s.nvlink_tx_bytes_per_s == pytest.approx(1024**3)
    # 50 % HMMA at 1980 MHz on H100 SXM: bf16 dense peak 989.4 TFLOPS at 1830 MHz
    assert s.tflops_estimate == pytest.approx(494.7 * AT_1980)
    assert s.tflops_method is TflopsMethod.GPM
    # at a throttled clock the estimate scales with it
    slow = tick(cluster, clock, sampler, activity=Activity(sm_clock_mhz=990.0))[0]
    assert slow.tflops_estimate == pytest.approx(494.7 * AT_1980 / 2)


def test_each_gpm_figure_covers_the_interval_since_the_previous_tick(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    tick(cluster, clock, sampler)
    for sm_pct in (10.0, 80.0, 35.0, 60.0, 5.0):  # the two GPM buffers take turns
        s = tick(cluster, clock, sampler, activity=Activity(sm_active_pct=sm_pct))[0]
        assert s.sm_active_pct == pytest.approx(sm_pct)
    cluster.gpus[0].failing["nvmlGpmSampleGet"] = NV.NVML_ERROR_TIMEOUT  # a snapshot missed
    assert tick(cluster, clock, sampler)[0].sm_active_pct is None
    del cluster.gpus[0].failing["nvmlGpmSampleGet"]
    assert tick(cluster, clock, sampler)[0].sm_active_pct is None  # no interval yet
    s = tick(cluster, clock, sampler, activity=Activity(sm_active_pct=25.0))[0]
    assert s.sm_active_pct == pytest.approx(25.0)


def test_tensor_precision_chooses_the_peak(cluster: SimCluster, clock: Clock) -> None:
    with NvmlSampler(FakeNvml(cluster, HOST), HOST, tensor_precision="fp8", xid_events=False) as s:
        tick(cluster, clock, s)
        assert tick(cluster, clock, s)[0].tflops_estimate == pytest.approx(1978.9 / 2 * AT_1980)


def test_a100_without_gpm_has_no_tflops(clock: Clock) -> None:
    cluster = make_cluster(2, model="A100 SXM")
    with NvmlSampler(FakeNvml(cluster, HOST), HOST, xid_events=False) as s:
        for _ in range(3):
            samples = tick(cluster, clock, s)
        assert s.devices()[0].gpm_supported is False
    assert all(x.tflops_estimate is None and x.tflops_method is None for x in samples)
    assert all(x.tensor_hmma_active_pct is None for x in samples)
    assert "tflops_estimate" not in fields_of(samples[0])


def test_mig_mode_does_not_crash_and_refused_fields_are_none(clock: Clock) -> None:
    cluster = make_cluster(2)
    scenario_mig(cluster, index=0)
    with NvmlSampler(FakeNvml(cluster, HOST), HOST, xid_events=False) as s:
        for _ in range(3):
            samples = tick(cluster, clock, s)
    mig = samples[0]
    assert mig.mig_enabled is True and not mig.lost
    assert mig.utilization_gpu_pct is None and mig.tflops_estimate is None
    assert mig.power_w == 500.0 and mig.memory_used_bytes is not None
    assert samples[1].tflops_estimate is not None


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16", "fp8"])
def test_the_inlined_tflops_estimate_is_the_shared_formula(clock: Clock, precision: str) -> None:
    cluster = make_cluster(1)
    mixed = Activity(
        sm_clock_mhz=1755.0,
        tensor_hmma_pct=37.5,
        tensor_dfma_pct=4.25,
        fp64_pct=3.0,
        fp32_pct=11.0,
        fp16_pct=6.5,
    )
    with NvmlSampler(
        FakeNvml(cluster, HOST), HOST, tensor_precision=precision, xid_events=False
    ) as s:
        tick(cluster, clock, s)
        sample = tick(cluster, clock, s, activity=mixed)[0]
    expected = estimate_tflops_from_pipes(
        SPECS["H100 SXM"],
        sm_clock_mhz=sample.sm_clock_mhz,
        tensor_hmma_active_pct=sample.tensor_hmma_active_pct,
        tensor_dfma_active_pct=sample.tensor_dfma_active_pct,
        fp64_active_pct=sample.fp64_active_pct,
        fp32_active_pct=sample.fp32_active_pct,
        fp16_active_pct=sample.fp16_active_pct,
        tensor_precision=precision,
    )
    assert expected is not None and sample.tflops_estimate == pytest.approx(expected, rel=1e-12)


class _OneGpmMetricFails(FakeNvml):
    """NVML answering one metric of a GPM request with an error (the others succeed)."""

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        out = super().nvmlGpmMetricsGet(metricsGet)
        metricsGet.metrics[2].nvmlReturn = NV.NVML_ERROR_NOT_SUPPORTED  # ANY_TENSOR_UTIL
        return out


def test_a_gpm_metric_that_fails_alone_is_none_alone(clock: Clock) -> None:
    cluster = make_cluster(1)
    with NvmlSampler(_OneGpmMetricFails(cluster, HOST), HOST, xid_events=False) as s:
        tick(cluster, clock, s)
        sample = tick(cluster, clock, s)[0]
    assert sample.tensor_active_pct is None
    assert sample.tensor_hmma_active_pct == pytest.approx(50.0)
    assert sample.sm_active_pct == pytest.approx(90.0)
    assert sample.tflops_estimate == pytest.approx(494.7 * AT_1980)


def test_fake_gpm_request_answers_like_nvml() -> None:
    """Results per metric id; no data over a zero interval; the request's header kept."""
    cluster = make_cluster(1)
    nv = FakeNvml(cluster, HOST)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    get = NV.c_nvmlGpmMetricsGet_t()
    get.version = NV.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = 3
    get.sample1, get.sample2 = first, second
    ids = (NV.NVML_GPM_METRIC_FP32_UTIL, 9999, NV.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC)
    for i, metric_id in enumerate(ids):
        get.metrics[i].metricId = metric_id

    def answers() -> list[tuple[int, int, float]]:
        nv.nvmlGpmMetricsGet(get)
        assert (get.version, get.numMetrics) == (NV.NVML_GPM_METRICS_GET_VERSION, 3)
        return [(m.metricId, m.nvmlReturn, m.value) for m in get.metrics[:3]]

    nv.nvmlGpmSampleGet(h, first)
    nv.nvmlGpmSampleGet(h, second)
    nodata, unsupported = NV.NVML_ERROR_NO_DATA, NV.NVML_ERROR_NOT_SUPPORTED
    assert answers() == [(ids[0], nodata, 0.0), (9999, unsupported, 0.0), (ids[2], nodata, 0.0)]
    run_for(cluster.gpus[0], 2.0, Activity(fp32_pct=25.0, nvlink_rx_bytes_per_s=3 * 1024**2))
    nv.nvmlGpmSampleGet(h, second)
    (fp32, ok1, fp32_pct), unknown, (rx, ok2, rx_mib_s) = answers()
    assert (fp32, ok1, rx, ok2) == (ids[0], NV.NVML_SUCCESS, ids[2], NV.NVML_SUCCESS)
    assert fp32_pct == pytest.approx(25.0) and rx_mib_s == pytest.approx(3.0)
    assert unknown == (9999, unsupported, 0.0)


def test_a_field_refused_for_good_is_not_asked_again(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    scenario_no_fan(cluster)
    first = tick(cluster, clock, sampler)[0]
    assert first.fan_speed_pct is None
    assert first.processes == ()  # the row after it was still asked in that tick
    cluster.gpus[0].unsupported.clear()  # NVML would answer now, but is not asked
    assert tick(cluster, clock, sampler)[0].fan_speed_pct is None


def test_clock_reasons_fall_back_to_the_old_name_at_once(clock: Clock) -> None:
    cluster = make_cluster(1)
    g = cluster.gpus[0]
    g.clock_event_reasons = 0x4
    g.failing["nvmlDeviceGetCurrentClocksEventReasons"] = NV.NVML_ERROR_FUNCTION_NOT_FOUND
    with NvmlSampler(FakeNvml(cluster, HOST), HOST, xid_events=False) as s:
        assert tick(cluster, clock, s)[0].clock_event_reasons == 0x4
        assert tick(cluster, clock, s)[0].clock_event_reasons == 0x4
        assert s.unsupported_fields() == {}  # the old call gives the same field: nothing lost


def test_gpm_refused_for_good_gives_way_to_pcie_throughput_in_the_same_tick(
    clock: Clock,
) -> None:
    cluster = make_cluster(1)
    g = cluster.gpus[0]
    g.pcie_tx_kib_per_s = 1000.0
    with NvmlSampler(FakeNvml(cluster, HOST), HOST, xid_events=False) as s:
        tick(cluster, clock, s)
        assert tick(cluster, clock, s)[0].tflops_estimate is not None
        g.unsupported.add("nvmlGpmSampleGet")
        sample = tick(cluster, clock, s)[0]
        assert sample.tflops_estimate is None and sample.sm_active_pct is None
        assert sample.pcie_tx_bytes_per_s == 1000.0 * 1024
        assert s.unsupported_fields()["gpu0/gpm"] == "NVMLError_NotSupported"
        assert tick(cluster, clock, s)[0].pcie_tx_bytes_per_s == 1000.0 * 1024


def test_every_field_the_query_tables_fill_is_a_sample_field() -> None:
    names = {f.name for f in dataclasses.fields(GpuSample)}
    rows: list[FieldQuery] = [*tick_queries(NV), *pcie_queries(NV), *slow_queries(NV)]
    while rows:
        row = rows.pop()
        assert row.field is None or row.field in names, row
        assert set(row.lacks) <= names, row
        if row.fallback is not None:
            rows.append(row.fallback)


# --- slow cadence and XIDs ---------------------------------------------------------------------


def test_slow_fields_only_on_slow_ticks(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    g = cluster.gpus[0]
    g.ecc_sbe_volatile, g.ecc_dbe_volatile = 7, 1
    g.remapped_rows_correctable, g.remapped_rows_pending = 2, True
    fast = tick(cluster, clock, sampler)[0]
    assert fast.ecc_sbe_volatile_count is None and fast.remapped_rows_pending is None
    slow = tick(cluster, clock, sampler, include_slow=True)[0]
    assert (slow.ecc_sbe_volatile_count, slow.ecc_dbe_volatile_count) == (7, 1)
    assert slow.remapped_rows_correctable == 2 and slow.remapped_rows_pending is True
    assert slow.remapped_rows_failure is False


def test_lifetime_ecc_counts_include_errors_from_before_this_boot(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    g = cluster.gpus[0]
    g.ecc_sbe_volatile, g.ecc_dbe_volatile = 7, 1
    g.ecc_sbe_aggregate_base, g.ecc_dbe_aggregate_base = 100, 2
    fast = tick(cluster, clock, sampler)[0]
    assert fast.ecc_sbe_aggregate_count is None
    slow = tick(cluster, clock, sampler, include_slow=True)[0]
    assert (slow.ecc_sbe_aggregate_count, slow.ecc_dbe_aggregate_count) == (107, 3)
    assert (slow.ecc_sbe_volatile_count, slow.ecc_dbe_volatile_count) == (7, 1)


def test_xids_raised_in_the_cluster_reach_the_next_sample(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    assert sampler.xid_listener_active
    cluster.raise_xid(cluster.gpus[2], 79)
    cluster.raise_xid(cluster.gpus[2], 48)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and len(sampler._gpus[2].xids) < 2:
        time.sleep(0.01)
    samples = tick(cluster, clock, sampler)
    assert samples[2].xid_errors == (79, 48)
    assert samples[0].xid_errors == ()
    assert tick(cluster, clock, sampler)[2].xid_errors == ()  # delivered once
    assert fields_of(samples[2])["xid_last"] == 48


def test_close_stops_the_listener_promptly(cluster: SimCluster) -> None:
    s = NvmlSampler(FakeNvml(cluster, HOST), HOST, xid_wait_ms=50)
    s.open()
    assert s.xid_listener_active
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 1.0
    assert not s.xid_listener_active


def test_unregistrable_device_is_skipped(clock: Clock) -> None:
    cluster = make_cluster(2)
    cluster.gpus[0].unsupported.add("nvmlDeviceRegisterEvents")
    with NvmlSampler(FakeNvml(cluster, HOST), HOST, xid_wait_ms=20) as s:
        assert s._listener is not None and s._listener.registered == (1,)
        cluster.raise_xid(cluster.gpus[1], 13)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not s._gpus[1].xids:
            time.sleep(0.01)
        assert tick(cluster, clock, s)[1].xid_errors == (13,)


def test_run_for_helper_integrates_counters() -> None:
    cluster = make_cluster(1)
    run_for(cluster.gpus[0], 2.0, Activity(power_w=100.0, tensor_hmma_pct=25.0))
    assert cluster.gpus[0].energy_mj == 200_000
    assert cluster.gpus[0].tensor_hmma_active_s == pytest.approx(0.5)


# --- HBM temperature: a field value, refused in its own return code -----------------------------


def test_hbm_temperature_is_read_from_its_field_value(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler
) -> None:
    samples = tick(cluster, clock, sampler)
    for s, g in zip(samples, cluster.gpus, strict=True):
        assert s.temperature_memory_c == round(g.memory_temperature_c)
    assert fields_of(samples[0])["temperature_memory_c"] == samples[0].temperature_memory_c


def test_hbm_temperature_refused_in_the_field_is_not_measured_and_the_rest_goes_on(
    cluster: SimCluster, clock: Clock, sampler: NvmlSampler, caplog: pytest.LogCaptureFixture
) -> None:
    """The batch call itself succeeds; the refusal is in the field's ``nvmlReturn`` (a GDDR
    board): the field is None, refused for good once, and the other GPUs keep theirs."""
    cluster.gpus[0].unsupported.add("NVML_FI_DEV_MEMORY_TEMP")
    with caplog.at_level(logging.INFO, logger="gpuwatt.collector.nvml_source"):
        for _ in range(3):
            samples = tick(cluster, clock, sampler)
    assert samples[0].temperature_memory_c is None and samples[0].power_w == 500.0
    assert all(s.temperature_memory_c is not None for s in samples[1:])
    cause = sampler.unsupported_fields()["gpu0/temperature_memory_c"]
    assert cause == "NVMLError_NotSupported"
    logs = [r for r in caplog.records if "temperature_memory_c" in r.getMessage()]
    assert len(logs) == 1
