"""A spool replayed into the embedded store as rows (``SqliteStore.write_rows``): what it stores
is what ``write_samples`` stores for the same samples, and a replay killed at any point loses
nothing and stores nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpuwatt.collector.runtime import Flusher
from gpuwatt.collector.spool import Spool
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod
from gpuwatt.store import raw, rounds
from gpuwatt.store.sqlite import SqliteStore

T0 = 1_700_000_000_000_000_000
NS = 1_000_000_000
GPUS = 6


def _tick(k: int) -> list[GpuSample]:
    """Tick ``k`` of a small cluster, with every kind of value a frame carries, and tails that
    change: a job starting, processes coming and going, XIDs, a GPU lost, metrics not measured,
    a NaN, counters beyond 2**53."""
    out = []
    for g in range(GPUS):
        lost = g == 5 and 20 <= k < 25
        out.append(
            GpuSample(
                time_ns=T0 + k * NS,
                host=f"node-{g // 3}",
                gpu_index=g % 3,
                uuid=f"GPU-{g}",
                name="NVIDIA H100 80GB HBM3",
                lost=lost,
                power_w=None if lost else 300.0 + g + k / 7,
                utilization_gpu_pct=None if lost or k % 4 == 0 else float(k % 100),
                memory_used_bytes=None if lost else (k * 1024**2 + g) * (2**20 if g == 1 else 1),
                temperature_gpu_c=float("nan") if k % 9 == 0 else 55.0 + g,
                energy_j=None if lost else 1e9 + k * 300.0,
                mig_enabled=bool(g % 2),
                energy_method=None if lost else EnergyMethod.COUNTER,
                tflops_method=TflopsMethod.GPM if g % 2 else TflopsMethod.SM_ACTIVITY_UPPER_BOUND,
                tflops_estimate=None if g % 2 else 12.5,
                xid_errors=(13, 79) if (g == 2 and k % 10 == 3) else (),
                processes=(ProcessSample(4000 + k // 8, 1024**3, "alice"), ProcessSample(7, None))
                if g < 3 and k > 4
                else None,
                job_id=f"job-{k // 12}" if g < 4 else None,
            )
        )
    return out


def _ticks(n: int, start: int = 0) -> list[list[GpuSample]]:
    return [_tick(k) for k in range(start, start + n)]


def _spool(folder: Path, ticks: list[list[GpuSample]]) -> Spool:
    spool = Spool(folder, binary=True, fsync=False)
    for samples in ticks:
        spool.append_samples(samples)
    return spool


def _stored(path: Path) -> list[tuple[Any, ...]]:
    """Every raw sample of a store file as (time, GPU, values, tail), ids replaced by what they
    stand for: two files that hold the same samples give the same list, whatever ids they use."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        gpus = {
            r[0]: r[1:] for r in con.execute("SELECT id, host, gpu_index, uuid, name FROM gpus")
        }
        tails = {
            r[0]: r[1:]
            for r in con.execute(f"SELECT id, {', '.join(rounds.TAIL_COLUMNS)} FROM tails")
        }
        out = []
        ncols = con.execute("SELECT count(*) FROM columns").fetchone()[0]
        got = raw.read(con, 0, 2**62, range(ncols))
        for t, gid, lost, tail, row in zip(
            got.time_ns.tolist(), got.gpu_id.tolist(), got.lost, got.tail, got.values, strict=True
        ):
            values = tuple(None if v != v else float(v) for v in (lost, *row))
            out.append((t, gpus[gid], values, tails[int(tail)]))
        return sorted(out, key=repr)
    finally:
        con.close()


def _reads(store: SqliteStore, end_ns: int) -> tuple[pd.DataFrame, pd.DataFrame, list[str], int]:
    series = store.series(T0, end_ns).sort_values(["time_ns", "uuid"]).reset_index(drop=True)
    minutes = store.series(T0, end_ns, step_s=60).sort_values(["time_ns", "uuid"])
    latest = sorted(repr(s) for s in store.latest())
    return series, minutes.reset_index(drop=True), latest, store.count_samples(T0, end_ns)


