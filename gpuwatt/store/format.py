"""The embedded store's file format: its version, and the stored columns with their types.

SQLite's file header carries a 32-bit ``application_id`` (the file's magic number: gpuwatt's is
``APPLICATION_ID``) and a 32-bit ``user_version`` (the format version). The ``columns`` table
lists every metric column the file stores, with its id (its position in a raw row), the
``GpuSample`` attribute it holds and its type; raw rows and chunks refer to columns by id. A
column is only ever appended: a metric added to ``schema.FIELDS`` becomes a new column the next
time a writer opens the file, and every sample written before it reads back with that metric not
measured (NaN). See docs/storage.md.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatt.schema import FIELDS, FieldSpec

APPLICATION_ID = 0x47505754  # "GPWT"
FORMAT_VERSION = 3
#: Older formats this version reads, and upgrades in place when it opens them (docs/storage.md)
UPGRADES_FROM = (2,)

#: The page size of a new file (an existing file keeps the one it was made with: SQLite fixes
#: it when the file is created). Each commit appends every page it changed to the WAL, so what a
#: collector round costs in writes is its changed pages: with 1 KiB pages a round of the demo
#: (its head row, ~3.5 kB, and the B-tree pages above it) writes ~2.5x fewer bytes than with
#: SQLite's default 4 KiB (bench/store_write.py). Any page size reads the same.
PAGE_SIZE = 1024
#: WAL bytes after which a commit checkpoints (SQLite's ``wal_autocheckpoint`` counts pages:
#: its default is 1,000 pages, 4 MB at 4 KiB), in bytes whatever the file's page size. A page
#: changed by many commits between two checkpoints (the head's leaf and B-tree pages, page 1)
#: is copied into the file once per checkpoint: 16 MB writes ~18 % less than 4 MB
#: (bench/store_write.py, demo: 322 against 393 B per GPU-sample), for a WAL file that stays
#: 16 MB on disk (it is never truncated: its pages are reused).
WAL_CHECKPOINT_BYTES = 16 << 20

COLUMNS_SQL = """
CREATE TABLE IF NOT EXISTS columns (
  id INTEGER PRIMARY KEY,
  attr TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL
);
"""


#: Stored precision of float metrics whose sources give more digits than anyone reads (NVML's
#: GPM percentages and the byte rates derived from its counters are full float64 ratios that
#: change every sample: ~6 B each after compression, most of a block). Segments keep them
#: rounded to this many digits after the point as they are appended (docs/storage.md, "Stored
#: precision"; format 2 rounded them in its chunks, its head kept them as written). Suffix of
#: the attribute -> digits.
STORED_DECIMALS: dict[str, int] = {"_pct": 3, "_bytes_per_s": 0, "tflops_estimate": 3}


def stored_decimals(attrs: Sequence[str]) -> dict[int, int]:
    """Column id -> the digits after the point its float values are kept to in chunks."""
    out = {}
    for i, attr in enumerate(attrs):
        for suffix, digits in STORED_DECIMALS.items():
            if attr.endswith(suffix):
                out[i] = digits
    return out


class FormatError(Exception):
    """The file is not an embedded store this version can read (the message says why)."""


@dataclass(frozen=True)
class Columns:
    """The stored metric columns: ``attrs[i]`` is column id ``i``."""

    attrs: tuple[str, ...]

    @property
    def index(self) -> dict[str, int]:
        return {a: i for i, a in enumerate(self.attrs)}


def check(con: sqlite3.Connection, path: object) -> bool:
    """Whether the file is a store of this format or of one it upgrades (False: a new, empty
    file). Raises ``FormatError`` for any other file: another application's database, a newer
    format, or a layout written before format 2 (development versions only; no release wrote
    one)."""
    (app_id,) = con.execute("PRAGMA application_id").fetchone()
    (version,) = con.execute("PRAGMA user_version").fetchone()
    if app_id == APPLICATION_ID:
        if version > FORMAT_VERSION:
            raise FormatError(
                f"{path} is embedded store format {version}, newer than this gpuwatt reads "
                f"(format {FORMAT_VERSION}): upgrade gpuwatt to read it"
            )
        if version < FORMAT_VERSION and version not in UPGRADES_FROM:
            raise FormatError(f"{path}: embedded store format {version} is not supported")
        return True
    (tables,) = con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    if app_id == 0 and tables == 0:
        return False
    if (
        app_id == 0
        and con.execute(
            "SELECT 1 FROM sqlite_master WHERE name IN ('raw_rounds', 'samples')"
        ).fetchone()
    ):
        raise FormatError(
            f"{path} was written by a development version of gpuwatt (before embedded store "
            f"format {FORMAT_VERSION}), which no release wrote: move it away and start a new one"
        )
    raise FormatError(f"{path} is not a gpuwatt embedded store")


def stamp(con: sqlite3.Connection) -> None:
    """Mark a new file as this format (inside the transaction that creates its tables)."""
    con.execute(f"PRAGMA application_id={APPLICATION_ID}")
    con.execute(f"PRAGMA user_version={FORMAT_VERSION}")


def read_columns(con: sqlite3.Connection) -> Columns:
    rows = con.execute("SELECT id, attr FROM columns ORDER BY id").fetchall()
    if [i for i, _ in rows] != list(range(len(rows))):
        raise FormatError("the columns table is not numbered 0, 1, ...")
    return Columns(tuple(a for _, a in rows))


def add_columns(
    con: sqlite3.Connection, known: Columns, fields: Sequence[FieldSpec] | None = None
) -> Columns:
    """Append the schema's fields (``schema.FIELDS``) the file does not store yet (in a
    write transaction)."""
    attrs = list(known.attrs)
    for f in FIELDS if fields is None else fields:
        if f.attr not in attrs:
            con.execute(
                "INSERT INTO columns (id, attr, kind) VALUES (?, ?, ?)",
                (len(attrs), f.attr, f.kind.value),
            )
            attrs.append(f.attr)
    return Columns(tuple(attrs))
