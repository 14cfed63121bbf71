"""Telegraf's ``nvidia_smi`` fields, read in Telegraf's types; gpuwatt's never in another type.

Golden data: Telegraf's own test expectations (``tests/data/telegraf``), from real nvidia-smi
dumps of twelve GPUs and XML schemas v11, v12 and v13.
"""

from __future__ import annotations

import pytest
from telegraf_data import CASES, EXPECTED, gpu_metric, telegraf_line

from gpuwatt.line_protocol import LineEncoder, decode_line, parse_line
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod
from gpuwatt.schema import FIELD_BY_NAME, FIELDS, MIB, Kind
from gpuwatt.telegraf import (
    ALIASES,
    REASON_FIELDS,
    TELEGRAF_FIELD_TYPES,
    merge_writers,
    mig_from_point,
    process_from_point,
    reasons_from_fields,
)

LP_TYPE = {bool: "bool", int: "int", float: "float", str: "str"}


def _full_sample() -> GpuSample:
    """A sample with every field gpuwatt writes set."""
    values = {
        f.attr: (True if f.kind is Kind.BOOL else 7.5 if f.kind is Kind.FLOAT else 7)
        for f in FIELDS
    }
    return GpuSample(
        time_ns=1,
        host="h",
        gpu_index=0,
        uuid="GPU-1",
        name="NVIDIA A10G",
        **values,
        energy_method=EnergyMethod.COUNTER,
        tflops_method=TflopsMethod.GPM,
        xid_errors=(79,),
        processes=(ProcessSample(1, 2),),
        job_id="j",
        pci_device_id=0x223710DE,
    )


def test_every_field_telegraf_has_is_written_in_telegrafs_type() -> None:
    _, _, written, _ = parse_line(LineEncoder().encode(_full_sample()))
    shared = {k: LP_TYPE[type(v)] for k, v in written.items() if k in TELEGRAF_FIELD_TYPES}
    assert shared, "gpuwatt writes Telegraf's fields"
    assert shared == {k: TELEGRAF_FIELD_TYPES[k] for k in shared}
    # gpuwatt's remap flags are booleans under its own names (VictoriaMetrics keeps no strings)
    assert {k: LP_TYPE[type(v)] for k, v in written.items() if "remap" in k} == {
        "remapped_rows_correctable": "int",
        "remapped_rows_uncorrectable": "int",
        "row_remap_pending": "bool",
        "row_remap_failure": "bool",
    }
    # and the table is Telegraf's own: every typed field of its expectations agrees with it
    for case in CASES:
        for field, (kind, _) in gpu_metric(case)["fields"].items():
            assert TELEGRAF_FIELD_TYPES[field] == kind, (case["name"], field)


