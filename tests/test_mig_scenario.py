"""The MIG scenario end to end: every MIG device sampled, attributed to its job, and shown.

The shipped ``mig_partitioned`` scenario runs through the fake NVML and the real sampler into
the embedded store; ``gpuwatt status``'s table, the dashboard's data layer and the per-GPU and
per-job reports are built from what the store returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly.utils
import pytest

from gpuwatt.collector.sim.mig_scenario import MIG_PROFILES
from gpuwatt.collector.sim.scenario import load_scenario, load_scenario_text
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.dashboard.app import PAGES, render_page
from gpuwatt.dashboard.csv_export import build_report
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.pages import node, overview
from gpuwatt.dashboard.timerange import parse_range
from gpuwatt.errors import ConfigError
from gpuwatt.mig import is_mig_device, mig_profile, parents
from gpuwatt.model import GpuSample
from gpuwatt.status import render_status, summary_line
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
END_NS = 1_767_225_600 * NS + 30 * 60 * NS
MINUTES = 30


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimulatedClusterSource, SqliteStore]:
    """30 minutes of the scenario at 5-s ticks, written to a fresh embedded store."""
    path = tmp_path_factory.mktemp("mig") / "gpuwatt.db"
    scenario = load_scenario("mig_partitioned")
    source = SimulatedClusterSource(
        scenario, start_ns=END_NS - MINUTES * 60 * NS, clock_ns=lambda: END_NS
    )
    source.open()
    store = SqliteStore(Path(path))
    for batch in source.backfill(END_NS, interval_s=5.0, slow_interval_s=60.0):
        store.write_samples(batch)
        _check_batch(source, batch)
    source.close()
    store.flush_rollups()
    return source, store


def _check_batch(source: SimulatedClusterSource, batch: list[GpuSample]) -> None:
    """Every MIG device of the plan is in every batch, under its parent, with its job."""
    plan = source.scenario.mig
    t_s = (batch[0].time_ns - source.start_ns) / NS
    by_parent = {(s.host, s.gpu_index): s for s in batch if not is_mig_device(s)}
    migs = [s for s in batch if is_mig_device(s)]
    assert len(migs) == sum(len(g.profiles) for g in plan.gpus) == 15
    for spec in plan.gpus:
        parent = by_parent[spec.gpu]
        assert parent.mig_enabled is True and parent.job_id is None
        mine = [s for s in migs if s.parent_uuid == parent.uuid]
        assert [mig_profile(s.name) for s in mine] == list(spec.profiles)
        for k, s in enumerate(mine):
            assert (s.host, s.gpu_index, s.gpu_instance_id) == (*spec.gpu, k + 1)
            job = plan.job_at((*spec.gpu, k), t_s)
            assert s.job_id == (job.id if job is not None else None)
            assert s.memory_total_bytes == MIG_PROFILES[spec.profiles[k]][1] * 1024**2
            if job is None:
                assert s.processes == () and s.memory_used_bytes == 0
            else:
                assert s.memory_used_bytes == round(job.memory_gib * 1024**3)
                assert s.processes is not None and len(s.processes) == 1


def test_every_mig_device_is_sampled_with_its_job_in_every_tick(
    run: tuple[SimulatedClusterSource, SqliteStore],
) -> None:
    source, _ = run  # the checks ran on each batch as it was written
    assert source.scenario.mig.jobs


def test_gpm_activity_and_tflops_follow_each_devices_job(
    run: tuple[SimulatedClusterSource, SqliteStore],
) -> None:
    _, store = run
    latest = {s.uuid: s for s in store.latest()}
    by_job: dict[str | None, list[GpuSample]] = {}
    for s in latest.values():
        if is_mig_device(s):
            by_job.setdefault(s.job_id, []).append(s)
    idle = by_job.pop(None)
    assert len(idle) == 2 and all(s.tflops_estimate == 0.0 for s in idle)
    big = by_job["llm-finetune-small"][0]  # 3g.40gb, load 0.9, intensity 0.8
    small = by_job["chat-replicas"][0]  # 1g.10gb, load 0.7, intensity 0.6
    assert big.utilization_gpu_pct == pytest.approx(90.0, abs=0.5)  # its job's load
    assert all(s.utilization_gpu_pct == 0.0 for s in idle)
    assert big.tensor_hmma_active_pct == pytest.approx(72.0, abs=0.5)
    assert small.tensor_hmma_active_pct == pytest.approx(42.0, abs=0.5)
    assert big.tflops_estimate is not None and small.tflops_estimate is not None
    assert big.tflops_estimate > 4 * small.tflops_estimate > 0
    # the whole GPU's facts stay on the parent, and the store keeps the MIG device apart
    parent = latest[parents(store.latest())[big.uuid]]
    assert parent.power_w is not None and big.power_w is None
    assert parent.memory_used_bytes is not None and big.memory_used_bytes is not None
    assert parent.memory_used_bytes >= big.memory_used_bytes


def test_status_shows_each_mig_device_under_its_parent_with_its_job(
    run: tuple[SimulatedClusterSource, SqliteStore],
) -> None:
    _, store = run
    text = render_status(store.latest(), now_ns=END_NS)
    lines = text.splitlines()
    assert lines[-1] == "8 GPUs and 15 MIG devices, 0 lost, 0 stale, 0 throttled, 0 hot, 23 ok"
    node1 = [line for line in lines if line.startswith("node-1 ")]
    assert "NVIDIA H100 80GB HBM3" in node1[0]
    assert all("MIG 1g.10gb" in line for line in node1[1:8])
    assert sum("chat-replica" in line for line in node1[1:8]) == 6
    assert "llm-pretrain" in node1[8]
    line = summary_line(store.latest())  # the demo's live line
    assert "8/8 GPUs up (+15 MIG)" in line


def test_dashboard_data_and_reports_show_mig_devices_as_devices_with_parents(
    run: tuple[SimulatedClusterSource, SqliteStore],
) -> None:
    _, store = run
    data = DashboardData(store, clock_ns=lambda: END_NS)
    tr, problem = parse_range({"range": "15m"}, END_NS)
    assert problem is None
    window = data.window(tr)
    counts = window.counts(data.latest(), END_NS)
    assert (counts.total, counts.up, counts.mig_devices) == (8, 8, 15)
    assert len(window.gpus) == 8 + 15
    mig_parents = parents(data.latest())
    assert len(mig_parents) == 15 and len(set(mig_parents.values())) == 3
    by_gpu = build_report(window.summary, "gpu")
    migs = by_gpu.loc[by_gpu["uuid"].str.startswith("MIG-")]
    assert len(migs) == 15
    assert set(migs["job_id"].dropna()) == {
        "llm-finetune-small",
        "embeddings",
        "notebook-b",
        "ci-tests",
        "chat-replicas",
    }
    jobs = build_report(window.summary, "job").set_index("job_id")
    assert jobs.loc["chat-replicas", ["gpus", "mig_devices"]].tolist() == [0, 6]
    assert jobs.loc["chat-replicas", "utilization_mean_pct"] == pytest.approx(70.0, abs=1.0)
    assert jobs.loc["llm-pretrain", "gpus"] == 5


BASE = """
name: t
cluster: {nodes: 1, gpus_per_node: 2, model: H100 SXM}
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("mig: [{gpus: 'node-0:0', instances: [4g.40gb, 4g.40gb]}]", "need 8 compute slices"),
        ("mig: [{gpus: 'node-0:0', instances: [5g.50gb]}]", "5g.50gb"),
        (
            "mig: [{gpus: 'node-0:0', instances: [1g.10gb]}]\n"
            "jobs: [{id: a, kind: training, gpus: 'node-0:0'}]",
            "runs on the whole GPU",
        ),
        (
            "mig: [{gpus: 'node-0:0', instances: [1g.10gb]}]\n"
            "mig_jobs: [{id: a, instances: ['node-0:1/0']}]",
            "not in MIG mode",
        ),
        (
            "mig: [{gpus: 'node-0:0', instances: [1g.10gb]}]\n"
            "mig_jobs: [{id: a, instances: ['node-0:0/1']}]",
            "MIG devices 0-0",
        ),
        (
            "mig: [{gpus: 'node-0:0', instances: [1g.10gb]}]\n"
            "mig_jobs: [{id: a, instances: ['node-0:0/0'], memory_gib: 12}]",
            "more than 1g.10gb has",
        ),
        (
            "mig: [{gpus: 'node-0:0', instances: [1g.10gb]}]\n"
            "mig_jobs: [{id: a, instances: ['node-0:0/0']}, {id: b, instances: ['node-0:0/0']}]",
            "already in job 'a'",
        ),
    ],
)
def test_bad_mig_sections_point_at_the_problem(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_scenario_text(BASE + extra)


def test_a_model_without_mig_is_refused() -> None:
    text = "name: t\ncluster: {nodes: 1, gpus_per_node: 1, model: L4}\n"
    text += "mig: [{gpus: 'node-0:0', instances: [1g.10gb]}]\n"
    with pytest.raises(ConfigError, match="not simulated in MIG mode"):
        load_scenario_text(text)


def test_gpuwatt_demo_on_the_mig_scenario_then_status(tmp_path: Path) -> None:
    from test_cli import gpuwatt

    demo = gpuwatt(
        "demo", "--scenario", "mig_partitioned", "--backfill", "60", "--duration", "2",
        home=tmp_path,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    status = gpuwatt("status", home=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "8 GPUs and 15 MIG devices, 0 lost" in status.stdout
    rows = [line for line in status.stdout.splitlines() if "  MIG " in line]
    assert len(rows) == 15 and sum("chat-replica" in r for r in rows) == 6


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.PAGE)
def test_every_dashboard_page_renders_with_mig_devices(
    page: Any, run: tuple[SimulatedClusterSource, SqliteStore]
) -> None:
    _, store = run
    data = DashboardData(store, clock_ns=lambda: END_NS)
    out = render_page(page, {"range": "15m", "host": "node-0", "gpu": "0"}, data)
    text = json.dumps(out, cls=plotly.utils.PlotlyJSONEncoder)
    assert "error-state" not in text and "empty-state" not in text
    if page is overview:
        assert "8 / 8 (+15 MIG)" in text  # GPUs up, MIG devices counted with their GPUs


def test_the_node_page_lists_each_process_once_under_its_mig_device(
    run: tuple[SimulatedClusterSource, SqliteStore],
) -> None:
    _, store = run
    data = DashboardData(store, clock_ns=lambda: END_NS)
    text = json.dumps(
        render_page(node, {"range": "15m", "host": "node-1"}, data),
        cls=plotly.utils.PlotlyJSONEncoder,
    )
    assert text.count("GPU 0 MIG 1g.10gb") == 6  # the six chat replicas, not their parent too
    assert text.count("chat-replicas") >= 6


def test_the_shipped_alert_rules_evaluate_cleanly_and_stay_quiet_on_the_mig_scenario(
    tmp_path: Path,
) -> None:
    from test_alerts_helpers import drive

    from gpuwatt.alerts.clock import ManualClock
    from gpuwatt.alerts.db import open_db
    from gpuwatt.alerts.rules import load_rules
    from gpuwatt.alerts.service import Evaluator

    t0 = END_NS - MINUTES * 60 * NS
    source = SimulatedClusterSource(load_scenario("mig_partitioned"), start_ns=t0)
    source.open()
    clock = ManualClock(t0)
    con = open_db(tmp_path / "alerts.db")
    errors: dict[str, str] = {}
    try:
        with SqliteStore(tmp_path / "store.db") as store:
            ev = Evaluator(load_rules(), store, con, channels={}, routes=[], clock=clock)
            for _ in drive(ev, source, store, clock, from_s=0, until_s=300):
                errors.update(ev.evaluate().errors)
            alerts = ev.alerts.all()
    finally:
        con.close()
        source.close()
    assert errors == {} and not alerts
