"""POST JSON and classify the answer: delivered, retry later (429 / 5xx / network), or rejected.

The URL may carry a secret (a Slack webhook URL is one), so it never appears in a result or a log:
only its scheme and host do.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message
from typing import Any
from urllib.parse import urlsplit

from gpuwatt.alerts.notify.base import (
    Delivered,
    DeliveryResult,
    Rejected,
    RetryLater,
    checked_timeout_s,
)

MAX_BODY_SHOWN = 200
RETRY_AFTER_MAX_S = 3600.0


def safe_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "") + "/…"


def retry_after_s(headers: Message | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds form), capped; None when absent/bad."""
    if headers is None:
        return None
    raw = headers.get("Retry-After")
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return min(max(value, 0.0), RETRY_AFTER_MAX_S)


def post_json(
    url: str,
    body: Any,
    *,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    ok_body: str | None = None,
) -> DeliveryResult:
    timeout_s = checked_timeout_s(timeout_s)
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json; charset=utf-8")
    req.add_header("User-Agent", "gpuwatt-alerts")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    where = safe_url(url)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            text = resp.read(4096).decode("utf-8", "replace")
            if ok_body is not None and text.strip() != ok_body:
                return Rejected(f"{where} answered {resp.status} {text[:MAX_BODY_SHOWN]!r}")
            return Delivered(f"{resp.status}")
    except urllib.error.HTTPError as exc:
        with exc:
            text = exc.read(4096).decode("utf-8", "replace")[:MAX_BODY_SHOWN]
        reason = f"{where} answered HTTP {exc.code}: {text}".rstrip(": ")
        if exc.code == 429:
            return RetryLater(reason, retry_after_s(exc.headers))
        if exc.code >= 500 or exc.code == 408:
            return RetryLater(reason, retry_after_s(exc.headers))
        return Rejected(reason)
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        return RetryLater(f"{where} unreachable: {why}")
