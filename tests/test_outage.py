"""The collector against a real store that goes away: nothing lost, memory bounded, no duplicates.

These run the real command line (``python -m gpuwatt collect --simulate ...``) against Debian's
victoria-metrics, which accepts InfluxDB's ``/api/v2/write``; the server is killed and restarted
underneath it. The embedded store's outage is another writer holding its database. Times here
are how long the scenario lasts, not how fast anything must be.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from servers import VictoriaMetricsServer

pytestmark = pytest.mark.servers

GPUS = 32  # the healthy scenario: 4 nodes x 8 GPUs
OUTAGE_S = 30.0


def _collector(vm: VictoriaMetricsServer, spool: Path, interval_s: float, duration_s: float):
    env = {
        **os.environ,
        "INFLUXDB_V2_TOKEN": "test-token-not-checked-by-victoria-metrics",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [
        sys.executable,
        "-m",
        "gpuwatt",
        "collect",
        "--simulate",
        "healthy",
        "--interval",
        str(interval_s),
        "--duration",
        str(duration_s),
        "--spool",
        str(spool),
        "--store",
        f"influxdb://{vm.url.removeprefix('http://')}/gpuwatt?org=test",
    ]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _kill_if_running(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _summary(proc: subprocess.Popen[str], out: str) -> tuple[int, int, int]:
    """(taken, delivered, kept) from a collector's last words; it must have stopped cleanly."""
    assert proc.returncode == 0, out
    m = re.search(r"(\d+) GPU samples taken, (\d+) delivered, (\d+) kept", out)
    assert m, out
    taken, delivered, kept = map(int, m.groups())
    return taken, delivered, kept


def _timestamps_by_gpu(vm: VictoriaMetricsServer) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for series in vm.export('{__name__="nvidia_smi_gpu_lost"}'):
        labels = series["metric"]
        out.setdefault((labels["host"], labels["index"]), []).extend(series["timestamps"])
    return out


def _settled(vm: VictoriaMetricsServer, expected: int) -> dict[tuple[str, str], list[int]]:
    """The stored timestamps once ``expected`` points are visible (or after a minute).

    victoria-metrics makes freshly written points of new series searchable a few seconds after
    acknowledging them, even after /internal/force_flush (measured here: 0 visible at once, all
    two seconds later), so the read-back waits for the count to arrive instead of racing it.
    """
    deadline = time.monotonic() + 60
    while True:
        by_gpu = _timestamps_by_gpu(vm)
        if sum(len(ts) for ts in by_gpu.values()) >= expected or time.monotonic() > deadline:
            return by_gpu
        time.sleep(0.5)


def _undelivered_lines(spool: Path) -> int:
    """Complete lines after the spool's cursor, read without opening (and repairing) the spool."""
    for _ in range(10):
        try:
            cursor = json.loads((spool / "cursor.json").read_text())
            break
        except FileNotFoundError:
            cursor = {"segment": 0, "offset": 0}
            break
        except json.JSONDecodeError:  # read while the collector rewrote it in place: read again
            time.sleep(0.01)
    else:
        raise AssertionError("cursor.json never read whole")
    total = 0
    for path in sorted(spool.glob("*.lp")):
        seq = int(path.stem)
        if seq < cursor["segment"]:
            continue
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # delivered and removed since the glob
            continue
        total += data[cursor["offset"] if seq == cursor["segment"] else 0 :].count(b"\n")
    return total


