"""Achieved TFLOPS from pipe utilisation: pure arithmetic shared by the collector and analytics.

TFLOPS ~= sum over pipes of (fraction of time the pipe was active x the pipe's dense peak) x
(current SM clock / the clock the peak is quoted at). The HMMA tensor pipe covers TF32, BF16,
FP16 and FP8 work and the counters cannot tell which, so its peak is the one of the precision the
site configures (``tensor_precision``, default bf16). Integer (IMMA) work is not counted.
"""

from __future__ import annotations

from gpuwatt.gpu_specs import GpuSpec


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
    terms = (
        (tensor_hmma_active_pct, spec.tensor_peak_tflops(tensor_precision)),
        (tensor_dfma_active_pct, spec.fp64_tensor_tflops),
        (fp64_active_pct, spec.fp64_tflops),
        (fp32_active_pct, spec.fp32_tflops),
        (fp16_active_pct, spec.fp16_tflops),
    )
    if all(pct is None for pct, _ in terms):
        return None
    total = sum((pct or 0.0) / 100.0 * (peak or 0.0) for pct, peak in terms)
    clock_ratio = 1.0 if sm_clock_mhz is None else sm_clock_mhz / spec.peak_clock_mhz
    return total * clock_ratio


def upper_bound_tflops_from_sm_activity(
    spec: GpuSpec,
    *,
    sm_active_pct: float,
    sm_clock_mhz: float | None,
    tensor_precision: str = "bf16",
) -> float | None:
    """For GPUs without pipe counters: SM activity x the tensor peak, clearly an upper bound."""
    peak = spec.tensor_peak_tflops(tensor_precision) or spec.fp32_tflops
    if peak is None:
        return None
    clock_ratio = 1.0 if sm_clock_mhz is None else sm_clock_mhz / spec.peak_clock_mhz
    return sm_active_pct / 100.0 * peak * clock_ratio
