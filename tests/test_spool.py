"""The spool keeps every sample on disk until the store has it, in order, within its bound."""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import msgpack
import pytest

from gpuwatt.collector import spool_frames
from gpuwatt.collector.spool import Spool
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod


def _lines(start: int, n: int) -> list[str]:
    return [f"m,host=h f={i}i {i}" for i in range(start, start + n)]


def _drain(spool: Spool) -> list[str]:
    out: list[str] = []
    while True:
        batch = spool.read_batch(max_lines=7)
        if not batch.lines:
            return out
        out += batch.lines
        spool.commit(batch)


def test_lines_come_back_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=200, max_bytes=1_000_000)
    for k in range(20):
        spool.append(_lines(k * 5, 5))
    assert len(list(tmp_path.glob("*.lp"))) > 3
    assert _drain(spool) == _lines(0, 100)
    assert spool.pending_lines() == 0
    # delivered segments are deleted
    assert len(list(tmp_path.glob("*.lp"))) == 1
    spool.close()


def test_uncommitted_batch_is_read_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(_lines(0, 10))
    first = spool.read_batch(max_lines=4)
    again = spool.read_batch(max_lines=4)  # the store failed: nothing committed
    assert first.lines == again.lines == _lines(0, 4)
    spool.commit(again)
    assert spool.read_batch().lines == _lines(4, 6)
    spool.close()


def test_restart_resumes_from_the_cursor(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=150, max_bytes=1_000_000)
    spool.append(_lines(0, 30))
    batch = spool.read_batch(max_lines=12)
    spool.commit(batch)
    spool.close()
    reopened = Spool(tmp_path, segment_bytes=150, max_bytes=1_000_000)
    assert _drain(reopened) == _lines(12, 18)
    reopened.close()


def test_partial_tail_from_a_crash_is_cut(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(_lines(0, 3))
    spool.close()
    seg = sorted(tmp_path.glob("*.lp"))[-1]
    with open(seg, "ab") as f:
        f.write(b"m,host=h f=99")  # killed mid-write
    reopened = Spool(tmp_path)
    assert _drain(reopened) == _lines(0, 3)
    reopened.append(_lines(3, 1))
    assert _drain(reopened) == _lines(3, 1)
    reopened.close()


def test_bound_drops_oldest_first_and_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, segment_bytes=100, max_bytes=300)
    for k in range(40):
        spool.append(_lines(k, 1))
    assert spool.pending_bytes() <= 300 + 100
    kept = _drain(spool)
    assert spool.dropped_lines > 0
    assert spool.dropped_lines + len(kept) == 40
    assert kept == _lines(40 - len(kept), len(kept))  # the newest survive, in order
    assert "dropped" in caplog.text
    spool.close()


