"""Achieved TFLOPS and TFLOPS/W from GPM pipe activity and the GPU table; absent with a reason."""

from __future__ import annotations

import pytest
from test_analytics_support import A100, NS, T0_NS, cluster_frame

from gpuwatt.analytics import Quality, analyze
from gpuwatt.gpu_specs import SPECS


def test_h100_tflops_from_tensor_activity_and_clock() -> None:
    f = cluster_frame(hosts=1, gpus=2, duration_s=600, util_pct=100.0, power_w=500.0)
    f = f.assign(tensor_hmma_active_pct=50.0, sm_clock_mhz=1500.0, power_w=500.0)
    s = analyze(f, now_ns=T0_NS + 600 * NS, tensor_precision="bf16")
    h100 = SPECS["H100 SXM"]
    expected = 0.5 * h100.bf16_tensor_tflops * 1500.0 / h100.hmma_clock_mhz
    assert expected == pytest.approx(405.5, abs=0.1)  # 989.4 x 0.5 x 1500/1830
    for _, row in s.energy_by_gpu.iterrows():
        assert row["tflops_mean"] == pytest.approx(expected, rel=1e-9)
        assert row["tflops_per_w"] == pytest.approx(expected / 500.0, rel=1e-9)
        assert row["tflops_quality"] == Quality.GPM_ESTIMATE.value
    assert s.cluster["tflops"].value == pytest.approx(2 * expected)
    assert s.cluster["tflops_per_w"].value == pytest.approx(expected / 500.0)
    assert s.cluster["tflops"].quality is Quality.GPM_ESTIMATE
    eff = s.efficiency_over_time
    assert eff["tflops_per_w"].to_numpy() == pytest.approx(expected / 500.0)


def test_precision_picks_the_tensor_peak() -> None:
    f = cluster_frame(hosts=1, gpus=1, duration_s=120).assign(
        tensor_hmma_active_pct=50.0,
        sm_clock_mhz=1830.0,  # the clock H100's tensor peaks are at
    )
    s = analyze(f, now_ns=T0_NS + 120 * NS, tensor_precision="fp8")
    assert s.energy_by_gpu["tflops_mean"].iloc[0] == pytest.approx(0.5 * 1978.9)


def test_collector_estimate_is_used_as_is() -> None:
    f = cluster_frame(hosts=1, gpus=1, duration_s=120).assign(tflops_estimate=321.0)
    s = analyze(f, now_ns=T0_NS + 120 * NS)
    assert s.energy_by_gpu["tflops_mean"].iloc[0] == pytest.approx(321.0)


def test_a100_has_no_figure_and_says_why() -> None:
    f = cluster_frame(hosts=1, gpus=2, duration_s=300, name=A100).drop(
        columns=["tensor_active_pct", "tensor_hmma_active_pct"]
    )
    s = analyze(f, now_ns=T0_NS + 300 * NS)
    for _, row in s.energy_by_gpu.iterrows():
        assert row["tflops_quality"] == Quality.NOT_AVAILABLE.value
        assert row["tflops_mean"] != row["tflops_mean"]  # NaN, never a made-up number
        assert row["tflops_reason"] == "A100 SXM (Ampere) has no GPM tensor counters"
    fig = s.cluster["tflops_per_w"]
    assert fig.value is None
    assert fig.quality is Quality.NOT_AVAILABLE
    assert "no GPM tensor counters" in fig.reason
    assert s.efficiency_over_time["tflops_per_w"].isna().all()


def test_unknown_model_is_absent_with_reason() -> None:
    f = cluster_frame(hosts=1, gpus=1, duration_s=120, name="Mystery GPU 9000")
    s = analyze(f, now_ns=T0_NS + 120 * NS)
    assert "unknown GPU model" in s.energy_by_gpu["tflops_reason"].iloc[0]


def test_mixed_cluster_divides_by_the_power_of_gpus_with_an_estimate() -> None:
    h = cluster_frame(hosts=1, gpus=1, duration_s=120).assign(
        tensor_hmma_active_pct=50.0, sm_clock_mhz=1830.0, power_w=500.0
    )
    a = cluster_frame(hosts=1, gpus=1, duration_s=120, name=A100).assign(
        host="node-9", uuid="GPU-A100", power_w=300.0
    )
    a = a.drop(columns=["tensor_hmma_active_pct", "tensor_active_pct"])
    import pandas as pd

    s = analyze(pd.concat([h, a], ignore_index=True), now_ns=T0_NS + 120 * NS)
    fig = s.cluster["tflops_per_w"]
    assert fig.value == pytest.approx(0.5 * 989.4 / 500.0)
    assert "1 of 2 GPUs" in fig.reason


def test_a_gpu_without_a_model_name_is_analysed_with_the_reason_its_tflops_are_absent() -> None:
    frame = cluster_frame(duration_s=300, step_s=10)
    gpu = (frame["host"] == frame["host"].iloc[0]) & (frame["gpu_index"] == 0)
    frame["name"] = frame["name"].astype(object).where(~gpu, None)
    s = analyze(frame, now_ns=T0_NS + 300 * NS, window_s=60.0)
    by_gpu = s.energy_by_gpu.set_index(["host", "gpu_index"])
    nameless = by_gpu.loc[(frame["host"].iloc[0], 0)]
    assert nameless["tflops_reason"] == "no GPU model name in the data: no peak throughput known"
    assert nameless["energy_kwh"] > 0  # its energy counted, within the fallback power ceiling
    others = by_gpu.drop(index=(frame["host"].iloc[0], 0))
    assert (others["tflops_quality"] == "gpm_estimate").all() and len(others) == s.gpus - 1
