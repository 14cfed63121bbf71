"""The embedded store's file format (docs/storage.md): version and magic number, the stored
columns (a metric added to the schema is a non-event), files it refuses and why, the chunk
codec's exact round trip, and compaction of closed blocks (late samples included)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatt.schema import FIELDS
from gpuwatt.store import StoreRejected, codec, format
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour
NEW = FIELDS[-1].attr  # the field a newer gpuwatt "adds" in these tests


def sql(path: Path, query: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as con:
        return con.execute(query).fetchall()


def test_a_new_file_records_its_format_and_columns(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    SqliteStore(path).close()
    assert sql(path, "PRAGMA application_id") == [(format.APPLICATION_ID,)]
    assert sql(path, "PRAGMA user_version") == [(format.FORMAT_VERSION,)]
    assert sql(path, "SELECT id, attr, kind FROM columns ORDER BY id") == [
        (i, f.attr, f.kind.value) for i, f in enumerate(FIELDS)
    ]


def _write(store: SqliteStore, make_sample, start_s: int, end_s: int, **kw) -> list:
    written = []
    for t in range(start_s, end_s, 10):
        batch = [
            make_sample(T0 + t * S, "node1", g, power_w=100.0 + t % 37 + g, **kw) for g in range(2)
        ]
        store.write_samples(batch)
        written += batch
    return written


def test_a_field_added_to_the_schema_is_a_new_column_and_old_samples_read_it_as_not_measured(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written by a gpuwatt whose schema lacked a field (raw samples in the head and in
    chunks, rollups) opens with the field added as a column: every old sample reads back with
    it not measured (None / NaN), new samples carry it, and aggregates over both are right."""
    path = tmp_path / "old.db"
    monkeypatch.setattr(format, "FIELDS", FIELDS[:-1])  # the gpuwatt before the field
    with SqliteStore(path) as store:
        old = _write(store, make_sample, 0, 900, **{NEW: True})
    assert NEW not in {a for (a,) in sql(path, "SELECT attr FROM columns")}
    monkeypatch.undo()
    with SqliteStore(path) as store:
        assert sql(path, "SELECT max(id), attr FROM columns") == [(len(FIELDS) - 1, NEW)]
        latest = store.latest()
        assert [getattr(s, NEW) for s in latest] == [None, None]
        assert latest[0] == dataclasses.replace(old[-2], **{NEW: None})
        raw = store.series(T0, T0 + 900 * S, ["power_w", NEW])
        assert len(raw) == len(old) and raw[NEW].isna().all()
        assert raw["power_w"].tolist() == [s.power_w for s in old]
        new = _write(store, make_sample, 900, 1500, **{NEW: True})
        assert [getattr(s, NEW) for s in store.latest()] == [True, True]
        raw = store.series(T0, T0 + 1500 * S, [NEW])
        assert raw[NEW].isna().sum() == len(old) and (raw[NEW] == 1.0).sum() == len(new)
        minutes = store.series(T0, T0 + 1500 * S, [NEW], step_s=60)
        assert minutes.loc[minutes["time_ns"] < T0 + 900 * S, NEW].isna().all()
        assert (minutes.loc[minutes["time_ns"] >= T0 + 900 * S, NEW] == 1.0).all()


def test_a_column_the_schema_no_longer_has_is_kept_and_ignored(tmp_path: Path, make_sample) -> None:
    path = tmp_path / "f.db"
    SqliteStore(path).close()
    with contextlib.closing(sqlite3.connect(path)) as con, con:
        con.execute("INSERT INTO columns VALUES (?, 'gone_metric_w', 'float')", (len(FIELDS),))
    with SqliteStore(path) as store:
        written = _write(store, make_sample, 0, 700)
        assert store.latest() == written[-2:]
        assert store.series(T0, T0 + 700 * S, ["power_w"])["power_w"].notna().all()


def test_a_newer_format_is_refused_with_a_clear_message(tmp_path: Path, make_sample) -> None:
    path = tmp_path / "f.db"
    with SqliteStore(path) as store:
        store.write_samples([make_sample(T0)])
    with contextlib.closing(sqlite3.connect(path)) as con:
        con.execute(f"PRAGMA user_version={format.FORMAT_VERSION + 1}")
    with pytest.raises(StoreRejected, match=r"newer than this gpuwatt reads.*upgrade gpuwatt"):
        SqliteStore(path)


