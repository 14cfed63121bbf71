"""The SQLite store's packed copy of its rollups: reads through it equal reads of the rollup
tables, through late data, host filters, missing metrics, retention and an upgrade from a
database written without it."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def sql_path(store: SqliteStore, *args, **kw) -> pd.DataFrame:
    """The same read with the packed copy declared incomplete: served by the rollup tables."""
    with contextlib.closing(sqlite3.connect(store.path)) as con, con:
        saved = con.execute("SELECT key, value FROM meta WHERE key LIKE 'packed_%'").fetchall()
        con.execute("UPDATE meta SET value = ? WHERE key LIKE 'packed_%'", (2**62,))
    try:
        return store.series(*args, **kw)
    finally:
        with contextlib.closing(sqlite3.connect(store.path)) as con, con:
            con.executemany("UPDATE meta SET value = ? WHERE key = ?", [(v, k) for k, v in saved])


def packed_rows(store: SqliteStore) -> int:
    with contextlib.closing(sqlite3.connect(store.path)) as con:
        return con.execute("SELECT count(*) FROM packed").fetchone()[0]


@pytest.mark.parametrize("step_s", [60, 120, 300, 3600, 7200])
@pytest.mark.parametrize("hosts", [None, ["node2"]])
def test_packed_reads_equal_the_rollup_tables(
    tmp_path: Path, make_sample, step_s: int, hosts: list[str] | None
) -> None:
    with SqliteStore(tmp_path / "p.db") as store:
        write_hours(store, make_sample, 0, 2 * 3600 + 900)
        # late samples: a minute and an hour already rolled become dirty
        store.write_samples([make_sample(T0 + 45 * S, "node2", 1, power_w=5000.0)])
        assert packed_rows(store) > 0
        for start_s, end_s in ((0, 3 * 3600), (125, 3 * 3600), (3600, 2 * 3600 + 800)):
            args = (T0 + start_s * S, T0 + end_s * S, FIELDS)
            got = store.series(*args, step_s=step_s, hosts=hosts)
            want = sql_path(store, *args, step_s=step_s, hosts=hosts)
            assert not got.empty
            pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)
            assert set(got["host"]) == set(hosts or ["node1", "node2"])
        got = store.series(T0, T0 + 3 * 3600 * S, ["fan_speed_pct"], step_s=step_s)
        assert got.loc[got["gpu_index"] == 2, "fan_speed_pct"].isna().all()
        assert got.loc[got["gpu_index"] != 2, "fan_speed_pct"].notna().all()


def test_retention_removes_the_packed_copy_with_the_rollups(tmp_path: Path, make_sample) -> None:
    with SqliteStore(tmp_path / "r.db", retention_1m_s=600) as store:
        write_hours(store, make_sample, 0, 1800)
        with contextlib.closing(sqlite3.connect(store.path)) as con:
            oldest_1m = con.execute("SELECT min(time_ns) FROM samples_1m").fetchone()[0]
            oldest_packed = con.execute(
                "SELECT min(time_ns) FROM packed WHERE level_ns = ?", (60 * S,)
            ).fetchone()[0]
        assert oldest_packed == oldest_1m >= T0 + 1100 * S


def test_minutes_older_than_the_packed_copy_are_read_from_the_rollup_table(
    tmp_path: Path, make_sample
) -> None:
    path = tmp_path / "r.db"
    with SqliteStore(path, retention_1m_s=1200, retention_packed_1m_s=300) as store:
        write_hours(store, make_sample, 0, 1800)
        with contextlib.closing(sqlite3.connect(store.path)) as con:
            oldest_1m = con.execute("SELECT min(time_ns) FROM samples_1m").fetchone()[0]
            oldest_packed = con.execute(
                "SELECT min(time_ns) FROM packed WHERE level_ns = ?", (60 * S,)
            ).fetchone()[0]
        assert oldest_1m <= T0 + 660 * S and oldest_packed >= T0 + 1380 * S
        got = store.series(T0, T0 + 1800 * S, FIELDS, step_s=60)
        assert got["time_ns"].min() == oldest_1m  # every kept minute, packed or not
        pd.testing.assert_frame_equal(
            got, sql_path(store, T0, T0 + 1800 * S, FIELDS, step_s=60), rtol=1e-12
        )


def test_a_database_without_the_packed_copy_is_read_from_its_rollups(
    tmp_path: Path, make_sample
) -> None:
    path = tmp_path / "old.db"
    with SqliteStore(path) as store:
        write_hours(store, make_sample, 0, 1800)
        want = store.series(T0, T0 + 3600 * S, FIELDS, step_s=60)
    with contextlib.closing(sqlite3.connect(path)) as con, con:  # as an older version left it
        con.execute("DROP TABLE packed")
        con.execute("DELETE FROM meta WHERE key LIKE 'packed_%'")
    with SqliteStore(path) as store:
        assert packed_rows(store) == 0
        got = store.series(T0, T0 + 3600 * S, FIELDS, step_s=60)
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)
        write_hours(store, make_sample, 1800, 2400)
        assert packed_rows(store) > 0  # minutes rolled from now on are packed
        got = store.series(T0, T0 + 3600 * S, FIELDS, step_s=60)
        assert got["time_ns"].nunique() == 40  # 40 minutes of data, old and new
        pd.testing.assert_frame_equal(
            got, sql_path(store, T0, T0 + 3600 * S, FIELDS, step_s=60), rtol=1e-12
        )


def test_series_many_equals_separate_reads_and_aggregates_the_raw_tail_once(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range at 1 h and its last hour at 1 min (the dashboard's 24 h view) read together:
    the same frames as two ``series`` calls, with the not-yet-rolled raw samples aggregated
    once, not once per read."""
    from gpuwatt.store import rounds
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
        aggregate = rounds.aggregate

        def counted(raw: rounds.RawRange, *args: Any) -> dict[str, Any]:
            raw_aggregations.append((len(raw.time_ns), args[0]))
            return aggregate(raw, *args)

        monkeypatch.setattr(rounds, "aggregate", counted)

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
