"""Alert state: pending -> firing -> resolved, persisted by fingerprint, with history.

Semantics follow Prometheus: a condition must hold for ``for`` before the alert fires; a firing
alert keeps firing while the condition holds against the recovery threshold, and for
``keep_firing_for`` after it last held (so a flapping signal is one episode, not many). A pending
alert whose condition lapses goes back to nothing (recorded in the history, never notified).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatt.alerts.clock import NS_PER_S
from gpuwatt.alerts.evaluate import Observation
from gpuwatt.alerts.rules import IncreaseQuery, Rule, ThresholdQuery, render_template
from gpuwatt.precision import settled

PENDING = "pending"
FIRING = "firing"
RESOLVED = "resolved"
INACTIVE = "inactive"

_COLUMNS = (
    "fingerprint, rule, labels, annotations, state, value, pending_since_ns, firing_since_ns, "
    "last_holding_ns, resolved_ns, updated_ns, suppressed"
)


@dataclass(frozen=True, slots=True)
class Alert:
    fingerprint: str
    rule: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    value: float | None
    pending_since_ns: int | None = None
    firing_since_ns: int | None = None
    last_holding_ns: int | None = None
    resolved_ns: int | None = None
    updated_ns: int = 0
    suppressed: str = ""  # why no notification goes out: silence:<id>, node_down:<host>
    extra: dict[str, str] = field(default_factory=dict, compare=False)


def fingerprint(labels: Mapping[str, str]) -> str:
    text = json.dumps(dict(sorted(labels.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def alert_labels(rule: Rule, target: Mapping[str, str], cluster: str) -> dict[str, str]:
    return {
        "alertname": rule.name,
        "severity": rule.severity,
        "cluster": cluster,
        **rule.labels,
        **target,
    }


def rule_annotations(rule: Rule, labels: Mapping[str, str], obs: Observation) -> dict[str, str]:
    q = rule.query
    values: dict[str, object] = {
        **labels,
        "value": obs.value if obs.value is not None else "",
        "threshold": getattr(q, "threshold", "")
        if getattr(q, "threshold", None) is not None
        else "",
        "window": _fmt_window(getattr(q, "window_s", None)),
        "detail": obs.detail,
    }
    out = {"summary": render_template(rule.summary, values)}
    if rule.description:
        out["description"] = render_template(rule.description, values)
    if rule.runbook_url:
        out["runbook_url"] = render_template(rule.runbook_url, values)
    if isinstance(q, ThresholdQuery) or obs.value is not None:
        out["value"] = "" if obs.value is None else f"{settled(obs.value):.6g}"
    return out


def _fmt_window(window_s: float | None) -> str:
    if window_s is None:
        return ""
    if window_s % 3600 == 0:
        return f"{window_s / 3600:g}h"
    if window_s % 60 == 0:
        return f"{window_s / 60:g}m"
    return f"{window_s:g}s"


def next_state(
    current: Alert | None, rule: Rule, obs: Observation | None, now_ns: int, labels: dict[str, str]
) -> Alert | None:
    """The alert after one evaluation (pure). None: there is (still) nothing to track."""
    breach = obs is not None and obs.breach
    holding = obs is not None and obs.holding
    value = obs.value if obs is not None else None
    # a measured value is worth showing even once the condition lapses ("resolved at 74 °C");
    # a deadman's or an event's text describes the fault, so it keeps its last firing wording
    refresh = obs is not None and (
        obs.holding or isinstance(rule.query, ThresholdQuery | IncreaseQuery)
    )
    notes = rule_annotations(rule, labels, obs) if obs is not None and refresh else None
    active = current is not None and current.state in (PENDING, FIRING)
    if not active:
        if not breach:
            return current
        fp = fingerprint(labels)
        alert = Alert(fp, rule.name, labels, notes or {}, PENDING, value, pending_since_ns=now_ns,
                      last_holding_ns=now_ns, updated_ns=now_ns)  # fmt: skip
        return _maybe_fire(alert, rule, now_ns)
    assert current is not None
    kept = replace(current, annotations=notes or current.annotations, updated_ns=now_ns)
    if obs is not None:
        kept = replace(kept, value=value)
    if current.state == PENDING:
        if not breach:
            return replace(kept, state=INACTIVE)
        return _maybe_fire(replace(kept, last_holding_ns=now_ns), rule, now_ns)
    if holding:
        return replace(kept, last_holding_ns=now_ns)
    last = current.last_holding_ns or now_ns
    if now_ns - last < round(rule.keep_firing_for_s * NS_PER_S):
        return kept
    return replace(kept, state=RESOLVED, resolved_ns=now_ns)


def _maybe_fire(alert: Alert, rule: Rule, now_ns: int) -> Alert:
    assert alert.pending_since_ns is not None
    if now_ns - alert.pending_since_ns >= round(rule.for_s * NS_PER_S):
        return replace(alert, state=FIRING, firing_since_ns=now_ns, resolved_ns=None)
    return alert


# --- persistence ---------------------------------------------------------------------------------


class AlertTable:
    """Alerts by fingerprint and their history, in the evaluator's database."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con

    def all(self) -> dict[str, Alert]:
        rows = self._con.execute(f"SELECT {_COLUMNS} FROM alerts").fetchall()
        return {r[0]: _alert(r) for r in rows}

    def active(self) -> list[Alert]:
        rows = self._con.execute(
            f"SELECT {_COLUMNS} FROM alerts WHERE state IN ('pending', 'firing') "
            "ORDER BY firing_since_ns, fingerprint"
        ).fetchall()
        return [_alert(r) for r in rows]

    def save(self, before: Alert | None, after: Alert, now_ns: int) -> None:
        """Write ``after`` (in the caller's transaction) and its transition to the history."""
        from_state = before.state if before is not None else INACTIVE
        if from_state != after.state:
            self._con.execute(
                "INSERT INTO history (fingerprint, rule, labels, from_state, to_state, at_ns, "
                "value) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (after.fingerprint, after.rule, json.dumps(after.labels, sort_keys=True),
                 from_state, after.state, now_ns, after.value),
            )  # fmt: skip
        if after.state == INACTIVE:
            self._con.execute("DELETE FROM alerts WHERE fingerprint = ?", (after.fingerprint,))
            return
        self._con.execute(
            f"INSERT OR REPLACE INTO alerts ({_COLUMNS}) VALUES ({', '.join('?' * 12)})",
            (after.fingerprint, after.rule, json.dumps(after.labels, sort_keys=True),
             json.dumps(after.annotations, sort_keys=True), after.state, after.value,
             after.pending_since_ns, after.firing_since_ns, after.last_holding_ns,
             after.resolved_ns, after.updated_ns, after.suppressed),
        )  # fmt: skip

    def history(self, *, limit: int = 1000) -> list[dict[str, object]]:
        rows = self._con.execute(
            "SELECT fingerprint, rule, labels, from_state, to_state, at_ns, value FROM history "
            "ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        keys = ("fingerprint", "rule", "labels", "from_state", "to_state", "at_ns", "value")
        return [{**dict(zip(keys, r, strict=True)), "labels": json.loads(r[2])} for r in rows]

    def prune_resolved(self, before_ns: int) -> None:
        self._con.execute(
            "DELETE FROM alerts WHERE state = 'resolved' AND resolved_ns < ?", (before_ns,)
        )


def _alert(r: tuple[Any, ...]) -> Alert:
    return Alert(r[0], r[1], json.loads(r[2]), json.loads(r[3]), r[4], r[5], r[6], r[7], r[8],
                 r[9], r[10], r[11])  # fmt: skip


def step_rule(
    table: AlertTable,
    existing: Mapping[str, Alert],
    rule: Rule,
    observations: Iterable[Observation],
    now_ns: int,
    cluster: str,
    stale_hosts: frozenset[str] = frozenset(),
) -> list[tuple[Alert | None, Alert]]:
    """Apply one rule's observations to its alerts; returns the (before, after) of each change.

    An alert with no observation has no data. No data is not "resolved" when the alert's whole
    node sent nothing in the rule's window (``stale_hosts``): the alert keeps its state, and the
    node-down alert speaks for it. Otherwise (the node reports, this target does not) the
    condition counts as not holding.
    """
    seen: set[str] = set()
    changes: list[tuple[Alert | None, Alert]] = []
    for obs in observations:
        labels = alert_labels(rule, obs.target, cluster)
        fp = fingerprint(labels)
        seen.add(fp)
        before = existing.get(fp)
        after = next_state(before, rule, obs, now_ns, labels)
        if after is not None and after != before:
            table.save(before, after, now_ns)
            changes.append((before, after))
    for fp, before in existing.items():
        if before.rule != rule.name or fp in seen or before.state not in (PENDING, FIRING):
            continue
        if before.labels.get("host") in stale_hosts:
            continue
        after = next_state(before, rule, None, now_ns, before.labels)  # no data: not holding
        if after is not None and after != before:
            table.save(before, after, now_ns)
            changes.append((before, after))
    return changes
