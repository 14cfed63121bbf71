"""Achieved TFLOPS from pipe utilisation: pure arithmetic shared by the collector and analytics.

TFLOPS ~= sum over pipes of (fraction of time the pipe was active x the pipe's dense peak) x
(current SM clock / the clock that peak is quoted at: ``GpuSpec.hmma_clock_mhz`` for the tensor
pipe, ``peak_clock_mhz`` for the others). The HMMA tensor pipe covers TF32, BF16,
FP16 and FP8 work and the counters cannot tell which, so its peak is the one of the precision the
site configures (``tensor_precision``, default bf16). Integer (IMMA) work is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gpuwatt.gpu_specs import GpuSpec


class PipePeaks(NamedTuple):
    """A GPU's dense peaks per pipe for one tensor precision, looked up once (missing pipe: 0)."""

    hmma_tflops: float
    dfma_tflops: float
    fp64_tflops: float
    fp32_tflops: float
    fp16_tflops: float
    peak_clock_mhz: float
    hmma_clock_mhz: float

    @classmethod
    def of(cls, spec: GpuSpec, tensor_precision: str = "bf16") -> PipePeaks:
        return cls(
            spec.tensor_peak_tflops(tensor_precision) or 0.0,
            spec.fp64_tensor_tflops or 0.0,
            spec.fp64_tflops or 0.0,
            spec.fp32_tflops or 0.0,
            spec.fp16_tflops or 0.0,
            spec.peak_clock_mhz,
            spec.hmma_clock_mhz,
        )


def tflops_from_pipes(
    peaks: PipePeaks,
    sm_clock_mhz: float | None,
    hmma_pct: float | None,
    dfma_pct: float | None,
    fp64_pct: float | None,
    fp32_pct: float | None,
    fp16_pct: float | None,
) -> float | None:
    """The estimate from precomputed peaks (the collector's per-tick path); None if no pipe
    activity was measured."""
    measured = (hmma_pct, dfma_pct, fp64_pct, fp32_pct, fp16_pct)
    if measured.count(None) == len(measured):
        return None
    tensor = (hmma_pct or 0.0) * peaks.hmma_tflops / 100.0
    other = (
        (dfma_pct or 0.0) * peaks.dfma_tflops
        + (fp64_pct or 0.0) * peaks.fp64_tflops
        + (fp32_pct or 0.0) * peaks.fp32_tflops
        + (fp16_pct or 0.0) * peaks.fp16_tflops
    ) / 100.0
    if sm_clock_mhz is None:
        return tensor + other
    clk = sm_clock_mhz
    return tensor * clk / peaks.hmma_clock_mhz + other * clk / peaks.peak_clock_mhz


def tflops_from_values(
    peaks: PipePeaks, sm_clock_mhz: float | None, values: Mapping[str, Any]
) -> float | None:
    """``tflops_from_pipes`` of the pipe percentages in a sample's field values, by the model's
    names (what the sampler has gathered for a GPU or a MIG device this tick)."""
    get = values.get
    return tflops_from_pipes(
        peaks,
        sm_clock_mhz,
        get("tensor_hmma_active_pct"),
        get("tensor_dfma_active_pct"),
        get("fp64_active_pct"),
        get("fp32_active_pct"),
        get("fp16_active_pct"),
    )


def estimate_tflops_from_pipes(
    spec: GpuSpec,
    *,
    sm_clock_mhz: float | None,
    tensor_hmma_active_pct: float | None,
    tensor_dfma_active_pct: float | None,
    fp64_active_pct: float | None,
    fp32_active_pct: float | None,
    fp16_active_pct: float | None,
    tensor_precision: str = "bf16",
) -> float | None:
    """The estimate, or None when no pipe activity was measured."""
    return tflops_from_pipes(
        PipePeaks.of(spec, tensor_precision),
        sm_clock_mhz,
        tensor_hmma_active_pct,
        tensor_dfma_active_pct,
        fp64_active_pct,
        fp32_active_pct,
        fp16_active_pct,
    )


def upper_bound_tflops_from_sm_activity(
    spec: GpuSpec,
    *,
    sm_active_pct: float,
    sm_clock_mhz: float | None,
    tensor_precision: str = "bf16",
) -> float | None:
    """For GPUs without pipe counters: SM activity x the tensor peak, clearly an upper bound."""
    peak, at_mhz = spec.tensor_peak_tflops(tensor_precision), spec.hmma_clock_mhz
    if peak is None:
        peak, at_mhz = spec.fp32_tflops, spec.peak_clock_mhz
    if peak is None:
        return None
    clock_ratio = 1.0 if sm_clock_mhz is None else sm_clock_mhz / at_mhz
    return sm_active_pct / 100.0 * peak * clock_ratio
