"""The SQLite store's rollups (one stored form: column arrays per bucket): reads of them equal
the rollup rule applied to the raw samples, through late data, host filters, missing metrics
and retention; several reads in one snapshot aggregate the raw tail once."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpuwatt.model import GpuSample
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour
FIELDS = ["power_w", "energy_j", "temperature_memory_c", "clock_event_reasons", "fan_speed_pct"]


def write_hours(store: SqliteStore, make_sample, start_s: int, end_s: int, every_s: int = 30):
    for t in range(start_s, end_s, every_s):
        batch = []
        for host in ("node1", "node2"):
            for g in range(3):
                extra = {"fan_speed_pct": None} if g == 2 else {}  # a GPU without a fan reading
                if host == "node1" and g == 1 and (t // every_s) % 7 == 3:
                    s = make_sample(T0 + t * S, host, g)  # lost now and then: uneven weights
                    batch.append(
                        GpuSample(s.time_ns, s.host, s.gpu_index, s.uuid, s.name, lost=True)
                    )
                    continue
                batch.append(
                    make_sample(
                        T0 + t * S,
                        host,
                        g,
                        power_w=100.0 + (t * 7 + g * 13) % 101,
                        energy_j=10.0 * t + g,
                        clock_event_reasons=(t // 60 + g) % 4,
                        **extra,
                    )
                )
        store.write_samples(batch)


def from_raw(store: SqliteStore, *args, **kw) -> pd.DataFrame:
    """The same read with no bucket declared rolled: every bucket aggregated from the raw
    samples (head and chunks) by the rollup rule, none read from the stored rollups."""
    with contextlib.closing(sqlite3.connect(store.path)) as con, con:
        saved = con.execute("SELECT key, value FROM meta WHERE key LIKE 'rolled_%'").fetchall()
        con.execute("UPDATE meta SET value = ? WHERE key LIKE 'rolled_%'", (-(2**62),))
    try:
        return store.series(*args, **kw)
    finally:
        with contextlib.closing(sqlite3.connect(store.path)) as con, con:
            con.executemany("UPDATE meta SET value = ? WHERE key = ?", [(v, k) for k, v in saved])


def stored_buckets(store: SqliteStore, level_s: int) -> list[int]:
    with contextlib.closing(sqlite3.connect(store.path)) as con:
        rows = con.execute(
            "SELECT DISTINCT time_ns FROM rollups WHERE level_ns = ? ORDER BY 1", (level_s * S,)
        )
        return [t for (t,) in rows]


@pytest.mark.parametrize("step_s", [60, 120, 300, 3600, 7200])
@pytest.mark.parametrize("hosts", [None, ["node2"]])
def test_reads_of_stored_rollups_equal_the_rule_over_raw_samples(
    tmp_path: Path, make_sample, step_s: int, hosts: list[str] | None
) -> None:
    """Minutes and hours as stored (rolled by the rule from raw samples, hours from minutes),
    through late data, host filters and a missing metric, read the same as the rule applied to
    the raw samples at read time."""
    with SqliteStore(tmp_path / "p.db") as store:
        write_hours(store, make_sample, 0, 2 * 3600 + 900)
        # late samples: a minute and an hour already rolled become dirty
        store.write_samples([make_sample(T0 + 45 * S, "node2", 1, power_w=5000.0)])
        assert stored_buckets(store, 60) and stored_buckets(store, 3600) == [T0, T0 + 3600 * S]
        for start_s, end_s in ((0, 3 * 3600), (125, 3 * 3600), (3600, 2 * 3600 + 800)):
            args = (T0 + start_s * S, T0 + end_s * S, FIELDS)
            got = store.series(*args, step_s=step_s, hosts=hosts)
            want = from_raw(store, *args, step_s=step_s, hosts=hosts)
            assert not got.empty
            pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)
            assert set(got["host"]) == set(hosts or ["node1", "node2"])
        got = store.series(T0, T0 + 3 * 3600 * S, ["fan_speed_pct"], step_s=step_s)
        assert got.loc[got["gpu_index"] == 2, "fan_speed_pct"].isna().all()
        assert got.loc[got["gpu_index"] != 2, "fan_speed_pct"].notna().all()


def test_retention_removes_old_rollups_by_level(tmp_path: Path, make_sample) -> None:
    with SqliteStore(tmp_path / "r.db", retention_1m_s=600) as store:
        write_hours(store, make_sample, 0, 1800)
        assert T0 + 1100 * S <= stored_buckets(store, 60)[0] <= T0 + 1200 * S
        got = store.series(T0, T0 + 1800 * S, FIELDS, step_s=60)
        # minutes past the retention are gone; what is left comes from the rollups
        assert got["time_ns"].min() == stored_buckets(store, 60)[0]


def test_series_many_equals_separate_reads_and_aggregates_the_raw_tail_once(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range at 1 h and its last hour at 1 min (the dashboard's 24 h view) read together:
    the same frames as two ``series`` calls, with the not-yet-rolled raw samples aggregated
    once, not once per read."""
    from gpuwatt.store import sqlite_reads
    from gpuwatt.store.base import SeriesRead, series_many

    with SqliteStore(tmp_path / "m.db") as store:
        write_hours(store, make_sample, 0, 3 * 3600 + 100, every_s=10)
        end = T0 + (3 * 3600 + 100) * S
        reads = [
            SeriesRead(T0, end, FIELDS, 3600),
            SeriesRead(end - 3600 * S, end, FIELDS, 60),
            SeriesRead(end - 3600 * S, end, FIELDS, 60, ["node1"]),
        ]
        raw_aggregations: list[tuple[int, int]] = []
        aggregate = sqlite_reads.samples_as_level

        def counted(*args: Any, start_ns: int, end_ns: int) -> Any:
            raw_aggregations.append((start_ns, end_ns))
            return aggregate(*args, start_ns=start_ns, end_ns=end_ns)

        monkeypatch.setattr(sqlite_reads, "samples_as_level", counted)

        def traced(read: Callable[[], object]) -> tuple[Any, int]:
            raw_aggregations.clear()
            return read(), len(raw_aggregations)

        got, together = traced(lambda: series_many(store, reads))
        separate = [
            traced(
                lambda r=r: store.series(
                    r.start_ns, r.end_ns, r.fields, step_s=r.step_s, hosts=r.hosts
                )
            )
            for r in reads
        ]
        # separately, reads 0 and 1 aggregate the same tail (all GPUs); together, once. Reads 1
        # and 2 start 100 s past a minute: their partial first minute comes from raw samples too
        (_, n0), (_, n1), (_, n2) = separate
        assert n0 == n1 - 1 > 0 and n2 == 2
        assert together == n1 + n2
        for frame, (want, _) in zip(got, separate, strict=True):
            assert not frame.empty and frame["time_ns"].max() >= end - 100 * S
            pd.testing.assert_frame_equal(frame, want)


