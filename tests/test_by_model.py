"""Heterogeneous clusters: the per-model comparison on the ``three_models`` scenario.

Simulator (H100 SXM, A100 SXM and L40S nodes, each running the same kind of training job that
reports its steps) -> fake NVML -> sampler -> SqliteStore -> analyze -> ``by_model``; and the
same through ``gpuwatt report --by model``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pandas as pd
import pytest

from gpuwatt.analytics import ANALYSIS_FIELDS, AnalysisSummary, analyze
from gpuwatt.analytics.by_model import COLUMNS, by_model, most_work_per_watt
from gpuwatt.cli.dashboard import add_report_parser
from gpuwatt.collector.sim.scenario import Scenario, load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.collector.sim.work import SimulatedWorkReporter
from gpuwatt.dashboard.csv_export import build_report
from gpuwatt.gpu_specs import SPECS
from gpuwatt.job_step_format import JobStep, job_steps_frame
from gpuwatt.store.job_steps import open_job_step_store
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
START_NS = 1_767_225_600 * NS  # 2026-01-01T00:00:00Z
SECONDS = 600
MODELS = {"H100 SXM", "A100 SXM", "L40S"}


def _with_jobs(frame: pd.DataFrame, scenario: Scenario) -> pd.DataFrame:
    t_s = (frame["time_ns"] - START_NS) / NS
    return frame.assign(job_id=scenario.job_ids_at(frame["host"], frame["gpu_index"], t_s))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame, pd.DataFrame]:
    """The scenario's first ten minutes in a SQLite store (samples and job steps)."""
    path = tmp_path_factory.mktemp("models") / "store.db"
    scenario = load_scenario("three_models")
    src = SimulatedClusterSource(scenario, start_ns=START_NS, clock_ns=lambda: START_NS)
    reporter = SimulatedWorkReporter(src.simulator, start_ns=START_NS)
    steps: list[JobStep] = []
    src.after_sample = lambda: steps.extend(reporter.poll())
    store = SqliteStore(path)
    src.open()
    try:
        end_ns = START_NS + SECONDS * NS
        for batch in src.backfill(end_ns, interval_s=1.0, slow_interval_s=10.0):
            store.write_samples(batch)
        frame = store.series(START_NS, end_ns, ANALYSIS_FIELDS)
    finally:
        src.close()
        store.close()
    step_store = open_job_step_store(f"sqlite://{path}")
    try:
        step_store.write_job_steps(steps)
    finally:
        step_store.close()
    return path, _with_jobs(frame, scenario), job_steps_frame(steps)


def _summary(frame: pd.DataFrame, steps: pd.DataFrame) -> AnalysisSummary:
    return analyze(frame, now_ns=START_NS + SECONDS * NS, window_s=60, job_steps=steps)


def test_the_per_model_comparison(cluster) -> None:
    _, frame, steps = cluster
    s = _summary(frame, steps)
    assert s.stragglers == [] and s.idle_allocated == []  # three models, no fault: no alarm
    table = by_model(s)
    assert list(table.columns) == list(COLUMNS)
    assert set(table["model"]) == MODELS
    rows = table.set_index("model")
    assert (rows["gpus"] == 4).all()
    assert rows["gpu_hours_h"].to_numpy() == pytest.approx([4 * SECONDS / 3600] * 3)
    # energy: the analytics' own per-GPU figures, summed per model
    per_gpu = s.energy_by_gpu.assign(model=s.energy_by_gpu["name"].map(_model_of_name(frame)))
    want_kwh = per_gpu.groupby("model")["energy_j"].sum() / 3.6e6
    assert rows["energy_kwh"].to_dict() == pytest.approx(want_kwh.to_dict())
    # one truth: the models' GPU-hours and energy add up to the report by GPU's
    by_gpu = build_report(s, "gpu")
    assert rows["gpu_hours_h"].sum() == pytest.approx(by_gpu["gpu_hours_h"].sum(), rel=1e-9)
    assert rows["energy_kwh"].sum() == pytest.approx(by_gpu["energy_kwh"].sum(), rel=1e-9)
    assert set(rows["gpu_hours_quality"]) == {"measured"}
    assert set(rows["energy_quality"]) == set(by_gpu["energy_quality"])
    # reported work per joule: each job's reported TFLOPS over its GPUs' power
    for work in s.job_work:
        model = {"train-h100": "H100 SXM", "train-a100": "A100 SXM", "train-l40s": "L40S"}[
            work.job_id
        ]
        gpus = s.gpu_windows.loc[s.gpu_windows["job_id"] == work.job_id]
        watts = gpus.groupby("window_start_ns")["power_w"].sum().mean()
        assert rows.loc[model, "reported_tflop_per_j"] == pytest.approx(
            work.reported_tflops.value / watts, rel=0.03
        )
    # the ranking is the reported figure's, and the sentence names the winner
    best = rows["reported_tflop_per_j"].idxmax()
    assert table["model"].iloc[0] == best and table["work_per_w_rank"].iloc[0] == 1
    assert most_work_per_watt(table).startswith(f"{best} does the most work per watt")
    # the counter estimate exists where the GPU has GPM counters, and says what it is
    assert rows.loc["H100 SXM", "tflops_quality"] == "gpm_estimate"
    assert rows.loc["H100 SXM", "tflops_per_w"] == pytest.approx(
        rows.loc["H100 SXM", "reported_tflop_per_j"], rel=0.1
    )


