"""Quality labels tell the truth (docs/accounting.md, "Quality labels"): each figure's label
follows from how it was computed, and the dashboard has a badge for every label."""

from __future__ import annotations

from test_analytics_stragglers import NOW, _sync_thermal
from test_analytics_support import with_energy_counter

from gpuwatt.analytics import Quality, analyze
from gpuwatt.dashboard.components import QUALITY_COLOR, QUALITY_SHORT, QUALITY_TEXT


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
