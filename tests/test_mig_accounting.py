"""MIG devices in the figures (docs/accounting.md, "MIG"): whole GPUs counted once, MIG devices
apart, GPU-hours not counted twice, and each MIG device's energy a model estimate from its
parent's measured energy, the parent's energy being its devices' estimates plus a remainder.

Built from the shipped ``mig_partitioned`` scenario through the fake NVML into the embedded store.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuwatt.analytics import AnalysisSummary, Quality, analyze
from gpuwatt.analytics.by_model import by_model
from gpuwatt.analytics.inputs import read_analysis_input
from gpuwatt.analytics.mig_energy import slice_share
from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.dashboard.csv_export import QUALITY_COLUMNS, build_report
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
END_NS = 1_767_225_600 * NS + 20 * 60 * NS
MINUTES = 20
#: the jobs on MIG devices in the 15 minutes read (notebook-b starts after them)
MIG_JOBS = {"llm-finetune-small", "embeddings", "notebook-a", "ci-tests", "chat-replicas"}


@pytest.fixture(scope="module", params=[None, 60], ids=["raw", "rollups"])
def summary(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AnalysisSummary:
    path = tmp_path_factory.mktemp("mig") / "gpuwatt.db"
    source = SimulatedClusterSource(
        load_scenario("mig_partitioned"),
        start_ns=END_NS - MINUTES * 60 * NS,
        clock_ns=lambda: END_NS,
    )
    source.open()
    store = SqliteStore(Path(path))
    for batch in source.backfill(END_NS, interval_s=5.0, slow_interval_s=60.0):
        store.write_samples(batch)
    source.close()
    store.flush_rollups()
    start_ns = END_NS - 15 * 60 * NS
    inp = read_analysis_input(store, start_ns, END_NS, step_s=request.param)
    store.close()
    return analyze(inp.frame, now_ns=END_NS, start_ns=start_ns, jobs=inp.jobs, step_s=inp.step_s)


def test_whole_gpus_are_counted_once_and_mig_devices_apart(summary: AnalysisSummary) -> None:
    assert (summary.gpus, summary.mig_devices) == (8, 15)
    nodes = summary.energy_by_node.set_index("host")
    assert nodes.loc["node-0", ["gpus", "mig_devices"]].tolist() == [4, 8]
    assert nodes.loc["node-1", ["gpus", "mig_devices"]].tolist() == [4, 7]
    jobs = summary.energy_by_job.set_index("job_id")
    assert jobs.loc["chat-replicas", ["gpus", "mig_devices"]].tolist() == [0, 6]
    assert jobs.loc["llm-pretrain", ["gpus", "mig_devices"]].tolist() == [5, 0]


def test_gpu_hours_of_a_partitioned_gpu_are_not_counted_twice(summary: AnalysisSummary) -> None:
    g = summary.energy_by_gpu
    whole = g.loc[~g["mig"]]
    assert summary.cluster["gpu_hours"].value == pytest.approx(whole["seen_s"].sum() / 3600)
    # a node's GPU time is its whole GPUs' only
    nodes = summary.energy_by_node.set_index("host")
    for host, mine in whole.groupby("host"):
        assert nodes.loc[host, "seen_s"] == pytest.approx(mine["seen_s"].sum())
    # a job on MIG devices has the devices' share of the GPU's time: 6 x 1/7 of the range
    jobs = summary.energy_by_job.set_index("job_id")
    assert jobs.loc["chat-replicas", "seen_s"] == pytest.approx(6 / 7 * 15 * 60, rel=0.02)
    # and no parent's devices hold more GPU time than the parent
    migs = g.loc[g["mig"]]
    for (host, idx), devs in migs.groupby(["host", "gpu_index"]):
        parent = whole.loc[(whole["host"] == host) & (whole["gpu_index"] == idx), "seen_s"]
        assert (devs["seen_s"] * devs["gpu_share"]).sum() <= float(parent.iloc[0]) + 1e-6


def test_mig_devices_get_an_energy_estimate_never_a_measurement(summary: AnalysisSummary) -> None:
    g = summary.energy_by_gpu
    migs = g.loc[g["mig"]]
    busy = migs.loc[migs["job_id"].isin(MIG_JOBS)]
    assert len(busy) == 13
    assert set(busy["energy_quality"]) == {Quality.MODEL_ESTIMATE.value}
    assert (busy["energy_j"] > 0).all()
    assert not set(migs["energy_quality"]) & {"measured", "measured_counter", "integrated_power"}
    jobs = summary.energy_by_job.set_index("job_id")
    for job in MIG_JOBS:
        assert jobs.loc[job, "energy_quality"] == Quality.MODEL_ESTIMATE.value
        assert jobs.loc[job, "energy_j"] > 0
    assert jobs.loc["llm-pretrain", "energy_quality"] != Quality.MODEL_ESTIMATE.value


def test_a_parents_energy_is_its_devices_estimates_plus_its_remainder(
    summary: AnalysisSummary,
) -> None:
    g = summary.energy_by_gpu
    whole, migs = g.loc[~g["mig"]], g.loc[g["mig"]]
    parents = whole.loc[whole["unattributed_energy_j"].notna()]
    assert len(parents) == 3
    for _, p in parents.iterrows():
        devs = migs.loc[(migs["host"] == p["host"]) & (migs["gpu_index"] == p["gpu_index"])]
        split = float(devs["energy_j"].fillna(0.0).sum())
        assert p["energy_j"] == pytest.approx(split + p["unattributed_energy_j"], rel=1e-9)
        assert 0 < split < p["energy_j"] and p["unattributed_energy_j"] > 0
    # the cluster's energy is the whole GPUs' measured energy: the estimates are not added again
    kwh = summary.cluster["energy_kwh"].value
    assert kwh == pytest.approx(whole["energy_j"].sum() / 3.6e6)
    assert whole.loc[whole["unattributed_energy_j"].isna(), "energy_j"].notna().all()


@pytest.mark.parametrize(
    ("name", "share"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 3 / 7),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 1 / 7),
        ("NVIDIA A30 MIG 2g.12gb", 2 / 4),
        ("NVIDIA H100 80GB HBM3", np.nan),
    ],
)
def test_slice_share_from_the_device_name(name: str, share: float) -> None:
    got = slice_share(name)
    assert got == pytest.approx(share, nan_ok=True)


def test_a_frame_without_mig_devices_has_no_mig_columns_set() -> None:
    t = np.arange(0, 600, 5) * NS + END_NS - 600 * NS
    frame = pd.DataFrame(
        {
            "time_ns": np.tile(t, 2),
            "host": "n0",
            "gpu_index": np.repeat([0, 1], len(t)),
            "uuid": np.repeat(["GPU-a", "GPU-b"], len(t)),
            "name": "NVIDIA H100 80GB HBM3",
            "power_w": 300.0,
            "utilization_gpu_pct": 80.0,
        }
    )
    s = analyze(frame, now_ns=END_NS)
    assert (s.gpus, s.mig_devices) == (2, 0)
    assert s.energy_by_node["mig_devices"].tolist() == [0]
    assert s.energy_by_gpu["unattributed_energy_j"].isna().all()


def test_the_report_by_model_counts_a_partitioned_gpu_once(summary: AnalysisSummary) -> None:
    out = by_model(summary)
    assert out["gpus"].sum() == 8
    whole = summary.energy_by_gpu.loc[~summary.energy_by_gpu["mig"]]
    assert out["gpu_hours_h"].sum() == pytest.approx(whole["seen_s"].sum() / 3600)
    assert out["energy_kwh"].sum() == pytest.approx(summary.cluster["energy_kwh"].value)


@pytest.mark.parametrize("by", ["gpu", "node", "job"])
def test_a_report_cell_without_a_figure_is_labelled_not_available(
    summary: AnalysisSummary, by: str
) -> None:
    """MIG devices have a TFLOPS estimate but no power of their own, and parents in MIG mode no
    estimate: an empty cell never carries a measurement's or an estimate's label."""
    table = build_report(summary, by)
    cost_col = next(c for c in table.columns if c.startswith("cost_"))
    checked = 0
    for figure, label in QUALITY_COLUMNS.items():
        column = cost_col if figure == "cost" else figure
        empty = pd.to_numeric(table[column], errors="coerce").isna()
        assert (table.loc[empty, label] == Quality.NOT_AVAILABLE.value).all(), (by, figure)
        checked += int(empty.sum())
    assert checked > 0  # the scenario has empty cells: TFLOPS/W of the MIG devices and parents


def test_a_nodes_tflops_per_watt_from_some_of_its_gpus_is_labelled_an_estimate(
    summary: AnalysisSummary,
) -> None:
    nodes = build_report(summary, "node").set_index("host")
    # node-0: two whole GPUs with a GPM estimate, two parents in MIG mode without one
    assert np.isfinite(nodes.loc["node-0", "tflops_per_w"])
    assert nodes.loc["node-0", "tflops_quality"] == Quality.GPM_ESTIMATE.value
