"""Peak dense throughput and TDP of the GPU models gpuwatt knows, each with its source.

Peaks are *dense* (no 2:4 sparsity) TFLOPS at the boost clock the vendor quotes them at
(``peak_clock_mhz``); the TFLOPS estimate scales them by the GPU's current SM clock over that
clock. ``None`` means the GPU has no such pipe (V100 has no BF16) or the vendor publishes no
figure. Integer tensor peaks (TOPS) are kept apart: they are not floating-point work. Datasheets
quote sparse tensor figures for Ampere and newer: those are halved here. GeForce cards' tensor
peaks are with FP32 accumulate (what training uses), half their FP16-accumulate figure.

A model is found by its NVML name (``nvmlDeviceGetName``) and, where the name is not one the
table knows, by its PCI device id (NVML's ``pciDeviceId``, e.g. ``0x233010DE``: device id in the
upper 16 bits, NVIDIA's vendor id 0x10DE in the lower). Device ids are those of the PCI ID
database (pci-ids.ucw.cz): every id below was checked against its ``pci.ids``
(github.com/pciutils/pciids, commit c1c12547d626, 2026-08-22; the lines are kept in
``tests/data/pci_ids_nvidia.txt``). A model not in the table is logged once; every figure that
does not need its peak (utilisation, power, energy, clocks, reasons) is kept, TFLOPS and
TFLOPS/W are absent with that reason.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

NVIDIA_VENDOR_ID = 0x10DE


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
    pci_device_ids: tuple[int, ...] = ()  # 16-bit PCI device ids (vendor 0x10DE)

    def tensor_peak_tflops(self, precision: str) -> float | None:
        """Dense tensor peak for ``precision`` in {tf32, bf16, fp16, fp8}."""
        return {
            "tf32": self.tf32_tensor_tflops,
            "bf16": self.bf16_tensor_tflops,
            "fp16": self.fp16_tensor_tflops,
            "fp8": self.fp8_tensor_tflops,
        }[precision]


TENSOR_PRECISIONS: tuple[str, ...] = ("tf32", "bf16", "fp16", "fp8")


def _spec(
    model: str,
    arch: str,
    tdp_w: float,
    clock_mhz: float,
    *,
    source: str,
    ids: tuple[int, ...],
    fp64: float | None = None,
    fp64_tc: float | None = None,
    fp32: float | None = None,
    fp16: float | None = None,
    tf32: float | None = None,
    bf16: float | None = None,
    fp16_tc: float | None = None,
    fp8: float | None = None,
    int8: float | None = None,
    gpm: bool = False,
) -> GpuSpec:
    return GpuSpec(
        model, arch, tdp_w, clock_mhz, fp64, fp64_tc, fp32, fp16, tf32, bf16,
        fp16_tc if fp16_tc is not None else bf16, fp8, int8, gpm, source, ids,
    )  # fmt: skip


_DC = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center"
_IMG = "https://images.nvidia.com/content"
_PRO = "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization"

_HOPPER_NOTE = "sparse figures halved"

# (pattern over the NVML device name, spec). First match wins, so specific names come first.
_TABLE: tuple[tuple[str, GpuSpec], ...] = (
    # --- Blackwell ------------------------------------------------------------------------------
    (r"\bGB200\b", _spec(
        "GB200", "Blackwell", 1200, 1965, fp64=40.0, fp64_tc=40.0, fp32=80.0, tf32=1250.0,
        bf16=2500.0, fp8=5000.0, int8=5000.0, gpm=True, ids=(0x2941,),
        source="https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (per-GPU column, sparse "
        "halved; clock not published: B200's); checked against "
        "https://zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html (NVIDIA's "
        "GB200 NVL72 / HGX B200 table: FP64 40, FP32 80; the first Blackwell datasheet's 45 "
        "is superseded)",
    )),
    (r"\bB200\b", _spec(
        "B200", "Blackwell", 1000, 1965, fp64=37.0, fp64_tc=37.0, fp32=75.0, tf32=1100.0,
        bf16=2250.0, fp8=4500.0, int8=4500.0, gpm=True, ids=(0x2901,),
        source="https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200 per GPU, sparse "
        "halved); checked against https://zdszero.github.io/Computer/Artificial_Intelligence/"
        "Hardware.html (NVIDIA's table: FP64 37, FP32 75, TF32 2.2 PF sparse, 1,000 W) and "
        "https://hmc-tech.com/gpu/nvidia-b200-vs-nvidia-gb200",
    )),
    (r"\bB100\b", _spec(
        "B100", "Blackwell", 700, 1965, fp64=30.0, fp64_tc=30.0, tf32=900.0, bf16=1750.0,
        fp8=3500.0, int8=3500.0, gpm=True, ids=(0x29BC,),
        source="https://resources.nvidia.com/en-us-blackwell-architecture (HGX B100 per GPU, "
        "sparse halved; clock not published: B200's); TDP checked against "
        "https://glennklockwood.com/garden/processors/B200 (B100: 700 W); peaks not found in a "
        "second source",
    )),
    # --- Hopper ---------------------------------------------------------------------------------
    (r"\bGH200\b", _spec(
        "GH200", "Hopper", 1000, 1980, fp64=34.0, fp64_tc=67.0, fp32=67.0, fp16=133.8,
        tf32=494.7, bf16=989.4, fp8=1978.9, int8=1978.9, gpm=True, ids=(0x2342, 0x2348),
        source="https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip "
        "(GPU figures; TDP is the module's, CPU included; sparse halved)",
    )),
    (r"\bH200\b.*\bNVL\b", _spec(
        "H200 NVL", "Hopper", 600, 1785, fp64=30.0, fp64_tc=60.0, fp32=60.0, fp16=120.0,
        tf32=417.5, bf16=835.5, fp8=1670.5, int8=1670.5, gpm=True, ids=(0x233B,),
        source="https://www.nvidia.com/en-us/data-center/h200/ (H200 NVL, sparse halved); "
        "TDP checked against https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html",
    )),
    (r"\bH200\b", _spec(
        "H200 SXM", "Hopper", 700, 1980, fp64=34.0, fp64_tc=67.0, fp32=67.0, fp16=133.8,
        tf32=494.7, bf16=989.4, fp8=1978.9, int8=1978.9, gpm=True, ids=(0x2335,),
        source="https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM, sparse halved); "
        "checked against https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html "
        "(dense: BF16 989, FP8 1,979, FP64 34/67, 700 W)",
    )),
    (r"\bH100\b.*\bNVL\b", _spec(
        "H100 NVL", "Hopper", 400, 1785, fp64=30.0, fp64_tc=60.0, fp32=60.0, fp16=120.0,
        tf32=418.0, bf16=835.0, fp8=1670.0, int8=1670.0, gpm=True, ids=(0x2321,),
        source=f"{_DC}/h100/PB-11773-001_v01.pdf (H100 NVL product brief, sparse halved)",
    )),
    (r"\bH100\b.*\bPCIe\b", _spec(
        "H100 PCIe", "Hopper", 350, 1755, fp64=25.6, fp64_tc=51.2, fp32=51.2, fp16=102.4,
        tf32=378.0, bf16=756.0, fp8=1513.0, int8=1513.0, gpm=True, ids=(0x2331,),
        source="https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet "
        "(H100 PCIe 80GB, sparse halved); checked against "
        "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html (datasheet table, "
        "sparse marked: TF32 756*, BF16 1,513*, FP8 3,026*; 350 W)",
    )),
    (r"\bH100\b", _spec(
        "H100 SXM", "Hopper", 700, 1980, fp64=34.0, fp64_tc=67.0, fp32=67.0, fp16=133.8,
        tf32=494.7, bf16=989.4, fp8=1978.9, int8=1978.9, gpm=True, ids=(0x2330,),
        source="https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet "
        "(H100 SXM5 80GB, sparse halved); checked against "
        "https://glennklockwood.com/garden/processors/h100 (dense matrix TF32 494.7, BF16 "
        "989.4, FP8 1978.9; FP64 33.5/66.9) and "
        "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html (700 W)",
    )),
    (r"\bH800\b.*\bPCIe\b", _spec(
        "H800 PCIe", "Hopper", 350, 1755, fp64=0.8, fp64_tc=0.8, fp32=51.2, fp16=102.4,
        tf32=378.0, bf16=756.0, fp8=1513.0, int8=1513.0, gpm=True, ids=(0x2322,),
        source="https://www.nvidia.cn/data-center/h800/ (H800 PCIe datasheet, sparse halved)",
    )),
    (r"\bH800\b", _spec(
        "H800 SXM", "Hopper", 700, 1980, fp64=1.0, fp64_tc=1.0, fp32=67.0, fp16=133.8,
        tf32=494.7, bf16=989.4, fp8=1978.9, int8=1978.9, gpm=True, ids=(0x2324,),
        source="https://www.nvidia.cn/data-center/h800/ (H800 SXM5 datasheet, sparse halved)",
    )),
    (r"\bH20\b", _spec(
        "H20", "Hopper", 400, 1980, fp64=1.0, fp64_tc=1.0, fp32=44.0, tf32=74.0, bf16=148.0,
        fp8=296.0, int8=296.0, gpm=True, ids=(0x2329,),
        source="NVIDIA HGX H20 product brief (dense figures; no public datasheet URL; clock "
        "not published: H100 SXM's); checked against "
        "https://zangshuxian.com/new/674733024499207168 (dense: INT8 296, FP16 148, TF32 74, "
        "FP32 44, FP64 1)",
    )),
    # --- Ada Lovelace ---------------------------------------------------------------------------
    (r"\bL40S\b", _spec(
        "L40S", "Ada Lovelace", 350, 2520, fp64=1.43, fp32=91.6, fp16=91.6, tf32=183.0,
        bf16=362.05, fp8=733.0, int8=733.0, ids=(0x26B9,),
        source=f"{_DC}/l40s/l40s-datasheet-28413.pdf (sparse halved); checked against "
        "https://www.mullet.se/product.html?product_id=355414 (NVIDIA's L40/L40S table, "
        "sparse marked) and https://hmc-tech.com/gpu/nvidia-l40s-vs-nvidia-t40 (INT8 733 dense)",
    )),
    (r"\bL40\b", _spec(
        "L40", "Ada Lovelace", 300, 2490, fp32=90.5, tf32=90.5, bf16=181.0, fp8=362.0,
        int8=362.0, ids=(0x26B5,),
        source=f"{_IMG}/Solutions/data-center/vgpu-L40-datasheet.pdf (sparse halved); checked "
        "against https://www.mullet.se/product.html?product_id=355414 (NVIDIA's L40/L40S "
        "table, sparse marked; 300 W)",
    )),
    (r"\bL4\b", _spec(
        "L4", "Ada Lovelace", 72, 2040, fp64=0.47, fp32=30.3, fp16=30.3, tf32=60.0, bf16=121.0,
        fp8=242.5, int8=242.5, ids=(0x27B8,),
        source=f"{_DC}/l4/pdf/l4-datasheet.pdf (sparse halved); checked against "
        "https://grokipedia.com/page/NVIDIA_L4_vs_L40S (FP16 242 and FP8 485 sparse, 72 W)",
    )),
    (r"RTX 6000 Ada", _spec(
        "RTX 6000 Ada", "Ada Lovelace", 300, 2505, fp32=91.1, tf32=182.1, bf16=364.3,
        fp8=728.5, int8=728.5, ids=(0x26B1,),
        source=f"{_PRO}/rtx-6000/proviz-print-rtx6000-datasheet-web-2504660.pdf "
        "(1457 TFLOPS FP8 sparse, halved)",
    )),
    (r"RTX 5000 Ada", _spec(
        "RTX 5000 Ada", "Ada Lovelace", 250, 2550, fp32=65.3, tf32=130.6, bf16=261.1,
        fp8=522.2, int8=522.2, ids=(0x26B2,),
        source=f"{_PRO}/rtx/rtx-5000-ada/proviz-rtx-5000-datasheet-2739839.pdf "
        "(1044.4 TFLOPS FP8 sparse, halved)",
    )),
    (r"RTX 4000 SFF Ada", _spec(
        "RTX 4000 SFF Ada", "Ada Lovelace", 70, 1565, fp32=19.2, tf32=38.4, bf16=76.7,
        fp8=153.4, int8=153.4, ids=(0x27B0,),
        source=f"{_PRO}/rtx-4000-sff/proviz-rtx-4000-sff-ada-datasheet-2616456-web.pdf "
        "(306.8 TFLOPS FP8 sparse, halved)",
    )),
    (r"RTX 4000 Ada", _spec(
        "RTX 4000 Ada", "Ada Lovelace", 130, 2175, fp32=26.7, tf32=41.0, bf16=81.9, fp8=163.8,
        int8=163.8, ids=(0x27B2,),
        source=f"{_PRO}/rtx/rtx-4000/proviz-rtx-4000-datasheet-2895238.pdf "
        "(327.6 TFLOPS FP8 sparse, halved)",
    )),
    (r"RTX 4090\b", _spec(
        "GeForce RTX 4090", "Ada Lovelace", 450, 2520, fp64=1.29, fp32=82.6, fp16=82.6,
        tf32=82.6, bf16=165.2, fp8=330.3, int8=660.6, ids=(0x2684,),
        source="https://images.nvidia.com/aem-dam/Solutions/geforce/ada/"
        "nvidia-ada-gpu-architecture.pdf Appendix A (FP32-accumulate tensor)",
    )),
    # --- Blackwell GeForce ----------------------------------------------------------------------
    (r"RTX 5090\b", _spec(
        "GeForce RTX 5090", "Blackwell", 575, 2407, fp32=104.8, fp16=104.8, tf32=104.8,
        bf16=209.5, fp8=419.0, int8=838.0, ids=(0x2B85,),
        source="https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
        "nvidia-rtx-blackwell-gpu-architecture.pdf Appendix (FP32-accumulate tensor)",
    )),
    # --- Ampere ---------------------------------------------------------------------------------
    (r"\bA100\b.*PCIe.*40\s*GB|\bA100\b.*40\s*GB.*PCIe", _spec(
        "A100 PCIe 40GB", "Ampere", 250, 1410, fp64=9.7, fp64_tc=19.5, fp32=19.5, fp16=78.0,
        tf32=156.0, bf16=312.0, int8=624.0, ids=(0x20B1, 0x20F1),
        source=f"{_DC}/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
        "(PCIe 40GB, sparse halved)",
    )),
    (r"\bA100\b.*PCIe", _spec(
        "A100 PCIe", "Ampere", 300, 1410, fp64=9.7, fp64_tc=19.5, fp32=19.5, fp16=78.0,
        tf32=156.0, bf16=312.0, int8=624.0, ids=(0x20B5,),
        source=f"{_DC}/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
        "(PCIe 80GB, sparse halved)",
    )),
    (r"\bA100\b.*40\s*GB", _spec(
        "A100 SXM4 40GB", "Ampere", 400, 1410, fp64=9.7, fp64_tc=19.5, fp32=19.5, fp16=78.0,
        tf32=156.0, bf16=312.0, int8=624.0, ids=(0x20B0,),
        source=f"{_DC}/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
        "(SXM4 40GB, sparse halved)",
    )),
    (r"\bA100\b", _spec(
        "A100 SXM", "Ampere", 400, 1410, fp64=9.7, fp64_tc=19.5, fp32=19.5, fp16=78.0,
        tf32=156.0, bf16=312.0, int8=624.0, ids=(0x20B2,),
        source=f"{_DC}/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
        "(SXM4 80GB, sparse halved)",
    )),
    (r"\bA800\b.*PCIe", _spec(
        "A800 PCIe", "Ampere", 300, 1410, fp64=9.7, fp64_tc=19.5, fp32=19.5, fp16=78.0,
        tf32=156.0, bf16=312.0, int8=624.0, ids=(0x20F5,),
        source="https://www.nvidia.cn/data-center/a800/ (A800 80GB PCIe, sparse halved)",
    )),
    (r"\bA800\b", _spec(
        "A800 SXM", "Ampere", 400, 1410, fp64=9.7, fp64_tc=19.5, fp32=19.5, fp16=78.0,
        tf32=156.0, bf16=312.0, int8=624.0, ids=(0x20F3,),
        source="https://www.nvidia.cn/data-center/a800/ (A800 SXM4 80GB, sparse halved)",
    )),
    (r"\bA10G\b", _spec(
        "A10G", "Ampere", 300, 1710, fp32=35.0, tf32=70.0, bf16=140.1, int8=280.2, ids=(0x2237,),
        source="no NVIDIA datasheet (AWS EC2 G5): derived from the A10's per-SM rates "
        f"({_DC}/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf) x 80 SMs x 1710 MHz; "
        "TDP: nvidia-smi's power limit (Telegraf testdata a10g.xml)",
    )),
    (r"\bA10\b", _spec(
        "A10", "Ampere", 150, 1695, fp64=0.98, fp32=31.2, fp16=31.2, tf32=62.5, bf16=125.0,
        int8=250.0, ids=(0x2236,),
        source=f"{_DC}/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf (sparse halved)",
    )),
    (r"\bA16\b", _spec(
        "A16", "Ampere", 62.5, 1755, fp32=4.5, tf32=9.0, bf16=17.9, int8=35.9, ids=(0x25B6,),
        source=f"{_IMG}/Solutions/data-center/vgpu-a16-datasheet.pdf (per GPU: the board "
        "holds 4 and 250 W; sparse halved)",
    )),
    (r"\bA30\b", _spec(
        "A30", "Ampere", 165, 1440, fp64=5.2, fp64_tc=10.3, fp32=10.3, tf32=82.0, bf16=165.0,
        int8=330.0, ids=(0x20B7,),
        source=f"{_DC}/products/a30-gpu/pdf/a30-datasheet.pdf (sparse halved)",
    )),
    (r"\bA40\b", _spec(
        "A40", "Ampere", 300, 1740, fp32=37.4, tf32=74.8, bf16=149.7, int8=299.3, ids=(0x2235,),
        source=f"{_IMG}/Solutions/data-center/a40/nvidia-a40-datasheet.pdf (sparse halved)",
    )),
    (r"RTX A6000", _spec(
        "RTX A6000", "Ampere", 300, 1800, fp32=38.7, tf32=77.4, bf16=154.8, int8=309.7,
        ids=(0x2230,),
        source=f"{_PRO}/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-"
        "nvidia-1454980-r9-web (1).pdf (309.7 TFLOPS tensor sparse, halved)",
    )),
    (r"RTX A5500", _spec(
        "RTX A5500", "Ampere", 230, 1665, fp32=34.1, tf32=68.2, bf16=136.4, int8=272.8,
        ids=(0x2233,),
        source=f"{_PRO}/rtx/nvidia-rtx-a5500-datasheet.pdf (272.8 TFLOPS tensor sparse, halved)",
    )),
    (r"RTX A5000", _spec(
        "RTX A5000", "Ampere", 230, 1695, fp32=27.8, tf32=55.6, bf16=111.1, int8=222.2,
        ids=(0x2231,),
        source=f"{_PRO}/rtx-a5000/nvidia-rtx-a5000-datasheet.pdf "
        "(222.2 TFLOPS tensor sparse, halved)",
    )),
    (r"RTX A4500", _spec(
        "RTX A4500", "Ampere", 200, 1650, fp32=23.7, tf32=47.3, bf16=94.6, int8=189.2,
        ids=(0x2232,),
        source=f"{_PRO}/rtx/nvidia-rtx-a4500-datasheet.pdf (189.2 TFLOPS tensor sparse, halved)",
    )),
    (r"RTX A4000", _spec(
        "RTX A4000", "Ampere", 140, 1560, fp32=19.2, tf32=38.4, bf16=76.7, int8=153.4,
        ids=(0x24B0,),
        source="https://www.nvidia.com/content/dam/en-zz/Solutions/gtcs21/rtx-a4000/"
        "nvidia-rtx-a4000-datasheet.pdf (153.4 TFLOPS tensor sparse, halved)",
    )),
    (r"RTX 3090\b(?!\s*Ti)", _spec(
        "GeForce RTX 3090", "Ampere", 350, 1695, fp32=35.6, fp16=35.6, tf32=35.6, bf16=71.0,
        int8=284.0, ids=(0x2204,),
        source="https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-"
        "whitepaper-v2.pdf Appendix A (FP32-accumulate tensor)",
    )),
    (r"RTX 3080\b(?!\s*Ti)", _spec(
        "GeForce RTX 3080", "Ampere", 320, 1710, fp32=29.8, fp16=29.8, tf32=29.8, bf16=59.5,
        int8=238.0, ids=(0x2206, 0x220A, 0x2216),
        source="https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-"
        "whitepaper-v2.pdf Appendix A (FP32-accumulate tensor)",
    )),
    # --- Turing, Volta, Pascal ------------------------------------------------------------------
    (r"\bT4\b", _spec(
        "T4", "Turing", 70, 1590, fp64=0.25, fp32=8.1, fp16=16.2, fp16_tc=65.0, int8=130.0,
        ids=(0x1EB8,),
        source=f"{_DC}/tesla-t4/t4-tensor-core-datasheet-951643.pdf (mixed-precision tensor)",
    )),
    (r"V100(?!S).*PCIe", _spec(
        "V100 PCIe", "Volta", 250, 1380, fp64=7.0, fp32=14.0, fp16=28.0, fp16_tc=112.0,
        ids=(0x1DB4, 0x1DB6),
        source=f"{_IMG}/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    )),
    (r"V100(?!S)", _spec(
        "V100 SXM2", "Volta", 300, 1530, fp64=7.8, fp32=15.7, fp16=31.4, fp16_tc=125.0,
        ids=(0x1DB1, 0x1DB5, 0x1DF5),
        source=f"{_IMG}/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    )),
    (r"P100.*PCIe", _spec(
        "P100 PCIe", "Pascal", 250, 1303, fp64=4.7, fp32=9.3, fp16=18.7, ids=(0x15F7, 0x15F8),
        source=f"{_IMG}/tesla/pdf/nvidia-tesla-p100-PCIe-datasheet.pdf (16GB)",
    )),
    (r"P100", _spec(
        "P100 SXM2", "Pascal", 300, 1480, fp64=5.3, fp32=10.6, fp16=21.2, ids=(0x15F9,),
        source=f"{_IMG}/tesla/pdf/nvidia-tesla-p100-datasheet.pdf (SXM2)",
    )),
)  # fmt: skip

#: Names of mobile parts: their peaks are not their desktop namesakes'.
_MOBILE = re.compile(r"Laptop|Mobile|Max-Q", re.IGNORECASE)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), spec) for p, spec in _TABLE)

#: Every spec by its model name, e.g. ``SPECS["H100 SXM"]``.
SPECS: dict[str, GpuSpec] = {spec.model: spec for _, spec in _TABLE}
#: Every spec by its 16-bit PCI device id.
BY_PCI_DEVICE_ID: dict[int, GpuSpec] = {i: spec for _, spec in _TABLE for i in spec.pci_device_ids}

_reported_unknown: set[tuple[str, int | None]] = set()


def pci_device(pci_device_id: int) -> int | None:
    """The 16-bit device id of NVML's ``pciDeviceId`` (``0x233010DE`` -> ``0x2330``), or of a
    bare device id; None for another vendor's."""
    if pci_device_id > 0xFFFF:
        if pci_device_id & 0xFFFF != NVIDIA_VENDOR_ID:
            return None
        return (pci_device_id >> 16) & 0xFFFF
    return pci_device_id


