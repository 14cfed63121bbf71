"""Line protocol: Telegraf-compatible names and types, None omitted, exact round trip."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwatt.line_protocol import LineEncoder, LineProtocolError, decode_line, parse_line
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod
from gpuwatt.schema import FIELDS

BASE = GpuSample(
    time_ns=1_700_000_000_123_456_789,
    host="node 1",
    gpu_index=5,
    uuid="GPU-1234",
    name="NVIDIA H100 80GB HBM3",
)


def test_none_fields_are_absent_not_zero() -> None:
    line = LineEncoder().encode(dataclasses.replace(BASE, power_w=612.25, fan_speed_pct=None))
    _, tags, fields, ts = parse_line(line)
    assert fields["power_draw"] == 612.25
    assert "fan_speed" not in fields
    assert "utilization_gpu" not in fields
    assert tags == {"host": "node 1", "index": "5", "uuid": "GPU-1234", "name": BASE.name}
    assert ts == BASE.time_ns


def test_telegraf_names_units_and_types() -> None:
    sample = dataclasses.replace(
        BASE,
        utilization_gpu_pct=97,
        memory_used_bytes=40 * 1024**3,
        temperature_gpu_c=71,
        sm_clock_mhz=1980,
        power_limit_w=700.0,
    )
    line = LineEncoder().encode(sample)
    assert line.startswith("nvidia_smi,host=node\\ 1,index=5,uuid=GPU-1234,")
    assert "utilization_gpu=97i" in line
    assert "memory_used=40960i" in line  # MiB, integer, like Telegraf
    assert "temperature_gpu=71i" in line
    assert "clocks_current_sm=1980i" in line
    assert "power_limit=700.000" in line


def test_full_sample_round_trips() -> None:
    values = {
        f.attr: (123.5 if f.kind.value == "float" else True if f.kind.value == "bool" else 42)
        for f in FIELDS
    }
    for attr in ("memory_used_bytes", "memory_total_bytes", "memory_free_bytes"):
        values[attr] = 7 * 1024**2  # stored in whole MiB, as Telegraf does
    values["memory_reserved_bytes"] = 0
    sample = dataclasses.replace(
        BASE,
        **values,
        energy_method=EnergyMethod.COUNTER,
        tflops_method=TflopsMethod.GPM,
        xid_errors=(13, 79),
        processes=(ProcessSample(4242, 1024**3), ProcessSample(4243, None)),
        job_id='train "llm", run 7',
    )
    back = decode_line(LineEncoder().encode(sample))
    for f in FIELDS:
        assert getattr(back, f.attr) == getattr(sample, f.attr), f.attr
    assert back.energy_method is EnergyMethod.COUNTER
    assert back.tflops_method is TflopsMethod.GPM
    assert back.xid_errors == (79,)  # the last XID of the interval
    assert back.processes == sample.processes
    assert back.job_id == sample.job_id
    assert back.key == sample.key


def test_lost_gpu_is_a_marker_not_zeros() -> None:
    line = LineEncoder().encode(dataclasses.replace(BASE, lost=True, power_w=1.0))
    _, _, fields, _ = parse_line(line)
    assert fields == {"gpu_lost": True}
    assert decode_line(line).lost


def test_non_finite_values_are_dropped() -> None:
    line = LineEncoder().encode(
        dataclasses.replace(BASE, power_w=float("nan"), temperature_memory_c=float("inf"))
    )
    _, _, fields, _ = parse_line(line)
    assert "power_draw" not in fields
    assert "temperature_memory_c" not in fields


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_dropped_on_the_hot_path_too(bad: float) -> None:
    """The same presence pattern as the sample before (the compiled direct format)."""
    enc = LineEncoder()
    base = dataclasses.replace(BASE, power_w=300.5, energy_j=5.0, temperature_memory_c=61.0)
    before = parse_line(enc.encode(base))[2]
    assert {"power_draw", "energy_j", "temperature_memory_c"} <= before.keys()
    fields = parse_line(enc.encode(dataclasses.replace(base, power_w=bad)))[2]
    assert fields == {k: v for k, v in before.items() if k != "power_draw"}
    # Finite values whose sum overflows take the general path and are all kept.
    huge = dataclasses.replace(base, power_w=1e308, energy_j=1e308)
    assert parse_line(enc.encode(huge))[2]["power_draw"] == 1e308
    assert parse_line(enc.encode(base))[2] == before


def test_presence_patterns_are_encoded_independently() -> None:
    enc = LineEncoder()
    a = enc.encode(dataclasses.replace(BASE, power_w=1.0))
    b = enc.encode(dataclasses.replace(BASE, temperature_gpu_c=50))
    assert "power_draw" in a and "temperature_gpu" not in a
    assert "temperature_gpu" in b and "power_draw" not in b


@pytest.mark.parametrize("bad", ["nvidia_smi", "nvidia_smi,host=a f=1 notatime", 'm f="open 1'])
def test_malformed_lines_are_rejected(bad: str) -> None:
    with pytest.raises(LineProtocolError):
        decode_line(bad)