def _sigkill_after_300_appends(script: str) -> int:
    """Run ``script`` (it appends for ever, printing each index once its append returned) and
    SIGKILL it once it reported 300: the last index it reported."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acknowledged = -1
    for line in proc.stdout:
        acknowledged = int(line)
        if acknowledged >= 300:
            break
    os.kill(proc.pid, 9)
    proc.wait()
    proc.stdout.close()
    return acknowledged


def test_sigkill_loses_nothing_that_append_returned(tmp_path: Path) -> None:
    """A child appends, reports each append, and is SIGKILLed: every reported line is on disk."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from gpuwatt.collector.spool import Spool
        spool = Spool({str(tmp_path)!r}, segment_bytes=4096)
        i = 0
        while True:
            spool.append([f"m,host=h f={{i}}i {{i}}"])
            print(i, flush=True)
            i += 1
        """
    )
    acknowledged = _sigkill_after_300_appends(script)
    spool = Spool(tmp_path, segment_bytes=4096)
    got = _drain(spool)
    assert got[: acknowledged + 1] == _lines(0, acknowledged + 1)
    spool.close()


# --- the binary form (a store on this machine) ---------------------------------------------------


def _samples(start: int, n: int) -> list[GpuSample]:
    """Samples with every kind of value a frame carries: floats, ints, bools, enums, XIDs,
    processes, a job id, absent metrics."""
    return [
        GpuSample(
            time_ns=1_700_000_000_000_000_000 + i,
            host="node 1,\n%",
            gpu_index=i % 8,
            uuid=f"GPU-{i % 8}",
            name="NVIDIA H100 80GB HBM3",
            power_w=300.0 + i / 7,
            memory_used_bytes=i * 1024**2 + 1,
            temperature_gpu_c=float("nan") if i % 5 == 0 else 60.0,
            mig_enabled=bool(i % 2),
            energy_method=EnergyMethod.COUNTER,
            tflops_method=TflopsMethod.GPM if i % 3 else None,
            xid_errors=(13, 79) if i % 4 == 0 else (),
            processes=(ProcessSample(4242, 1024**3, "alice"), ProcessSample(7, None))
            if i % 2
            else None,
            job_id=f'job "{i}"' if i % 3 else None,
        )
        for i in range(start, start + n)
    ]


def _same(a: list[GpuSample], b: list[GpuSample]) -> bool:
    """Equal, NaN matching NaN (a sample holding NaN is not equal to itself)."""
    return [repr(s) for s in a] == [repr(s) for s in b]


def _drain_samples(spool: Spool, max_lines: int = 7) -> list[GpuSample]:
    out: list[GpuSample] = []
    while True:
        batch = spool.read_batch(max_lines=max_lines)
        if not len(batch):
            return out
        assert not batch.lines
        out += batch.samples
        spool.commit(batch)


def test_binary_samples_come_back_equal_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=2000, max_bytes=1_000_000, binary=True)
    for k in range(20):
        spool.append_samples(_samples(k * 5, 5))
    assert len(list(tmp_path.glob("*.gws"))) > 3 and not list(tmp_path.glob("*.lp"))
    assert spool.pending_lines() == 100
    back = _drain_samples(spool)
    assert _same(back, _samples(0, 100))
    assert all(type(s) is GpuSample for s in back)
    assert spool.pending_lines() == 0
    assert len(list(tmp_path.glob("*.gws"))) == 1
    spool.close()


def test_binary_restart_resumes_from_the_cursor(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=50_000, max_bytes=1_000_000, binary=True)
    for k in range(6):
        spool.append_samples(_samples(k * 5, 5))
    batch = spool.read_batch(max_lines=12)  # whole frames: 10 samples
    assert len(batch) == 10
    spool.commit(batch)
    spool.close()
    reopened = Spool(tmp_path, segment_bytes=50_000, max_bytes=1_000_000, binary=True)
    assert _same(_drain_samples(reopened), _samples(10, 20))
    reopened.close()


def _binary_segment(folder: Path, n: int) -> Path:
    """A binary spool in ``folder`` with ``n`` samples written and closed: its one segment."""
    spool = Spool(folder, binary=True)
    spool.append_samples(_samples(0, n))
    spool.close()
    (seg,) = folder.glob("*.gws")
    return seg


def test_binary_frame_cut_short_by_a_crash_is_cut(tmp_path: Path) -> None:
    seg = _binary_segment(tmp_path, 3)
    intact = seg.stat().st_size
    spool = Spool(tmp_path, binary=True)
    spool.append_samples(_samples(3, 3))
    spool.close()
    with open(seg, "r+b") as f:  # killed mid-write: the second frame half on disk
        f.truncate(intact + (seg.stat().st_size - intact) // 2)
    reopened = Spool(tmp_path, binary=True)
    assert seg.stat().st_size == intact
    assert _same(_drain_samples(reopened), _samples(0, 3))
    reopened.append_samples(_samples(6, 1))
    assert _same(_drain_samples(reopened), _samples(6, 1))
    reopened.close()


def test_binary_bound_drops_oldest_first_and_counts(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1000, max_bytes=3000, binary=True)
    for k in range(40):
        spool.append_samples(_samples(k, 1))
    kept = _drain_samples(spool)
    assert spool.dropped_lines > 0
    assert spool.dropped_lines + len(kept) == 40
    assert _same(kept, _samples(40 - len(kept), len(kept)))
    spool.close()


def test_text_left_by_an_earlier_run_is_delivered_first(tmp_path: Path) -> None:
    text = Spool(tmp_path)
    text.append(_lines(0, 3))
    text.close()
    spool = Spool(tmp_path, binary=True)
    spool.append_samples(_samples(0, 2))
    first = spool.read_batch()
    assert first.lines == _lines(0, 3) and not first.samples
    spool.commit(first)
    assert _same(_drain_samples(spool), _samples(0, 2))
    with pytest.raises(ValueError, match="takes samples"):
        spool.append(_lines(3, 1))
    spool.close()
    # and back: a text spool delivers the binary segments an earlier run left
    spool = Spool(tmp_path, binary=True)
    spool.append_samples(_samples(5, 2))
    spool.close()
    text = Spool(tmp_path)
    text.append_samples(_samples(7, 1))
    assert _same(text.read_batch().samples, _samples(5, 2))
    text.close()


def test_a_segment_written_before_a_metric_was_added_reads_by_name(tmp_path: Path) -> None:
    """A segment whose header lacks an attribute (written before it existed) and has one this
    version does not know: known values come back by name, the new one not measured."""
    older = [a for a in spool_frames.ATTRS if a != "power_w"] + ["retired_metric"]
    header = msgpack.packb({"fields": older})
    sample = _samples(1, 1)[0]
    row = [getattr(sample, a) for a in older if a != "retired_metric"] + [1.5]
    payload = msgpack.packb([row], default=lambda p: (p.pid, p.used_memory_bytes))
    data = struct.pack("<7sBI", b"GWSPOOL", 1, len(header)) + header
    data += struct.pack("<III", len(payload), 1, zlib.crc32(payload)) + payload
    private = tmp_path / "spool"
    Spool(private).close()
    (private / "0000000000000005.gws").write_bytes(data)
    spool = Spool(private, binary=True)
    (back,) = _drain_samples(spool)
    assert back.power_w is None
    # the older writer kept (pid, bytes): its processes read back without users
    procs = tuple(ProcessSample(p.pid, p.used_memory_bytes) for p in sample.processes or ())
    assert procs and repr(back) == repr(dataclasses.replace(sample, power_w=None, processes=procs))
    spool.close()


def test_a_newer_segment_format_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    seg = _binary_segment(tmp_path, 1)
    data = bytearray(seg.read_bytes())
    data[7] = 2  # the version byte
    seg.write_bytes(bytes(data))
    with pytest.raises(spool_frames.SpoolFormatError, match="newer than this collector"):
        Spool(tmp_path, binary=True)


def test_binary_sigkill_loses_nothing_that_append_returned(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_spool import _samples
        from gpuwatt.collector.spool import Spool
        spool = Spool({str(tmp_path)!r}, segment_bytes=8192, binary=True)
        i = 0
        while True:
            spool.append_samples(_samples(i, 1))
            print(i, flush=True)
            i += 1
        """
    )
    acknowledged = _sigkill_after_300_appends(script)
    spool = Spool(tmp_path, segment_bytes=8192, binary=True)
    got = _drain_samples(spool, max_lines=50)
    assert _same(got[: acknowledged + 1], _samples(0, acknowledged + 1))
    spool.close()


def test_a_second_reader_leaves_the_running_spools_cursor_alone(tmp_path: Path) -> None:
    """``gpuwatt spool status`` opens the spool of a running collector: the collector's later
    commits must still reach the cursor file the next start reads."""
    running = Spool(tmp_path)
    running.append(_lines(0, 10))
    running.commit(running.read_batch(max_lines=3))
    status = Spool(tmp_path)
    assert status.pending_lines() == 7
    status.close()
    running.commit(running.read_batch(max_lines=4))
    running.close()
    reopened = Spool(tmp_path)
    assert _drain(reopened) == _lines(7, 3)
    reopened.close()
