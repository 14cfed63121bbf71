"""Overlaps and restarts are harmless: a counter step the GPU could not have drawn is never energy.

Two writers of one GPU whose counters interleave (two collectors, or a demo restarted over the
data it already stored) used to make 933 kWh of an hour; a counter that resets or jumps is a
reset or a conflict, its interval filled from the power reading and flagged as integrated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatt.analytics import ANALYSIS_FIELDS, analyze
from gpuwatt.analytics.quality import Quality
from gpuwatt.model import EnergyMethod, GpuSample
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
POWER_W = 300.0
SECONDS = 600


def _sample(t_s: int, energy_j: float, uuid: str = "GPU-a") -> GpuSample:
    return GpuSample(
        time_ns=T0 + t_s * NS,
        host="node-1",
        gpu_index=0,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        utilization_gpu_pct=90.0,
        power_w=POWER_W,
        energy_j=energy_j,
        energy_method=EnergyMethod.COUNTER,
    )


def _energy(tmp_path: Path, samples: list[GpuSample]):  # type: ignore[no-untyped-def]
    with SqliteStore(tmp_path / "e.db") as store:
        store.write_samples(samples)
        frame = store.series(T0, T0 + SECONDS * NS, ANALYSIS_FIELDS)
    return analyze(frame, now_ns=T0 + SECONDS * NS, start_ns=T0, window_s=60)


def test_two_writers_of_one_gpu_are_not_summed(tmp_path: Path) -> None:
    # Writer A's counter started long ago, writer B's at the demo's restart: they alternate.
    samples = [_sample(t, (5e8 if t % 2 == 0 else 2e6) + POWER_W * t) for t in range(SECONDS)]
    summary = _energy(tmp_path, samples)
    energy = summary.cluster["energy_kwh"]
    expected_kwh = POWER_W * SECONDS / 3.6e6
    assert energy.value == pytest.approx(expected_kwh, rel=0.02)
    assert energy.quality is Quality.INTEGRATED_POWER
    assert any("two collectors writing the same GPU" in note for note in summary.notes)
    (reason,) = set(summary.energy_by_gpu["energy_reason"])
    assert "two writers" in reason


def test_a_counter_reset_counts_only_what_was_drawn(tmp_path: Path) -> None:
    # Driver reload at t=300: the counter starts again from 0.
    samples = [
        _sample(t, 1e9 + POWER_W * t if t < 300 else POWER_W * (t - 300)) for t in range(SECONDS)
    ]
    summary = _energy(tmp_path, samples)
    assert summary.cluster["energy_kwh"].value == pytest.approx(
        POWER_W * (SECONDS - 1) / 3.6e6, rel=0.01
    )
    assert summary.cluster["energy_kwh"].quality is Quality.MEASURED_COUNTER
    assert not any("two collectors" in note for note in summary.notes)


def test_a_counter_jump_is_not_energy(tmp_path: Path) -> None:
    samples = [_sample(t, POWER_W * t + (3.6e9 if t >= 400 else 0.0)) for t in range(SECONDS)]
    summary = _energy(tmp_path, samples)  # a 1,000 kWh step in one second: a conflict
    assert summary.cluster["energy_kwh"].value == pytest.approx(POWER_W * SECONDS / 3.6e6, rel=0.02)


def test_waiting_energy_is_labelled_an_estimate() -> None:
    from gpuwatt.collector.sim.frame import attach_jobs, sample_frame
    from gpuwatt.collector.sim.scenario import load_scenario

    scenario = load_scenario("thermal_straggler")
    frame = attach_jobs(sample_frame(scenario, 900.0, T0), scenario, T0)
    summary = analyze(frame, now_ns=T0 + 900 * NS, start_ns=T0, window_s=60)
    waiting = summary.cluster["peers_waiting_energy_kwh"]
    assert waiting.available and waiting.quality is Quality.MODEL_ESTIMATE
    assert summary.cluster["energy_kwh"].quality is Quality.MEASURED_COUNTER


def test_two_writers_are_a_dashboard_notice_and_a_log_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpuwatt.dashboard.data import DashboardData
    from gpuwatt.dashboard.timerange import parse_range

    # the two writers' samples interleave irregularly: a minute's newest is one or the other
    samples = [_sample(t, (5e8 if t % 7 < 3 else 2e6) + POWER_W * t) for t in range(SECONDS)]
    end_ns = T0 + SECONDS * NS
    with SqliteStore(tmp_path / "w.db") as store:
        store.write_samples(samples)
        data = DashboardData(store, clock_ns=lambda: end_ns)
        try:
            tr, _ = parse_range({"range": "10m"}, end_ns)
            with caplog.at_level("WARNING", logger="gpuwatt.dashboard"):
                summary = data.window(tr).summary
                data.clear_cache()
                data.window(tr)  # computed again: logged once
        finally:
            data.close()
    notice = [n for n in summary.notes if "two collectors writing the same GPU" in n]
    assert len(notice) == 1
    assert [r.getMessage() for r in caplog.records] == notice
    assert summary.cluster["energy_kwh"].value == pytest.approx(POWER_W * SECONDS / 3.6e6, rel=0.02)
