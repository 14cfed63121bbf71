"""Format 3's segment files (docs/storage.md, "Segment files"): rounds read back bit for bit, a
torn or garbled end of the open segment ends what is read, a reader decodes only what was
appended since it last looked, a segment a writer left open is closed by the next one, and a
format 2 file (what gpuwatt wrote before) is upgraded in place and reads as it did."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from gpuwatt.store import StoreRejected, format, segments
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000
T0 = 1_699_999_200 * S
DATA = Path(__file__).parent / "data"


def _rounds(n: int, seed: int = 0) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Rounds of a few GPUs (some come and go) whose values are integers, decimals, counters,
    full-precision floats, NaN (not measured) and infinities."""
    rng = np.random.default_rng(seed)
    out = []
    energy = np.zeros(6)
    for k in range(n):
        gids = np.array([g for g in range(6) if (g + k) % 7 != 0], dtype=np.int64)
        m = len(gids)
        energy[gids] += np.round(rng.uniform(100, 700, m), 3)
        rows = np.column_stack(
            [
                (rng.random(m) < 0.1).astype(float),  # lost
                rng.integers(0, 100, m).astype(float),  # an integer gauge
                np.round(rng.uniform(50, 700, m), 3),  # W to the mW
                energy[gids],  # a counter
                rng.uniform(0, 100, m),  # a full-precision ratio
                np.where(rng.random(m) < 0.3, np.nan, 2.5),  # sometimes not measured
                np.full(m, math.inf if k % 5 == 0 else 1e300),
                np.full(m, float(k // 10)),  # the tail id
            ]
        )
        out.append((T0 + k * S, gids, rows))
    return out


def _same(got: list[segments.Record], want: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for r, (t, gids, rows) in zip(got, want, strict=True):
        assert r.time_ns == t
        assert r.gpu_ids.tolist() == gids.tolist()
        assert r.rows.view(np.uint64).tolist() == rows.view(np.uint64).tolist()


def test_rounds_read_back_bit_for_bit(tmp_path: Path) -> None:
    want = _rounds(300)
    writer = segments.SegmentWriter(tmp_path, 1)
    for t, gids, rows in want:
        writer.append(t, gids, rows)
    open_bytes = writer.path.stat().st_size
    _same(segments._Cache().records(writer.path), want)  # as another process: the open file
    writer.close()
    assert writer.path.stat().st_size > open_bytes  # the frame's end
    _same(segments._Cache().records(writer.path), want)
    assert writer.path.stat().st_mode & 0o777 == 0o600


def test_a_reader_decodes_what_was_appended_since_it_last_looked(tmp_path: Path) -> None:
    want = _rounds(50)
    writer = segments.SegmentWriter(tmp_path / "segs", 7)
    assert (tmp_path / "segs").stat().st_mode & 0o777 == 0o700
    reader = segments._Cache()
    for k, (t, gids, rows) in enumerate(want):
        writer.append(t, gids, rows)
        if k % 9 == 0:
            _same(reader.records(writer.path), want[: k + 1])
    _same(reader.records(writer.path), want)
    writer.abandon()


def test_memory_stays_bounded_and_every_round_still_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``CACHE_BYTES`` a reader drops its oldest decoded rounds; a read that reaches back
    to them decodes the file again."""
    monkeypatch.setattr(segments, "CACHE_BYTES", 4096)
    want = _rounds(60)
    writer = segments.SegmentWriter(tmp_path, 1)
    reader = segments._Cache()
    for k, (t, gids, rows) in enumerate(want):
        writer.append(t, gids, rows)
        recent = reader.records(writer.path, t)
        _same([r for r in recent if r.time_ns >= t], [want[k]])
        assert sum(e.nbytes for e in reader._entries.values()) <= 4096
    _same(reader.records(writer.path), want)
    writer.abandon()


@pytest.mark.parametrize("garbage", [b"", b"\x00" * 300, bytes(range(256)) * 3])
def test_a_torn_or_garbled_end_ends_what_is_read(tmp_path: Path, garbage: bytes) -> None:
    """A writer killed (or a power loss) in the middle of a round leaves part of its bytes,
    or bytes that are not its: every round before it reads back, nothing after."""
    want = _rounds(40)
    writer = segments.SegmentWriter(tmp_path, 1)
    sizes = []
    for t, gids, rows in want:
        writer.append(t, gids, rows)
        sizes.append(writer.path.stat().st_size)
    writer.abandon()
    data = writer.path.read_bytes()
    for cut in range(sizes[-2], sizes[-1], max(1, (sizes[-1] - sizes[-2]) // 17)):
        writer.path.write_bytes(data[:cut] + garbage)
        _same(segments._Cache().records(writer.path), want[:-1])
    writer.path.write_bytes(data + garbage)
    _same(segments._Cache().records(writer.path), want)


def test_a_segment_left_open_is_closed_by_the_next_writer(tmp_path: Path, make_sample) -> None:
    path = tmp_path / "w.db"
    store = SqliteStore(path)
    for t in range(5):
        store.write_samples([make_sample(T0 + t * S, "node1", g) for g in range(3)])
    store._segments.abandon()  # as if killed: the index says open
    store.close()
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT closed FROM segments").fetchall() == [(0,)]
    with SqliteStore(path) as store:
        assert store.count_samples(T0, T0 + 10 * S) == 15  # an open segment is read whole
        store.write_samples([make_sample(T0 + 5 * S, "node1", 0)])
        assert store.count_samples(T0, T0 + 10 * S) == 16
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT t_min_ns, t_max_ns, n, closed FROM segments").fetchall() == [
            (T0, T0 + 4 * S, 15, 1),
            (T0 + 5 * S, T0 + 5 * S, 1, 1),
        ]


def _frame_lists(frame) -> dict[str, list]:
    return {
        c: frame[c].astype("int64" if c == "time_ns" else frame[c].dtype).tolist() for c in frame
    }


def _equal(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, float) and math.isnan(w):
            assert isinstance(g, float) and math.isnan(g)
        else:
            assert g == w


def test_a_format_2_file_is_upgraded_in_place_and_reads_as_it_did(tmp_path: Path) -> None:
    """``tests/data/store_format2.db.gz``: written by gpuwatt's format 2 (4 GPUs on 2 hosts,
    every 10 s for 25 minutes: two blocks in chunks, the open one in the head, a sample
    rewritten late into a compacted block, rollups), with the reads it gave then."""
    path = tmp_path / "old.db"
    path.write_bytes(gzip.decompress((DATA / "store_format2.db.gz").read_bytes()))
    want = json.loads((DATA / "store_format2.json").read_text())
    fields = ["power_w", "energy_j", "sm_active_pct", "memory_used_bytes", "clock_event_reasons"]
    with SqliteStore(path) as store:
        reads = {
            "raw": store.series(T0, T0 + 1500 * S, fields),
            "minutes": store.series(T0, T0 + 1500 * S, fields, step_s=60),
            "hosts": store.series(T0 + 590 * S, T0 + 1230 * S, fields, hosts=["node2"]),
        }
        for name, frame in reads.items():
            got = _frame_lists(frame)
            assert list(got) == list(want[name])
            for column in got:
                _equal(got[column], want[name][column])
        assert store.count_samples(0, 2**62) == want["count"]
        got_latest = [
            [s.time_ns, s.host, s.gpu_index, s.power_w, s.sm_active_pct] for s in store.latest()
        ]
        assert got_latest == want["latest"]
        # new samples go into segments; one rewritten for a compacted block wins
        late = store.latest()[0]
        store.write_samples([dataclasses.replace(late, time_ns=T0 + 20 * S, power_w=1.5)])
        raw = store.series(T0 + 20 * S, T0 + 21 * S, ["power_w"], hosts=[late.host])
        assert 1.5 in raw["power_w"].tolist()
        assert store.count_samples(0, 2**62) == want["count"]
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("PRAGMA user_version").fetchone() == (format.FORMAT_VERSION,)
        assert con.execute("SELECT count(*) FROM segments").fetchone() == (1,)


def test_a_format_before_2_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    with contextlib.closing(sqlite3.connect(path)) as con:
        con.execute(f"PRAGMA application_id={format.APPLICATION_ID}")
        con.execute("PRAGMA user_version=1")
        con.execute("CREATE TABLE x (a)")
    with pytest.raises(StoreRejected, match="format 1 is not supported"):
        SqliteStore(path)


def test_a_write_that_fails_after_its_round_went_in_names_only_committed_ids(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment is not rolled back: the ids a round names (a new GPU) are committed before the
    round goes in, so a write that fails later leaves a round of a GPU that exists, and the
    retry (the spool's) stores it once."""
    from gpuwatt.errors import StoreUnavailable

    with SqliteStore(tmp_path / "f.db") as store:
        store.write_samples([make_sample(T0, "node1", 0)])

        def failing(*args: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(store, "_maintain", failing)
        with pytest.raises(StoreUnavailable):
            store.write_samples([make_sample(T0 + S, "node2", 5)])
        monkeypatch.undo()
        store.write_samples([make_sample(T0 + 2 * S, "node3", 7)])  # a GPU new to the file
        store.write_samples([make_sample(T0 + S, "node2", 5)])  # the retry
        got = store.series(T0, T0 + 3 * S, ["power_w"])
        assert sorted(zip(got["time_ns"], got["host"], got["gpu_index"], strict=True)) == [
            (T0, "node1", 0),
            (T0 + S, "node2", 5),
            (T0 + 2 * S, "node3", 7),
        ]
        assert store.count_samples(T0, T0 + 3 * S) == 3


def test_a_round_the_disk_refused_leaves_the_segment_readable(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of a round that fails half-way (disk full) is an outage (the spool retries): the
    file is cut back to its last whole round, the writer goes on in a new segment, and every
    round stored reads back, in this process and in another."""
    import errno
    import os

    from gpuwatt.errors import StoreUnavailable

    def round_(t: int) -> list:
        return [make_sample(T0 + t * S, "node1", g) for g in range(2)]

    path = tmp_path / "d.db"
    with SqliteStore(path) as store:
        for t in range(3):
            store.write_samples(round_(t))
        real = os.write

        def full(fd: int, data: bytes) -> int:
            real(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(segments.os, "write", full)
        with pytest.raises(StoreUnavailable, match="No space left"):
            store.write_samples(round_(3))
        monkeypatch.undo()
        for t in range(3, 5):  # the retry, and the next round
            store.write_samples(round_(t))
        assert store.count_samples(T0, T0 + 10 * S) == 10
    monkeypatch.setattr(segments, "_CACHE", segments._Cache())  # as another process
    with SqliteStore(path) as store:
        assert store.count_samples(T0, T0 + 10 * S) == 10
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT t_min_ns, t_max_ns, n, closed FROM segments").fetchall() == [
            (T0, T0 + 2 * S, 6, 1),
            (T0 + 3 * S, T0 + 4 * S, 4, 1),
        ]