def _assert_same_reads(a: SqliteStore, b: SqliteStore, end_ns: int) -> None:
    sa, ma, la, na = _reads(a, end_ns)
    sb, mb, lb, nb = _reads(b, end_ns)
    pd.testing.assert_frame_equal(sa, sb)
    pd.testing.assert_frame_equal(ma, mb)
    assert la == lb
    assert na == nb


def test_a_replay_as_rows_stores_what_write_samples_stores(tmp_path: Path) -> None:
    """Through the flusher, in batches of whole frames, tails changing, late ticks among them
    (rolled minutes become dirty), a tick written twice: the same rows, tails and reads."""
    ticks = _ticks(150)
    late = [ticks[40], ticks[3]]  # written again, and one of them long after its minute rolled
    spooled = [*ticks[:100], *late, *ticks[100:]]
    spool = _spool(tmp_path / "spool", spooled)
    with SqliteStore(tmp_path / "rows.db") as by_rows, SqliteStore(tmp_path / "s.db") as by_one:
        flusher = Flusher(spool, by_rows, rows_batch_samples=7 * GPUS)
        assert flusher.flush() == len(spooled) * GPUS
        assert spool.pending_lines() == 0 and flusher.rejected_lines == 0
        for samples in spooled:
            by_one.write_samples(samples)
        _assert_same_reads(by_rows, by_one, T0 + 200 * NS)
        assert len(by_rows.series(T0, T0 + 200 * NS)) == 150 * GPUS
    assert _stored(tmp_path / "rows.db") == _stored(tmp_path / "s.db")
    spool.close()


def test_rows_and_samples_written_in_turn_keep_each_gpus_tail(tmp_path: Path) -> None:
    """The live path (``write_samples``) and a replay (``write_rows``) on one writer: a GPU whose
    job changed in one and changes back in the other is stored with the right job each time."""
    ticks = _ticks(60)
    spool = _spool(tmp_path / "spool", [])
    with SqliteStore(tmp_path / "mixed.db") as mixed, SqliteStore(tmp_path / "s.db") as by_one:
        for k, samples in enumerate(ticks):
            by_one.write_samples(samples)
            if k % 3 == 1:
                mixed.write_samples(samples)
                continue
            spool.append_samples(samples)
            batch = spool.read_batch(as_rows=True)
            assert batch.rows is not None and len(batch.rows) == GPUS
            mixed.write_rows(batch.rows)
            spool.commit(batch)
        _assert_same_reads(mixed, by_one, T0 + 100 * NS)
    assert _stored(tmp_path / "mixed.db") == _stored(tmp_path / "s.db")
    spool.close()


def test_rows_the_store_refuses_write_nothing_and_the_samples_say_which(tmp_path: Path) -> None:
    """A batch with a value the store cannot take (no float64): ``write_rows`` writes none of
    it; the flusher writes the others as samples and sets the one refused aside."""
    good = _tick(0)
    bad = GpuSample(T0 + NS, "node-0", 0, "GPU-0", "H100", memory_used_bytes=10**400)  # no float
    spool = _spool(tmp_path / "spool", [good, [bad], _tick(2)])
    with SqliteStore(tmp_path / "s.db") as store:
        batch = spool.read_batch(as_rows=True)
        assert batch.rows is not None and len(batch.rows) == 2 * GPUS + 1
        with pytest.raises(OverflowError):
            store.write_rows(batch.rows)
        assert store.count_samples(T0, T0 + 10 * NS) == 0
        flusher = Flusher(spool, store)
        assert flusher.flush() == 2 * GPUS + 1
        assert flusher.rejected_lines == 1 and flusher.delivered_lines == 2 * GPUS
        assert store.count_samples(T0, T0 + 10 * NS) == 2 * GPUS
    ((line, reason),) = flusher.set_aside.lines(flusher.set_aside.files()[0])
    assert f"memory_used={10**400 // 1024**2}i" in line and "does not pack" in reason
    spool.close()


