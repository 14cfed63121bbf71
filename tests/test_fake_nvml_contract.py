"""The fake NVML is held to the real module: same functions, same signatures, same objects."""

from __future__ import annotations

import inspect

import pynvml
import pytest
from nvml_fixtures import make_cluster

from gpuwatt.collector.sim.fake_nvml import FakeNvml


@pytest.fixture(scope="module")
def fake() -> FakeNvml:
    return FakeNvml(make_cluster(2), "node-1")


def _fake_functions(fake: FakeNvml) -> list[str]:
    return [
        name
        for name in dir(type(fake))
        if name.startswith("nvml") and inspect.isfunction(getattr(type(fake), name))
    ]


def test_fake_offers_the_functions_the_collector_calls(fake: FakeNvml) -> None:
    offered = set(_fake_functions(fake))
    needed = {
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlEventSetCreate",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait",
        "nvmlEventSetFree",
        "nvmlDeviceGetRemappedRows",
    }
    assert needed <= offered


@pytest.mark.parametrize("name", _fake_functions(FakeNvml(make_cluster(1), "node-1")))
def test_every_fake_function_exists_in_pynvml_with_a_compatible_signature(name: str) -> None:
    real = getattr(pynvml, name, None)
    assert real is not None, f"{name} is not a pynvml function"
    real_params = list(inspect.signature(real).parameters.values())
    fake_params = list(inspect.signature(getattr(FakeNvml, name)).parameters.values())[1:]
    assert [p.name for p in fake_params] == [p.name for p in real_params]
    for fp, rp in zip(fake_params, real_params, strict=True):
        assert fp.kind == rp.kind, f"{name}({fp.name}): kind differs"
        # a parameter the real function defaults must be defaulted to the same value
        assert (fp.default is inspect.Parameter.empty) == (rp.default is inspect.Parameter.empty)
        if rp.default is not inspect.Parameter.empty:
            assert fp.default == rp.default, f"{name}({fp.name}): default differs"


def test_every_constant_class_and_struct_is_the_real_object(fake: FakeNvml) -> None:
    exported = [n for n in vars(fake) if not n.startswith("_")]
    assert len(exported) > 500  # constants, error classes, structs
    for name in exported:
        assert getattr(fake, name) is getattr(pynvml, name), name
    for name in ("NVMLError", "NVMLError_GpuIsLost", "c_nvmlMemory_v2_t", "nvmlMemory_v2"):
        assert getattr(fake, name) is getattr(pynvml, name)


def test_the_fake_has_no_public_attribute_of_its_own(fake: FakeNvml) -> None:
    own = {n for n in dir(fake) if not n.startswith("_")} - set(vars(pynvml))
    assert own == set(), own


def test_errors_are_the_real_subclasses() -> None:
    cluster = make_cluster(2)
    cluster.gpus[0].lost = True
    cluster.gpus[1].unsupported.add("nvmlDeviceGetFanSpeed")
    nv = FakeNvml(cluster, "node-1")
    nv.nvmlInit()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetPowerUsage(nv.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetFanSpeed(nv.nvmlDeviceGetHandleByIndex(1))
    with pytest.raises(pynvml.NVMLError_Timeout):
        nv.nvmlEventSetWait(nv.nvmlEventSetCreate(), 1)


def test_answers_have_the_real_types() -> None:
    nv = FakeNvml(make_cluster(1), "node-1")
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    m2 = nv.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert isinstance(m2, pynvml.c_nvmlMemory_v2_t)
    assert m2.used + m2.free + m2.reserved == m2.total
    m1 = nv.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(m1, pynvml.c_nvmlMemory_t) and m1.used == m2.used + m2.reserved
    assert isinstance(nv.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    assert isinstance(nv.nvmlGpmSampleAlloc(), pynvml.c_nvmlGpmSample_t)
    assert isinstance(nv.nvmlDeviceGetUUID(h), str)
