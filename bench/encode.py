"""Line-protocol encoding: gpuwatt's LineEncoder vs influxdb_client's Point API, and vs the
encoder it replaced; parsing, today's parser vs the one it replaced.

    .venv/bin/python bench/encode.py [--points 20000] [--v1-rev 05ec61d]

All encode the same full samples (every metric set) into identical-content lines; prints
microseconds per point for each and the ratio (target: ours >= 10x faster than the Point API).
Beside it, the encoder of commit 8509a5f, which generated code at run time for each pattern of
present fields, against today's plain one (issue 19, point 4: plain code unless the trick is
needed; the output is identical, ``tests/test_line_protocol_v1.py``), and ``parse_line`` /
``decode_line`` against 8509a5f's character-by-character parser. That old code is no longer in
the tree: it is read from git history (``tests/line_protocol_v1.py`` at ``--v1-rev``), and the
comparison is left out, with a line saying so, where git or that commit is not at hand.

The two are timed in alternating rounds, in CPU time (``time.process_time``), and the ratio is
taken per round: the machines this runs on are shared and their speed drifts from one minute to
the next, and a ratio of two figures measured a minute apart measures the drift as well. The
target is checked against the median of the per-round ratios; their spread is printed beside it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import types
from pathlib import Path

from gpuwatt.line_protocol import (
    LineEncoder,
    decode_line,
    format_processes,
    parse_line,
    sample_from_fields,
)
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod
from gpuwatt.schema import (
    FIELD_ENERGY_METHOD,
    FIELD_LOST,
    FIELD_PROCESS_COUNT,
    FIELD_PROCESSES,
    FIELD_TFLOPS_METHOD,
    FIELD_XID_COUNT,
    FIELD_XID_LAST,
    FIELDS,
    MEASUREMENT,
    Kind,
)

T0_NS = 1_700_000_040 * 1_000_000_000
ROOT = Path(__file__).resolve().parents[1]
V1_PATH = "tests/line_protocol_v1.py"


def load_v1(rev: str) -> types.ModuleType | None:
    """8509a5f's encoder and parser as kept at ``rev`` (None where git cannot show it)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{V1_PATH}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    module = types.ModuleType("line_protocol_v1")
    exec(compile(done.stdout, f"{rev}:{V1_PATH}", "exec"), module.__dict__)
    return module


