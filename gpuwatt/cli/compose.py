"""Glue that only the command line may write: the alert evaluator's state shown by the dashboard.

The dashboard never imports ``alerts`` and ``alerts`` never imports ``dashboard``; this adapter
reads the evaluator's database (SQLite, WAL: safe to read while the evaluator writes) and hands
the dashboard its own ``AlertView`` objects.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from gpuwatt.alerts.silences import SilenceTable
from gpuwatt.alerts.state import Alert, AlertTable
from gpuwatt.dashboard.alerts_hook import AlertsUnavailable, AlertView, DeliveryView, SilenceView


class AlertsDbView:
    """``gpuwatt.dashboard.alerts_hook.AlertsSource`` over the evaluator's ``gpuwatt.alerts.db``."""

    def __init__(self, db_path: str | Path, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.db_path = Path(db_path)
        self._clock_ns = clock_ns

    def _connect(self) -> sqlite3.Connection:
        """A read-only connection (the evaluator owns the schema); ``AlertsUnavailable`` when
        there is no database yet (no evaluator ever ran with this config) or it cannot be read."""
        if not self.db_path.exists():
            raise AlertsUnavailable(
                f"no alert database at {self.db_path}: is `gpuwatt alerts` running with this "
                "configuration?"
            )
        try:
            con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=5.0)
            con.execute("SELECT 1 FROM alerts LIMIT 1")
        except sqlite3.Error as exc:
            raise AlertsUnavailable(f"cannot read {self.db_path}: {exc}") from None
        return con

    def active(self) -> list[AlertView]:
        con = self._connect()
        try:
            return [_view(a) for a in AlertTable(con).active()]
        except sqlite3.Error as exc:
            raise AlertsUnavailable(f"cannot read {self.db_path}: {exc}") from None
        finally:
            con.close()

    def silences(self) -> list[SilenceView]:
        con = self._connect()
        try:
            current = SilenceTable(con).current_and_future(self._clock_ns())
        except sqlite3.Error as exc:
            raise AlertsUnavailable(f"cannot read {self.db_path}: {exc}") from None
        finally:
            con.close()
        return [
            SilenceView(dict(s.matchers), s.author, s.comment, s.starts_ns, s.ends_ns, s.kind, s.id)
            for s in current
        ]

    def silence(
        self, matchers: dict[str, str], *, duration_s: float, author: str, comment: str
    ) -> int:
        """Add a silence from now for ``duration_s`` (the dashboard's action; as
        ``gpuwatt alerts silence`` does it). ValueError for bad matchers or an empty comment."""
        from gpuwatt.alerts.db import open_db, transaction

        if not self.db_path.exists():
            self._connect()  # raises AlertsUnavailable: never create the evaluator's database
        now = self._clock_ns()
        con = open_db(self.db_path)
        try:
            with transaction(con):
                s = SilenceTable(con).add(
                    matchers, author=author, comment=comment, starts_ns=now,
                    ends_ns=now + round(duration_s * 1e9), now_ns=now,
                )  # fmt: skip
        finally:
            con.close()
        return s.id

    def expire(self, silence_id: int) -> None:
        from gpuwatt.alerts.db import open_db, transaction

        if not self.db_path.exists():
            self._connect()
        con = open_db(self.db_path)
        try:
            with transaction(con):
                SilenceTable(con).expire(int(silence_id), self._clock_ns())
        finally:
            con.close()

    def deliveries(self) -> list[DeliveryView]:
        """Notifications being retried (with an error) or given up, newest first (at most 50)."""
        from gpuwatt.alerts.outbox import FAILED, PENDING, Outbox

        con = self._connect()
        try:
            outbox = Outbox(con)
            owed = [("retrying", e) for e in outbox.entries(PENDING) if e.last_error]
            failed = [("failed", e) for e in outbox.entries(FAILED)]
        finally:
            con.close()
        rows = sorted(owed + failed, key=lambda r: r[1].created_ns, reverse=True)[:50]
        return [
            DeliveryView(e.channel, state, e.attempts, e.last_error, e.created_ns)
            for state, e in rows
        ]

    def history(self, start_ns: int, end_ns: int) -> list[AlertView]:
        con = self._connect()
        try:
            rows = AlertTable(con).history(limit=5000)
        finally:
            con.close()
        out = []
        for r in rows:
            at_ns = int(r["at_ns"])  # type: ignore[call-overload]
            if start_ns <= at_ns < end_ns:
                labels = dict(r["labels"])  # type: ignore[call-overload]
                out.append(
                    AlertView(
                        name=str(r["rule"]),
                        severity=labels.get("severity", "warning"),
                        summary=f"{r['from_state']} -> {r['to_state']}",
                        state=str(r["to_state"]),
                        since_ns=at_ns,
                        labels=labels,
                    )
                )
        return out


def _view(a: Alert) -> AlertView:
    return AlertView(
        name=a.rule,
        severity=a.labels.get("severity", "warning"),
        summary=a.annotations.get("summary", a.rule),
        state=a.state,
        since_ns=a.firing_since_ns or a.pending_since_ns or a.updated_ns,
        labels=dict(a.labels),
        runbook_url=a.annotations.get("runbook_url") or None,
    )


def alerts_db_path(config_path: str | None) -> Path:
    """Where the alert evaluator keeps its state for this config (its ``alerts.state_db``).

    Only that one value is read: the dashboard, which asks, holds none of the channels' secrets
    and reads the state from a read-only mount (compose, systemd, Kubernetes), so neither the
    secret files nor the folder's writability are checked here; the evaluator checks both."""
    import os

    from gpuwatt.config import gpuwatt_home
    from gpuwatt.yamlfile import load_file

    if config_path is not None:
        alerts = load_file(config_path).get("alerts")
        state_db = alerts.get("state_db") if alerts is not None else None
        if state_db is not None:
            return Path(state_db.string()).expanduser()
    return gpuwatt_home(os.environ) / "alerts.db"
