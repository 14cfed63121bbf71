"""SQLite specifics: idempotence, rollups (incremental, recomputed for late data), retention,
WAL with a writer and readers in other threads and processes."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample, TflopsMethod
from gpuwatt.store import format, rollups, segments
from gpuwatt.store.codec import Span
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "g.db") as s:
        yield s


def peek(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Read the file directly (what another process would see)."""
    with contextlib.closing(sqlite3.connect(path)) as con:
        return con.execute(sql, params).fetchall()


def level_rows(path: Path, level_s: int, attrs: tuple[str, ...] = ("power_w",)) -> list[tuple]:
    """The stored buckets of a rollup level as (time_ns, gpu_id, n, n_ok, *attrs) rows, read
    from the file directly (the store's own decoding of its rollups)."""
    with contextlib.closing(sqlite3.connect(path)) as con:
        index = format.read_columns(con).index
        cols = rollups.read(con, level_s * S, -(2**62), 2**62, attrs, index)
    keys = ("time_ns", "gpu_id", "n", "n_ok", *attrs)
    return sorted(zip(*(cols[k].tolist() for k in keys), strict=True))


def oldest_raw_ns(path: Path) -> int:
    """The oldest raw sample the file keeps: segments (their index; the open one read whole)."""
    (closed,) = peek(path, "SELECT min(t_min_ns) FROM segments WHERE closed = 1")[0]
    with contextlib.closing(sqlite3.connect(path)) as con:
        found, _ = segments.read(con, Span(0, 2**62, ()))
    return min(t for t in (closed, *found.time_ns.tolist()) if t is not None)


def rounds(make_sample, start_s: int, end_s: int, every_s: int, gpus: int = 2, **kw):
    """One batch per timestamp; power depends on time and GPU so means are checkable."""
    for t in range(start_s, end_s, every_s):
        yield [
            make_sample(
                T0 + t * S, "node1", g, power_w=100.0 + t % 97 + g, energy_j=10.0 * t + g, **kw
            )
            for g in range(gpus)
        ]


