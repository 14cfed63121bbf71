"""The spool keeps every sample on disk until the store has it, in order, within its bound."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwatt.collector.spool import Spool


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
    spool = Spool(tmp_path, segment_bytes=4096)
    got = _drain(spool)
    assert got[: acknowledged + 1] == _lines(0, acknowledged + 1)
    spool.close()