def test_only_telegrafs_own_fields_are_marked_as_telegrafs() -> None:
    marked = {f.field for f in FIELDS if f.telegraf}
    assert marked <= set(TELEGRAF_FIELD_TYPES)
    assert "clocks_max_sm" not in marked and "clocks_max_sm" not in TELEGRAF_FIELD_TYPES
    assert {f.field for f in FIELDS if not f.telegraf}.isdisjoint(TELEGRAF_FIELD_TYPES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_telegraf_point_reads_as_telegraf_meant_it(case: dict) -> None:
    metric = gpu_metric(case)
    fields = {k: v for k, (_, v) in metric["fields"].items()}
    s = decode_line(telegraf_line(metric, "ws-1", 1_700_000_000 * 10**9))
    assert (s.uuid, s.name, s.gpu_index) == (
        metric["tags"]["uuid"],
        metric["tags"]["name"],
        int(metric["tags"]["index"]),
    )
    assert not s.lost
    for name, value in fields.items():
        spec = FIELD_BY_NAME.get(name)
        if spec is None:
            continue
        assert getattr(s, spec.attr) == pytest.approx(value * spec.scale), name
    reasons = {k: v for k, v in fields.items() if k in REASON_FIELDS}
    if reasons:
        want = sum(bit for k, bit in REASON_FIELDS.items() if fields.get(k))
        assert s.clock_event_reasons == want
    else:
        assert s.clock_event_reasons is None  # absent, never zero
    for alias in ALIASES:
        present = [fields[f] for f in alias.fields if f in fields]
        got = getattr(s, alias.attr)
        if present and alias.flag:
            assert got is ("Yes" in present), alias.attr
        elif present:
            assert got == pytest.approx(sum(present) * alias.scale), alias.attr
        else:
            assert got is None, alias.attr


def test_the_golden_data_covers_what_it_should() -> None:
    seen = {f for c in CASES for m in c["metrics"] for f in m["fields"]}
    assert set(REASON_FIELDS) <= seen  # all nine reasons
    assert {"temperature_memory", "pcie_rx_util", "pcie_tx_util"} <= seen
    assert {"ecc_errors_channel_repair_pending", "remapped_rows_failure"} <= seen
    measurements = {m["measurement"] for c in CASES for m in c["metrics"]}
    assert measurements == {"nvidia_smi", "nvidia_smi_process", "nvidia_smi_mig"}
    assert "influxdata/telegraf" in EXPECTED["source"]


def test_reason_fields_make_nvmls_bitmask() -> None:
    assert reasons_from_fields({}) is None
    assert reasons_from_fields({"clocks_event_reason_gpu_idle": 0}) == 0
    both = {"clocks_event_reason_hw_slowdown": 1, "clocks_event_reason_sw_power_cap": 1}
    assert reasons_from_fields(both) == 0x8 | 0x4


def test_schema_v13_ecc_counts_are_nvmls_totals() -> None:
    # Telegraf's v13 parser splits volatile ECC counts by DRAM and SRAM (no testdata has them)
    line = (
        "nvidia_smi,host=h,index=0,uuid=u ecc_errors_volatile_dram_correctable=3i,"
        "ecc_errors_volatile_sram_correctable=1i,ecc_errors_volatile_dram_uncorrectable=0i 1"
    )
    s = decode_line(line)
    assert (s.ecc_sbe_volatile_count, s.ecc_dbe_volatile_count) == (4, 0)


def test_old_boolean_remap_flags_still_read() -> None:
    line = "nvidia_smi,host=h,index=0,uuid=u remapped_rows_failure=true,gpu_lost=false 1"
    assert decode_line(line).remapped_rows_failure is True


def _s(t_s: int, **kw: object) -> GpuSample:
    return GpuSample(time_ns=t_s * 10**9, host="h", gpu_index=0, uuid="GPU-1", name="A10G", **kw)


def test_two_writers_of_one_gpu_are_one_gpu_not_a_sum() -> None:
    ours = _s(100, power_w=150.0, energy_j=5.0)
    theirs = _s(101, power_w=150.0, temperature_memory_c=60.0)
    out, shared = merge_writers([(ours, "gpuwatt"), (theirs, "telegraf")])
    assert len(out) == 1
    assert out[0].power_w == 150.0 and out[0].energy_j == 5.0
    assert out[0].temperature_memory_c == 60.0  # filled from the other writer
    assert shared == {"GPU-1": ("gpuwatt", "telegraf")}


def test_one_gpu_under_two_pstates_is_one_gpu() -> None:
    out, shared = merge_writers([(_s(10, power_w=1.0), "telegraf"), (_s(20), "telegraf")])
    assert [s.time_ns for s in out] == [20 * 10**9]
    assert out[0].power_w == 1.0
    assert shared == {}


def test_a_stale_gpuwatt_point_gives_way_to_a_fresh_telegraf_one() -> None:
    out, _ = merge_writers([(_s(0, energy_j=5.0), "gpuwatt"), (_s(600), "telegraf")])
    assert out[0].time_ns == 600 * 10**9
    assert out[0].energy_j is None  # not filled from a point ten minutes old


def test_memory_scale_is_mib() -> None:
    assert FIELD_BY_NAME["memory_used"].scale == MIB


def _points(measurement: str) -> list[tuple[dict, tuple]]:
    out = []
    for case in CASES:
        for m in case["metrics"]:
            if m["measurement"] == measurement:
                _, tags, values, t_ns = parse_line(telegraf_line(m, "ws-1", 10**18))
                out.append((m, (t_ns, tags, values)))
    return out


def test_telegraf_process_points_read_as_processes() -> None:
    points = _points("nvidia_smi_process")
    assert len(points) == 9  # RTX 3080 (v12) and RTX 4000 SFF Ada
    for m, args in points:
        p = process_from_point(*args)
        assert p.pid == m["fields"]["pid"][1]
        assert p.used_memory_bytes == m["fields"]["used_memory"][1] * MIB
        assert (p.process_name, p.context_type) == (m["tags"]["name"], m["tags"]["type"])


def test_telegraf_mig_points_read_as_mig_devices_of_their_gpu() -> None:
    points = _points("nvidia_smi_mig")
    assert len(points) == 4  # the A100 in MIG mode
    for m, args in points:
        d = mig_from_point(*args)
        assert d.gpu_uuid == m["tags"]["uuid"]
        assert (d.mig_index, d.gpu_instance_id, d.compute_instance_id) == (
            int(m["tags"]["index"]),
            int(m["tags"]["gpu_index"]),
            int(m["tags"]["compute_index"]),
        )
        assert d.memory_total_bytes == m["fields"]["memory_fb_total"][1] * MIB
        assert d.memory_used_bytes == m["fields"]["memory_fb_used"][1] * MIB