def test_a_development_layout_and_another_database_are_refused(tmp_path: Path) -> None:
    dev = tmp_path / "dev.db"
    with contextlib.closing(sqlite3.connect(dev)) as con:
        con.execute("CREATE TABLE raw_rounds (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreRejected, match=r"development version.*no release wrote"):
        SqliteStore(dev)
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as con:
        con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreRejected, match="not a gpuwatt embedded store"):
        SqliteStore(other)


_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**40), 2**40).map(float),
    st.integers(0, 10**9).map(lambda i: i / 1000),  # mJ and mW as NVML gives them
    st.just(math.nan),
)


@settings(max_examples=150, deadline=None)
@given(
    runs=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    data=st.data(),
)
def test_chunks_round_trip_bit_for_bit(runs: list[int], data: st.DataObject) -> None:
    m = sum(runs)
    ncols = data.draw(st.integers(1, 5))
    gid = np.repeat(np.arange(len(runs), dtype=np.int64) * 3 + 1, runs)
    steps = data.draw(st.lists(st.integers(1, 10**10), min_size=m, max_size=m))
    time_ns = T0 + np.cumsum(np.array(steps, dtype=np.int64))
    values = np.array(
        data.draw(
            st.lists(st.lists(_floats, min_size=ncols, max_size=ncols), min_size=m, max_size=m)
        )
    )
    rows = codec.Rows(
        gid,
        time_ns,
        np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=m, max_size=m))),
        np.array(data.draw(st.lists(st.integers(1, 5000), min_size=m, max_size=m)), float),
        values.reshape(m, ncols),
        tuple(range(0, 2 * ncols, 2)),
    )
    back = codec.decode(codec.encode(rows))
    for name in ("gpu_id", "time_ns", "lost", "tail"):
        assert getattr(back, name).tobytes() == getattr(rows, name).tobytes(), name
    # a column with no value at all has no section; the others come back bit for bit, NaN
    # (not measured) as NaN
    for j, c in enumerate(rows.col_ids):
        if c in back.col_ids:
            got = back.values[:, back.col_ids.index(c)]
            want = rows.values[:, j]
            assert np.isnan(got).tolist() == np.isnan(want).tolist()
            set_ = ~np.isnan(want)
            assert got[set_].view(np.uint64).tolist() == want[set_].view(np.uint64).tolist()
        else:
            assert np.isnan(rows.values[:, j]).all()


def _sections(chunk: bytes) -> list[tuple[int, int, int]]:
    """(column id, transform, decimals) of each metric section of an encoded chunk."""
    import zstandard

    raw = zstandard.ZstdDecompressor().decompress(chunk[1:])
    _, _, runs, k = codec._HEADER.unpack_from(b"\x00" + raw[: codec._HEADER.size - 1])
    pos = codec._HEADER.size - 1 + runs * codec._RUN.size
    return [codec._SECTION.unpack_from(raw, pos + i * codec._SECTION.size) for i in range(k)]


def test_a_metric_sometimes_not_measured_keeps_the_integer_transform() -> None:
    """GPM metrics are not measured in a GPU's first sample (no interval yet): that gap must not
    push the whole column to raw float bits."""
    m = 50
    power = np.round(np.linspace(100.0, 300.0, m), 3)
    power[[0, 7, 8, 49]] = np.nan
    rows = codec.Rows(
        np.repeat(np.array([1, 2], dtype=np.int64), [20, 30]),
        T0 + np.r_[np.arange(20), np.arange(30)].astype(np.int64) * S,
        np.zeros(m),
        np.ones(m),
        power.reshape(m, 1),
        (9,),
    )
    data = codec.encode(rows)
    assert _sections(data) == [(9, codec.DECIMAL_DELTA_GAPS, 3)]
    back = codec.decode(data).values[:, 0]
    assert np.isnan(back).tolist() == np.isnan(power).tolist()
    assert back[~np.isnan(power)].tolist() == power[~np.isnan(power)].tolist()


