"""Notification policy: routes by labels to channels, grouping, group interval, repeat interval,
resolved notices (on by default per channel).

Per (channel, group) the database remembers which alerts were announced as firing and when the
group was last notified. A group is notified when an alert joins it, when an announced alert
resolves (if the channel sends resolved notices), and every ``repeat_interval`` while it fires.
The timers live in the database, so a restart neither re-sends nor restarts them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwatt.alerts.clock import NS_PER_S
from gpuwatt.alerts.notify.base import FIRING, RESOLVED, AlertItem, Notification
from gpuwatt.alerts.outbox import Outbox
from gpuwatt.alerts.silences import Silence
from gpuwatt.alerts.state import FIRING as STATE_FIRING
from gpuwatt.alerts.state import RESOLVED as STATE_RESOLVED
from gpuwatt.alerts.state import Alert

DEFAULT_GROUP_BY: tuple[str, ...] = ("alertname", "cluster")


@dataclass(frozen=True, slots=True)
class Route:
    channels: tuple[str, ...]
    matchers: dict[str, str]  # same syntax as silences: exact, or ~regex
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    group_interval_s: float = 60.0
    repeat_interval_s: float = 4 * 3600.0
    continue_matching: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        probe = Silence(0, "", self.matchers, "", "", 0, 1)
        return probe.matches(labels)


@dataclass(frozen=True, slots=True)
class GroupState:
    notified: tuple[str, ...]
    last_sent_ns: int | None
    seq: int


def routes_for(labels: Mapping[str, str], routes: Sequence[Route]) -> list[tuple[int, Route]]:
    out = []
    for i, r in enumerate(routes):
        if r.matches(labels):
            out.append((i, r))
            if not r.continue_matching:
                break
    return out


def group_key(route_index: int, route: Route, labels: Mapping[str, str]) -> str:
    picked = {k: labels.get(k, "") for k in route.group_by}
    return f"{route_index}:" + json.dumps(picked, sort_keys=True, separators=(",", ":"))


class Policy:
    def __init__(
        self,
        con: sqlite3.Connection,
        routes: Sequence[Route],
        send_resolved: Mapping[str, bool],
        outbox: Outbox,
        external_url: str = "",
    ) -> None:
        self._con = con
        self.routes = list(routes)
        self.send_resolved = dict(send_resolved)
        self.outbox = outbox
        self.external_url = external_url

    def _groups(self) -> dict[tuple[str, str], GroupState]:
        rows = self._con.execute(
            "SELECT channel, group_key, notified, last_sent_ns, seq FROM groups"
        )
        return {(c, g): GroupState(tuple(json.loads(n)), t, s) for c, g, n, t, s in rows}

    def plan(self, alerts: Mapping[str, Alert], now_ns: int) -> list[Notification]:
        """Decide and enqueue notifications (in the caller's transaction); returns them."""
        active: dict[tuple[str, str], list[str]] = {}
        route_of: dict[tuple[str, str], Route] = {}
        group_labels: dict[tuple[str, str], dict[str, str]] = {}
        for fp, a in sorted(alerts.items(), key=lambda kv: (kv[1].firing_since_ns or 0, kv[0])):
            if a.state != STATE_FIRING or a.suppressed:
                continue
            for i, route in routes_for(a.labels, self.routes):
                key = group_key(i, route, a.labels)
                for ch in route.channels:
                    active.setdefault((ch, key), []).append(fp)
                    route_of[(ch, key)] = route
                    group_labels[(ch, key)] = {k: a.labels.get(k, "") for k in route.group_by}
        stored = self._groups()
        sent: list[Notification] = []
        for ck in sorted(set(active) | set(stored)):
            now_active = active.get(ck, [])
            state = stored.get(ck, GroupState((), None, 0))
            owner = route_of.get(ck) or self._route_by_key(ck[1])
            n = self._decide(ck, now_active, state, owner, alerts, group_labels.get(ck), now_ns)
            if n is not None:
                sent.append(n)
        return sent

    def _route_by_key(self, key: str) -> Route | None:
        index = int(key.split(":", 1)[0])
        return self.routes[index] if index < len(self.routes) else None

    def _decide(
        self,
        ck: tuple[str, str],
        now_active: list[str],
        state: GroupState,
        route: Route | None,
        alerts: Mapping[str, Alert],
        labels: dict[str, str] | None,
        now_ns: int,
    ) -> Notification | None:
        channel, key = ck
        new = [fp for fp in now_active if fp not in state.notified]
        # an announced alert that is only muted (silence, node down) stays announced: no second
        # firing notice when the mute ends; if it resolves while muted, it leaves quietly
        held = [fp for fp in state.notified if fp not in now_active and _muted(alerts.get(fp))]
        gone = [fp for fp in state.notified if fp not in now_active and fp not in held]
        resolved = [fp for fp in gone if _resolved(alerts.get(fp))]
        wants_resolved = self.send_resolved.get(channel, True)
        group_interval_ns = round((route.group_interval_s if route else 0) * NS_PER_S)
        repeat_ns = round((route.repeat_interval_s if route else 0) * NS_PER_S)
        since = None if state.last_sent_ns is None else now_ns - state.last_sent_ns
        changed = bool(new) or (bool(resolved) and wants_resolved)
        if changed and since is not None and since < group_interval_ns:
            return None  # batch changes: at most one message per group interval
        repeat = bool(now_active) and since is not None and repeat_ns > 0 and since >= repeat_ns
        if not changed and not repeat:
            if gone:  # left quietly (resolved while muted, or resolved without notices)
                self._save(ck, now_active + held, state.last_sent_ns, state.seq)
            return None
        seq = state.seq + 1
        items = [_item(alerts[fp], FIRING) for fp in now_active]
        if wants_resolved:
            items += [_item(alerts[fp], RESOLVED) for fp in resolved if fp in alerts]
        if labels is None:
            first = alerts.get(resolved[0]) if resolved else None
            labels = {k: first.labels.get(k, "") for k in route.group_by} if first and route else {}
        n = Notification(
            channel=channel,
            group_key=key,
            group_labels=labels,
            status=FIRING if now_active else RESOLVED,
            alerts=tuple(items),
            created_ns=now_ns,
            seq=seq,
            external_url=self.external_url,
        )
        self.outbox.enqueue(n, f"{channel}|{key}|{seq}", now_ns)
        self._save(ck, now_active + held, now_ns, seq)
        return n

    def _save(
        self, ck: tuple[str, str], notified: list[str], last_ns: int | None, seq: int
    ) -> None:
        if not notified and last_ns is None:
            self._con.execute("DELETE FROM groups WHERE channel = ? AND group_key = ?", ck)
            return
        self._con.execute(
            "INSERT OR REPLACE INTO groups (channel, group_key, notified, last_sent_ns, seq) "
            "VALUES (?, ?, ?, ?, ?)",
            (*ck, json.dumps(notified), last_ns, seq),
        )


def _muted(a: Alert | None) -> bool:
    return a is not None and a.state == STATE_FIRING and bool(a.suppressed)


def _resolved(a: Alert | None) -> bool:
    return a is not None and a.state == STATE_RESOLVED and not a.suppressed


def _item(a: Alert, status: str) -> AlertItem:
    return AlertItem(
        fingerprint=a.fingerprint,
        status=status,
        labels=dict(a.labels),
        annotations=dict(a.annotations),
        starts_ns=a.firing_since_ns or a.pending_since_ns or a.updated_ns,
        ends_ns=a.resolved_ns if status == RESOLVED else None,
    )
