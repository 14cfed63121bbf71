"""The collector against the fake NVML answering as real GPUs did (``nvidia-smi -q -x`` dumps).

Each dump in ``tests/data/nvidia_smi`` (Telegraf's test data, from real GPUs) becomes a device
profile: the fake refuses what the device reported as N/A, as real NVML does. The real sampler
then runs against it, slow counters and the XID listener included: no exception, every refused
query absent from the sample and from the written line (never zero), every answered one equal to
what the GPU reported.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from gpuwatt.collector.nvml_source import NvmlSampler
from gpuwatt.collector.sim.device_profile import DeviceProfile, load_dump, profile_state
from gpuwatt.collector.sim.fake_nvml import FakeNvml
from gpuwatt.collector.sim.state import SimCluster
from gpuwatt.gpu_specs import by_pci_device_id
from gpuwatt.line_protocol import LineEncoder, parse_line
from gpuwatt.model import EnergyMethod, GpuSample
from gpuwatt.schema import FIELD_BY_ATTR

DUMPS = sorted((Path(__file__).parent / "data" / "nvidia_smi").glob("*.xml"))
MIB = 1024 * 1024
HOST = "node-0"

#: NVML function -> the sample fields only it fills (what must be absent when it is refused).
FILLS: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetUtilizationRates": ("utilization_gpu_pct", "utilization_memory_pct"),
    "nvmlDeviceGetFanSpeed": ("fan_speed_pct",),
    "nvmlDeviceGetPowerUsage": ("power_w",),
    "nvmlDeviceGetEnforcedPowerLimit": ("power_limit_w",),
    "nvmlDeviceGetClockInfo": ("sm_clock_mhz", "memory_clock_mhz", "graphics_clock_mhz"),
    "nvmlDeviceGetMaxClockInfo": ("sm_clock_max_mhz",),
    "nvmlDeviceGetPcieThroughput": ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
    "nvmlDeviceGetTotalEccErrors": ("ecc_sbe_volatile_count", "ecc_dbe_volatile_count"),
    "nvmlDeviceGetRemappedRows": (
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
    ),
    "nvmlDeviceGetMigMode": ("mig_enabled",),
    "nvmlDeviceGetPciInfo": ("pci_device_id",),
}


def _run(profile: DeviceProfile, ticks: int = 3) -> tuple[NvmlSampler, list[list[GpuSample]]]:
    cluster = SimCluster([profile_state(profile, HOST, 0)])
    mono = [100.0]
    sampler = NvmlSampler(
        FakeNvml(cluster, HOST),
        HOST,
        clock_ns=lambda: int(mono[0] * 1e9),
        monotonic_s=lambda: mono[0],
        xid_wait_ms=10,
    )
    rounds = []
    with sampler:
        for k in range(ticks):
            mono[0] += 1.0
            rounds.append(sampler.sample(include_slow=k % 2 == 0))
        assert sampler.xid_listener_active
    return sampler, rounds


def _absent(s: GpuSample, attr: str) -> None:
    assert getattr(s, attr) is None, attr
    spec = FIELD_BY_ATTR.get(attr)
    if spec is not None and not s.lost:
        assert spec.field not in parse_line(LineEncoder().encode(s))[2], attr


@pytest.fixture(params=DUMPS, ids=[p.stem for p in DUMPS])
def profile(request: pytest.FixtureRequest) -> DeviceProfile:
    (p,) = load_dump(request.param)
    return p


def test_the_collector_runs_against_the_device_and_refused_queries_are_absent(
    profile: DeviceProfile, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _, rounds = _run(profile)
    # no traceback: nothing logged with an exception, nothing above a warning
    assert not [r for r in caplog.records if r.exc_info or r.levelno > logging.WARNING]
    slow = rounds[-1][0]  # the third tick read the slow counters too
    for samples in rounds:
        assert not any(s.lost for s in samples)
    refused = profile.unsupported
    for fn, attrs in FILLS.items():
        if fn in refused:
            for attr in attrs:
                _absent(slow, attr)
    temperature_refused = "nvmlDeviceGetTemperature" in refused
    if temperature_refused:
        _absent(slow, "temperature_gpu_c")
    if "nvmlDeviceGetMemoryInfo_v2" in profile.failing:
        _absent(slow, "memory_reserved_bytes")
    reasons_refused = {
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    } <= refused
    if reasons_refused:
        _absent(slow, "clock_event_reasons")
    if "nvmlDeviceGetTotalEnergyConsumption" in refused:
        if "nvmlDeviceGetPowerUsage" in refused:
            _absent(slow, "energy_j")
        else:
            assert slow.energy_method is EnergyMethod.INTEGRATED
    else:
        assert slow.energy_method is EnergyMethod.COUNTER
    # and what the device answered is what it reported
    for attr, want in (
        ("temperature_gpu_c", profile.temperature_c),
        ("power_w", profile.power_w),
        ("power_limit_w", profile.power_limit_w),
        ("fan_speed_pct", profile.fan_speed_pct),
        ("utilization_gpu_pct", profile.utilization_gpu_pct),
        ("sm_clock_mhz", profile.sm_clock_mhz),
        ("sm_clock_max_mhz", profile.sm_clock_max_mhz),
        ("clock_event_reasons", profile.clock_event_reasons),
    ):
        if want is not None:
            assert getattr(slow, attr) == pytest.approx(want), attr
    if profile.memory_total_mib is not None:
        assert slow.memory_total_bytes == profile.memory_total_mib * MIB
        assert slow.memory_used_bytes is not None
    if profile.remapped_rows is not None:
        assert slow.remapped_rows_pending is profile.remapped_rows[2]
    assert slow.pci_device_id == profile.pci_device_id


def test_a_dumps_pci_device_id_is_read_and_names_its_model() -> None:
    by_file = {p.name: load_dump(p)[0] for p in DUMPS}
    a100 = by_file["a100-sxm4-v12.xml"]  # <pci_device_id>20B210DE</pci_device_id>
    assert a100.pci_device_id == 0x20B210DE
    spec = by_pci_device_id(a100.pci_device_id)
    assert spec is not None and spec.model == "A100 SXM"
    # Telegraf's a10g.xml has its device part zeroed ("000000DE"): refused, not zero
    a10g = by_file["a10g.xml"]
    assert a10g.pci_device_id is None
    assert "nvmlDeviceGetPciInfo" in a10g.unsupported


def test_static_facts_are_the_devices_limits_clocks_and_thresholds(
    profile: DeviceProfile,
) -> None:
    sampler, _ = _run(profile, ticks=1)
    (info,) = sampler.devices()
    assert (info.uuid, info.name) == (profile.uuid, profile.name)
    for got, want in (
        (info.power_limit_default_w, profile.power_limit_default_w),
        (info.power_limit_enforced_w, profile.power_limit_w),
        (info.slowdown_temp_c, profile.slowdown_temp_c),
        (info.shutdown_temp_c, profile.shutdown_temp_c),
        (info.sm_clock_max_mhz, profile.sm_clock_max_mhz),
    ):
        assert got == (None if want is None else pytest.approx(want))
    assert info.mig_enabled is profile.mig_enabled
    assert info.gpm_supported is False  # no Hopper among the dumps


def _profile(stem: str) -> DeviceProfile:
    (p,) = load_dump(next(d for d in DUMPS if d.stem == stem))
    return p


def test_what_the_t4_a10g_and_geforce_cards_really_answer() -> None:
    t4 = _profile("tesla-t4")  # passively cooled, ECC on, driver 515 (before the rename)
    assert {"nvmlDeviceGetFanSpeed", "nvmlDeviceGetRemappedRows"} <= t4.unsupported
    assert "nvmlDeviceGetTotalEccErrors" not in t4.unsupported
    assert set(t4.failing) == {
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetTemperatureV",
    }
    assert (t4.power_limit_w, t4.slowdown_temp_c, t4.shutdown_temp_c) == (70.0, 93.0, 96.0)
    a10g = _profile("a10g")
    assert "nvmlDeviceGetRemappedRows" not in a10g.unsupported  # it has row remapping
    rtx = _profile("rtx-3080-v13")  # GeForce: no ECC, no row remapping, no MIG
    assert {
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetMigMode",
    } <= rtx.unsupported
    assert rtx.failing == {}  # a current driver: every newer call exists
    old = _profile("gtx-1070-ti")  # Pascal, no power sensor: no energy at all
    assert not old.energy_counter and old.power_w is None


def test_the_a100_in_mig_mode_samples_its_four_mig_devices() -> None:
    a100 = _profile("a100-sxm4-v12")
    assert a100.mig_enabled is True and len(a100.mig_devices) == 4
    _, rounds = _run(a100)
    parent, *migs = rounds[-1]
    assert parent.mig_enabled is True and parent.utilization_gpu_pct is None
    assert parent.power_w == pytest.approx(67.03)
    assert [m.gpu_instance_id for m in migs] == [3, 4, 5, 6]
    assert all(m.parent_uuid == a100.uuid and m.uuid.startswith("MIG-") for m in migs)
    assert all(m.name == "NVIDIA A100-SXM4-80GB MIG 1g.20gb" for m in migs)
    assert all(m.memory_total_bytes == 19968 * MIB for m in migs)
    assert all(m.memory_used_bytes == 12 * MIB for m in migs)
    for m in migs:  # what the parent reports is not repeated on its MIG devices
        for attr in ("power_w", "temperature_gpu_c", "utilization_gpu_pct", "energy_j"):
            _absent(m, attr)
        assert m.sm_active_pct is None and m.tflops_estimate is None  # no GPM on an A100


def test_a_dump_value_of_na_never_becomes_zero() -> None:
    for path in DUMPS:
        for p in load_dump(path):
            state = profile_state(p)
            if p.slowdown_temp_c is None:
                assert math.isnan(state.slowdown_temp_c)
            if p.power_limit_w is None:
                assert math.isnan(state.power_limit_w)
