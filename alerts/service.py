"""The alert evaluator: one process, two steps driven by APScheduler.

- ``Evaluator.evaluate()``: read the store at the clock's time, evaluate every rule, move alerts
  through pending -> firing -> resolved, mark silenced and node-down alerts, and enqueue the
  notifications the policy decides, all in one SQLite transaction.
- ``Evaluator.deliver()``: send what the outbox has due.

Tests call the two steps directly with a ``ManualClock``; ``run()`` schedules them for real
(one worker thread, so the steps never overlap; coalesced, one instance at a time).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuwatt.alerts.clock import NS_PER_S, Clock
from gpuwatt.alerts.db import transaction
from gpuwatt.alerts.evaluate import Observation, evaluate_rule
from gpuwatt.alerts.notify.base import Channel, Notification
from gpuwatt.alerts.outbox import DeliveryReport, Outbox, RetryPolicy
from gpuwatt.alerts.policy import Policy, Route
from gpuwatt.alerts.rules import DeadmanQuery, Rule
from gpuwatt.alerts.silences import SilenceTable, silenced_by
from gpuwatt.alerts.state import FIRING, PENDING, RESOLVED, Alert, AlertTable, step_rule
from gpuwatt.store.base import Store

log = logging.getLogger("gpuwatt.alerts")

RESOLVED_KEEP_S = 7 * 86_400.0


@dataclass(slots=True)
class EvaluationReport:
    now_ns: int
    transitions: list[tuple[str, str, str]] = field(default_factory=list)  # (fp, from, to)
    notifications: list[Notification] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # rule -> why it was not evaluated


def _is_node_down_rule(rule: Rule) -> bool:
    return isinstance(rule.query, DeadmanQuery) and rule.query.scope == "host"


class Evaluator:
    def __init__(
        self,
        rules: Sequence[Rule],
        store: Store,
        con: sqlite3.Connection,
        *,
        channels: Mapping[str, Channel],
        routes: Sequence[Route],
        clock: Clock,
        cluster: str = "default",
        retry: RetryPolicy | None = None,
        external_url: str = "",
    ) -> None:
        self.rules = list(rules)
        self.store = store
        self.clock = clock
        self.cluster = cluster
        self.channels = dict(channels)
        self._con = con
        self.alerts = AlertTable(con)
        self.silences = SilenceTable(con)
        self.outbox = Outbox(con, retry)
        routes = list(routes) or ([Route(tuple(self.channels), {})] if self.channels else [])
        send_resolved = {n: c.send_resolved for n, c in self.channels.items()}
        self.policy = Policy(con, routes, send_resolved, self.outbox, external_url)
        self._node_down_rules = {r.name for r in self.rules if _is_node_down_rule(r)}
        self._lock = threading.Lock()

    def evaluate(self) -> EvaluationReport:
        with self._lock:
            now_ns = self.clock.now_ns()
            report = EvaluationReport(now_ns)
            observed: dict[str, list[Observation]] = {}
            for rule in self.rules:  # store reads happen outside the write transaction
                try:
                    observed[rule.name] = evaluate_rule(rule, self.store, now_ns)
                except Exception as exc:  # a failing rule must not stop the others
                    log.exception("rule %s could not be evaluated", rule.name)
                    report.errors[rule.name] = f"{type(exc).__name__}: {exc}"
            host_last = self._host_last_seen(report)
            down = {
                o.target.get("host", "")
                for name in self._node_down_rules
                for o in observed.get(name, [])
                if o.breach
            }
            with transaction(self._con):
                existing = self.alerts.all()
                for rule in self.rules:
                    if rule.name not in observed:
                        continue  # no data is not "resolved": leave its alerts as they are
                    window_ns = round(getattr(rule.query, "window_s", 60.0) * NS_PER_S)
                    stale = frozenset(h for h, t in host_last.items() if now_ns - t > window_ns)
                    for before, after in step_rule(
                        self.alerts, existing, rule, observed[rule.name], now_ns, self.cluster,
                        stale_hosts=stale,
                    ):  # fmt: skip
                        if before is None or before.state != after.state:
                            old = before.state if before else "inactive"
                            report.transitions.append((after.fingerprint, old, after.state))
                current = self._mark_suppressed(self.alerts.all(), now_ns, down)
                report.notifications = self.policy.plan(current, now_ns)
                self.alerts.prune_resolved(now_ns - round(RESOLVED_KEEP_S * NS_PER_S))
            return report

    def _host_last_seen(self, report: EvaluationReport) -> dict[str, int]:
        try:
            samples = self.store.latest()
        except Exception as exc:
            report.errors["<latest>"] = f"{type(exc).__name__}: {exc}"
            return {}
        last: dict[str, int] = {}
        for s in samples:
            last[s.host] = max(last.get(s.host, s.time_ns), s.time_ns)
        return last

    def _mark_suppressed(
        self, alerts: dict[str, Alert], now_ns: int, down_now: set[str]
    ) -> dict[str, Alert]:
        """Silenced alerts, and GPU alerts of a node whose collector is silent, send nothing."""
        silences = self.silences.current_and_future(now_ns)
        down = set(down_now) | {
            a.labels.get("host", "")
            for a in alerts.values()
            if a.rule in self._node_down_rules and a.state in (PENDING, FIRING)
        }
        out = {}
        for fp, a in alerts.items():
            just_resolved = a.state == RESOLVED and a.resolved_ns == now_ns
            if a.state not in (PENDING, FIRING) and not just_resolved:
                out[fp] = a
                continue
            why = ""
            if (sid := silenced_by(silences, a.labels, now_ns)) is not None:
                why = f"silence:{sid}"
            elif a.rule not in self._node_down_rules and a.labels.get("host") in down:
                why = f"node_down:{a.labels['host']}"
            if why != a.suppressed:
                a = replace(a, suppressed=why)
                self.alerts.save(a, a, now_ns)
            out[fp] = a
        return out

    @property
    def lock(self) -> threading.Lock:
        """Guards this evaluator's database connection (evaluation and delivery records)."""
        return self._lock

    def deliver(self) -> DeliveryReport:
        """Send every due message now, one after another (tests; the running evaluator sends
        from one thread per channel, see ``run``)."""
        with self._lock:
            return self.outbox.deliver_due(self.channels, self.clock.now_ns())

    def send_test(self, channel: str) -> str:
        """Send a test notification now, bypassing rules and outbox; returns the result."""
        from gpuwatt.alerts.notify.base import test_notification

        if channel not in self.channels:
            raise KeyError(channel)
        return repr(self.channels[channel].send(test_notification(channel, self.clock.now_ns())))


