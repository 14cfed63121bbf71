"""GpuSample's fast constructors build exactly what the dataclass builds."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

import pytest

from gpuwatt.model import (
    EnergyMethod,
    GpuSample,
    ProcessSample,
    TflopsMethod,
    _slot_twin,
    gpu_sample_from_fields,
    make_gpu_sample,
)


def _distinct_values() -> dict[str, Any]:
    """A value for every field, each different from the others and from the defaults."""
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(GpuSample)):
        values[f.name] = 1000.5 + i
    values.update(
        time_ns=1_700_000_000_000_000_001,
        host="node-7",
        gpu_index=3,
        uuid="GPU-abc",
        name="NVIDIA H100 80GB HBM3",
        lost=False,
        memory_used_bytes=11,
        memory_total_bytes=12,
        memory_free_bytes=13,
        memory_reserved_bytes=14,
        energy_method=EnergyMethod.COUNTER,
        clock_event_reasons=4,
        tflops_method=TflopsMethod.GPM,
        xid_errors=(79, 48),
        ecc_sbe_volatile_count=1,
        ecc_dbe_volatile_count=2,
        remapped_rows_correctable=3,
        remapped_rows_uncorrectable=4,
        remapped_rows_pending=True,
        remapped_rows_failure=False,
        mig_enabled=True,
        processes=(ProcessSample(42, 1024), ProcessSample(43, None)),
        job_id="job-9",
        extra={"k": "v"},
    )
    return values


def test_the_fast_constructor_is_available_on_this_interpreter() -> None:
    assert _slot_twin(GpuSample) is not None  # CPython allows the class switch


def test_positional_construction_equals_the_keyword_constructor_field_by_field() -> None:
    values = _distinct_values()
    normal = GpuSample(**values)
    for fast in (make_gpu_sample(*values.values()), gpu_sample_from_fields(values)):
        assert type(fast) is GpuSample
        assert fast == normal and hash(fast) == hash(normal)
        for name, value in values.items():
            assert getattr(fast, name) is value, name


def test_construction_by_keyword_leaves_the_rest_at_the_defaults() -> None:
    fast = gpu_sample_from_fields(
        {"time_ns": 1, "host": "h", "gpu_index": 0, "uuid": "u", "name": "n", "power_w": 5.0}
    )
    assert fast == GpuSample(1, "h", 0, "u", "n", power_w=5.0)
    assert fast.xid_errors == () and fast.energy_j is None and fast.extra == {}
    with pytest.raises(TypeError):
        gpu_sample_from_fields(
            {
                "time_ns": 1,
                "host": "h",
                "gpu_index": 0,
                "uuid": "u",
                "name": "n",
                "power_watts": 5.0,
            }
        )  # no such field


def test_defaults_are_the_dataclass_defaults_and_extra_is_fresh() -> None:
    a = make_gpu_sample(1, "h", 0, "u", "n")
    assert a == GpuSample(1, "h", 0, "u", "n")
    assert a.lost is False and a.power_w is None and a.xid_errors == () and a.extra == {}
    assert make_gpu_sample(1, "h", 0, "u", "n").extra is not a.extra
    with pytest.raises(TypeError):
        make_gpu_sample(1, "h", 0, "u")  # a required field missing, as with GpuSample


def test_the_result_stays_frozen_and_replace_and_pickle_work() -> None:
    s = make_gpu_sample(*_distinct_values().values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.power_w = 1.0  # type: ignore[misc]
    changed = dataclasses.replace(s, power_w=2.0)
    assert type(changed) is GpuSample and changed.power_w == 2.0 and changed.host == s.host
    assert pickle.loads(pickle.dumps(s)) == s
    assert not hasattr(s, "__dict__")


def test_a_class_with_post_init_gets_its_own_constructor_back() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError

    assert _slot_twin(Checked) is None  # built by its own __init__, which checks
