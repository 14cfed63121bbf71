"""Email over SMTP: STARTTLS (587), implicit TLS (465) or plain (a local relay), with auth.

A timeout is always set. Each message has a plain-text and an HTML part; every value in the HTML
is escaped. The password comes from an environment variable or a file and is never logged.
"""

from __future__ import annotations

import hashlib
import html
import smtplib
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime

from gpuwatt.alerts.notify.base import (
    Delivered,
    DeliveryResult,
    Notification,
    Rejected,
    RetryLater,
    body_lines,
    checked_timeout_s,
    fmt_time,
    shorten,
    title,
)

STARTTLS = "starttls"
TLS = "tls"
PLAIN = "none"
SECURITY = (STARTTLS, TLS, PLAIN)
SUBJECT_MAX = 200


def message_id(n: Notification, domain: str) -> str:
    digest = hashlib.sha256(
        f"{n.channel}|{n.group_key}|{n.seq}|{n.created_ns}".encode()
    ).hexdigest()
    return f"<gpuwatt.{digest[:24]}@{domain}>"


def runbook_urls(n: Notification) -> list[str]:
    """The distinct runbook links of the notification's alerts."""
    return sorted(
        {a.annotations["runbook_url"] for a in n.alerts if a.annotations.get("runbook_url")}
    )


def render_text(n: Notification, max_listed: int) -> str:
    lines = [title(n), ""]
    for heading, items in body_lines(n, max_listed):
        lines.append(f"{heading}:")
        lines += [f"  - {item}" for item in items]
        lines.append("")
    runbooks = runbook_urls(n)
    lines += [f"Runbook: {u}" for u in runbooks]
    lines.append(f"Sent by gpuwatt at {fmt_time(n.created_ns)}")
    return "\n".join(lines) + "\n"


def render_html(n: Notification, max_listed: int) -> str:
    e = html.escape
    color = "#c0392b" if n.status == "firing" else "#27ae60"
    parts = [
        '<!DOCTYPE html><html><body style="font-family:sans-serif">',
        f'<h2 style="color:{color}">{e(title(n))}</h2>',
    ]
    for heading, items in body_lines(n, max_listed):
        parts.append(f"<h3>{e(heading)}</h3><ul>")
        parts += [f"<li>{e(item)}</li>" for item in items]
        parts.append("</ul>")
    runbooks = runbook_urls(n)
    parts += [f'<p><a href="{e(u, quote=True)}">Runbook: {e(u)}</a></p>' for u in runbooks]
    parts.append(f'<p style="color:#888">Sent by gpuwatt at {e(fmt_time(n.created_ns))}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render(
    n: Notification, sender: str, recipients: list[str], max_listed: int = 10
) -> EmailMessage:
    """The exact message sent (pure)."""
    msg = EmailMessage()
    msg["Subject"] = shorten(title(n), SUBJECT_MAX)
    msg["From"] = sender
    msg["To"] = ", ".join(recipients)
    msg["Date"] = format_datetime(datetime.fromtimestamp(n.created_ns / 1e9, UTC))
    msg["Message-ID"] = message_id(n, sender.rpartition("@")[2] or "gpuwatt")
    msg["X-Gpuwatt-Status"] = n.status
    msg.set_content(render_text(n, max_listed))
    msg.add_alternative(render_html(n, max_listed), subtype="html")
    return msg


@dataclass
class EmailChannel:
    name: str
    host: str
    port: int
    sender: str
    recipients: list[str]
    security: str = STARTTLS
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    ca_file: str | None = None  # trust this CA too (a site's own CA, a test's self-signed cert)
    send_resolved: bool = True
    max_listed: int = 10

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    def send(self, notification: Notification) -> DeliveryResult:
        timeout_s = checked_timeout_s(self.timeout_s)
        msg = render(notification, self.sender, self.recipients, self.max_listed)
        where = f"smtp {self.host}:{self.port}"
        try:
            if self.security == TLS:
                client: smtplib.SMTP = smtplib.SMTP_SSL(
                    self.host, self.port, timeout=timeout_s, context=self._context()
                )
            else:
                client = smtplib.SMTP(self.host, self.port, timeout=timeout_s)
            with client:
                if self.security == STARTTLS:
                    client.starttls(context=self._context())
                if self.username:
                    client.login(self.username, self.password or "")
                client.send_message(msg)
            return Delivered(where)
        except smtplib.SMTPAuthenticationError as exc:
            return Rejected(f"{where}: authentication failed ({exc.smtp_code})")
        except smtplib.SMTPNotSupportedError as exc:
            return Rejected(f"{where}: {exc}")
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            reason = f"{where}: recipients refused {sorted(exc.recipients)}"
            return RetryLater(reason) if all(400 <= c < 500 for c in codes) else Rejected(reason)
        except smtplib.SMTPResponseException as exc:
            reason = f"{where}: {exc.smtp_code} {exc.smtp_error!r}"
            return RetryLater(reason) if 400 <= exc.smtp_code < 500 else Rejected(reason)
        except ssl.SSLCertVerificationError as exc:
            return Rejected(f"{where}: TLS certificate not trusted: {exc.verify_message}")
        except (smtplib.SMTPException, OSError) as exc:
            return RetryLater(f"{where}: {type(exc).__name__}: {exc}")
