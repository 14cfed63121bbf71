"""gpuwatt on data a cluster already has: dcgm-exporter series in a real Prometheus and a real
VictoriaMetrics, with no gpuwatt collector installed.

The thermal-straggler scenario (16 H100 in one synchronous job; node-1 GPU 5 loses cooling at
5 min) is turned into dcgm-exporter's series (``prom_fixtures``) and backfilled: into Prometheus
with ``promtool tsdb create-blocks-from openmetrics``, into VictoriaMetrics through its Prometheus
import. The CLI's analysis, the dashboard's data layer and the shipped straggler alert rule must
each name node-1 GPU 5 and its thermal cause from that data alone, and the store's bucketed
reads must equal the same buckets computed from the samples themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
from prom_fixtures import PrometheusServer, dcgm_exposition, have_prometheus
from servers import VICTORIA_METRICS, VictoriaMetricsServer, http
from test_cli import gpuwatt

from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.model import GpuSample
from gpuwatt.store import LAST_VALUE_ATTRS, open_store

NS = 1_000_000_000
MINUTES = 20
INTERVAL_S = 10.0


def _span() -> tuple[int, int]:
    """The history's (start, end): it ends a minute before the module's tests run, since the CLI
    and the alert rule analyse "the last N minutes". Computed when the data is built, not when
    the suite is collected (a long suite would leave it behind)."""
    end = (time.time_ns() // (60 * NS)) * 60 * NS - 60 * NS
    return end - MINUTES * 60 * NS, end


pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(not have_prometheus(), reason="needs Debian's prometheus (make test-deps)"),
]


@pytest.fixture(scope="module")
def span() -> tuple[int, int]:
    return _span()


@pytest.fixture(scope="module")
def samples(span: tuple[int, int]) -> list[GpuSample]:
    start_ns, end_ns = span
    source = SimulatedClusterSource(
        load_scenario("thermal_straggler"), start_ns=start_ns, clock_ns=lambda: end_ns
    )
    source.open()
    try:
        out = [
            s
            for batch in source.backfill(end_ns, interval_s=INTERVAL_S, slow_interval_s=60.0)
            for s in batch
        ]
    finally:
        source.close()
    return out


@pytest.fixture(scope="module")
def prometheus(samples: list[GpuSample]) -> Iterator[str]:
    server = PrometheusServer(dcgm_exposition(samples, openmetrics=True))
    try:
        yield server.url.replace("http://", "prometheus://") + "?source=dcgm"
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def victoria(samples: list[GpuSample]) -> Iterator[str]:
    import shutil

    if shutil.which(VICTORIA_METRICS) is None:
        pytest.skip("needs Debian's victoria-metrics")
    server = VictoriaMetricsServer()
    server.start()
    try:
        body = dcgm_exposition(samples, openmetrics=False).encode()
        status, answer = http("POST", f"{server.url}/api/v1/import/prometheus", data=body)
        assert status in (200, 204), answer[:300]
        server.force_flush()
        yield server.url.replace("http://", "victoriametrics://") + "?source=dcgm"
    finally:
        server.cleanup()


@pytest.fixture(params=["prometheus", "victoria"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


FIELDS = (
    "power_w",
    "sm_clock_mhz",
    "utilization_gpu_pct",
    "energy_j",
    "memory_used_bytes",
    "tensor_active_pct",
    "clock_event_reasons",
)


def _reference(samples: list[GpuSample], start_ns: int, end_ns: int, step_s: int) -> pd.DataFrame:
    """The store contract's buckets computed from the samples: gauge means, last values."""
    rows = [
        {"uuid": s.uuid, "time_ns": s.time_ns, **{f: getattr(s, f) for f in FIELDS}}
        for s in samples
        if start_ns <= s.time_ns < end_ns and not s.lost
    ]
    df = pd.DataFrame(rows).astype({f: float for f in FIELDS})
    df["bucket"] = df["time_ns"] // (step_s * NS) * (step_s * NS)
    # a bucket cut by the range's start is keyed at the start (docs/accounting.md, rule 4)
    df["bucket"] = df["bucket"].clip(lower=start_ns)
    df = df.sort_values("time_ns")
    agg = {f: ("last" if f in LAST_VALUE_ATTRS else "mean") for f in FIELDS}
    return df.groupby(["bucket", "uuid"]).agg(agg)


