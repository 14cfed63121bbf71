"""Delivery that no channel can stall: one sender thread per channel, apart from evaluation.

The scheduler calls ``ChannelWorkers.dispatch`` every second. It reads the due messages under the
evaluator's lock (a moment), and hands each channel's messages to that channel's own thread, which
sends them one by one (``outbox.send_isolated``: an exception becomes a recorded retry) and records
each result under the lock. A channel whose previous batch is still going (a webhook that never
answers until its timeout) is skipped until it is free: it delays only its own messages, never
another channel's, and never an evaluation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from gpuwatt.alerts.notify.base import Channel
from gpuwatt.alerts.outbox import DeliveryReport, Outbox, OutboxEntry, send_isolated

log = logging.getLogger("gpuwatt.alerts.dispatch")


class ChannelWorkers:
    def __init__(
        self,
        outbox: Outbox,
        channels: Mapping[str, Channel],
        lock: threading.Lock,
        now_ns: Callable[[], int],
    ) -> None:
        self.outbox = outbox
        self.channels = dict(channels)
        self._lock = lock  # the evaluator's: guards its database connection
        self._now_ns = now_ns
        self._busy: dict[str, threading.Thread] = {}
        self._busy_lock = threading.Lock()
        #: Totals since start, per channel (``alerts status`` and the log read the outbox rows).
        self.reports: dict[str, DeliveryReport] = {}

    def dispatch(self) -> int:
        """Start a sender for every channel with due messages that is not already sending;
        returns how many messages were handed over."""
        with self._lock:
            due = self.outbox.due(self._now_ns())
        by_channel: dict[str, list[OutboxEntry]] = {}
        for e in due:
            by_channel.setdefault(e.channel, []).append(e)
        handed = 0
        for name, entries in by_channel.items():
            channel = self.channels.get(name)
            report = self.reports.setdefault(name, DeliveryReport())
            if channel is None:
                with self._lock:
                    for e in entries:
                        self.outbox.record_missing_channel(e, self._now_ns(), report)
                continue
            with self._busy_lock:
                if name in self._busy:
                    continue  # still sending its previous batch
                sender = threading.Thread(
                    target=self._send,
                    args=(name, channel, entries, report),
                    name=f"alerts-send-{name}",
                    daemon=True,  # a hung send must not hold the process at exit
                )
                self._busy[name] = sender
            sender.start()
            handed += len(entries)
        return handed

    def _send(
        self, name: str, channel: Channel, entries: list[OutboxEntry], report: DeliveryReport
    ) -> None:
        try:
            for e in entries:
                result = send_isolated(channel, e.notification)
                with self._lock:
                    self.outbox.record(e, result, self._now_ns(), report)
        except Exception:
            log.exception("%s: recording a delivery failed", name)
        finally:
            with self._busy_lock:
                self._busy.pop(name, None)

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the senders still running (shutdown)."""
        with self._busy_lock:
            senders = list(self._busy.values())
        for sender in senders:
            sender.join(timeout_s)
