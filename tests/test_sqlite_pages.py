"""What the embedded store's writes cost on disk (docs/storage.md, "Size and writes"): new files
get small pages and files made with larger ones still open, are written and read; the WAL is
checkpointed after a bounded number of bytes whatever the page size; a compaction of what a
format 2 file kept in its head does not write again the head pages it frees."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from gpuwatt.store import format, rounds
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour
WAL_HEADER = 32
FRAME_HEADER = 24


def sql(path: Path, query: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as con:
        return con.execute(query).fetchall()


def _rounds(store: SqliteStore, make_sample, start_s: int, end_s: int, gpus: int = 4) -> list:
    written = []
    for t in range(start_s, end_s):
        batch = [
            make_sample(T0 + t * S, "node1", g, power_w=100.0 + (t * 7 + g) % 97)
            for g in range(gpus)
        ]
        store.write_samples(batch)
        written += batch
    return written


def _power(store: SqliteStore, start_s: int, end_s: int) -> list[float]:
    frame = store.series(T0 + start_s * S, T0 + end_s * S, ["power_w"])
    return frame.sort_values(["time_ns", "gpu_index"])["power_w"].tolist()


def test_a_new_file_gets_the_format_page_size(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SqliteStore(path).close()
    assert sql(path, "PRAGMA page_size") == [(format.PAGE_SIZE,)]
    assert sql(path, "PRAGMA journal_mode") == [("wal",)]


@pytest.mark.parametrize("old_page_size", [4096, 16384])
def test_a_file_made_with_larger_pages_keeps_them_and_is_written_and_read(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch, old_page_size: int
) -> None:
    """Files made before 1 KiB pages (SQLite's 4 KiB; 16 KiB where the job-step store created
    the file) open as they are: old samples read back, new ones are written, blocks close."""
    path = tmp_path / "old.db"
    with monkeypatch.context() as m:
        m.setattr(format, "PAGE_SIZE", old_page_size)
        with SqliteStore(path) as store:
            old = _rounds(store, make_sample, 0, 300)
    assert sql(path, "PRAGMA page_size") == [(old_page_size,)]
    with SqliteStore(path) as store:
        new = _rounds(store, make_sample, 300, 1300)  # two blocks closed and compacted
        assert _power(store, 0, 1300) == [s.power_w for s in old + new]
        assert store.count_samples(T0, T0 + 1300 * S) == len(old) + len(new)
    assert sql(path, "PRAGMA page_size") == [(old_page_size,)]
    # segments: 0-300 s (closed with the store), 300-600, 600-1200, 1200-1300 (closed with it)
    assert sql(path, "SELECT t_min_ns, closed FROM segments ORDER BY id") == [
        (T0 + t * S, 1) for t in (0, 300, 600, 1200)
    ]


@pytest.mark.parametrize("page_size", [format.PAGE_SIZE, 4096])
def test_the_wal_is_checkpointed_after_a_bounded_number_of_bytes(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch, page_size: int
) -> None:
    """SQLite's default checkpoints after 1,000 pages (1 MB of 1 KiB pages, 4 MB of 4 KiB
    ones); the store checkpoints after ``WAL_CHECKPOINT_BYTES``, counted in bytes. The WAL file
    is never truncated: it stays as long as its longest stretch between checkpoints."""
    limit = 64 << 10
    monkeypatch.setattr(format, "WAL_CHECKPOINT_BYTES", limit)
    monkeypatch.setattr(format, "PAGE_SIZE", page_size)
    path = tmp_path / "wal.db"
    with SqliteStore(path) as store:
        written = _rounds(store, make_sample, 0, 400)
        wal_bytes = (path.parent / (path.name + "-wal")).stat().st_size
        frames = (wal_bytes - WAL_HEADER) // (FRAME_HEADER + page_size)
        # one round's commit (a few pages) may go past the limit before the checkpoint
        assert frames * page_size <= limit + 16 * page_size
        assert store.count_samples(T0, T0 + 400 * S) == len(written)


def test_a_compaction_does_not_write_again_the_pages_it_frees(tmp_path: Path, make_sample) -> None:
    """The head rows (a format 2 file's) that a compaction moves into a chunk are deleted; the
    pages they leave free are listed in the free list, not zeroed and written (SQLite's
    secure_delete, on in Debian's build, wrote every one of them again: into the WAL, then into
    the file)."""
    path = tmp_path / "c.db"
    with SqliteStore(path) as store:
        _rounds(store, make_sample, 0, 1, gpus=8)  # the GPUs and their tail
        con = store._writer
        ncols = len(format.read_columns(con).attrs)
        gids = [g for (g,) in con.execute("SELECT id FROM gpus ORDER BY id")]
        with store._transaction(con):  # the head rows a format 2 writer left
            for t in range(1, 300):
                rows = t + np.add.outer(np.arange(8.0) * 1e3, np.arange(ncols + 2.0))
                rows[:, 0], rows[:, -1] = 0.0, 1.0  # not lost, tail 1
                rounds.insert(con, T0 + t * S, gids, rows.tobytes(), ncols)
        with contextlib.closing(sqlite3.connect(path)) as con:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        store.compact()
        (page_size,) = store._writer.execute("PRAGMA page_size").fetchone()
        (freed,) = store._writer.execute("PRAGMA freelist_count").fetchone()
        wal_bytes = (path.parent / (path.name + "-wal")).stat().st_size
    frames = (wal_bytes - WAL_HEADER) // (FRAME_HEADER + page_size)
    assert freed >= 100  # the head's pages, now free
    assert frames < freed / 2