def _wait_for(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def test_store_killed_for_30s_loses_no_sample(
    victoria_metrics: VictoriaMetricsServer, tmp_path: Path
) -> None:
    vm = victoria_metrics
    spool = tmp_path / "spool"
    interval_s = 0.1  # 320 GPU samples a second, so an in-memory backlog would show in RSS
    proc = _collector(vm, spool, interval_s, duration_s=600)
    try:
        rss = psutil.Process(proc.pid)
        # running and delivering (however long start-up took on this machine), then a baseline
        _wait_for(lambda: len(_timestamps_by_gpu(vm)) == GPUS, timeout_s=60)
        time.sleep(1)
        rss_before = rss.memory_info().rss
        stopped_ms = time.time() * 1000
        vm.stop()
        rss_peak = rss_before
        spool_peak = 0
        outage_end = time.monotonic() + OUTAGE_S
        while time.monotonic() < outage_end:
            rss_peak = max(rss_peak, rss.memory_info().rss)
            spool_peak = max(spool_peak, _undelivered_lines(spool))
            time.sleep(0.5)
        started_ms = time.time() * 1000
        vm.start()
        # the spool is replayed; then a clean stop, as systemd or docker would ask for one
        _wait_for(lambda: _undelivered_lines(spool) < GPUS * 20, timeout_s=120)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        out += f"\nvm stopped at {stopped_ms:.0f}, started at {started_ms:.0f}"
    finally:
        _kill_if_running(proc)
    taken, delivered, kept = _summary(proc, out)
    assert kept == 0 and delivered == taken, out
    # the outage really happened and the samples waited on disk, not in memory
    assert "store unreachable" in out and "received SIGTERM" in out
    assert spool_peak >= GPUS * 50
    assert rss_peak - rss_before < 16 * 1024 * 1024, (rss_before, rss_peak)
    # every sample is in the store exactly once
    by_gpu = _settled(vm, taken)
    assert len(by_gpu) == GPUS
    one = sorted(next(iter(by_gpu.values())))
    gaps = sorted(((b - a, a) for a, b in itertools.pairwise(one)), reverse=True)[:5]
    counts = sorted({len(ts) for ts in by_gpu.values()})
    print("per-GPU counts", counts, "largest gaps", gaps, "first", one[0], "last", one[-1])
    print(out)
    print(vm.log_tail(15))
    assert sum(len(ts) for ts in by_gpu.values()) == taken
    for ts in by_gpu.values():
        assert len(ts) == len(set(ts)) == taken // GPUS


def test_sigkill_loses_at_most_one_tick_and_replays_the_spool(
    victoria_metrics: VictoriaMetricsServer, tmp_path: Path
) -> None:
    vm = victoria_metrics
    vm.stop()  # everything the first collector takes waits in its spool
    spool = tmp_path / "spool"
    interval_s = 0.2
    first = _collector(vm, spool, interval_s, duration_s=600)
    try:
        _wait_for(lambda: _undelivered_lines(spool) >= 10 * GPUS, timeout_s=120)
        # Freeze it (possibly in the middle of a write), count what it had made durable, kill it.
        os.kill(first.pid, signal.SIGSTOP)
        acknowledged = _undelivered_lines(spool)
        killed_at_ms = time.time() * 1000
        os.kill(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
    finally:
        _kill_if_running(first)
    vm.start()
    second = _collector(vm, spool, interval_s, duration_s=3)
    out, _ = second.communicate(timeout=120)
    taken_second, delivered_second, kept = _summary(second, out)
    assert kept == 0
    # the second collector delivered the first one's spool and its own samples
    assert delivered_second == acknowledged + taken_second
    by_gpu = _settled(vm, acknowledged + taken_second)
    for ts in by_gpu.values():
        assert len(ts) == len(set(ts))  # nothing twice
    first_run = sum(1 for ts in by_gpu.values() for t in ts if t < killed_at_ms)
    # Everything the first collector had fsync'd reached the store; only the tick it was in the
    # middle of when killed (at most one interval) is gone.
    assert acknowledged >= 10 * GPUS
    assert first_run == acknowledged
    assert sum(len(ts) for ts in by_gpu.values()) == acknowledged + taken_second


def test_embedded_store_locked_by_another_writer_loses_nothing(tmp_path: Path) -> None:
    """The real command line into the embedded store, whose spool holds binary frames: while
    another process holds the database's write lock, samples wait in the spool; once it lets go,
    every sample is stored exactly once, and a clean stop leaves nothing behind."""
    import sqlite3

    from gpuwatt.store.sqlite import SqliteStore

    db = tmp_path / "gpuwatt.db"
    SqliteStore(db).close()  # created (WAL) before the collector starts
    argv = [
        *(sys.executable, "-m", "gpuwatt", "collect", "--simulate", "healthy"),
        *("--interval", "0.2", "--duration", "600"),
        *("--spool", str(tmp_path / "spool"), "--store", f"sqlite:///{db}"),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with SqliteStore(db) as store:
            _wait_for(lambda: store.count_samples(0, 2**62) >= GPUS, timeout_s=60)
            holder = sqlite3.connect(db, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # another writer: the collector's writes wait
            held = store.count_samples(0, 2**62)
            time.sleep(3)
            assert store.count_samples(0, 2**62) == held  # nothing got through meanwhile
            assert sorted((tmp_path / "spool").glob("*.gws"))  # binary frames, no text
            holder.execute("ROLLBACK")
            holder.close()
            _wait_for(lambda: store.count_samples(0, 2**62) >= held + 10 * GPUS, timeout_s=60)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        _kill_if_running(proc)
    taken, delivered, kept = _summary(proc, out)
    assert kept == 0 and delivered == taken, out
    with SqliteStore(db) as store:
        assert store.count_samples(0, 2**62) == taken
        frame = store.series(0, 2**62, ["power_w"])
    assert not frame.duplicated(["time_ns", "host", "gpu_index"]).any()
    assert len(frame) == taken
