"""The fake NVML is held to the real module: same functions, same signatures, same objects."""

from __future__ import annotations

import ctypes
import inspect

import pynvml
import pytest
from nvml_fixtures import make_cluster, scenario_mig_partitioned

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
        "nvmlDeviceGetPciInfo",  # pciDeviceId: the GPU table's second key
        # MIG (collector.nvml_mig)
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetAttributes",
        "nvmlDeviceGetGpuInstanceProfileInfo",
        "nvmlGpmMigSampleGet",
        "nvmlGpmQueryDeviceSupport",
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


def test_mig_answers_have_the_real_types_and_refuse_what_nvml_refuses() -> None:
    cluster = make_cluster(1)
    (mig,) = scenario_mig_partitioned(cluster, index=0, profiles=("1g.10gb",))
    nv = FakeNvml(cluster, "node-1")
    nv.nvmlInit()
    parent = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert isinstance(nv.nvmlDeviceGetMaxMigDeviceCount(parent), int)
    h = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0) is h  # one handle per device
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    # pynvml returns the c_uint itself from nvmlDeviceIsMigDeviceHandle
    is_mig = nv.nvmlDeviceIsMigDeviceHandle(h)
    assert isinstance(is_mig, ctypes.c_uint) and is_mig.value == 1
    assert nv.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    assert nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h) is parent
    assert nv.nvmlDeviceGetGpuInstanceId(h) == mig.gpu_instance_id
    assert nv.nvmlDeviceGetComputeInstanceId(h) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetGpuInstanceId(parent)
    attrs = nv.nvmlDeviceGetAttributes(h)
    assert isinstance(attrs, pynvml.c_nvmlDeviceAttributes)
    assert attrs.multiprocessorCount == 16 and attrs.gpuInstanceSliceCount == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetAttributes(parent)  # NVML answers it on MIG device handles only
    full = nv.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    assert isinstance(full, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (full.sliceCount, full.multiprocessorCount) == (7, 132)
    assert isinstance(
        nv.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t
    )
    assert isinstance(nv.nvmlDeviceGetUUID(h), str) and nv.nvmlDeviceGetUUID(h).startswith("MIG-")
    for refused in (nv.nvmlDeviceGetPowerUsage, nv.nvmlDeviceGetUtilizationRates):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            refused(h)
    sample = nv.nvmlGpmSampleAlloc()
    assert nv.nvmlGpmMigSampleGet(parent, mig.gpu_instance_id, sample) is sample
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlGpmMigSampleGet(parent, 99, sample)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlGpmSampleGet(parent, sample)  # a GPU in MIG mode: GPM per instance only
    cluster.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetMemoryInfo(h)