_KILLED_REPLAY = """
import os, signal, sys
from gpuwatt.collector.runtime import Flusher
from gpuwatt.collector.spool import Spool
from gpuwatt.store.sqlite import SqliteStore

spool_dir, db, where, after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = SqliteStore(db)
spool = Spool(spool_dir, binary=True)
writes = 0
if where == "in_transaction":  # killed inside the store's transaction of write number `after`
    maintain = store._maintain
    def _maintain(*args):
        maintain(*args)
        if writes == after:
            os.kill(os.getpid(), signal.SIGKILL)
    store._maintain = _maintain
write_rows = store.write_rows
def counted(rows):
    global writes
    writes += 1
    write_rows(rows)
    if where == "after_commit" and writes == after:  # the store committed; the cursor did not move
        os.kill(os.getpid(), signal.SIGKILL)
store.write_rows = counted
Flusher(spool, store, rows_batch_samples=int(sys.argv[5])).flush()
sys.exit(3)  # not killed: the test's premise failed
"""


@pytest.mark.parametrize("where", ["after_commit", "in_transaction"])
def test_a_replay_killed_midway_loses_nothing_and_stores_nothing_twice(
    tmp_path: Path, where: str
) -> None:
    ticks = _ticks(120)
    _spool(tmp_path / "spool", ticks).close()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    argv = [sys.executable, "-c", textwrap.dedent(_KILLED_REPLAY), str(tmp_path / "spool")]
    killed = subprocess.run(
        [*argv, str(tmp_path / "r.db"), where, "3", str(10 * GPUS)], env=env, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL
    with SqliteStore(tmp_path / "r.db") as store:
        spool = Spool(tmp_path / "spool", binary=True)
        stored_before = store.count_samples(T0, T0 + 200 * NS)
        assert 0 < spool.pending_lines() < 120 * GPUS
        # killed inside the transaction, after its rounds went into the segment: they are
        # kept (a segment is not rolled back), and the replay stores them once more, as one
        assert stored_before == 3 * 10 * GPUS
        flusher = Flusher(spool, store, rows_batch_samples=10 * GPUS)
        flusher.flush()
        assert spool.pending_lines() == 0
        spool.close()
        with SqliteStore(tmp_path / "s.db") as by_one:
            for samples in ticks:
                by_one.write_samples(samples)
            _assert_same_reads(store, by_one, T0 + 200 * NS)
    assert _stored(tmp_path / "r.db") == _stored(tmp_path / "s.db")


def test_a_refused_batch_of_rows_leaves_no_id_behind(tmp_path: Path) -> None:
    """The GPU ids a refused batch inserted are rolled back with it: a GPU written next takes the
    same id, and the refused GPU's next sample is stored as its own, not as that one's."""
    x_bad = GpuSample(T0, "node-9", 0, "GPU-X", "H100", memory_used_bytes=10**400)
    y = GpuSample(T0 + NS, "node-8", 0, "GPU-Y", "H100", power_w=1.0)
    x_good = GpuSample(T0 + 2 * NS, "node-9", 0, "GPU-X", "H100", power_w=2.0)
    spool = _spool(tmp_path / "spool", [[x_bad], [x_good]])
    with SqliteStore(tmp_path / "s.db") as store:
        refused = spool.read_batch(max_lines=1, as_rows=True)
        assert refused.rows is not None
        with pytest.raises(OverflowError):
            store.write_rows(refused.rows)
        spool.commit(refused)
        store.write_samples([y])
        batch = spool.read_batch(as_rows=True)
        assert batch.rows is not None
        store.write_rows(batch.rows)
        spool.commit(batch)
        latest = {s.uuid: (s.host, s.time_ns, s.power_w) for s in store.latest()}
    assert latest == {"GPU-Y": ("node-8", T0 + NS, 1.0), "GPU-X": ("node-9", T0 + 2 * NS, 2.0)}
    spool.close()