def full_sample(time_ns: int, host: str, gpu_index: int, seed: float = 0.0) -> GpuSample:
    """A sample with every metric set (what a Hopper GPU with GPM reports)."""
    k = (gpu_index * 7 + seed) % 50
    return GpuSample(
        time_ns=time_ns,
        host=host,
        gpu_index=gpu_index,
        uuid=f"GPU-{host}-{gpu_index:04d}",
        name="NVIDIA H100 80GB HBM3",
        utilization_gpu_pct=float(40 + int(k)),
        utilization_memory_pct=float(20 + int(k) // 2),
        memory_used_bytes=(30_000 + int(k) * 100) * 1024 * 1024,
        memory_total_bytes=81_559 * 1024 * 1024,
        memory_free_bytes=(51_559 - int(k) * 100) * 1024 * 1024,
        memory_reserved_bytes=512 * 1024 * 1024,
        temperature_gpu_c=float(55 + int(k) // 5),
        temperature_memory_c=60.5 + k / 10,
        fan_speed_pct=0.0,
        power_w=350.25 + k,
        power_limit_w=700.0,
        energy_j=1.0e7 + time_ns / 1e9 * 400.0,
        energy_method=EnergyMethod.COUNTER,
        sm_clock_mhz=1980.0,
        memory_clock_mhz=2619.0,
        graphics_clock_mhz=1980.0,
        sm_clock_max_mhz=1980.0,
        clock_event_reasons=4,
        pcie_tx_bytes_per_s=1.5e9 + k,
        pcie_rx_bytes_per_s=2.5e9 + k,
        nvlink_tx_bytes_per_s=1.2e11 + k,
        nvlink_rx_bytes_per_s=1.1e11 + k,
        sm_active_pct=70.5 + k / 10,
        sm_occupancy_pct=45.25,
        tensor_active_pct=55.5,
        tensor_hmma_active_pct=50.5,
        tensor_imma_active_pct=0.0,
        tensor_dfma_active_pct=0.0,
        fp64_active_pct=0.5,
        fp32_active_pct=10.5,
        fp16_active_pct=2.5,
        dram_active_pct=60.75,
        tflops_estimate=480.5 + k,
        tflops_method=TflopsMethod.GPM,
        xid_errors=(),
        ecc_sbe_volatile_count=0,
        ecc_dbe_volatile_count=0,
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        mig_enabled=False,
        processes=(ProcessSample(4242 + gpu_index, 29 * 1024**3),),
        job_id="job-123456",
    )


def full_samples(count: int, gpus: int = 1024) -> list[GpuSample]:
    """``count`` samples over ``gpus`` GPUs (8 per host), one timestamp per round, 1 s apart."""
    out = []
    for i in range(count):
        t, g = divmod(i, gpus)
        out.append(full_sample(T0_NS + t * 1_000_000_000, f"node{g // 8:04d}", g % 8, float(t)))
    return out


def point_api_line(s: GpuSample) -> str:
    """The same line built with influxdb_client's Point API."""
    from influxdb_client import Point, WritePrecision

    p = (
        Point(MEASUREMENT)
        .tag("host", s.host)
        .tag("index", str(s.gpu_index))
        .tag("uuid", s.uuid)
        .tag("name", s.name)
        .field(FIELD_LOST, s.lost)
    )
    for spec in FIELDS:
        v = getattr(s, spec.attr)
        if v is None:
            continue
        if spec.kind is Kind.INT:
            p = p.field(spec.field, round(v / spec.scale))
        elif spec.kind is Kind.FLOAT:
            p = p.field(spec.field, float(v))
        else:
            p = p.field(spec.field, bool(v))
    if s.energy_method is not None:
        p = p.field(FIELD_ENERGY_METHOD, s.energy_method.value)
    if s.tflops_method is not None:
        p = p.field(FIELD_TFLOPS_METHOD, s.tflops_method.value)
    if s.xid_errors:
        p = p.field(FIELD_XID_LAST, s.xid_errors[-1]).field(FIELD_XID_COUNT, len(s.xid_errors))
    if s.processes is not None:
        p = p.field(FIELD_PROCESS_COUNT, len(s.processes))
        if s.processes:
            p = p.field(FIELD_PROCESSES, format_processes(s.processes))
    if s.job_id is not None:
        p = p.field("job_id", s.job_id)
    return p.time(s.time_ns, WritePrecision.NS).to_line_protocol()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--v1-rev", default="05ec61d", help="a commit that still has " + V1_PATH)
    args = ap.parse_args()
    v1 = load_v1(args.v1_rev)
    samples = full_samples(args.points)
    n_point = min(len(samples), 2_000)
    n_parse = min(len(samples), 5_000)

    enc = LineEncoder()
    generated = v1.GeneratedLineEncoder() if v1 is not None else None
    parse_v1 = v1.parse_line_v1 if v1 is not None else None
    for e in (enc, generated):
        if e is not None:
            e.encode_many(samples[:1024])  # warm the tag-prefix cache like a running collector
    clock = time.process_time
    times: dict[str, list[float]] = {
        k: [] for k in ("ours", "generated", "point", "parse", "parse_v1", "decode", "decode_v1")
    }
    ratios = []

    def timed(key: str, fn, n: int):  # type: ignore[no-untyped-def]
        t = clock()
        out = fn()
        times[key].append((clock() - t) / n * 1e6)
        return out

    for _ in range(args.rounds):
        ours = timed("ours", lambda: enc.encode_many(samples), len(samples))
        if generated is not None:
            old = timed("generated", lambda: generated.encode_many(samples), len(samples))
            assert ours == old, "the plain and the generated encoders disagree"
        theirs = timed("point", lambda: [point_api_line(s) for s in samples[:n_point]], n_point)
        ratios.append(times["point"][-1] / times["ours"][-1])
        lines = ours[:n_parse]
        timed("parse", lambda lines=lines: [parse_line(x) for x in lines], n_parse)
        timed("decode", lambda lines=lines: [decode_line(x) for x in lines], n_parse)
        if parse_v1 is not None:
            timed("parse_v1", lambda lines=lines: [parse_v1(x) for x in lines], n_parse)
            timed(
                "decode_v1",
                lambda lines=lines: [
                    sample_from_fields(p[3], p[1], p[2]) for p in map(parse_v1, lines)
                ],
                n_parse,
            )

    n_fields = len(parse_line(ours[0])[2])
    assert parse_line(ours[0]) == parse_line(theirs[0])
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"fields per point:           {n_fields}; {args.rounds} alternating rounds, CPU time")
    print(
        f"gpuwatt LineEncoder:        {med['ours']:8.2f} µs/point median "
        f"({len(samples)} points per round)"
    )
    print(
        f"influxdb_client Point API:  {med['point']:8.2f} µs/point median "
        f"({n_point} points per round)"
    )
    ratio = statistics.median(ratios)
    verdict = "ok" if ratio >= 10 else "MISSED"
    print(
        f"ratio (Point / ours):       {ratio:8.1f}x median of the rounds' ratios "
        f"(range {min(ratios):.1f}-{max(ratios):.1f}x; target >= 10x: {verdict})"
    )
    if v1 is None:
        print(f"8509a5f's encoder and parser: not compared ({V1_PATH} not found at {args.v1_rev})")
        print(f"parse_line:                 {med['parse']:8.2f} µs/line median")
        print(f"decode_line (to a sample):  {med['decode']:8.2f} µs/line median")
        return
    print(
        f"8509a5f's generated encoder:{med['generated']:8.2f} µs/point median (identical "
        f"output); plain / generated {med['ours'] / med['generated']:.2f}x"
    )
    print(
        f"parse_line:                 {med['parse']:8.2f} µs/line median; 8509a5f's "
        f"{med['parse_v1']:.2f} µs ({med['parse_v1'] / med['parse']:.1f}x faster)"
    )
    print(
        f"decode_line (to a sample):  {med['decode']:8.2f} µs/line median; 8509a5f's "
        f"{med['decode_v1']:.2f} µs ({med['decode_v1'] / med['decode']:.1f}x faster)"
    )


if __name__ == "__main__":
    main()
