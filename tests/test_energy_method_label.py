"""A GPU without NVML's energy counter (pre-Volta) has its power integrated by the collector into
``energy_j``, and its samples say so (``energy_method: integrated``). Its energy is labelled
"integrated power", not "measured counter", on every store (the embedded store, InfluxDB and
VictoriaMetrics with their rollups; Debian's servers on 127.0.0.1) and by every reader: the CLI's
and the alert evaluator's input (``read_analysis_input``), the dashboard's views (raw and 1-minute
reads) and its "Energy today". Store reads carry no method (a bucket has none): it is the GPU's,
from its newest sample, as its job is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from loaded_stores import store_fixture

from gpuwatt.analytics import Quality, analyze
from gpuwatt.analytics.inputs import read_analysis_input
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.timerange import parse_range
from gpuwatt.model import EnergyMethod, GpuSample

NS = 1_000_000_000
START_NS = 1_767_225_600 * NS + 3600 * NS
END_NS = START_NS + 40 * 60 * NS


def samples(make_sample: Callable[..., GpuSample]) -> list[GpuSample]:
    """40 minutes of 10-s samples: GPU 0 with a counter, GPU 1 with its power integrated."""
    out = []
    for k in range(240):
        t = START_NS + k * 10 * NS
        for g, method in ((0, EnergyMethod.COUNTER), (1, EnergyMethod.INTEGRATED)):
            out.append(
                make_sample(
                    t, "node1", g, energy_j=1.0e6 + 600.25 * 10 * k, energy_method=method,
                    xid_errors=(), processes=None, job_id="train",
                )
            )  # fmt: skip
    return out


store = store_fixture(samples, rolled=(START_NS, END_NS), now_ns=END_NS)


def qualities(summary: Any) -> dict[int, str]:
    eg = summary.energy_by_gpu
    return dict(zip(eg["gpu_index"].astype(int), eg["energy_quality"], strict=True))


WANT = {0: Quality.MEASURED_COUNTER.value, 1: Quality.INTEGRATED_POWER.value}


@pytest.mark.parametrize("minutes", [20, 40])  # raw samples; 1-minute rollups (>= 30 min)
def test_the_cli_and_alerts_input_labels_integrated_energy(store: Any, minutes: int) -> None:
    data = read_analysis_input(store, END_NS - minutes * 60 * NS, END_NS)
    summary = analyze(
        data.frame, now_ns=END_NS, start_ns=END_NS - minutes * 60 * NS, window_s=60.0,
        jobs=data.jobs, step_s=data.step_s,
    )  # fmt: skip
    assert qualities(summary) == WANT
    assert summary.cluster["energy_kwh"].quality is Quality.INTEGRATED_POWER  # the worst


def test_the_dashboard_labels_integrated_energy(store: Any) -> None:
    data = DashboardData(store, clock_ns=lambda: END_NS)
    try:
        for query in ({"range": "15m"}, {"range": "1h"}):
            window = data.window(parse_range(query, END_NS)[0])
            assert qualities(window.summary) == WANT, query
        today = data.energy_today(END_NS)
        assert today.cluster["energy_kwh"].quality is Quality.INTEGRATED_POWER
    finally:
        data.close()
