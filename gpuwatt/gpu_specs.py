"""Peak dense throughput and TDP of the GPU models gpuwatt knows, each with its source.

Peaks are *dense* (no 2:4 sparsity) TFLOPS at the boost clock the vendor quotes them at
(``peak_clock_mhz``); the TFLOPS estimate scales them by the GPU's current SM clock over that
clock. ``None`` means the GPU has no such pipe (V100 has no BF16) or the vendor publishes no
figure. Integer tensor peaks (TOPS) are kept apart: they are not floating-point work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    architecture: str
    tdp_w: float
    peak_clock_mhz: float
    fp64_tflops: float | None  # non-tensor FP64 pipe
    fp64_tensor_tflops: float | None  # DFMA tensor
    fp32_tflops: float | None  # non-tensor FP32 pipe
    fp16_tflops: float | None  # non-tensor FP16 pipe
    tf32_tensor_tflops: float | None
    bf16_tensor_tflops: float | None
    fp16_tensor_tflops: float | None
    fp8_tensor_tflops: float | None
    int8_tensor_tops: float | None
    has_gpm: bool  # GPM counters (Hopper and newer)
    source: str

    def tensor_peak_tflops(self, precision: str) -> float | None:
        """Dense tensor peak for ``precision`` in {tf32, bf16, fp16, fp8}."""
        return {
            "tf32": self.tf32_tensor_tflops,
            "bf16": self.bf16_tensor_tflops,
            "fp16": self.fp16_tensor_tflops,
            "fp8": self.fp8_tensor_tflops,
        }[precision]


TENSOR_PRECISIONS: tuple[str, ...] = ("tf32", "bf16", "fp16", "fp8")

_NV = "NVIDIA datasheet"

# (pattern over the NVML device name, spec). First match wins, so specific names come first.
_TABLE: tuple[tuple[str, GpuSpec], ...] = (
    (
        r"H100.*PCIe",
        GpuSpec(
            "H100 PCIe",
            "Hopper",
            350,
            1755,
            25.6,
            51.2,
            51.2,
            102.4,
            378.0,
            756.0,
            756.0,
            1513.0,
            1513.0,
            True,
            f"{_NV}: H100 Tensor Core GPU (PCIe 80GB), sparse figures halved",
        ),
    ),
    (
        r"H100.*NVL",
        GpuSpec(
            "H100 NVL",
            "Hopper",
            400,
            1785,
            30.0,
            60.0,
            60.0,
            120.0,
            418.0,
            835.0,
            835.0,
            1670.0,
            1670.0,
            True,
            f"{_NV}: H100 Tensor Core GPU (H100 NVL), sparse figures halved",
        ),
    ),
    (
        r"H100",
        GpuSpec(
            "H100 SXM",
            "Hopper",
            700,
            1980,
            34.0,
            67.0,
            67.0,
            133.8,
            494.7,
            989.4,
            989.4,
            1978.9,
            1978.9,
            True,
            f"{_NV}: H100 Tensor Core GPU (SXM5 80GB), sparse figures halved",
        ),
    ),
    (
        r"GH200",
        GpuSpec(
            "GH200",
            "Hopper",
            1000,
            1980,
            34.0,
            67.0,
            67.0,
            133.8,
            494.7,
            989.4,
            989.4,
            1978.9,
            1978.9,
            True,
            f"{_NV}: GH200 Grace Hopper Superchip, GPU figures, sparse halved",
        ),
    ),
    (
        r"H200",
        GpuSpec(
            "H200 SXM",
            "Hopper",
            700,
            1980,
            34.0,
            67.0,
            67.0,
            133.8,
            494.7,
            989.4,
            989.4,
            1978.9,
            1978.9,
            True,
            f"{_NV}: H200 Tensor Core GPU (SXM 141GB), sparse figures halved",
        ),
    ),
    (
        r"B200",
        GpuSpec(
            "B200",
            "Blackwell",
            1000,
            1965,
            40.0,
            40.0,
            80.0,
            None,
            1100.0,
            2250.0,
            2250.0,
            4500.0,
            4500.0,
            True,
            f"{_NV}: DGX B200 / HGX B200 per GPU, sparse figures halved",
        ),
    ),
    (
        r"A100.*PCIe",
        GpuSpec(
            "A100 PCIe",
            "Ampere",
            300,
            1410,
            9.7,
            19.5,
            19.5,
            78.0,
            156.0,
            312.0,
            312.0,
            None,
            624.0,
            False,
            f"{_NV}: A100 Tensor Core GPU (PCIe 80GB), sparse figures halved",
        ),
    ),
    (
        r"A100",
        GpuSpec(
            "A100 SXM",
            "Ampere",
            400,
            1410,
            9.7,
            19.5,
            19.5,
            78.0,
            156.0,
            312.0,
            312.0,
            None,
            624.0,
            False,
            f"{_NV}: A100 Tensor Core GPU (SXM4 80GB), sparse figures halved",
        ),
    ),
    (
        r"L40S",
        GpuSpec(
            "L40S",
            "Ada Lovelace",
            350,
            2520,
            1.43,
            None,
            91.6,
            91.6,
            183.0,
            362.05,
            362.05,
            733.0,
            733.0,
            False,
            f"{_NV}: L40S GPU, sparse figures halved",
        ),
    ),
    (
        r"\bL4\b",
        GpuSpec(
            "L4",
            "Ada Lovelace",
            72,
            2040,
            0.47,
            None,
            30.3,
            30.3,
            60.0,
            121.0,
            121.0,
            242.5,
            242.5,
            False,
            f"{_NV}: L4 Tensor Core GPU, sparse figures halved",
        ),
    ),
    (
        r"\bA10\b",
        GpuSpec(
            "A10",
            "Ampere",
            150,
            1695,
            0.98,
            None,
            31.2,
            31.2,
            62.5,
            125.0,
            125.0,
            None,
            250.0,
            False,
            f"{_NV}: A10 Tensor Core GPU, sparse figures halved",
        ),
    ),
    (
        r"RTX 4090",
        GpuSpec(
            "GeForce RTX 4090",
            "Ada Lovelace",
            450,
            2520,
            1.29,
            None,
            82.6,
            82.6,
            82.6,
            165.2,
            165.2,
            330.3,
            660.6,
            False,
            "NVIDIA Ada Lovelace architecture whitepaper v2.1, Appendix A (FP32-accumulate tensor)",
        ),
    ),
    (
        r"V100",
        GpuSpec(
            "V100 SXM2",
            "Volta",
            300,
            1530,
            7.8,
            None,
            15.7,
            31.4,
            None,
            None,
            125.0,
            None,
            None,
            False,
            f"{_NV}: Tesla V100 (SXM2)",
        ),
    ),
)

_COMPILED = tuple((re.compile(p, re.IGNORECASE), spec) for p, spec in _TABLE)

#: Every spec by its model name, e.g. ``SPECS["H100 SXM"]``.
SPECS: dict[str, GpuSpec] = {spec.model: spec for _, spec in _TABLE}


def lookup(device_name: str) -> GpuSpec | None:
    """The spec for an NVML device name such as ``'NVIDIA H100 80GB HBM3'``; None if unknown."""
    for pattern, spec in _COMPILED:
        if pattern.search(device_name):
            return spec
    return None