def test_full_precision_ratios_are_kept_to_their_stored_precision() -> None:
    """Percentages to 0.001 percentage point, byte rates to 1 B/s, TFLOPS to 0.001 in chunks
    (docs/storage.md, "Stored precision"); other columns exactly."""
    attrs = ("sm_active_pct", "nvlink_tx_bytes_per_s", "tflops_estimate", "power_w", "energy_j")
    decimals = format.stored_decimals(attrs)
    assert decimals == {0: 3, 1: 0, 2: 3}
    rng = np.random.default_rng(1)
    m = 40
    values = np.column_stack(
        [
            rng.uniform(0, 100, m),
            rng.uniform(0, 5e10, m),
            rng.uniform(0, 900, m),
            rng.uniform(0, 700, m),  # not rounded: kept as float bits
            np.round(np.cumsum(rng.uniform(0, 700, m)), 3),
        ]
    )
    values[0, :3] = np.nan
    rows = codec.Rows(
        np.ones(m, np.int64),
        T0 + np.arange(m, dtype=np.int64) * S,
        np.zeros(m),
        np.ones(m),
        values,
        tuple(range(5)),
    )
    back = codec.decode(codec.encode(rows, decimals=decimals)).values
    assert np.isnan(back[0, :3]).all()
    for j, digits in ((0, 3), (1, 0), (2, 3)):
        assert back[1:, j].tolist() == np.round(values[1:, j], digits).tolist()
        assert np.abs(back[1:, j] - values[1:, j]).max() <= 0.5 * 10.0**-digits
    assert back[:, 3].tolist() == values[:, 3].tolist()
    assert back[:, 4].tolist() == values[:, 4].tolist()


def test_closed_blocks_are_closed_segments_and_late_samples_win(
    tmp_path: Path, make_sample
) -> None:
    """Past a block's end, its segment is closed: recorded in the index with its time range
    and samples, never written again. Raw reads are exact across segments; a sample rewritten
    late for a closed block goes into the open segment and is read back at once (the copy
    written last wins), counted once; ``compact`` closes the open segment too."""
    with SqliteStore(tmp_path / "c.db") as store:
        written = _write(store, make_sample, 0, 1300)
        assert sql(store.path, "SELECT t_min_ns, t_max_ns, n, closed FROM segments") == [
            (T0, T0 + 590 * S, 120, 1),
            (T0 + 600 * S, T0 + 1190 * S, 120, 1),
            (None, None, 0, 0),  # open: its range is read from the file
        ]
        folder = Path(f"{store.path}-segments")
        assert folder.stat().st_mode & 0o777 == 0o700
        assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o600}
        raw = store.series(T0, T0 + 1300 * S, ["power_w", "energy_j"])
        assert raw["power_w"].tolist() == [s.power_w for s in written]
        assert raw["energy_j"].tolist() == [s.energy_j for s in written]
        late = make_sample(T0 + 20 * S, "node1", 1, power_w=5000.0)
        store.write_samples([late])
        assert store.count_samples(T0, T0 + 1300 * S) == len(written)
        raw = store.series(T0 + 20 * S, T0 + 21 * S, ["power_w"])
        assert raw["power_w"].tolist() == [100.0 + 20, 5000.0]
        store.write_samples([make_sample(T0 + 1361 * S, "node1", 0)])  # a minute on
        assert store.count_samples(T0, T0 + 1300 * S) == len(written)
        got = store.series(T0, T0 + 60 * S, ["power_w"], step_s=60)
        want = (sum(101.0 + t % 37 for t in range(0, 60, 10)) - 121.0 + 5000.0) / 6
        assert got["power_w"].tolist()[1] == pytest.approx(want, rel=1e-12)
        before = store.series(T0, T0 + 1400 * S, ["power_w", "energy_j"])
        store.compact()  # the open segment too
        assert sql(store.path, "SELECT count(*) FROM segments WHERE closed = 0") == [(0,)]
        pd.testing.assert_frame_equal(
            store.series(T0, T0 + 1400 * S, ["power_w", "energy_j"]), before
        )
        assert store.latest()[0].time_ns == T0 + 1361 * S


def test_a_database_from_before_lifetime_ecc_reads_it_as_not_measured(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    lifetime = {"ecc_sbe_aggregate_count", "ecc_dbe_aggregate_count"}
    path = tmp_path / "old.db"
    before = tuple(f for f in FIELDS if f.attr not in lifetime)
    monkeypatch.setattr(format, "FIELDS", before)
    with SqliteStore(path) as store:
        _write(store, make_sample, 0, 300, ecc_sbe_volatile_count=3)
    monkeypatch.undo()
    with SqliteStore(path) as store:
        for s in store.latest():
            assert s.ecc_sbe_volatile_count == 3
            assert s.ecc_sbe_aggregate_count is None and s.ecc_dbe_aggregate_count is None
        raw = store.series(T0, T0 + 300 * S, sorted(lifetime))
        assert len(raw) == 60 and raw[sorted(lifetime)].isna().all().all()
        _write(store, make_sample, 300, 400, ecc_sbe_aggregate_count=9)
        assert [s.ecc_sbe_aggregate_count for s in store.latest()] == [9, 9]
