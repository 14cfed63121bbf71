"""Where application-reported job steps (``job_step_format.JobStep``) are kept.

A small store of its own beside the sample store, so that a training job's reporter needs no
more than this module and the samples' stores stay as they are:

- ``SqliteJobStepStore``: the table ``job_steps`` in the *same* database file as the samples,
  through its own connection (WAL: the collector keeps writing samples meanwhile; a write that
  finds the file locked waits up to ``busy_timeout_s``). Keyed by ``(time_ns, job_id, rank)``,
  so writing the same step twice stores it once. Rows older than the newest step minus
  ``retention_s`` are deleted (checked once per minute of data time).
- ``InfluxJobStepStore``: line protocol (``job_step_format.encode_job_step``) through
  ``InfluxStore``'s SYNCHRONOUS write path (/api/v2/write) and InfluxQL reads over /query, with
  its error mapping: ``StoreUnavailable`` (retry later) and ``StoreRejected`` (the data or query
  is refused).

``open_job_step_store(url)`` takes the same URLs as ``gpuwatt.store.open_store``. Reads return a
pandas frame with ``schema.JOB_STEP_COLUMNS`` sorted by time (``gpu_uuids`` comma-separated, "" when
not reported; NaN for a missing number); pandas is imported by the read paths only.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuwatt.errors import StoreUnavailable
from gpuwatt.job_step_format import (
    FIELD_GPU_UUIDS,
    FIELD_MODEL_FLOPS_PER_STEP,
    FIELD_PRECISION,
    FIELD_STEP_TIME_S,
    FIELD_TOKENS_PER_STEP,
    JOB_STEP_COLUMNS,
    JOB_STEP_FIELDS,
    JOB_STEP_MEASUREMENT,
    TAG_JOB_ID,
    TAG_RANK,
    JobStep,
    encode_job_step,
)
from gpuwatt.line_protocol import encode_name
from gpuwatt.schema import TAG_HOST
from gpuwatt.store import format

if TYPE_CHECKING:
    import pandas as pd

    from gpuwatt.store.influx import InfluxStore

NS_PER_S = 1_000_000_000
DAY_S = 86_400
_RETENTION_CHECK_NS = 60 * NS_PER_S


@runtime_checkable
class JobStepStore(Protocol):
    """Write job steps; read them back for a time range."""

    def write_job_steps(self, steps: Sequence[JobStep]) -> None:
        """Persist steps (idempotent). Raises ``StoreUnavailable`` when the store is unreachable."""

    def job_steps(
        self, start_ns: int, end_ns: int, *, job_ids: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """Steps with ``start_ns <= time_ns < end_ns`` (optionally only those jobs)."""

    def close(self) -> None: ...


def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    import pandas as pd

    df = pd.DataFrame.from_records(rows, columns=list(JOB_STEP_COLUMNS))
    for col in ("time_ns", "rank", "step"):
        df[col] = df[col].astype("int64")
    for col in (FIELD_STEP_TIME_S, FIELD_MODEL_FLOPS_PER_STEP, FIELD_TOKENS_PER_STEP):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in (TAG_HOST, TAG_JOB_ID, FIELD_GPU_UUIDS):
        df[col] = df[col].fillna("").astype(object)
    precision = df[FIELD_PRECISION].astype(object)
    df[FIELD_PRECISION] = precision.where(precision.notna(), None)
    return df.sort_values(["time_ns", TAG_JOB_ID, TAG_RANK], kind="stable").reset_index(drop=True)


# --- SQLite -----------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_steps (
  time_ns INTEGER NOT NULL,
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  host TEXT NOT NULL,
  step INTEGER NOT NULL,
  step_time_s REAL NOT NULL,
  model_flops_per_step REAL,
  tokens_per_step REAL,
  gpu_uuids TEXT,
  precision TEXT,
  PRIMARY KEY (time_ns, job_id, rank)
) WITHOUT ROWID;
"""
_INSERT = (
    "INSERT OR REPLACE INTO job_steps (time_ns, job_id, rank, host, step, step_time_s, "
    "model_flops_per_step, tokens_per_step, gpu_uuids, precision) VALUES (?,?,?,?,?,?,?,?,?,?)"
)


