"""Quality labels tell the truth (docs/accounting.md, "Quality labels"): each figure's label
follows from how it was computed, and the dashboard has a badge for every label."""

from __future__ import annotations

import pandas as pd
import pytest
from test_analytics_stragglers import NOW, _sync_thermal
from test_analytics_support import with_energy_counter

from gpuwatt.analytics import Quality, analyze
from gpuwatt.dashboard.components import QUALITY_COLOR, QUALITY_SHORT, QUALITY_TEXT
from gpuwatt.dashboard.csv_export import QUALITY_COLUMNS, build_report

NS = 1_000_000_000


def test_energy_waiting_on_stragglers_is_an_estimate_and_energy_a_counter_measurement() -> None:
    frame = with_energy_counter(_sync_thermal())
    s = analyze(frame, now_ns=NOW, window_s=60, price_per_kwh=0.2, carbon_g_per_kwh=300.0)
    c = s.cluster
    # counter deltas: measured, and what is computed from them by a price carries it
    for name in ("energy_kwh", "idle_energy_kwh", "cost", "co2_kg"):
        assert c[name].quality is Quality.MEASURED_COUNTER, name
    # a model over measured inputs (peers' energy x their utilisation gap): an estimate
    waiting = c["peers_waiting_energy_kwh"]
    assert waiting.value is not None and waiting.value > 0
    assert waiting.quality is Quality.MODEL_ESTIMATE
    assert QUALITY_SHORT[waiting.quality.value] == "estimated"
    # without the counter, energy is power integrated over time, and says so
    s = analyze(frame.drop(columns=["energy_j"]), now_ns=NOW, window_s=60)
    assert s.cluster["energy_kwh"].quality is Quality.INTEGRATED_POWER


def test_every_quality_label_has_a_dashboard_badge() -> None:
    shown = {q.value for q in Quality}
    for table in (QUALITY_TEXT, QUALITY_SHORT, QUALITY_COLOR):
        assert shown <= set(table), shown - set(table)


def _three_gpus() -> pd.DataFrame:
    """Ten minutes of three GPUs every 10 s: one with an energy counter and GPM pipe counters,
    one without an energy counter, one of a model the GPU table does not know."""
    rows = []
    for k in range(60):
        t = NOW - 600 * NS + k * 10 * NS
        common = {"time_ns": t, "utilization_gpu_pct": 80.0, "power_w": 400.0}
        rows.append(
            common | {"host": "n", "gpu_index": 0, "uuid": "GPU-a", "name": "H100 SXM",
                      "energy_j": 400.0 * 10 * k, "tensor_hmma_active_pct": 50.0,
                      "sm_clock_mhz": 1980.0}
        )  # fmt: skip
        rows.append(common | {"host": "n", "gpu_index": 1, "uuid": "GPU-b", "name": "H100 SXM"})
        rows.append(
            common
            | {"host": "n", "gpu_index": 2, "uuid": "GPU-c", "name": "X", "energy_j": 4e3 * k}
        )
    return pd.DataFrame(rows)


def test_every_report_figure_carries_the_label_of_how_it_was_computed() -> None:
    s = analyze(_three_gpus(), now_ns=NOW, start_ns=NOW - 600 * NS, price_per_kwh=0.3)
    table = build_report(s, "gpu", alert_counts=lambda by, key: 0 if key == "GPU-a" else None)
    cost_col = next(c for c in table.columns if c.startswith("cost_") and c != "cost_quality")
    for figure, label in QUALITY_COLUMNS.items():
        assert (cost_col if figure == "cost" else figure) in table.columns, figure
        assert label in table.columns, label
    q = table.set_index("uuid")
    valid = {x.value for x in Quality}
    assert set(q[list(QUALITY_COLUMNS.values())].to_numpy().ravel()) <= valid
    # energy: counter deltas, or power x time where there is no counter
    assert q.loc["GPU-a", "energy_quality"] == Quality.MEASURED_COUNTER
    assert q.loc["GPU-b", "energy_quality"] == Quality.INTEGRATED_POWER
    # idle energy and cost are energy figures: its label; CO2 has no intensity configured
    assert (q["idle_energy_quality"] == q["energy_quality"]).all()
    assert (q["cost_quality"] == q["energy_quality"]).all()
    assert (q["co2_quality"] == Quality.NOT_AVAILABLE).all()
    # time seen and utilisation are read as they are
    assert (q["gpu_hours_quality"] == Quality.MEASURED).all()
    assert (q["utilization_quality"] == Quality.MEASURED).all()
    # TFLOPS: GPM pipe activity x peaks; nothing for a model the table does not know
    assert q.loc["GPU-a", "tflops_quality"] == Quality.GPM_ESTIMATE
    assert q.loc["GPU-c", "tflops_quality"] == Quality.NOT_AVAILABLE
    # straggler minutes are the detector's verdict: a model over measured inputs
    assert (q["straggler_minutes_quality"] == Quality.MODEL_ESTIMATE).all()
    # alert counts where the alert history answers
    assert q.loc["GPU-a", "alerts_quality"] == Quality.MEASURED
    assert q.loc["GPU-b", "alerts_quality"] == Quality.NOT_AVAILABLE
    # the cluster's time figures, as the dashboard shows them
    c = s.cluster
    assert c["gpu_hours"].value == pytest.approx(3 * 600 / 3600)
    assert c["gpu_hours"].quality is Quality.MEASURED
    assert c["utilization_pct"].quality is Quality.MEASURED
    assert c["straggler_minutes"].quality is Quality.MODEL_ESTIMATE
    assert c["energy_kwh"].quality is Quality.INTEGRATED_POWER  # one GPU without a counter
