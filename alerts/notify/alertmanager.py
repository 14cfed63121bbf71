"""Push alerts to an existing Prometheus Alertmanager through its API (``POST /api/v2/alerts``).

Alertmanager then groups, silences, inhibits and routes them with the rest of the site's alerts.
Each alert of a notification becomes one of Alertmanager's postable alerts: ``labels`` (the
alert's identity there: ``alertname``, ``severity``, ``host``, ``gpu`` ...), ``annotations``
(summary, runbook_url ...), ``startsAt``, ``endsAt`` and ``generatorURL``.

``endsAt``: a resolved alert carries the time it resolved (a test notification resolves itself
after five minutes). A firing one carries the send time plus
``resolve_timeout``: Alertmanager holds it firing until then, and gpuwatt sends it again before
(the route's ``repeat_interval`` must be shorter, which the settings check), so an alert stays
firing while gpuwatt says so and resolves by itself if gpuwatt stops saying anything. This is how
Prometheus itself pushes (its ``endsAt`` is a few evaluation intervals ahead).

Label and annotation names outside Alertmanager's ``[a-zA-Z_][a-zA-Z0-9_]*`` are rewritten with
``_``; an empty label is dropped (Prometheus treats it as absent). With several URLs (an
Alertmanager cluster) every instance gets every alert, as Prometheus does; Alertmanager merges
repeats of an alert, so a retry after a partial failure re-sends to all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuwatt.alerts.notify.base import (
    RESOLVED,
    Delivered,
    DeliveryResult,
    Notification,
    Rejected,
    RetryLater,
    rfc3339,
)
from gpuwatt.alerts.notify.http import post_json

API_PATH = "/api/v2/alerts"
DEFAULT_RESOLVE_TIMEOUT_S = 5 * 3600.0  # the default route repeats every 4 h
TEST_ALERT_TTL_S = 300.0  # `gpuwatt alerts test`: shown for 5 minutes, then resolved
_NS_PER_S = 1_000_000_000
_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def label_name(name: str) -> str:
    """``name`` as a valid Prometheus/Alertmanager label name."""
    cleaned = _INVALID_NAME_CHARS.sub("_", name)
    return f"_{cleaned}" if not cleaned or cleaned[0].isdigit() else cleaned


def _label_set(values: dict[str, str]) -> dict[str, str]:
    return {label_name(k): str(v) for k, v in sorted(values.items()) if str(v) != ""}


def alerts_url(base_url: str) -> str:
    """The API endpoint of an Alertmanager given by its base URL (``http://am:9093``)."""
    url = base_url.rstrip("/")
    return url if url.endswith(API_PATH) else url + API_PATH


def render(n: Notification, resolve_timeout_s: float) -> list[dict[str, Any]]:
    """The exact body posted: a list of Alertmanager v2 postable alerts (pure)."""
    ttl_s = min(resolve_timeout_s, TEST_ALERT_TTL_S) if n.test else resolve_timeout_s
    firing_ends_ns = n.created_ns + round(ttl_s * _NS_PER_S)
    body = []
    for a in n.alerts:
        labels = _label_set(a.labels)
        labels.setdefault("alertname", "GpuwattAlert")
        ends_ns = (a.ends_ns or n.created_ns) if a.status == RESOLVED else firing_ends_ns
        alert: dict[str, Any] = {
            "labels": labels,
            "annotations": _label_set(a.annotations),
            "startsAt": rfc3339(a.starts_ns),
            "endsAt": rfc3339(max(ends_ns, a.starts_ns)),
        }
        if n.external_url:
            alert["generatorURL"] = n.external_url
        body.append(alert)
    return body


@dataclass
class AlertmanagerChannel:
    name: str
    urls: list[str] = field(repr=False)  # may hold credentials: never logged (safe_url)
    send_resolved: bool = True
    timeout_s: float = 10.0
    resolve_timeout_s: float = DEFAULT_RESOLVE_TIMEOUT_S
    bearer_token: str | None = field(default=None, repr=False)

    def send(self, notification: Notification) -> DeliveryResult:
        body = render(notification, self.resolve_timeout_s)
        headers = {"Authorization": f"Bearer {self.bearer_token}"} if self.bearer_token else None
        results = [
            post_json(alerts_url(u), body, timeout_s=self.timeout_s, headers=headers)
            for u in self.urls
        ]
        retry = [r for r in results if isinstance(r, RetryLater)]
        if retry:  # Alertmanager merges repeats: sending again to every instance is harmless
            waits = [r.after_s for r in retry if r.after_s is not None]
            return RetryLater("; ".join(r.reason for r in retry), max(waits) if waits else None)
        rejected = [r for r in results if isinstance(r, Rejected)]
        if rejected:
            return Rejected("; ".join(r.reason for r in rejected))
        return Delivered(f"{len(body)} alerts to {len(self.urls)} Alertmanager(s)")
