"""A persisted outbox: every notification is a row until it is delivered or permanently rejected.

Retries: the receiver's Retry-After when it gives one (Slack's 429), else exponential back-off
from ``base_backoff_s`` up to ``max_backoff_s``. A message is given up only when it is rejected
(HTTP 4xx other than 429, SMTP 5xx, bad credentials) or older than ``max_age_s``; either way the
row stays with its reason, visible to ``gpuwatt alerts outbox`` and the dashboard.
Delivery is at least once: a crash between a successful send and its commit re-sends that one
message after a restart; nothing else is ever sent twice.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatt.alerts.clock import NS_PER_S
from gpuwatt.alerts.notify.base import (
    Channel,
    Delivered,
    DeliveryResult,
    Notification,
    Rejected,
    RetryLater,
)

log = logging.getLogger("gpuwatt.alerts.outbox")

PENDING = "pending"
SENT = "sent"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_backoff_s: float = 5.0
    max_backoff_s: float = 600.0
    max_age_s: float = 86_400.0

    def backoff_s(self, attempts: int) -> float:
        return min(self.max_backoff_s, self.base_backoff_s * 2 ** max(0, attempts - 1))


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    id: int
    channel: str
    notification: Notification
    state: str
    attempts: int
    next_attempt_ns: int
    last_error: str
    created_ns: int
    done_ns: int | None


@dataclass(slots=True)
class DeliveryReport:
    sent: int = 0
    retrying: int = 0
    failed: int = 0


class Outbox:
    def __init__(self, con: sqlite3.Connection, policy: RetryPolicy | None = None) -> None:
        self._con = con
        self.policy = policy or RetryPolicy()

    def enqueue(self, n: Notification, dedup_key: str, now_ns: int) -> bool:
        """Queue a notification (in the caller's transaction); False if its key is queued."""
        cur = self._con.execute(
            "INSERT OR IGNORE INTO outbox (dedup_key, channel, payload, created_ns, state, "
            "next_attempt_ns) VALUES (?, ?, ?, ?, ?, ?)",
            (dedup_key, n.channel, n.to_json(), now_ns, PENDING, now_ns),
        )
        return cur.rowcount == 1

    def due(self, now_ns: int, limit: int = 100) -> list[OutboxEntry]:
        rows = self._con.execute(
            f"SELECT {_COLS} FROM outbox WHERE state = ? AND next_attempt_ns <= ? "
            "ORDER BY next_attempt_ns, id LIMIT ?",
            (PENDING, now_ns, limit),
        ).fetchall()
        return [_entry(r) for r in rows]

    def entries(self, state: str | None = None) -> list[OutboxEntry]:
        where, params = ("WHERE state = ?", (state,)) if state else ("", ())
        rows = self._con.execute(f"SELECT {_COLS} FROM outbox {where} ORDER BY id", params)
        return [_entry(r) for r in rows.fetchall()]

    def next_due_ns(self) -> int | None:
        (t,) = self._con.execute(
            "SELECT min(next_attempt_ns) FROM outbox WHERE state = ?", (PENDING,)
        ).fetchone()
        return t

    def deliver_due(self, channels: Mapping[str, Channel], now_ns: int) -> DeliveryReport:
        """Try every due message once, one after another (tests, ``alerts test``). The running
        evaluator sends through one worker per channel instead (``ChannelWorkers``)."""
        report = DeliveryReport()
        for e in self.due(now_ns):
            channel = channels.get(e.channel)
            if channel is None:
                self.record_missing_channel(e, now_ns, report)
                continue
            self.record(e, send_isolated(channel, e.notification), now_ns, report)
        return report

    def record_missing_channel(self, e: OutboxEntry, now_ns: int, report: DeliveryReport) -> None:
        self._finish(e, FAILED, f"no channel named {e.channel!r} is configured", now_ns)
        report.failed += 1

    def record(
        self, e: OutboxEntry, result: DeliveryResult, now_ns: int, report: DeliveryReport
    ) -> None:
        """Record one attempt's result: sent, failed for good, or due again after a back-off."""
        attempts = e.attempts + 1
        if isinstance(result, Delivered):
            self._finish(e, SENT, "", now_ns, attempts)
            report.sent += 1
        elif isinstance(result, Rejected):
            log.error("%s: notification %d rejected: %s", e.channel, e.id, result.reason)
            self._finish(e, FAILED, f"rejected: {result.reason}", now_ns, attempts)
            report.failed += 1
        else:
            assert isinstance(result, RetryLater)
            age_s = (now_ns - e.created_ns) / NS_PER_S
            if age_s >= self.policy.max_age_s:
                reason = f"gave up after {attempts} attempts: {result.reason}"
                log.error("%s: notification %d: %s", e.channel, e.id, reason)
                self._finish(e, FAILED, reason, now_ns, attempts)
                report.failed += 1
                return
            wait_s = (
                result.after_s if result.after_s is not None else self.policy.backoff_s(attempts)
            )
            log.warning("%s: notification %d: %s; retry in %.0f s", e.channel, e.id,
                        result.reason, wait_s)  # fmt: skip
            self._con.execute(
                "UPDATE outbox SET attempts = ?, next_attempt_ns = ?, last_error = ? WHERE id = ?",
                (attempts, now_ns + round(wait_s * NS_PER_S), result.reason, e.id),
            )
            report.retrying += 1

    def _finish(
        self, e: OutboxEntry, state: str, error: str, now_ns: int, attempts: int | None = None
    ) -> None:
        self._con.execute(
            "UPDATE outbox SET state = ?, last_error = ?, done_ns = ?, attempts = ? WHERE id = ?",
            (state, error, now_ns, e.attempts if attempts is None else attempts, e.id),
        )


_COLS = "id, channel, payload, state, attempts, next_attempt_ns, last_error, created_ns, done_ns"


def send_isolated(channel: Channel, n: Notification) -> DeliveryResult:
    """``channel.send``, with any exception it raises (a broken setting, a library bug) turned into
    a retry with that error recorded: one bad message or channel never stops the others."""
    try:
        return channel.send(n)
    except Exception as exc:
        log.exception("%s: sending raised %s", channel.name, type(exc).__name__)
        return RetryLater(f"{type(exc).__name__}: {exc}"[:500])


def _entry(r: tuple[Any, ...]) -> OutboxEntry:
    return OutboxEntry(r[0], r[1], Notification.from_json(r[2]), r[3], r[4], r[5], r[6], r[7], r[8])