def _model_of_name(frame: pd.DataFrame) -> dict[str, str]:
    from gpuwatt.gpu_specs import lookup

    return {n: lookup(n).model for n in frame["name"].unique()}  # type: ignore[union-attr]


def test_an_unknown_model_keeps_every_figure_that_needs_no_peak(cluster) -> None:
    _, frame, steps = cluster
    mystery = frame["name"].str.contains("L40S")
    frame = frame.assign(name=frame["name"].where(~mystery, "NVIDIA Mystery X1"))
    rows = by_model(_summary(frame, steps)).set_index("model")
    row = rows.loc["NVIDIA Mystery X1"]
    assert row["gpus"] == 4 and row["energy_kwh"] > 0 and row["utilization_mean_pct"] > 50
    assert row["power_mean_w"] > 0 and row["reported_tflop_per_j"] > 0  # the job says so
    assert pd.isna(row["peak_tflops_per_w"])  # the one figure that needs the table


def test_without_reported_work_models_of_different_quality_are_not_ranked(cluster) -> None:
    _, frame, _ = cluster
    table = by_model(analyze(frame, now_ns=START_NS + SECONDS * NS, window_s=60))
    assert table["reported_tflop_per_j"].isna().all()
    assert table["work_per_w_rank"].isna().all()  # GPM estimate vs not available
    assert most_work_per_watt(table).startswith("no comparison")


def test_gpuwatt_report_by_model(cluster, tmp_path: Path) -> None:
    path, _, _ = cluster
    p = argparse.ArgumentParser(prog="gpuwatt")
    add_report_parser(p.add_subparsers(dest="command", required=True))
    out = tmp_path / "models.csv"
    args = p.parse_args(
        ["report", "--store", f"sqlite://{path}", "--from", "2026-01-01T00:00:00Z",
         "--to", "2026-01-01T00:10:00Z", "--by", "model", "--out", str(out)]
    )  # fmt: skip
    assert args.func(args) == 0
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert {r["model"] for r in rows} == MODELS
    assert all(float(r["reported_tflop_per_j"]) > 0 for r in rows)  # the job steps were read
    assert rows[0]["work_per_w_rank"] == "1.0"
    assert all(r["model"] in SPECS for r in rows)


def test_the_dashboard_serves_the_per_model_report(cluster) -> None:
    from gpuwatt.dashboard.app import create_app

    path, _, _ = cluster
    store = SqliteStore(path)
    try:
        app = create_app(store, now_ns=START_NS + SECONDS * NS)
        resp = app.server.test_client().get("/download/report.csv?range=10m&by=model")
        assert resp.status_code == 200
        rows = list(csv.DictReader(resp.get_data(as_text=True).splitlines()))
    finally:
        store.close()
    assert {r["model"] for r in rows} == MODELS
    assert all(float(r["energy_kwh"]) > 0 for r in rows)


def test_the_dashboard_data_layer_has_the_per_model_table(cluster) -> None:
    from gpuwatt.dashboard.data import DashboardData
    from gpuwatt.dashboard.timerange import parse_range

    path, _, _ = cluster
    now_ns = START_NS + SECONDS * NS
    tr, problem = parse_range({"range": "10m"}, now_ns)
    assert not problem
    with SqliteStore(path) as store:
        table = DashboardData(store, clock_ns=lambda: now_ns).window(tr).by_model
    assert set(table["model"]) == MODELS and (table["gpus"] == 4).all()
