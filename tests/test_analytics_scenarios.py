"""Scenario-driven: simulator -> fake NVML -> NvmlSampler -> SqliteStore -> analyze."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuwatt.analytics import ANALYSIS_FIELDS, AnalysisSummary, Quality, analyze
from gpuwatt.collector.sim.scenario import Scenario, load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
START_NS = 1_700_000_040 * NS


def _jobs(frame: pd.DataFrame, scenario: Scenario) -> pd.DataFrame:
    t_s = (frame["time_ns"] - START_NS) / NS
    return frame.assign(job_id=scenario.job_ids_at(frame["host"], frame["gpu_index"], t_s))


def _run(name: str, seconds: int, tmp_path: Path) -> tuple[pd.DataFrame, AnalysisSummary]:
    scenario = load_scenario(name)
    src = SimulatedClusterSource(scenario, start_ns=START_NS, clock_ns=lambda: START_NS)
    store = SqliteStore(tmp_path / f"{name}.db")
    src.open()
    try:
        for batch in src.backfill(START_NS + seconds * NS, interval_s=1.0, slow_interval_s=10.0):
            store.write_samples(batch)
        frame = store.series(START_NS, START_NS + seconds * NS, ANALYSIS_FIELDS)
    finally:
        src.close()
        store.close()
    frame = _jobs(frame, scenario)
    return frame, analyze(frame, now_ns=START_NS + seconds * NS, window_s=60)


def test_thermal_straggler_scenario(tmp_path: Path) -> None:
    _, s = _run("thermal_straggler", 600, tmp_path)
    assert [(x.host, x.gpu_index, x.cause, x.signature) for x in s.stragglers] == [
        ("node-1", 5, "thermal", "synchronous")
    ]
    st = s.stragglers[0]
    onset = START_NS + 300 * NS
    assert (st.flagged_ns - onset) // (60 * NS) <= 5
    assert "hardware thermal slowdown" in st.explanation


def test_healthy_uneven_scenario_raises_nothing(tmp_path: Path) -> None:
    _, s = _run("healthy_uneven", 600, tmp_path)
    assert s.stragglers == []
    assert s.idle_allocated == []
    assert s.imbalance("cluster").iloc[-1] > 0.2  # uneven indeed


def test_idle_allocated_scenario(tmp_path: Path) -> None:
    _, s = _run("idle_allocated", 420, tmp_path)
    got = {(i.host, i.gpu_index) for i in s.idle_allocated}
    assert got == {("node-0", 7), ("node-1", 6), ("node-1", 7)}
    assert s.stragglers == []


def test_energy_matches_simulated_power_within_1pct(tmp_path: Path) -> None:
    frame, s = _run("power_brake_straggler", 480, tmp_path)
    # the simulator's power is constant over each 1-s step: its integral is the sum
    truth = frame.groupby("uuid")["power_w"].sum()
    by = s.energy_by_gpu.set_index("uuid")
    assert (by["energy_quality"] == Quality.MEASURED_COUNTER.value).all()
    np.testing.assert_allclose(by["energy_j"], truth.loc[by.index], rtol=0.01)
    integ = analyze(frame.drop(columns=["energy_j"]), now_ns=START_NS + 480 * NS)
    ib = integ.energy_by_gpu.set_index("uuid")
    assert (ib["energy_quality"] == Quality.INTEGRATED_POWER.value).all()
    np.testing.assert_allclose(ib["energy_j"], truth.loc[ib.index], rtol=0.01)


@pytest.mark.parametrize("name", ["demo"])
def test_demo_names_thermal_straggler_and_idle_allocated(name: str, tmp_path: Path) -> None:
    scenario = load_scenario(name)
    truth = {g.cause: (g.host, g.gpu_index) for g in scenario.ground_truth()}
    _, s = _run(name, 600, tmp_path)
    assert [(x.host, x.gpu_index, x.cause) for x in s.stragglers] == [
        (*truth["thermal_slowdown"], "thermal")
    ]
    assert truth["idle_allocated"] in {(i.host, i.gpu_index) for i in s.idle_allocated}