def run(
    evaluator: Evaluator,
    *,
    evaluation_interval_s: float,
    stop: threading.Event,
    deliver_interval_s: float = 1.0,
    shutdown_wait_s: float = 10.0,
) -> None:
    """Run until ``stop`` is set (SIGTERM/SIGINT in the CLI).

    Evaluation and delivery run on separate scheduler executors, and every channel sends from its
    own thread (``ChannelWorkers``): a channel that hangs or fails delays only its own messages.
    """
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    from gpuwatt.alerts.dispatch import ChannelWorkers

    workers = ChannelWorkers(
        evaluator.outbox, evaluator.channels, evaluator.lock, evaluator.clock.now_ns
    )
    scheduler = BackgroundScheduler(
        executors={"default": ThreadPoolExecutor(1), "delivery": ThreadPoolExecutor(1)},
        job_defaults={"coalesce": True, "max_instances": 1},
        timezone="UTC",
    )
    scheduler.add_job(
        evaluator.evaluate, "interval", seconds=evaluation_interval_s, id="evaluate",
        misfire_grace_time=max(1, int(evaluation_interval_s)),
    )  # fmt: skip
    scheduler.add_job(
        workers.dispatch, "interval", seconds=deliver_interval_s, id="deliver",
        executor="delivery", misfire_grace_time=max(1, int(deliver_interval_s)),
    )  # fmt: skip
    scheduler.start()
    try:
        stop.wait()
    finally:
        scheduler.shutdown(wait=True)
        workers.join(shutdown_wait_s)
