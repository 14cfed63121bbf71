"""The embedded store's tables, and how a GPU's identity and tail are stored in them.

The format around them (version, stored columns) is ``format``; the head's rounds, the chunks
and the rollups declare their own tables (``rounds``, ``chunks``, ``rollups``), gathered here.
docs/storage.md describes them all.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from gpuwatt.line_protocol import format_processes
from gpuwatt.store import chunks, format, rollups, rounds, segments

#: The GPU's identity and the fields of its tail (``rounds``): while they are equal from one
#: sample of a GPU to the next (one tuple comparison, mostly of identical objects), its id and
#: tail id are reused.
KEY_ATTRS: tuple[str, ...] = (
    "host",
    "gpu_index",
    "uuid",
    "name",
    "energy_method",
    "tflops_method",
    "xid_errors",
    "processes",
    "job_id",
)

SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS gpus (
  id INTEGER PRIMARY KEY,
  host TEXT NOT NULL,
  gpu_index INTEGER NOT NULL,
  uuid TEXT NOT NULL,
  name TEXT NOT NULL,
  last_time_ns INTEGER,
  UNIQUE (host, gpu_index, uuid)
);
{format.COLUMNS_SQL}
{rounds.SCHEMA_SQL}
{chunks.SCHEMA_SQL}
{segments.SCHEMA_SQL}
{rollups.SCHEMA_SQL}
CREATE TABLE IF NOT EXISTS rollup_dirty (
  level_ns INTEGER NOT NULL,
  bucket_ns INTEGER NOT NULL,
  PRIMARY KEY (level_ns, bucket_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER);
"""


def upgrade(con: sqlite3.Connection) -> None:
    """Bring a file of an older format (``format.UPGRADES_FROM``) to this one, in the
    transaction that opens it: format 2 gains the ``segments`` index; its head and chunks stay
    as they are, read as before, until the raw retention deletes them."""
    (version,) = con.execute("PRAGMA user_version").fetchone()
    if version < format.FORMAT_VERSION:
        con.execute(segments.SCHEMA_SQL)
        format.stamp(con)


def tail_row(
    key: tuple[Any, ...],
) -> tuple[str | None, str | None, int | None, int | None, str | None, str | None]:
    """A key's tail (``KEY_ATTRS[4:]``) as stored in ``tails``."""
    em, tm, xids, procs, job = key[4:]
    return (
        None if em is None else em.value,
        None if tm is None else tm.value,
        xids[-1] if xids else None,
        len(xids) if xids else None,
        None if procs is None else format_processes(procs),
        job,
    )
