"""Energy: counter deltas, resets, the power fallback, kWh / cost / CO2 and idle energy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_analytics_support import NS, T0_NS, cluster_frame, rollup, with_energy_counter

from gpuwatt.analytics import Quality, analyze


def _sine_power(frame: pd.DataFrame) -> pd.DataFrame:
    t = (frame["time_ns"] - T0_NS) / NS
    frame = frame.assign(power_w=400.0 + 200.0 * np.sin(t / 97.0) + frame["gpu_index"] * 10.0)
    return with_energy_counter(frame)


def _true_integral_j(frame: pd.DataFrame, uuid: str) -> float:
    g = frame.loc[frame["uuid"] == uuid].sort_values("time_ns")
    t = g["time_ns"].to_numpy() / NS
    p = g["power_w"].to_numpy()
    return float(np.sum((p[1:] + p[:-1]) / 2 * np.diff(t)))


@pytest.fixture
def known_power() -> pd.DataFrame:
    return _sine_power(cluster_frame(hosts=1, gpus=2, duration_s=3600))


def test_counter_energy_matches_integral_of_power_within_1pct(known_power: pd.DataFrame) -> None:
    s = analyze(known_power, now_ns=T0_NS + 3600 * NS)
    for _, row in s.energy_by_gpu.iterrows():
        truth = _true_integral_j(known_power, row["uuid"])
        assert row["energy_j"] == pytest.approx(truth, rel=0.01)
        assert row["energy_quality"] == Quality.MEASURED_COUNTER.value


def test_rollups_lose_no_energy(known_power: pd.DataFrame) -> None:
    s = analyze(rollup(known_power), now_ns=T0_NS + 3600 * NS)
    for _, row in s.energy_by_gpu.iterrows():
        truth = _true_integral_j(known_power, row["uuid"])
        assert row["energy_j"] == pytest.approx(truth, rel=0.01)


def test_power_integration_fallback_is_flagged(known_power: pd.DataFrame) -> None:
    s = analyze(known_power.drop(columns=["energy_j"]), now_ns=T0_NS + 3600 * NS)
    for _, row in s.energy_by_gpu.iterrows():
        truth = _true_integral_j(known_power, row["uuid"])
        assert row["energy_j"] == pytest.approx(truth, rel=0.01)
        assert row["energy_quality"] == Quality.INTEGRATED_POWER.value
        assert "power integrated" in row["energy_reason"]
    assert s.cluster["energy_kwh"].quality is Quality.INTEGRATED_POWER


def test_counter_reset_mid_run_is_handled(known_power: pd.DataFrame) -> None:
    f = known_power.copy()
    uuid = f["uuid"].iloc[0]
    mine = f["uuid"] == uuid
    reset_at = T0_NS + 1800 * NS
    after = mine & (f["time_ns"] >= reset_at)
    # the driver reloads: the counter restarts from zero and counts on
    first_after = f.loc[after, "energy_j"].iloc[0]
    prev = f.loc[mine & (f["time_ns"] < reset_at), "energy_j"].iloc[-1]
    f.loc[after, "energy_j"] = f.loc[after, "energy_j"] - first_after + (first_after - prev)
    assert (f.loc[after, "energy_j"] < prev).all()
    s = analyze(f, now_ns=T0_NS + 3600 * NS)
    row = s.energy_by_gpu.set_index("uuid").loc[uuid]
    assert row["energy_j"] == pytest.approx(_true_integral_j(known_power, uuid), rel=0.01)
    assert row["energy_quality"] == Quality.MEASURED_COUNTER.value


def test_kwh_cost_and_co2_follow_price_and_intensity() -> None:
    # 1 GPU at a constant 1000 W for one hour = 1 kWh
    f = cluster_frame(hosts=1, gpus=1, duration_s=3601, util_pct=100.0, power_w=1000.0)
    f = with_energy_counter(f.assign(power_w=1000.0))
    s = analyze(
        f, now_ns=T0_NS + 3601 * NS, price_per_kwh=0.25, carbon_g_per_kwh=400.0, currency="EUR"
    )
    kwh = s.cluster["energy_kwh"].value
    assert kwh == pytest.approx(1.0, rel=1e-3)
    assert s.cluster["cost"].value == pytest.approx(0.25 * kwh)
    assert s.cluster["cost"].unit == "EUR"
    assert s.cluster["co2_kg"].value == pytest.approx(0.4 * kwh)
    row = s.energy_by_gpu.iloc[0]
    assert row["cost"] == pytest.approx(0.25 * row["energy_kwh"])
    assert row["co2_kg"] == pytest.approx(0.4 * row["energy_kwh"])


def test_cost_absent_without_a_price() -> None:
    s = analyze(cluster_frame(hosts=1, gpus=1, duration_s=120), now_ns=T0_NS + 120 * NS)
    assert s.cluster["cost"].value is None
    assert "price" in s.cluster["cost"].reason
    assert s.cluster["co2_kg"].value is None


def test_energy_of_idle_gpus_is_counted_apart() -> None:
    f = cluster_frame(hosts=1, gpus=4, duration_s=600, util_pct=[95, 95, 95, 0])
    s = analyze(f, now_ns=T0_NS + 600 * NS)
    by = s.energy_by_gpu.set_index("gpu_index")
    assert by.loc[3, "idle_energy_j"] == pytest.approx(by.loc[3, "energy_j"], rel=0.01)
    assert by.loc[0, "idle_energy_j"] == 0
    idle_kwh = by.loc[3, "energy_j"] / 3.6e6
    assert s.cluster["idle_energy_kwh"].value == pytest.approx(idle_kwh, rel=0.01)


def test_gpu_without_any_energy_data_is_not_available() -> None:
    f = cluster_frame(hosts=1, gpus=2, duration_s=300).drop(columns=["energy_j", "power_w"])
    s = analyze(f, now_ns=T0_NS + 300 * NS)
    assert (s.energy_by_gpu["energy_quality"] == Quality.NOT_AVAILABLE.value).all()
    assert s.energy_by_gpu["energy_j"].isna().all()
    assert s.cluster["energy_kwh"].value is None


def test_an_impossible_counter_rise_or_a_step_back_is_not_energy(
    known_power: pd.DataFrame,
) -> None:
    """A second writer's counter interleaved with the GPU's own (rows 10x the true counter) and
    a counter that jumps back: the deltas between the two are no energy; the energy stays
    within 1 % of the power integral (the few intervals cut are filled from power)."""
    f = known_power.copy()
    uuid = f["uuid"].iloc[0]
    mine = (f["uuid"] == uuid).to_numpy()
    idx = np.flatnonzero(mine)
    f.loc[f.index[idx[100:103]], "energy_j"] *= 10.0  # a conflicting writer's counter
    f.loc[f.index[idx[200:]], "energy_j"] -= 5e5  # a step back, then counting on
    s = analyze(f, now_ns=T0_NS + 3600 * NS)
    row = s.energy_by_gpu.set_index("uuid").loc[uuid]
    assert row["energy_j"] == pytest.approx(_true_integral_j(known_power, uuid), rel=0.01)


def test_energy_across_a_collector_gap_counts_only_the_seen_time(
    known_power: pd.DataFrame,
) -> None:
    """Docs/accounting.md rule 3: a counter delta over a gap longer than three sampling steps
    ends the run; the unseen time is not energy."""
    f = known_power.copy()
    gap = (f["time_ns"] >= T0_NS + 1000 * NS) & (f["time_ns"] < T0_NS + 2000 * NS)
    s = analyze(f.loc[~gap], now_ns=T0_NS + 3600 * NS)
    for _, row in s.energy_by_gpu.iterrows():
        seen = f.loc[~gap & (f["uuid"] == row["uuid"])]
        before = _true_integral_j(seen.loc[seen["time_ns"] < T0_NS + 1000 * NS], row["uuid"])
        after = _true_integral_j(seen.loc[seen["time_ns"] >= T0_NS + 2000 * NS], row["uuid"])
        assert row["energy_j"] == pytest.approx(before + after, rel=0.01)
