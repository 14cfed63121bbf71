"""Load balance indices and idle / idle-allocated GPUs."""

from __future__ import annotations

import numpy as np
import pytest
from test_analytics_support import NS, T0_NS, cluster_frame

from gpuwatt.analytics import analyze
from gpuwatt.analytics.balance import DEFAULT_INDEX

NOW = T0_NS + 600 * NS


def _noiseless(util: list[float], jobs: list[str | None] | None = None):
    f = cluster_frame(hosts=1, gpus=len(util), duration_s=600, util_pct=util, jobs=jobs)
    f["utilization_gpu_pct"] = f["gpu_index"].map(dict(enumerate(util))).astype(float)
    return f


def test_indices_arithmetic() -> None:
    util = [100.0, 50.0, 50.0, 0.0]
    s = analyze(_noiseless(util), now_ns=NOW)
    b = s.balance
    row = b.loc[
        (b["scope"] == "cluster") & (b["level"] == "gpu") & (b["metric"] == "utilization_gpu_pct")
    ].iloc[-1]
    x = np.array(util)
    assert row["mean"] == pytest.approx(50.0)
    assert row["cv"] == pytest.approx(x.std() / x.mean())
    assert row["max_over_mean"] == pytest.approx(2.0)
    assert row["jain"] == pytest.approx(x.sum() ** 2 / (4 * (x**2).sum()))
    assert row["jain"] == pytest.approx(1 / (1 + row["cv"] ** 2))  # same information as CV
    assert DEFAULT_INDEX == "cv" == s.default_imbalance_index


def test_even_load_has_zero_cv_and_jain_one() -> None:
    s = analyze(_noiseless([80.0] * 4), now_ns=NOW)
    series = s.imbalance("cluster")
    assert np.allclose(series.to_numpy(), 0.0)
    assert np.allclose(s.imbalance("cluster", index="jain").to_numpy(), 1.0)
    assert len(series) == 10  # one value per 60-s window


def test_per_job_and_node_scopes() -> None:
    f = cluster_frame(hosts=2, gpus=2, duration_s=600, jobs=["a", "a", "b", "b"])
    s = analyze(f, now_ns=NOW)
    assert set(s.balance["scope"]) == {"cluster", "job:a", "job:b"}
    node = s.balance.loc[(s.balance["level"] == "node") & (s.balance["scope"] == "cluster")]
    assert (node["n"] == 2).all()
    assert s.jobs == ["a", "b"]


def test_idle_allocated_gpu_is_reported_with_evidence() -> None:
    util = [95.0, 95.0, 95.0, 0.0]
    f = _noiseless(util, jobs=["j1"] * 4)
    s = analyze(f, now_ns=NOW)
    assert [(i.gpu_index, i.job_id, i.allocated) for i in s.idle] == [(3, "j1", True)]
    idle = s.idle_allocated[0]
    assert idle.memory_used_bytes == pytest.approx(40 * 2**30)
    assert idle.idle_windows == 10
    assert idle.idle_energy_j is not None and idle.idle_energy_j > 0
    assert "allocated to job j1" in idle.explanation and "holds 40.0 GiB" in idle.explanation
    assert s.stragglers == []


def test_unallocated_idle_gpu_is_not_an_error() -> None:
    f = _noiseless([95.0, 0.0], jobs=["j1", None])
    s = analyze(f, now_ns=NOW)
    assert [(i.gpu_index, i.allocated, i.job_id) for i in s.idle] == [(1, False, None)]
    assert s.idle_allocated == []


def test_idle_must_persist() -> None:
    f = _noiseless([95.0, 95.0], jobs=["j1", "j1"])
    late = (f["gpu_index"] == 1) & (f["time_ns"] >= T0_NS + 480 * NS)
    f.loc[late, "utilization_gpu_pct"] = 0.0  # idle for the last 2 windows only
    assert analyze(f, now_ns=NOW).idle == []
    assert len(analyze(f, now_ns=NOW, idle_windows=2).idle) == 1


def test_jobs_mapping_and_job_filter() -> None:
    f = cluster_frame(hosts=1, gpus=4, duration_s=600).drop(columns=["job_id"])
    jobs = {"GPU-00-00": "x", "GPU-00-01": "x", "GPU-00-02": "y"}
    s = analyze(f, now_ns=NOW, jobs=jobs)
    assert s.jobs == ["x", "y"]
    only = analyze(f, now_ns=NOW, jobs=jobs, job="x")
    assert only.gpus == 2
