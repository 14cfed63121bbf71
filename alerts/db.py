"""The alert evaluator's own SQLite database: alert state, history, silences, groups, outbox.

One file, so that a state transition, the notification it causes and the outbox row that will
deliver it are committed in one transaction: a crash leaves either all of them or none.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from gpuwatt.private_files import private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
  fingerprint TEXT PRIMARY KEY,
  rule TEXT NOT NULL,
  labels TEXT NOT NULL,            -- JSON
  annotations TEXT NOT NULL,       -- JSON
  state TEXT NOT NULL,             -- pending | firing | resolved
  value REAL,
  pending_since_ns INTEGER,
  firing_since_ns INTEGER,
  last_holding_ns INTEGER,
  resolved_ns INTEGER,
  updated_ns INTEGER NOT NULL,
  suppressed TEXT NOT NULL DEFAULT ''   -- '' | silence:<id> | node_down:<host>
);
CREATE INDEX IF NOT EXISTS alerts_state ON alerts(state);
CREATE TABLE IF NOT EXISTS history (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  fingerprint TEXT NOT NULL,
  rule TEXT NOT NULL,
  labels TEXT NOT NULL,
  from_state TEXT NOT NULL,
  to_state TEXT NOT NULL,
  at_ns INTEGER NOT NULL,
  value REAL
);
CREATE INDEX IF NOT EXISTS history_at ON history(at_ns);
CREATE TABLE IF NOT EXISTS silences (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL,              -- silence | maintenance
  matchers TEXT NOT NULL,          -- JSON {label: value}
  author TEXT NOT NULL,
  comment TEXT NOT NULL,
  starts_ns INTEGER NOT NULL,
  ends_ns INTEGER NOT NULL,
  created_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS groups (
  channel TEXT NOT NULL,
  group_key TEXT NOT NULL,
  notified TEXT NOT NULL,          -- JSON list of fingerprints announced as firing
  last_sent_ns INTEGER,
  seq INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (channel, group_key)
);
CREATE TABLE IF NOT EXISTS outbox (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  dedup_key TEXT NOT NULL UNIQUE,
  channel TEXT NOT NULL,
  payload TEXT NOT NULL,           -- JSON Notification
  created_ns INTEGER NOT NULL,
  state TEXT NOT NULL,             -- pending | sent | failed
  attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt_ns INTEGER NOT NULL,
  last_error TEXT NOT NULL DEFAULT '',
  done_ns INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(state, next_attempt_ns);
"""


def open_db(path: str | Path) -> sqlite3.Connection:
    """Open (creating, 0600) the alert database; WAL so the dashboard can read it as we write."""
    private_file(path)
    con = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.executescript(SCHEMA)
    return con


@contextlib.contextmanager
def transaction(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
