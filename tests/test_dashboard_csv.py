"""CSV reports: totals equal the analytics engine's, formula cells are neutralised, the route
streams with units in the header and says what is wrong instead of failing."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from test_dashboard_support import DEMO_END_NS, NS, UnreachableStore, build_demo_store

from gpuwatt.analytics import Tariff, analyze
from gpuwatt.analytics.inputs import context_reads, joined
from gpuwatt.config import Config, EnergyConfig
from gpuwatt.dashboard.app import create_app
from gpuwatt.dashboard.csv_export import build_report, neutralise, report_csv
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.timerange import parse_range
from gpuwatt.model import EnergyMethod, GpuSample
from gpuwatt.store.base import series_many
from gpuwatt.store.sqlite import SqliteStore

EVIL = "=cmd|' /C calc'!A0"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> SqliteStore:
    store = build_demo_store(tmp_path_factory.mktemp("csv") / "demo.db", minutes=12)
    yield store
    store.close()


def _parse(chunks: object) -> list[list[str]]:
    return list(csv.reader(io.StringIO("".join(chunks))))  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["=1+1", "+1", "-1+2", "@SUM(A1)", "\tx", "\rx", EVIL])
def test_neutralise_formula_cells(text: str) -> None:
    assert neutralise(text) == "'" + text


def test_neutralise_leaves_plain_text_and_numbers() -> None:
    assert neutralise("node-2") == "node-2"
    assert neutralise(-1.5) == -1.5


def test_report_totals_match_the_analytics_engine(demo_store: SqliteStore) -> None:
    tariff = Tariff(0.25, 400.0, "EUR")
    data = DashboardData(demo_store, clock_ns=lambda: DEMO_END_NS, tariff=tariff)
    tr, problem = parse_range({"range": "10m"}, DEMO_END_NS)
    assert problem is None
    # the engine called directly on the same range and rollups (and the context rows before it)
    reads = context_reads(tr.start_ns, tr.end_ns, tr.step_s, float(tr.step_s))
    frame = joined(series_many(demo_store, reads))
    jobs = {s.uuid: s.job_id for s in demo_store.latest() if s.job_id}
    direct = analyze(
        frame,
        now_ns=tr.end_ns,
        start_ns=tr.start_ns,
        window_s=tr.step_s,
        step_s=tr.step_s,
        jobs=jobs,
        price_per_kwh=0.25,
        carbon_g_per_kwh=400.0,
        currency="EUR",
    )
    summary = data.window(tr).summary
    total_kwh = direct.cluster["energy_kwh"].value
    assert total_kwh and total_kwh > 0
    for by in ("gpu", "node", "job"):
        table = build_report(summary, by)
        rows = _parse(report_csv(table))
        header, body = rows[0], rows[1:]
        assert "energy_kwh" in header and "cost_EUR" in header and "gpu_hours_h" in header
        energy = sum(float(r[header.index("energy_kwh")]) for r in body)
        cost = sum(float(r[header.index("cost_EUR")]) for r in body)
        assert energy == pytest.approx(total_kwh, rel=1e-6)
        assert cost == pytest.approx(direct.cluster["cost"].value, rel=1e-6)
    by_gpu = build_report(summary, "gpu")
    assert len(by_gpu) == 32
    # 32 GPUs seen for the 10 minutes
    assert by_gpu["gpu_hours_h"].sum() == pytest.approx(32 * 10 / 60)
    straggler = by_gpu.loc[(by_gpu["host"] == "node-2") & (by_gpu["gpu_index"] == 5)]
    assert float(straggler["straggler_minutes_min"].iloc[0]) > 0
    assert by_gpu["straggler_minutes_min"].sum() == float(
        straggler["straggler_minutes_min"].iloc[0]
    )
    jobs_table = build_report(summary, "job")
    assert set(jobs_table["job_id"]) == {"llm-pretrain", "chat-serving", "notebook-17"}


def test_malicious_gpu_name_is_neutralised(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "evil.db")
    t0 = DEMO_END_NS - 10 * 60 * NS
    samples = []
    for i in range(10 * 6):
        t = t0 + i * 10 * NS
        for host in ('=HYPERLINK("x")', "node-a"):
            samples.append(
                GpuSample(
                    time_ns=t,
                    host=host,
                    gpu_index=0,
                    uuid=f"GPU-{host}",
                    name=EVIL,
                    utilization_gpu_pct=50.0,
                    power_w=300.0,
                    energy_j=300.0 * i * 10,
                    energy_method=EnergyMethod.COUNTER,
                    sm_clock_mhz=1980.0,
                    temperature_gpu_c=60.0,
                )
            )
    store.write_samples(samples)
    app = create_app(store, now_ns=DEMO_END_NS)
    client = app.server.test_client()
    resp = client.get("/download/report.csv?range=10m&by=gpu")
    assert resp.status_code == 200
    text = resp.get_data(as_text=True)
    assert EVIL not in text.replace("'" + EVIL, "")
    rows = list(csv.reader(io.StringIO(text)))
    names = {r[rows[0].index("name")] for r in rows[1:]}
    hosts = {r[0] for r in rows[1:]}
    assert names == {"'" + EVIL}
    assert '\'=HYPERLINK("x")' in hosts
    # no jobs in this store: the job report is just its header
    jobs = client.get("/download/report.csv?range=10m&by=job").get_data(as_text=True)
    assert jobs.startswith("job_id,gpus,") and len(jobs.splitlines()) == 1
    store.close()


def test_report_route_streams_with_units_in_header(demo_store: SqliteStore) -> None:
    config = Config(energy=EnergyConfig(price_per_kwh=0.3, currency="EUR", carbon_g_per_kwh=300))
    app = create_app(demo_store, now_ns=DEMO_END_NS, config=config)
    client = app.server.test_client()
    resp = client.get("/download/report.csv?range=10m&by=node")
    assert resp.status_code == 200 and resp.is_streamed
    assert resp.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in resp.headers["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(resp.get_data(as_text=True))))
    assert rows[0][:5] == [
        "host",
        "gpus",
        "gpu_hours_h",
        "gpu_hours_quality",
        "utilization_mean_pct",
    ]
    assert "cost_EUR" in rows[0] and "co2_kg" in rows[0]
    assert [r[0] for r in rows[1:]] == ["node-0", "node-1", "node-2", "node-3"]

    series = client.get("/download/series.csv?range=10m&step=60")
    srows = list(csv.reader(io.StringIO(series.get_data(as_text=True))))
    assert srows[0][:3] == ["time_utc", "time_ns", "host"] and "power_w" in srows[0]
    assert len(srows) - 1 == 32 * 10
    raw = client.get("/download/series.csv?range=2m&step=raw")
    assert len(list(csv.reader(io.StringIO(raw.get_data(as_text=True))))) - 1 == 32 * 24


def test_route_errors_are_messages(demo_store: SqliteStore) -> None:
    client = create_app(demo_store, now_ns=DEMO_END_NS).server.test_client()
    bad = client.get("/download/report.csv?range=banana")
    assert bad.status_code == 400 and "not understood" in bad.get_data(as_text=True)
    assert client.get("/download/report.csv?by=rack").status_code == 400
    assert client.get("/download/series.csv?step=7").status_code == 400
    down = create_app(UnreachableStore(), now_ns=DEMO_END_NS).server.test_client()  # type: ignore[arg-type]
    resp = down.get("/download/report.csv")
    assert resp.status_code == 503
    assert "store not reachable" in resp.get_data(as_text=True)
