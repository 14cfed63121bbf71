"""Slack incoming webhook: Block Kit with a plain-text fallback, within Slack's limits.

Limits respected (Slack's documented maxima): a header block's text 150 characters, a section's
text 3,000, at most 50 blocks, and the top-level ``text`` (the notification/fallback) kept under
3,000 although Slack accepts 40,000. A group of hundreds of GPUs lists the first ``max_listed``
and summarises the rest; text is cut at a word boundary, never mid-word.
The webhook URL is a secret: it comes from an environment variable or a file, never a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwatt.alerts.notify.base import (
    FIRING,
    DeliveryResult,
    Notification,
    body_lines,
    fmt_time,
    shorten,
    title,
)
from gpuwatt.alerts.notify.http import post_json

HEADER_MAX = 150
SECTION_MAX = 3000
FALLBACK_MAX = 3000
BLOCKS_MAX = 50


def escape_mrkdwn(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(n: Notification, max_listed: int = 10) -> dict[str, Any]:
    """The exact JSON body posted to the webhook (pure)."""
    head = title(n)
    icon = ":red_circle:" if n.status == FIRING else ":large_green_circle:"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": shorten(head, HEADER_MAX)}}
    ]
    # The fallback ``text`` is parsed for mentions and links as mrkdwn is: a host or job named
    # ``<!channel>`` would ping everyone unless escaped here too.
    fallback = [escape_mrkdwn(head)]
    for heading, lines in body_lines(n, max_listed):
        text = f"*{heading}*\n" + "\n".join(f"• {escape_mrkdwn(line)}" for line in lines)
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": shorten(text, SECTION_MAX)}}
        )
        fallback.append(escape_mrkdwn(f"{heading}: " + "; ".join(lines)))
    context = [f"{icon} {n.status}", f"sent {fmt_time(n.created_ns)}"]
    runbooks = sorted(
        {a.annotations["runbook_url"] for a in n.alerts if a.annotations.get("runbook_url")}
    )
    context += [f"<{escape_mrkdwn(u)}|runbook>" for u in runbooks[:3]]
    blocks.append(
        {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]}
    )
    return {"text": shorten("\n".join(fallback), FALLBACK_MAX), "blocks": blocks[:BLOCKS_MAX]}


@dataclass
class SlackChannel:
    name: str
    webhook_url: str = field(repr=False)
    send_resolved: bool = True
    timeout_s: float = 10.0
    max_listed: int = 10

    def send(self, notification: Notification) -> DeliveryResult:
        body = render(notification, self.max_listed)
        return post_json(self.webhook_url, body, timeout_s=self.timeout_s, ok_body="ok")