def test_rollups_written_before_the_seen_time_read_as_before(tmp_path: Path, make_sample) -> None:
    """A database whose rollups were written without ``seen_ns`` (an earlier gpuwatt) reads:
    the buckets' seen time is not known (NaN) and the analysis counts them whole, as before;
    a bucket recomputed later has it."""
    from gpuwatt.analytics import analyze
    from gpuwatt.store.base import SEEN_COLUMN
    from gpuwatt.store.rollups import KEY_COLS

    with SqliteStore(tmp_path / "old.db") as store:
        write_hours(store, make_sample, 0, 2 * 3600 + 900)
        store.flush_rollups()
        new = store.series(T0, T0 + 2 * 3600 * S, ["power_w"], step_s=60)
        assert (new[SEEN_COLUMN] > 0).any()
    with contextlib.closing(sqlite3.connect(tmp_path / "old.db")) as con, con:
        con.execute("DELETE FROM rollups WHERE col = ?", (KEY_COLS["seen_ns"],))
    with SqliteStore(tmp_path / "old.db") as store:
        for step_s in (60, 3600):
            old = store.series(T0, T0 + 2 * 3600 * S, ["power_w", "energy_j"], step_s=step_s)
            assert len(old) and old[SEEN_COLUMN].isna().all(), step_s
            s = analyze(old, now_ns=T0 + 2 * 3600 * S, start_ns=T0, step_s=step_s)
            # counted whole: every GPU that holds a measurement in a bucket, for the bucket
            assert s.cluster["gpu_hours"].value == pytest.approx(6 * 2), step_s