def nvml_pci_device_id(device: int) -> int:
    """NVML's ``pciDeviceId`` of a 16-bit NVIDIA device id (``0x2330`` -> ``0x233010DE``)."""
    return (device << 16) | NVIDIA_VENDOR_ID


def by_name(device_name: str) -> GpuSpec | None:
    """The spec whose name pattern matches an NVML device name; None if none does."""
    if _MOBILE.search(device_name):
        return None
    for pattern, spec in _COMPILED:
        if pattern.search(device_name):
            return spec
    return None


def by_pci_device_id(pci_device_id: int) -> GpuSpec | None:
    """The spec of NVML's ``pciDeviceId`` (or a 16-bit device id); None if unknown."""
    device = pci_device(pci_device_id)
    return None if device is None else BY_PCI_DEVICE_ID.get(device)


def lookup(device_name: str, pci_device_id: int | None = None) -> GpuSpec | None:
    """The spec for an NVML device name such as ``'NVIDIA H100 80GB HBM3'``, else for its PCI
    device id; None if unknown, which is logged once per name and id."""
    spec = by_name(device_name) if device_name else None
    if spec is None and pci_device_id is not None:
        spec = by_pci_device_id(pci_device_id)
    if spec is None and (device_name or pci_device_id is not None):
        key = (device_name, pci_device_id)
        if key not in _reported_unknown:
            _reported_unknown.add(key)
            pci = "" if pci_device_id is None else f", PCI device id {pci_device_id:#010x}"
            log.warning(
                "GPU model %r%s is not in gpuwatt's GPU table: no TFLOPS estimate or TFLOPS/W "
                "for it (every other figure is kept)",
                device_name,
                pci,
            )
    return spec
