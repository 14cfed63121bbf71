"""The GPU table: every listed model resolves from its NVML name and from its PCI device id."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import pytest

from gpuwatt.collector.sim.scenario import gpu_profile
from gpuwatt.gpu_specs import (
    BY_PCI_DEVICE_ID,
    SPECS,
    TENSOR_PRECISIONS,
    by_name,
    by_pci_device_id,
    lookup,
    pci_device,
)

# (table model, the name NVML reports, NVML's pciDeviceId: device id << 16 | 0x10DE)
MODELS: list[tuple[str, str, int]] = [
    ("T4", "Tesla T4", 0x1EB810DE),
    ("V100 PCIe", "Tesla V100-PCIE-32GB", 0x1DB610DE),
    ("V100 SXM2", "Tesla V100-SXM2-16GB", 0x1DB110DE),
    ("P100 PCIe", "Tesla P100-PCIE-16GB", 0x15F810DE),
    ("P100 SXM2", "Tesla P100-SXM2-16GB", 0x15F910DE),
    ("A10", "NVIDIA A10", 0x223610DE),
    ("A10G", "NVIDIA A10G", 0x223710DE),
    ("A16", "NVIDIA A16", 0x25B610DE),
    ("A30", "NVIDIA A30", 0x20B710DE),
    ("A40", "NVIDIA A40", 0x223510DE),
    ("A100 PCIe 40GB", "NVIDIA A100-PCIE-40GB", 0x20F110DE),
    ("A100 PCIe", "NVIDIA A100 80GB PCIe", 0x20B510DE),
    ("A100 SXM4 40GB", "NVIDIA A100-SXM4-40GB", 0x20B010DE),
    ("A100 SXM", "NVIDIA A100-SXM4-80GB", 0x20B210DE),
    ("A800 SXM", "NVIDIA A800-SXM4-80GB", 0x20F310DE),
    ("A800 PCIe", "NVIDIA A800 80GB PCIe", 0x20F510DE),
    ("L4", "NVIDIA L4", 0x27B810DE),
    ("L40", "NVIDIA L40", 0x26B510DE),
    ("L40S", "NVIDIA L40S", 0x26B910DE),
    ("RTX A4000", "NVIDIA RTX A4000", 0x24B010DE),
    ("RTX A4500", "NVIDIA RTX A4500", 0x223210DE),
    ("RTX A5000", "NVIDIA RTX A5000", 0x223110DE),
    ("RTX A5500", "NVIDIA RTX A5500", 0x223310DE),
    ("RTX A6000", "NVIDIA RTX A6000", 0x223010DE),
    ("RTX 4000 Ada", "NVIDIA RTX 4000 Ada Generation", 0x27B210DE),
    ("RTX 4000 SFF Ada", "NVIDIA RTX 4000 SFF Ada Generation", 0x27B010DE),
    ("RTX 5000 Ada", "NVIDIA RTX 5000 Ada Generation", 0x26B210DE),
    ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", 0x26B110DE),
    ("GeForce RTX 3080", "NVIDIA GeForce RTX 3080", 0x220610DE),
    ("GeForce RTX 3090", "NVIDIA GeForce RTX 3090", 0x220410DE),
    ("GeForce RTX 4090", "NVIDIA GeForce RTX 4090", 0x268410DE),
    ("GeForce RTX 5090", "NVIDIA GeForce RTX 5090", 0x2B8510DE),
    ("H100 PCIe", "NVIDIA H100 PCIe", 0x233110DE),
    ("H100 SXM", "NVIDIA H100 80GB HBM3", 0x233010DE),
    ("H100 NVL", "NVIDIA H100 NVL", 0x232110DE),
    ("H800 SXM", "NVIDIA H800", 0x232410DE),
    ("H800 PCIe", "NVIDIA H800 PCIe", 0x232210DE),
    ("H20", "NVIDIA H20", 0x232910DE),
    ("H200 SXM", "NVIDIA H200", 0x233510DE),
    ("H200 NVL", "NVIDIA H200 NVL", 0x233B10DE),
    ("GH200", "NVIDIA GH200 480GB", 0x234210DE),
    ("B100", "NVIDIA B100", 0x29BC10DE),
    ("B200", "NVIDIA B200", 0x290110DE),
    ("GB200", "NVIDIA GB200", 0x294110DE),
]


@pytest.mark.parametrize(("model", "nvml_name", "pci_id"), MODELS, ids=[m[0] for m in MODELS])
def test_a_listed_model_resolves_by_name_and_by_pci_device_id(
    model: str, nvml_name: str, pci_id: int
) -> None:
    assert by_name(nvml_name) is SPECS[model]
    assert by_pci_device_id(pci_id) is SPECS[model]
    assert lookup("", pci_id) is SPECS[model]  # a name the table does not know
    assert lookup(nvml_name, pci_id) is SPECS[model]


@pytest.mark.parametrize("model", sorted(SPECS))
def test_every_model_has_a_tdp_a_source_and_dense_peaks(model: str) -> None:
    spec = SPECS[model]
    assert spec.tdp_w > 0 and spec.peak_clock_mhz > 0
    assert spec.source and spec.pci_device_ids
    tensor = [spec.tensor_peak_tflops(p) for p in TENSOR_PRECISIONS]
    assert any(v for v in tensor) or spec.fp32_tflops
    # a dense peak is at most ~2x the next lower precision's (datasheets round: B200 2250/1100)
    ordered = [v for v in tensor if v]
    assert all(b <= 2.1 * a for a, b in itertools.pairwise(ordered))
    # the simulator's device name for the model resolves to it
    assert lookup(gpu_profile(model).nvml_name) is spec


def test_every_listed_model_is_tested_and_ids_are_unique() -> None:
    assert {m for m, _, _ in MODELS} == set(SPECS)
    assert sum(len(s.pci_device_ids) for s in SPECS.values()) == len(BY_PCI_DEVICE_ID)


def test_neighbours_are_not_confused() -> None:
    assert by_name("NVIDIA GH200 480GB") is SPECS["GH200"]  # not H200
    assert by_name("NVIDIA GB200") is SPECS["GB200"]  # not B200
    assert by_name("NVIDIA A10G") is SPECS["A10G"]  # not A10
    assert by_name("NVIDIA RTX A4000") is SPECS["RTX A4000"]  # not A40
    for other in ("NVIDIA GeForce RTX 3080 Ti", "NVIDIA GeForce RTX 4090 Laptop GPU"):
        assert by_name(other) is None  # other parts with other peaks


def test_pci_device_ids() -> None:
    assert pci_device(0x233010DE) == 0x2330
    assert pci_device(0x2330) == 0x2330
    assert pci_device(0x12341002) is None  # another vendor's
    assert by_pci_device_id(0xFFFF10DE) is None


def test_an_unknown_model_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuwatt.gpu_specs"):
        for _ in range(3):
            assert lookup("NVIDIA Mystery X1", 0x9FFF10DE) is None
    said = [r.getMessage() for r in caplog.records if "Mystery" in r.getMessage()]
    assert len(said) == 1
    assert "0x9fff10de" in said[0] and "every other figure is kept" in said[0]


def test_the_data_centre_and_workstation_gpus_of_telegrafs_testdata_are_known() -> None:
    from telegraf_data import CASES, gpu_metric

    names = {gpu_metric(c)["tags"]["name"] for c in CASES}
    known = {n: s.model for n in names if (s := by_name(n)) is not None}
    assert known == {
        "Tesla T4": "T4",
        "NVIDIA A10G": "A10G",
        "NVIDIA A100-SXM4-80GB": "A100 SXM",
        "NVIDIA GeForce RTX 3080": "GeForce RTX 3080",
        "NVIDIA GeForce RTX 3090": "GeForce RTX 3090",
        "NVIDIA RTX 4000 SFF Ada Generation": "RTX 4000 SFF Ada",
    }  # the others are desktop cards the table does not list (GTX 1070 Ti, Quadro P400...)


# --- checked against sources ----------------------------------------------------------------------

PCI_IDS = Path(__file__).parent / "data" / "pci_ids_nvidia.txt"
#: pci.ids names no table pattern matches, and the model they are
PCI_IDS_ALIASES: dict[int, str] = {0x2321: "H100 NVL"}  # pci.ids: "GH100 [H100L 94GB]"


def _pci_ids_names() -> dict[int, str]:
    """Device id -> the product name in brackets, from the pci.ids excerpt."""
    names = {}
    for line in PCI_IDS.read_text().splitlines():
        match = re.match(r"^\t([0-9a-f]{4})  .*\[(.+)\]$", line)
        if match:
            names[int(match[1], 16)] = match[2]
    return names


def test_every_pci_device_id_is_pci_ids_name_for_that_model() -> None:
    names = _pci_ids_names()
    for device, spec in BY_PCI_DEVICE_ID.items():
        assert device in names, f"{device:#06x} ({spec.model}) is not in pci.ids"
        named = PCI_IDS_ALIASES.get(device) or getattr(by_name(names[device]), "model", None)
        assert named == spec.model, (hex(device), names[device], spec.model)


#: Sparse (2:4) tensor figures as the datasheets print them: the table holds half of each.
SPARSE_AS_PRINTED: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 1979.0, "fp8": 3958.0, "tf32": 989.0},
    "H100 PCIe": {"bf16": 1513.0},
    "H200 SXM": {"fp8": 3958.0},
    "A100 SXM": {"bf16": 624.0, "tf32": 312.0},
    "A10": {"bf16": 250.0},
    "L40S": {"fp8": 1466.0},
    "L40": {"bf16": 362.1},
    "L4": {"fp8": 485.0},
    "B200": {"bf16": 4500.0},
    "GB200": {"fp8": 10000.0},
}


@pytest.mark.parametrize(
    ("model", "precision", "sparse"),
    [(m, p, v) for m, printed in SPARSE_AS_PRINTED.items() for p, v in printed.items()],
)
def test_tensor_peaks_are_dense_not_the_sparse_figure(
    model: str, precision: str, sparse: float
) -> None:
    peak = SPECS[model].tensor_peak_tflops(precision)
    assert peak == pytest.approx(sparse / 2, rel=0.01)
    assert SPECS["H100 SXM"].bf16_tensor_tflops == pytest.approx(989.4)  # not 1,979


def test_dense_peaks_keep_the_precisions_ratios() -> None:
    """A sparse figure taken for one precision only breaks the 1 : 2 : 4 of TF32 : BF16 : FP8
    that every tensor core here has (GeForce included, at FP32 accumulate)."""
    for spec in SPECS.values():
        tf32, bf16, fp8 = spec.tf32_tensor_tflops, spec.bf16_tensor_tflops, spec.fp8_tensor_tflops
        if tf32 is not None and bf16 is not None:
            assert bf16 == pytest.approx(2 * tf32, rel=0.03), spec.model
        if bf16 is not None and fp8 is not None:
            assert fp8 == pytest.approx(2 * bf16, rel=0.03), spec.model