class SqliteJobStepStore:
    """The ``job_steps`` table of a gpuwatt SQLite file, through one connection of its own.

    Safe to share between threads (one lock around the connection). The table and WAL mode are
    set up on first use, not in the constructor, so constructing never touches the file.
    """

    def __init__(
        self, path: str | Path, *, retention_s: int = 90 * DAY_S, busy_timeout_s: float = 30.0
    ) -> None:
        self.path = Path(path)
        self.retention_ns = int(retention_s) * NS_PER_S
        self.busy_timeout_s = float(busy_timeout_s)
        self._lock = threading.Lock()
        self._con: sqlite3.Connection | None = None
        self._newest_ns: int | None = None
        self._retention_checked_ns: int | None = None

    def __repr__(self) -> str:
        return f"SqliteJobStepStore({str(self.path)!r})"

    def _connection(self) -> sqlite3.Connection:
        if self._con is not None:
            return self._con
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            con = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        try:
            con.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            con.execute("PRAGMA synchronous=NORMAL")
            # The samples store's page size, should this connection create the file.
            con.execute(f"PRAGMA page_size={format.PAGE_SIZE}")
            with contextlib.suppress(sqlite3.OperationalError):
                con.execute("PRAGMA journal_mode=WAL").close()
            con.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            con.close()
            raise StoreUnavailable(f"cannot set up job_steps in {self.path}: {exc}") from exc
        self._con = con
        return con

    def write_job_steps(self, steps: Sequence[JobStep]) -> None:
        if not steps:
            return
        rows = [
            (
                int(s.time_ns),
                s.job_id,
                int(s.rank),
                s.host,
                int(s.step),
                float(s.step_time_s),
                s.model_flops_per_step,
                s.tokens_per_step,
                ",".join(s.gpu_uuids) or None,
                s.precision,
            )
            for s in steps
        ]
        newest = max(r[0] for r in rows)
        with self._lock:
            con = self._connection()
            try:
                con.execute("BEGIN IMMEDIATE")
                try:
                    con.executemany(_INSERT, rows)
                    self._apply_retention(con, newest)
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot write job steps to {self.path}: {exc}") from exc

    def _apply_retention(self, con: sqlite3.Connection, newest_ns: int) -> None:
        if self._newest_ns is None or newest_ns > self._newest_ns:
            self._newest_ns = newest_ns
        checked = self._retention_checked_ns
        if checked is not None and self._newest_ns - checked < _RETENTION_CHECK_NS:
            return
        self._retention_checked_ns = self._newest_ns
        cutoff_ns = self._newest_ns - self.retention_ns
        con.execute("DELETE FROM job_steps WHERE time_ns < ?", (cutoff_ns,))

    def job_steps(
        self, start_ns: int, end_ns: int, *, job_ids: Sequence[str] | None = None
    ) -> pd.DataFrame:
        sql = (
            "SELECT time_ns, host, job_id, rank, step, step_time_s, model_flops_per_step, "
            "tokens_per_step, gpu_uuids, precision FROM job_steps "
            "WHERE time_ns >= ? AND time_ns < ?"
        )
        params: list[Any] = [int(start_ns), int(end_ns)]
        if job_ids is not None:
            sql += f" AND job_id IN ({','.join('?' * len(job_ids))})" if job_ids else " AND 0"
            params += list(job_ids)
        with self._lock:
            con = self._connection()
            try:
                rows = con.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot read job steps from {self.path}: {exc}") from exc
        return _frame(rows)

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None

    def __enter__(self) -> SqliteJobStepStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- InfluxDB ---------------------------------------------------------------------------------