def expected_buckets(df_raw: pd.DataFrame, step_s: int) -> pd.DataFrame:
    df = df_raw.assign(bucket=df_raw["time_ns"] // (step_s * S) * (step_s * S))
    g = df.sort_values("time_ns").groupby(["bucket", "gpu_index"])
    return pd.DataFrame({"power_w": g["power_w"].mean(), "energy_j": g["energy_j"].last()})


def assert_matches_raw(store: SqliteStore, start_ns: int, end_ns: int, step_s: int) -> None:
    raw = store.series(start_ns, end_ns, ["power_w", "energy_j"])
    want = expected_buckets(raw, step_s)
    got = store.series(start_ns, end_ns, ["power_w", "energy_j"], step_s=step_s)
    got = got.set_index(["time_ns", "gpu_index"])[["power_w", "energy_j"]]
    assert len(got) == len(want)
    assert got["power_w"].to_numpy() == pytest.approx(want["power_w"].to_numpy(), rel=1e-12)
    assert got["energy_j"].tolist() == want["energy_j"].tolist()


def test_wal_mode_and_tables(store: SqliteStore) -> None:
    assert peek(store.path, "PRAGMA journal_mode") == [("wal",)]
    tables = {r[0] for r in peek(store.path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"gpus", "columns", "head", "tails", "chunks", "rollups", "meta"} <= tables


def test_writing_the_same_samples_twice_stores_them_once(store: SqliteStore, make_sample) -> None:
    batch = [make_sample(T0 + i * S, "node1", g) for i in range(3) for g in range(2)]
    store.write_samples(batch)
    store.write_samples(batch)
    store.write_lines(LineEncoder().encode_many(batch))  # the spool's replay path
    assert store.count_samples(T0, T0 + 10 * S) == 6
    assert store.latest() == [batch[4], batch[5]]
    assert peek(store.path, "SELECT count(*) FROM gpus") == [(2,)]


def test_write_lines_round_trip(store: SqliteStore, make_sample) -> None:
    sample = make_sample(T0, "host with space,comma", 3)
    store.write_lines([LineEncoder().encode(sample), ""])
    assert store.latest() == [sample]


def test_minute_rollup_is_incremental_by_data_time(store: SqliteStore, make_sample) -> None:
    for batch in rounds(make_sample, 0, 180, 10):
        store.write_samples(batch)
    # Newest data is at 170 s; with the 30 s grace minutes [0, 120) are rolled, minute 2 is not.
    rows = level_rows(store.path, 60)
    assert [(t, n) for t, _, n, _, _ in rows] == [
        (T0, 6),
        (T0, 6),
        (T0 + 60 * S, 6),
        (T0 + 60 * S, 6),
    ]
    assert_matches_raw(store, T0, T0 + 180 * S, 60)  # rolled minutes + the open one from raw
    assert_matches_raw(store, T0, T0 + 180 * S, 120)


def test_late_samples_recompute_their_bucket(store: SqliteStore, make_sample) -> None:
    for batch in rounds(make_sample, 0, 180, 10):
        store.write_samples(batch)
    # A spool replays a point the minute rollup has already seen past.
    store.write_samples([make_sample(T0 + 5 * S, "node1", 0, power_w=1000.0, energy_j=5.0)])
    # its minute, and the rolled minute after it: a sample changes its neighbours' slots
    # (rollup_rule.sample_seen_ns), so the seen time of the minutes around it may change too
    dirty = peek(store.path, "SELECT level_ns, bucket_ns FROM rollup_dirty ORDER BY bucket_ns")
    assert dirty == [(60 * S, T0), (60 * S, T0 + 60 * S)]
    assert_matches_raw(store, T0, T0 + 180 * S, 60)  # reads are exact before the recompute
    # A write that has moved past minute 0 recomputes it once.
    store.write_samples(next(rounds(make_sample, 180, 190, 10)))
    assert peek(store.path, "SELECT count(*) FROM rollup_dirty") == [(0,)]
    (_, _, n, _, power), *_ = [r for r in level_rows(store.path, 60) if r[0] == T0]
    assert n == 7
    assert power == pytest.approx((sum(100.0 + t for t in range(0, 60, 10)) + 1000.0) / 7)
    assert_matches_raw(store, T0, T0 + 190 * S, 60)


def test_hour_rollup_and_late_data(store: SqliteStore, make_sample) -> None:
    for batch in rounds(make_sample, 0, 2 * 3600 + 600, 60):
        store.write_samples(batch)
    hours = sorted({r[0] for r in level_rows(store.path, 3600)})
    assert hours == [T0, T0 + 3600 * S]
    assert_matches_raw(store, T0, T0 + 3 * 3600 * S, 3600)
    assert_matches_raw(store, T0, T0 + 3 * 3600 * S, 7200)
    store.write_samples([make_sample(T0 + 30 * S, "node1", 1, power_w=5000.0, energy_j=1.0)])
    assert_matches_raw(store, T0, T0 + 3 * 3600 * S, 3600)
    store.write_samples(next(rounds(make_sample, 2 * 3600 + 600, 2 * 3600 + 660, 60)))
    assert peek(store.path, "SELECT count(*) FROM rollup_dirty") == [(0,)]
    (n,) = [r[2] for r in level_rows(store.path, 3600) if r[:2] == (T0, 2)]
    assert n == 61
    assert_matches_raw(store, T0, T0 + 3 * 3600 * S, 3600)


def test_retention_by_data_time(tmp_path: Path, make_sample) -> None:
    with SqliteStore(tmp_path / "r.db", retention_raw_s=120, retention_1m_s=600) as store:
        for batch in rounds(make_sample, 0, 900, 10):
            store.write_samples(batch)
        # Newest data 890 s: raw kept from >= ~770 s (checked once a minute of data time), a
        # segment (the 10-minute block from 600 s) at a time: kept until it ends before that.
        oldest_raw = oldest_raw_ns(store.path)
        assert oldest_raw == T0 + 600 * S
        # the segments past the retention are gone from the index and from the disk
        ids = [i for (i,) in peek(store.path, "SELECT id FROM segments ORDER BY id")]
        folder = Path(f"{store.path}-segments")
        assert sorted(p.name for p in folder.iterdir()) == [segments.file_name(i) for i in ids]
        assert ids == [2]
        oldest_1m = level_rows(store.path, 60)[0][0]
        assert T0 + 200 * S <= oldest_1m <= T0 + 300 * S
        # Minutes whose raw rows are gone are still served from the rollup.
        df = store.series(T0 + 360 * S, T0 + 420 * S, ["power_w"], step_s=60)
        assert len(df) == 2 and df["power_w"].notna().all()
        assert store.series(T0 + 360 * S, T0 + 420 * S, ["power_w"]).empty


def test_writer_thread_and_reader_threads(store: SqliteStore, make_sample) -> None:
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                store.latest()
                store.series(T0, T0 + 600 * S, ["power_w"], step_s=60)
                store.count_samples(T0, T0 + 600 * S)
        except BaseException as exc:  # reported below
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for r in readers:
        r.start()
    try:
        for batch in rounds(make_sample, 0, 300, 5, gpus=8):
            store.write_samples(batch)
    finally:
        done.set()
        for r in readers:
            r.join()
    assert not errors
    assert store.count_samples(T0, T0 + 600 * S) == 60 * 8


WRITER = """
import sys, time
sys.path.insert(0, {tests!r})
from conftest import _make_sample
from gpuwatt.store import format, rollups, segments
from gpuwatt.store.codec import Span
from gpuwatt.store.sqlite import SqliteStore
with SqliteStore({path!r}) as store:
    for i in range(40):
        store.write_samples([_make_sample({t0} + i * 10**9, "w", g) for g in range(16)])
        time.sleep(0.005)
"""


def test_one_writer_process_and_a_reader_process(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    reader = SqliteStore(path)  # creates the file; the writer process opens it too
    try:
        code = WRITER.format(tests=str(Path(__file__).parent), path=str(path), t0=T0)
        proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
        seen = []
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            seen.append(reader.count_samples(T0, T0 + 100 * S))
            # One batch is one transaction: a reader never sees half of it.
            assert len({s.time_ns for s in reader.latest()}) <= 1
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        assert seen == sorted(seen)  # readers see whole, growing snapshots
        assert all(n % 16 == 0 for n in seen)
        assert reader.count_samples(T0, T0 + 100 * S) == 640
        # the newest round, though the gpus table records newest times once a minute only
        assert {s.time_ns for s in reader.latest()} == {T0 + 39 * S}
        assert len(reader.latest()) == 16
    finally:
        reader.close()


def test_closed_store_refuses_work(tmp_path: Path, make_sample) -> None:
    store = SqliteStore(tmp_path / "c.db")
    store.close()
    store.close()
    with pytest.raises(RuntimeError):
        store.write_samples([make_sample(T0)])
    with pytest.raises(RuntimeError):
        store.latest()


def test_what_a_gpu_reports_can_change_from_sample_to_sample(
    store: SqliteStore, make_sample
) -> None:
    """The writer binds each GPU's rows from what it reported before (metrics left None, flags,
    job, processes, XIDs): every change from one sample to the next is still stored exactly."""
    variants: list[dict | str] = [
        {"power_w": None, "fan_speed_pct": None, "sm_active_pct": None},
        {},
        {"power_w": None, "fan_speed_pct": None, "sm_active_pct": None},
        {"power_w": None, "fan_speed_pct": None, "sm_active_pct": None},
        {"power_w": None, "fan_speed_pct": 12.0, "sm_active_pct": None, "dram_active_pct": None},
        {"fan_speed_pct": None},
        {"job_id": None, "processes": None, "xid_errors": (), "energy_method": None},
        {
            "processes": (),
            "job_id": "other",
            "remapped_rows_pending": True,
            "mig_enabled": None,
            "tflops_method": TflopsMethod.SM_ACTIVITY_UPPER_BOUND,
        },
        "lost",
        "lost",
        {},
    ]
    written = []
    for i, v in enumerate(variants):
        if v == "lost":
            sample = GpuSample(T0 + i * S, "node1", 0, "GPU-node1-0", "NVIDIA H100 80GB HBM3", True)
        else:
            assert isinstance(v, dict)
            sample = make_sample(T0 + i * S, "node1", 0, **v)
        written.append(sample)
        store.write_samples([sample, make_sample(T0 + i * S, "node1", 1)])
        assert store.latest()[0] == sample, v
    df = store.series(T0, T0 + 20 * S, ["power_w", "fan_speed_pct", "dram_active_pct"])
    df = df[df["gpu_index"] == 0]
    for attr in ("power_w", "fan_speed_pct", "dram_active_pct"):
        want = [getattr(s, attr) for s in written]
        got = [None if pd.isna(x) else x for x in df[attr]]
        assert got == want, attr
    assert_matches_raw(store, T0, T0 + 20 * S, 60)


def test_latest_after_batches_of_several_times_and_id_gaps(store: SqliteStore, make_sample) -> None:
    store.write_samples([make_sample(T0, h, 0) for h in ("a", "b", "c")])  # ids 1, 2, 3
    # One time, ids 1 and 3 (not a range), GPU a twice: b must keep its time.
    store.write_samples([make_sample(T0 + S, h, 0) for h in ("a", "a", "c")])
    assert [s.time_ns for s in store.latest()] == [T0 + S, T0, T0 + S]
    assert store.count_samples(T0, T0 + 10 * S) == 5
    # Several times in one batch, out of order, and a late sample for b.
    store.write_samples(
        [
            make_sample(T0 + 3 * S, "a", 0),
            make_sample(T0 + 2 * S, "c", 0),
            make_sample(T0 + 2 * S, "a", 0),
            make_sample(T0 - S, "b", 0),
        ]
    )
    assert [s.time_ns for s in store.latest()] == [T0 + 3 * S, T0, T0 + 2 * S]
    # Two GPUs that share a UUID (a cloned image) are still two GPUs.
    twins = [make_sample(T0 + 4 * S, h, 0, uuid="GPU-same") for h in ("d", "e")]
    store.write_samples(twins)
    store.write_samples([make_sample(T0 + 5 * S, "d", 0, uuid="GPU-same", power_w=1.0)])
    got = {s.host: s for s in store.latest(since_ns=T0 + 4 * S)}
    assert got["d"].power_w == 1.0 and got["e"] == twins[1]


def test_minute_rollup_across_a_gap_in_the_data(store: SqliteStore, make_sample) -> None:
    for batch in [*rounds(make_sample, 0, 120, 10), *rounds(make_sample, 1800, 1900, 10)]:
        store.write_samples(batch)
    minutes = [(t,) for t in sorted({r[0] for r in level_rows(store.path, 60)})]
    assert minutes == [(T0,), (T0 + 60 * S,), (T0 + 1800 * S,)]
    assert_matches_raw(store, T0, T0 + 1900 * S, 60)
    store.write_samples([make_sample(T0 + 65 * S, "node1", 1, power_w=2000.0)])  # late
    store.write_samples(next(rounds(make_sample, 1900, 1910, 10)))
    assert peek(store.path, "SELECT count(*) FROM rollup_dirty") == [(0,)]
    assert_matches_raw(store, T0, T0 + 1910 * S, 60)


def test_the_last_of_two_samples_of_a_gpu_and_time_in_one_batch_wins(
    store: SqliteStore, make_sample
) -> None:
    """Also when the two are bound by different statements (a GPU that left a metric None)."""
    for g, pattern in enumerate(("fs", "sf", "sfs", "ssf")):
        full, sparse = make_sample(T0, "node1", g), make_sample(T0, "node1", g, power_w=None)
        batch = [full if c == "f" else sparse for c in pattern]
        store.write_samples(batch)
        assert store.latest()[g] == batch[-1], pattern
    assert store.count_samples(T0, T0 + S) == 4
