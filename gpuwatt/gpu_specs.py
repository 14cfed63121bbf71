"""Peak dense throughput and TDP of the GPU models gpuwatt knows, each with its source.

Peaks are *dense* (no 2:4 sparsity) TFLOPS at the boost clock the vendor quotes them at
(``peak_clock_mhz``); the TFLOPS estimate scales them by the GPU's current SM clock over that
clock. Hopper's datasheets quote the low-precision tensor peaks (TF32, BF16, FP16, FP8, INT8) at a
lower clock than the vector and FP64 peaks (H100 SXM: 989.4 TFLOPS BF16 = 132 SMs x 4,096 dense
FLOPs per clock x 1,830 MHz, where FP32's 66.9 is at 1,980 MHz); ``tensor_clock_mhz`` holds that
clock where it differs. Timed bf16 matrix products on a real H100 and H200 ran at 98 % and
89 % of what their tensor activity and clock allow with it (``docs/real-gpu.md``,
``tests/test_tflops_real_hopper.py``). ``None`` means the GPU has no such pipe (V100 has no BF16)
or the vendor publishes no figure. Integer tensor peaks (TOPS) are kept apart: they are not
floating-point work. Datasheets quote sparse tensor figures for Ampere and newer: those are
halved here. GeForce cards' tensor peaks are with FP32 accumulate (what training uses), half
their FP16-accumulate figure.

A model is found by its NVML name (``nvmlDeviceGetName``) and, where the name is not one the
table knows, by its PCI device id (NVML's ``pciDeviceId``, e.g. ``0x233010DE``: device id in the
upper 16 bits, NVIDIA's vendor id 0x10DE in the lower). Device ids are those of the PCI ID
database (pci-ids.ucw.cz): every id below was checked against its ``pci.ids``
(github.com/pciutils/pciids, commit c1c12547d626, 2026-08-22; the lines are kept in
``tests/data/pci_ids_nvidia.txt``). The figures, ids and sources are data, in ``gpu_specs.toml``
beside this module. A model not in the table is logged once; every figure that
does not need its peak (utilisation, power, energy, clocks, reasons) is kept, TFLOPS and
TFLOPS/W are absent with that reason.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from dataclasses import dataclass
from importlib import resources

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
    tensor_clock_mhz: float | None = None  # None: the tensor peaks are at peak_clock_mhz

    @property
    def hmma_clock_mhz(self) -> float:
        """The clock the low-precision tensor (HMMA) peaks are quoted at."""
        return self.tensor_clock_mhz or self.peak_clock_mhz

    def tensor_peak_tflops(self, precision: str) -> float | None:
        """Dense tensor peak for ``precision`` in {tf32, bf16, fp16, fp8}."""
        return {
            "tf32": self.tf32_tensor_tflops,
            "bf16": self.bf16_tensor_tflops,
            "fp16": self.fp16_tensor_tflops,
            "fp8": self.fp8_tensor_tflops,
        }[precision]


TENSOR_PRECISIONS: tuple[str, ...] = ("tf32", "bf16", "fp16", "fp8")


#: The table: ``gpu_specs.toml`` beside this module, one ``[[gpu]]`` per model with its name
#: ``pattern`` and the fields of ``GpuSpec``.
TABLE_FILE = "gpu_specs.toml"


def _load_table() -> tuple[tuple[str, GpuSpec], ...]:
    """(pattern over the NVML device name, spec) in the file's order. First match wins, so
    specific names come first."""
    text = resources.files("gpuwatt").joinpath(TABLE_FILE).read_text(encoding="utf-8")
    rows = []
    for entry in tomllib.loads(text)["gpu"]:
        fields = dict(entry)
        pattern = fields.pop("pattern")
        fields["pci_device_ids"] = tuple(fields.get("pci_device_ids", ()))
        known = {f: fields.pop(f) for f in _SPEC_FIELDS if f in fields}
        if fields:
            raise ValueError(f"{TABLE_FILE}: unknown fields {sorted(fields)} for {pattern!r}")
        rows.append((pattern, GpuSpec(**{f: None for f in _PEAK_FIELDS} | known)))
    return tuple(rows)


_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(GpuSpec))
_PEAK_FIELDS = tuple(f for f in _SPEC_FIELDS if f.endswith(("_tflops", "_tops")))
_TABLE = _load_table()

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