def write_random(store: SqliteStore, make_sample, seed: int, end_s: int) -> None:
    """Four GPUs sampled every 10 s over ``[0, end_s)`` with uneven data: lost samples, a
    metric unset in single samples and in whole minutes, a GPU silent for a while, a GPU that
    joins late, and a few late samples written out of order."""
    rng = np.random.default_rng(seed)
    late = []
    for t in range(0, end_s, 10):
        batch = []
        for g in range(4):
            if (g == 1 and 2000 <= t < 2400) or (g == 3 and t < 1500):
                continue
            if rng.random() < 0.05:
                s = make_sample(T0 + t * S, "node1", g)
                batch.append(GpuSample(s.time_ns, s.host, s.gpu_index, s.uuid, s.name, lost=True))
                continue
            extra: dict[str, Any] = {"temperature_memory_c": float(rng.integers(40, 90))}
            if rng.random() < 0.1 or (g == 2 and (t // 60) % 7 == 2):  # a sample, a minute
                extra["temperature_memory_c"] = None
            sample = make_sample(
                T0 + t * S,
                "node1",
                g,
                power_w=float(rng.integers(100, 700)) + rng.random(),
                energy_j=10.0 * t + g,
                clock_event_reasons=int(rng.integers(0, 4)),
                fan_speed_pct=float(rng.integers(20, 80)),
                **extra,
            )
            (late if rng.random() < 0.003 and t > 900 else batch).append(sample)
        store.write_samples(batch)
        if late and rng.random() < 0.02:  # a replay of what arrived late
            store.write_samples([dataclasses.replace(s, power_w=s.power_w * 3) for s in late])
            late.clear()


def from_minutes(store: SqliteStore, *args, **kw) -> pd.DataFrame:
    """The same read without the 5-minute level: what the store answered before it, every
    bucket combined from minutes (or raw samples) by the rule."""
    from gpuwatt.store import rollup_rule

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rollup_rule, "LEVELS", (rollup_rule.MINUTE_NS, rollup_rule.HOUR_NS))
        return store.series(*args, **kw)


def five_minute_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Record the reads of stored 5-minute buckets: (level, start, end)."""
    from gpuwatt.store import rollups

    calls: list[tuple[int, int, int]] = []
    read = rollups.read

    def spied(con: Any, level_ns: int, start_ns: int, end_ns: int, *a: Any, **kw: Any) -> Any:
        if level_ns == 300 * S:
            calls.append((level_ns, start_ns, end_ns))
        return read(con, level_ns, start_ns, end_ns, *a, **kw)

    monkeypatch.setattr(rollups, "read", spied)
    return calls


@pytest.mark.parametrize("seed", [1, 2])
def test_five_minute_level_reads_what_minutes_give(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Random ranges at 5-minute steps and random multiples of them (not of an hour): the frame
    equals what combining the minutes gives (the read before the level existed), counts and
    times exactly, means to float rounding. 5-minute steps read the stored 5-minute buckets;
    coarser ones minutes, as before (from 5-minute buckets, a metric unset for a whole minute of
    one would weigh differently: ``rollup_rule.COMBINED_FURTHER``)."""
    end_s = 2 * 3600 + 1234
    with SqliteStore(tmp_path / "f.db") as store:
        write_random(store, make_sample, seed, end_s)
        assert len(stored_buckets(store, 300)) >= 24
        ((rolled_ns,),) = peek(store.path, "SELECT value FROM meta WHERE key = 'rolled_300'")
        used = five_minute_reads(monkeypatch)
        rng = np.random.default_rng(100 + seed)
        fields = [*FIELDS, "utilization_gpu_pct"]
        served = 0
        for _ in range(20):
            step_s = 300 * int(rng.choice([1, 1, 1, 2, 3, 4, 6]))
            start_s = int(rng.integers(-600, end_s - 300))
            stop_s = int(rng.integers(start_s + 1, end_s + 900))
            args = (T0 + start_s * S, T0 + stop_s * S, fields)
            hosts = None if rng.random() < 0.8 else ["node1"]
            used.clear()
            got = store.series(*args, step_s=step_s, hosts=hosts)
            whole = T0 + (-(-start_s // 300) * 300 + 300) * S <= min(T0 + stop_s * S, rolled_ns)
            assert bool(used) == (whole and step_s == 300), (start_s, stop_s, step_s)
            served += bool(used)
            want = from_minutes(store, *args, step_s=step_s, hosts=hosts)
            pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9)
            exact = ["time_ns", "host", "gpu_index", "energy_j", "clock_event_reasons"]
            pd.testing.assert_frame_equal(got[exact], want[exact], check_exact=True)
        assert served >= 4


def test_a_late_sample_in_a_rolled_five_minute_bucket(tmp_path: Path, make_sample) -> None:
    """A late sample makes its minute and its 5-minute bucket dirty: the 5-minute read changes
    as the minute read does (read from minutes until the bucket is recomputed), and the bucket
    recomputed reads the same."""
    with SqliteStore(tmp_path / "l.db") as store:
        write_hours(store, make_sample, 0, 3600, every_s=10)
        bucket = T0 + 600 * S
        assert bucket in stored_buckets(store, 300)
        args = (T0, T0 + 3000 * S, ["power_w", "energy_j"])
        before = store.series(*args, step_s=300)
        minutes_before = store.series(*args, step_s=60)
        store.write_samples([make_sample(T0 + 725 * S, "node2", 1, power_w=9000.0)])
        dirty = peek(store.path, "SELECT level_ns, bucket_ns FROM rollup_dirty ORDER BY 1, 2")
        assert (300 * S, bucket) in dirty and (60 * S, T0 + 720 * S) in dirty
        after = store.series(*args, step_s=300)
        minutes_after = store.series(*args, step_s=60)
        changed = before.compare(after)
        assert list(after.loc[changed.index, "time_ns"].unique()) == [bucket]
        assert not minutes_before.compare(minutes_after).empty
        pd.testing.assert_frame_equal(after, from_minutes(store, *args, step_s=300))
        store.flush_rollups()
        assert peek(store.path, "SELECT * FROM rollup_dirty") == []
        pd.testing.assert_frame_equal(store.series(*args, step_s=300), after)


def peek(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as con:
        return con.execute(sql).fetchall()


def test_a_file_written_before_the_five_minute_level(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file with no 5-minute buckets and no ``rolled_300`` (an earlier gpuwatt) gets the
    level when opened: rolled from the last ``LEVEL_BACKFILL_S`` of its minutes, its start
    recorded (``rolled_300_from``); reads take the time before it from minutes and read what
    they read before; new data gets 5-minute buckets as it comes."""
    from gpuwatt.store import sqlite

    path = tmp_path / "old.db"
    with SqliteStore(path) as store:
        write_random(store, make_sample, 3, 3 * 3600)
        args = (T0 + 125 * S, T0 + 3 * 3600 * S, [*FIELDS, "utilization_gpu_pct"])
        before = from_minutes(store, *args, step_s=300)
    with contextlib.closing(sqlite3.connect(path)) as con, con:
        con.execute("DELETE FROM rollups WHERE level_ns = ?", (300 * S,))
        con.execute("DELETE FROM rollup_dirty WHERE level_ns = ?", (300 * S,))
        con.execute("DELETE FROM meta WHERE key LIKE 'rolled_300%'")
        ((rolled_60,),) = con.execute("SELECT value FROM meta WHERE key = 'rolled_60'")
    monkeypatch.setattr(sqlite, "LEVEL_BACKFILL_S", 3600)
    with SqliteStore(path) as store:
        since = rolled_60 // (300 * S) * 300 * S - 3600 * S
        assert peek(
            path, "SELECT key, value FROM meta WHERE key LIKE 'rolled_300%' ORDER BY 1"
        ) == [
            ("rolled_300", rolled_60 // (300 * S) * 300 * S),
            ("rolled_300_from", since),
        ]
        assert stored_buckets(store, 300) == list(range(since, since + 3600 * S, 300 * S))
        used = five_minute_reads(monkeypatch)
        got = store.series(*args, step_s=300)
        assert used and min(start for _, start, _ in used) == since
        pd.testing.assert_frame_equal(got, before, check_exact=False, rtol=1e-9)
        write_random(store, make_sample, 4, 4 * 3600)  # (rewrites the first hours: late data)
        got = store.series(T0, T0 + 4 * 3600 * S, FIELDS, step_s=300)
        want = from_minutes(store, T0, T0 + 4 * 3600 * S, FIELDS, step_s=300)
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9)
        assert stored_buckets(store, 300)[-1] >= T0 + (4 * 3600 - 600) * S


def test_five_minute_level_left_behind_by_an_older_writer(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gpuwatt from before the 5-minute level that writes the file rolls minutes but not
    5-minute buckets, and marks none dirty for late samples: a reader sees the level behind the
    minutes and reads minutes; the next open rolls the level again from them."""
    path = tmp_path / "mixed.db"
    args = (T0, T0 + 3600 * S, FIELDS)
    with SqliteStore(path) as store:
        write_random(store, make_sample, 5, 3600)
        want = from_minutes(store, *args, step_s=300)
    stale = T0 + 1200 * S
    with SqliteStore(path) as reader:  # (opened before the older writer came)
        with contextlib.closing(sqlite3.connect(path)) as con, con:
            # what the older writer leaves: minutes moved on, a 5-minute bucket no longer theirs
            ((rolled,),) = con.execute("SELECT value FROM meta WHERE key = 'rolled_300'")
            con.execute("UPDATE meta SET value = ? WHERE key = 'rolled_300'", (rolled - 600 * S,))
            con.execute(
                "UPDATE rollups SET data = (SELECT data FROM rollups r WHERE r.level_ns = ?1 "
                "AND r.time_ns = ?2 AND r.col = rollups.col) WHERE level_ns = ?1 AND time_ns = ?3",
                (300 * S, T0, stale),
            )
        used = five_minute_reads(monkeypatch)
        got = reader.series(*args, step_s=300)
        assert not used
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9)
    with SqliteStore(path) as store:
        assert peek(path, "SELECT value FROM meta WHERE key = 'rolled_300'") == [(rolled,)]
        assert stale in stored_buckets(store, 300)
        got = store.series(*args, step_s=300)
        assert used
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9)
