"""What every notifier shares: the notification model, delivery results, text helpers.

A ``Notification`` is channel-neutral and JSON-serialisable: the policy writes it to the outbox,
and the channel renders it at delivery time (so the exact payload is a pure function of it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Protocol

FIRING = "firing"
RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class AlertItem:
    fingerprint: str
    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_ns: int
    ends_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Notification:
    channel: str
    group_key: str
    group_labels: dict[str, str]
    status: str  # firing while any alert in it fires, else resolved
    alerts: tuple[AlertItem, ...]
    created_ns: int
    seq: int = 0
    test: bool = False
    external_url: str = ""

    @property
    def firing(self) -> list[AlertItem]:
        return [a for a in self.alerts if a.status == FIRING]

    @property
    def resolved(self) -> list[AlertItem]:
        return [a for a in self.alerts if a.status == RESOLVED]

    def common_labels(self) -> dict[str, str]:
        return _common([a.labels for a in self.alerts])

    def common_annotations(self) -> dict[str, str]:
        return _common([a.annotations for a in self.alerts])

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Notification:
        d = json.loads(text)
        d["alerts"] = tuple(AlertItem(**a) for a in d["alerts"])
        return cls(**d)


def _common(dicts: Sequence[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


@dataclass(frozen=True, slots=True)
class Delivered:
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RetryLater:
    reason: str
    after_s: float | None = None  # the receiver said when (HTTP Retry-After); None: back off


@dataclass(frozen=True, slots=True)
class Rejected:
    """Permanent: retrying the same message cannot succeed (bad webhook, unknown channel)."""

    reason: str


DeliveryResult = Delivered | RetryLater | Rejected


class Channel(Protocol):
    name: str
    send_resolved: bool

    def send(self, notification: Notification) -> DeliveryResult: ...


@dataclass(frozen=True, slots=True)
class ChannelOptions:
    name: str
    send_resolved: bool = True
    max_listed: int = 10  # alerts listed one by one; the rest are summarised
    extra: dict[str, str] = field(default_factory=dict)


# --- text -----------------------------------------------------------------------------------------


def checked_timeout_s(timeout_s: float) -> float:
    """``timeout_s`` if it is a usable network timeout; else ValueError naming it. Checked before
    any socket exists (smtplib leaks the socket it made when ``settimeout`` then refuses)."""
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s!r} is not a positive number of seconds")
    return float(timeout_s)


def shorten(text: str, limit: int, ellipsis: str = "…") -> str:
    """``text`` within ``limit`` characters, cut at a word boundary, never mid-word."""
    if len(text) <= limit:
        return text
    room = limit - len(ellipsis)
    cut = text[: room + 1]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    head = cut[:space] if space > 0 else cut[:room]
    return head.rstrip() + ellipsis


def fmt_time(t_ns: int) -> str:
    return datetime.fromtimestamp(t_ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def rfc3339(t_ns: int | None) -> str:
    if t_ns is None:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(t_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def title(n: Notification) -> str:
    """``[FIRING:3] GpuTemperatureHigh`` (Alertmanager's convention), plus common context."""
    if n.test:
        return "[TEST] gpuwatt test notification"
    name = n.group_labels.get("alertname") or n.common_labels().get("alertname", "alerts")
    count = len(n.firing) if n.status == FIRING else len(n.resolved)
    head = f"[{n.status.upper()}:{count}] {name}"
    ctx = [f"{k}={v}" for k, v in sorted(n.group_labels.items()) if k != "alertname"]
    return printable(head + (f" ({', '.join(ctx)})" if ctx else ""))


def alert_line(a: AlertItem) -> str:
    where = describe_target(a.labels)
    summary = a.annotations.get("summary", a.labels.get("alertname", ""))
    return f"{where}: {summary}" if where and where not in summary else summary


def describe_target(labels: dict[str, str]) -> str:
    host, gpu = labels.get("host"), labels.get("gpu")
    if host and gpu is not None:
        return f"{host} GPU {gpu}"
    return host or ""


def summarise_rest(items: Sequence[AlertItem]) -> str:
    """One line standing for many alerts: how many, on how many nodes, which nodes first."""
    hosts = sorted({a.labels.get("host", "") for a in items} - {""})
    gpus = sum(1 for a in items if "gpu" in a.labels)
    parts = [f"{len(items)} more"]
    if gpus:
        parts.append(f"{gpus} GPUs")
    if hosts:
        shown = ", ".join(hosts[:5]) + (
            f" and {len(hosts) - 5} more nodes" if len(hosts) > 5 else ""
        )
        parts.append(f"on {len(hosts)} node{'s' if len(hosts) != 1 else ''}: {shown}")
    return "… and " + ", ".join(parts)


def printable(text: str) -> str:
    """``text`` with its control characters shown as escapes (``\\n``, ``\\r``, ``\\x07``).

    Names come from hosts, schedulers and users: one holding a newline or a carriage return must
    neither break a notification's lines nor end up as a bare CR in an email. Every other
    character, any script or emoji, is kept as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def body_lines(n: Notification, max_listed: int) -> list[tuple[str, list[str]]]:
    """Sections (heading, lines) of a notification: firing first, then resolved; each line one
    line (``printable``)."""
    sections = []
    for heading, items in (("Firing", n.firing), ("Resolved", n.resolved)):
        if not items:
            continue
        lines = [printable(alert_line(a)) for a in items[:max_listed]]
        if len(items) > max_listed:
            lines.append(printable(summarise_rest(items[max_listed:])))
        sections.append((heading, lines))
    return sections


def test_notification(channel: str, now_ns: int) -> Notification:
    item = AlertItem(
        fingerprint="test",
        status=FIRING,
        labels={"alertname": "GpuwattTestNotification", "severity": "info"},
        annotations={"summary": "gpuwatt can reach this channel. No action needed."},
        starts_ns=now_ns,
    )
    return Notification(channel, "test", {}, FIRING, (item,), now_ns, test=True)