def test_bucketed_reads_equal_the_samples_buckets(
    store_url: str, samples: list[GpuSample], span: tuple[int, int]
) -> None:
    start_ns, _ = span
    # A range that starts and ends between minute boundaries: partial buckets at both edges.
    start = start_ns + 7 * 60 * NS + 29 * NS
    end = start_ns + 17 * 60 * NS + 41 * NS
    with open_store(store_url) as store:
        df = store.series(start, end, FIELDS, step_s=60)
        raw = store.series(start, end, ["power_w"])
    want = _reference(samples, start, end, 60)
    got = df.set_index(["time_ns", "uuid"])[list(FIELDS)].sort_index()
    got.index.names = ["bucket", "uuid"]
    assert list(got.index) == list(want.index)
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-9, equal_nan=True)
    assert set(df["host"]) == {"node-0", "node-1"} and set(df["name"]) == {"NVIDIA H100 80GB HBM3"}
    in_range = [s for s in samples if start <= s.time_ns < end and not s.lost]
    assert len(raw) == len(in_range)


def test_cli_analysis_names_the_straggler_and_its_cause(store_url: str, tmp_path: Any) -> None:
    result = gpuwatt("analyze", "--store", store_url, "--since", "25m", home=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "node-1" in line and "GPU 5" in line]
    assert lines, result.stdout
    assert any("thermal" in line for line in lines), result.stdout


def test_dashboard_data_and_the_alert_rule_find_it(store_url: str) -> None:
    from gpuwatt.alerts.evaluate import evaluate_rule
    from gpuwatt.alerts.rules import load_rules
    from gpuwatt.dashboard.data import DashboardData
    from gpuwatt.dashboard.timerange import parse_range

    now = time.time_ns()
    with open_store(store_url) as store:
        data = DashboardData(store, clock_ns=lambda: now)
        try:
            tr, _ = parse_range({"from": str((now - 30 * 60 * NS) // NS)}, now)
            window = data.window(tr)
        finally:
            data.close()
        found = {(s.host, s.gpu_index, s.cause) for s in window.stragglers}
        assert ("node-1", 5, "thermal") in found, found
        assert window.jobs.get(next(s.uuid for s in window.stragglers)) == "llm-train"

        (rule,) = [r for r in load_rules() if r.name == "GpuStraggler"]
        observations = evaluate_rule(rule, store, now)
    firing = [o.target for o in observations if o.breach]
    assert [(t["host"], t["gpu"]) for t in firing] == [("node-1", "5")]


@pytest.mark.parametrize("engine", ["victoriametrics", "prometheus"])
def test_a_job_change_inside_a_bucket_keeps_the_bucket_whole(
    engine: str, request: pytest.FixtureRequest, make_sample: Any
) -> None:
    """dcgm-exporter names the job on every series (``hpc_job``): a GPU that changed jobs has a
    series per job, and a bucket takes all of them (gauges' sums and counts added up, the
    energy counter's newest value), as it does on every other store."""
    from prom_fixtures import dcgm_store_url

    t0 = (time.time_ns() // (3600 * NS) - 2) * 3600 * NS  # within Prometheus' retention
    samples = [
        make_sample(
            t0 + i * 10 * NS, "node1", 0, job_id="job-y" if i < 3 else "job-b",
            power_w=100.0 + i, xid_errors=(), processes=None,
        )
        for i in range(6)
    ]  # fmt: skip
    vm = request.getfixturevalue("victoria_metrics") if engine == "victoriametrics" else None
    with dcgm_store_url(engine, samples, vm) as url, open_store(url) as store:
        df = store.series(t0, t0 + 60 * NS, ["power_w", "energy_j"], step_s=60)
    assert len(df) == 1
    assert df["power_w"].iloc[0] == pytest.approx(102.5)
    assert df["energy_j"].iloc[0] == pytest.approx(samples[-1].energy_j)