class InfluxJobStepStore:
    """Job steps in an InfluxDB bucket, through an ``InfluxStore``'s write and query paths."""

    def __init__(self, store: InfluxStore) -> None:
        self._store = store

    @classmethod
    def connect(
        cls, url: str, org: str, bucket: str, token: str | None = None, *, timeout_s: float = 10.0
    ) -> InfluxJobStepStore:
        from gpuwatt.store.influx import InfluxStore

        return cls(InfluxStore(url, org, bucket, token, timeout_s=timeout_s))

    def __repr__(self) -> str:
        return f"InfluxJobStepStore({self._store!r})"

    def write_job_steps(self, steps: Sequence[JobStep]) -> None:
        if steps:
            self._store.write_lines([encode_job_step(s) for s in steps])

    def job_steps(
        self, start_ns: int, end_ns: int, *, job_ids: Sequence[str] | None = None
    ) -> pd.DataFrame:
        from gpuwatt.store.influx import influxql_string

        where = f"time >= {int(start_ns)} AND time < {int(end_ns)}"
        if job_ids is not None:
            if not job_ids:
                return _frame([])
            ors = " OR ".join(
                f'"{TAG_JOB_ID}" = {influxql_string(encode_name(j))}' for j in job_ids
            )
            where += f" AND ({ors})"
        select = ", ".join(f'"{f}"' for f in JOB_STEP_FIELDS)
        series = self._store.query(
            f'SELECT {select} FROM "{JOB_STEP_MEASUREMENT}" WHERE {where} '
            f'GROUP BY "{TAG_HOST}", "{TAG_JOB_ID}", "{TAG_RANK}"'
        )
        rows: list[tuple[Any, ...]] = []
        for s in series:
            tags = s.get("tags", {})
            pos = [s["columns"].index(f) for f in JOB_STEP_FIELDS]
            for row in s.get("values", []):
                values = [row[i] for i in pos]
                if values[0] is None or values[1] is None:
                    continue  # not a complete step point
                rows.append(
                    (
                        row[0],
                        tags.get(TAG_HOST, ""),
                        tags.get(TAG_JOB_ID, ""),
                        int(tags.get(TAG_RANK) or 0),
                        *values,
                    )
                )
        return _frame(rows)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> InfluxJobStepStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NoJobStepStore:
    """Prometheus-compatible engines keep no job steps (their job ids and GPU lists are strings):
    reads find none, writes say where steps can go."""

    def __init__(self, where: str) -> None:
        self._where = where

    def write_job_steps(self, steps: Sequence[JobStep]) -> None:
        if steps:
            from gpuwatt.store import StoreRejected

            raise StoreRejected(
                f"{self._where} cannot keep job steps (string fields): report them to an "
                "InfluxDB or SQLite store"
            )

    def job_steps(
        self, start_ns: int, end_ns: int, *, job_ids: Sequence[str] | None = None
    ) -> pd.DataFrame:
        return _frame([])

    def close(self) -> None:
        pass


def open_job_step_store(
    url: str | None = None, environ: Mapping[str, str] | None = None
) -> JobStepStore:
    """The job-step store for a store URL (the same URLs as ``open_store``; None: the default).

    Does no I/O for SQLite (the file is opened on first use). Raises ``StoreUrlError`` for a
    malformed URL.
    """
    from gpuwatt.store import default_store_url
    from gpuwatt.store.url import InfluxTarget, PromTarget, SqliteTarget, parse_store_url

    env = os.environ if environ is None else environ
    target = parse_store_url(url or default_store_url(env), env)
    if isinstance(target, SqliteTarget):
        return SqliteJobStepStore(target.path)
    if isinstance(target, PromTarget):
        return NoJobStepStore(target.url)
    assert isinstance(target, InfluxTarget)
    s = target.settings
    return InfluxJobStepStore.connect(s.url, s.org, s.bucket, s.token)
