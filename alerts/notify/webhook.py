"""A generic webhook in Alertmanager's JSON format (version 4), so existing receivers work."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwatt.alerts.notify.base import DeliveryResult, Notification, rfc3339
from gpuwatt.alerts.notify.http import post_json

MAX_ALERTS = 500


def render(n: Notification, receiver: str, max_alerts: int = MAX_ALERTS) -> dict[str, Any]:
    """The exact body Alertmanager would POST (``max_alerts`` 0 = all; the rest are counted)."""
    alerts = list(n.alerts)
    kept = alerts[:max_alerts] if max_alerts else alerts
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": len(alerts) - len(kept),
        "status": n.status,
        "receiver": receiver,
        "groupLabels": dict(n.group_labels),
        "commonLabels": n.common_labels(),
        "commonAnnotations": n.common_annotations(),
        "externalURL": n.external_url,
        "alerts": [
            {
                "status": a.status,
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": rfc3339(a.starts_ns),
                "endsAt": rfc3339(a.ends_ns),
                "generatorURL": n.external_url,
                "fingerprint": a.fingerprint,
            }
            for a in kept
        ],
    }


@dataclass
class WebhookChannel:
    name: str
    url: str = field(repr=False)
    send_resolved: bool = True
    timeout_s: float = 10.0
    max_alerts: int = MAX_ALERTS
    bearer_token: str | None = field(default=None, repr=False)

    def send(self, notification: Notification) -> DeliveryResult:
        headers = {"Authorization": f"Bearer {self.bearer_token}"} if self.bearer_token else None
        body = render(notification, self.name, self.max_alerts)
        return post_json(self.url, body, timeout_s=self.timeout_s, headers=headers)
