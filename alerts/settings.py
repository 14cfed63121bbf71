"""The ``alerts:`` section of the gpuwatt config file: channels, routes, retries, where state lives.

Secrets (a Slack webhook URL, an SMTP password, a webhook bearer token) are read from an
environment variable (``*_env``) or a file (``*_file``, e.g. a Docker secret), never from the
config file itself or the command line, and never logged. Example::

    alerts:
      cluster: prod-a
      evaluation_interval: 15s
      state_db: /var/lib/gpuwatt/alerts.db
      channels:
        slack-ops: {type: slack, webhook_url_file: /run/secrets/slack_webhook}
        oncall-mail:
          type: email
          host: smtp.example.org
          port: 587
          security: starttls        # starttls (587) | tls (465) | none (local relay)
          username: gpuwatt
          password_file: /run/secrets/smtp_password
          from: gpuwatt@example.org
          to: [oncall@example.org]
        am: {type: webhook, url: "http://receiver:9095/hook"}
        alertmanager: {type: alertmanager, url: "http://alertmanager:9093", resolve_timeout: 20m}
      routes:
        - match: {severity: critical}
          channels: [slack-ops, oncall-mail]
          repeat_interval: 4h
        - channels: [slack-ops]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatt.alerts.notify.alertmanager import DEFAULT_RESOLVE_TIMEOUT_S, AlertmanagerChannel
from gpuwatt.alerts.notify.base import Channel
from gpuwatt.alerts.notify.email import PLAIN, SECURITY, STARTTLS, TLS, EmailChannel
from gpuwatt.alerts.notify.slack import SlackChannel
from gpuwatt.alerts.notify.webhook import WebhookChannel
from gpuwatt.alerts.outbox import RetryPolicy
from gpuwatt.alerts.policy import DEFAULT_GROUP_BY, Route
from gpuwatt.alerts.silences import check_matchers
from gpuwatt.yamlfile import Located, type_name

_TOP = {"cluster", "evaluation_interval", "state_db", "external_url", "channels", "routes", "retry"}
_COMMON = {"type", "send_resolved", "timeout", "max_listed"}
_TYPE_KEYS = {
    "slack": {"webhook_url_env", "webhook_url_file", "webhook_url"},
    "email": {
        "host", "port", "security", "username", "password_env", "password_file", "password",
        "from", "to", "ca_file",
    },
    "webhook": {"url", "url_env", "url_file", "bearer_token_env", "bearer_token_file",
                "max_alerts"},
    "alertmanager": {"url", "urls", "url_env", "url_file", "bearer_token_env",
                     "bearer_token_file", "resolve_timeout"},
}  # fmt: skip
_DEFAULT_PORT = {STARTTLS: 587, TLS: 465, PLAIN: 25}
_ROUTE = {"match", "channels", "group_by", "group_interval", "repeat_interval", "continue"}


@dataclass
class AlertSettings:
    cluster: str = "default"
    evaluation_interval_s: float = 15.0
    state_db: Path | None = None
    external_url: str = ""
    channels: dict[str, Channel] = field(default_factory=dict)
    routes: list[Route] = field(default_factory=list)
    retry: RetryPolicy = field(default_factory=RetryPolicy)


def parse_alert_settings(
    node: Located | None, environ: Mapping[str, str] = os.environ
) -> AlertSettings:
    if node is None:
        return AlertSettings()
    node.check_keys(_TOP)
    s = AlertSettings()
    if (v := node.get("cluster")) is not None:
        s.cluster = v.string()
    if (v := node.get("evaluation_interval")) is not None:
        s.evaluation_interval_s = v.duration_s(minimum=1.0)
    if (v := node.get("state_db")) is not None:
        s.state_db = v.writable_path("alert state database")
    if (v := node.get("external_url")) is not None:
        s.external_url = v.string()
    if (ch := node.get("channels")) is not None:
        for name, c in ch.mapping("a mapping of channel names to settings").items():
            s.channels[name] = parse_channel(name, c, environ)
    if (r := node.get("routes")) is not None:
        for rn in r.sequence("a list of routes"):
            s.routes.append(_route(rn, set(s.channels)))
    elif s.channels:
        s.routes.append(Route(tuple(s.channels), {}))
    _check_alertmanager_repeats(s, node.get("routes") or node)
    if (r := node.get("retry")) is not None:
        r.check_keys({"base_backoff", "max_backoff", "max_age"})
        d = RetryPolicy()
        s.retry = RetryPolicy(
            _dur(r, "base_backoff", d.base_backoff_s, 0.1),
            _dur(r, "max_backoff", d.max_backoff_s, 1.0),
            _dur(r, "max_age", d.max_age_s, 60.0),
        )
    return s


def parse_channel(name: str, node: Located, environ: Mapping[str, str]) -> Channel:
    node.mapping("a channel (a mapping with a type)")
    kind = _req(node, "type").choice(sorted(_TYPE_KEYS))
    node.check_keys(_COMMON | _TYPE_KEYS[kind], required={"type"})
    send_resolved = node.get("send_resolved").boolean() if node.get("send_resolved") else True  # type: ignore[union-attr]
    timeout_s = _dur(node, "timeout", 10.0, 0.1)
    max_listed = node.get("max_listed").integer(1, 50) if node.get("max_listed") else 10  # type: ignore[union-attr]
    if kind == "slack":
        url = _secret(node, "webhook_url", environ, required=True)
        assert url is not None
        return SlackChannel(name, url, send_resolved, timeout_s, max_listed)
    if kind == "webhook":
        url_node = node.get("url")
        url = (
            url_node.string()
            if url_node is not None
            else _secret(node, "url", environ, True, literal_ok=True)
        )
        assert url is not None
        max_alerts = node.get("max_alerts").integer(0) if node.get("max_alerts") else 500  # type: ignore[union-attr]
        token = _secret(node, "bearer_token", environ, required=False)
        return WebhookChannel(name, url, send_resolved, timeout_s, max_alerts, token)
    if kind == "alertmanager":
        return _alertmanager(name, node, environ, send_resolved, timeout_s)
    security = node.get("security").choice(SECURITY) if node.get("security") else STARTTLS  # type: ignore[union-attr]
    port = node.get("port").integer(1, 65535) if node.get("port") else _DEFAULT_PORT[security]  # type: ignore[union-attr]
    username = node.get("username").string() if node.get("username") else None  # type: ignore[union-attr]
    password = _secret(node, "password", environ, required=False)
    if username and password is None:
        raise node.error("username is set but no password_env or password_file")
    if password and security == PLAIN:
        raise node.error("refusing to send an SMTP password without TLS (security: none)")
    to = [t.string() for t in _req(node, "to").sequence("a list of addresses")]
    if not to:
        raise _req(node, "to").error("at least one recipient")
    ca = node.get("ca_file")
    return EmailChannel(
        name=name,
        host=_req(node, "host").string(),
        port=port,
        sender=_req(node, "from").string(),
        recipients=to,
        security=security,
        username=username,
        password=password,
        timeout_s=timeout_s,
        ca_file=ca.string() if ca is not None else None,
        send_resolved=send_resolved,
        max_listed=max_listed,
    )


def _alertmanager(
    name: str, node: Located, environ: Mapping[str, str], send_resolved: bool, timeout_s: float
) -> AlertmanagerChannel:
    if (many := node.get("urls")) is not None:
        urls = [u.string() for u in many.sequence("a list of Alertmanager URLs")]
        if not urls:
            raise many.error("at least one Alertmanager URL")
    elif (one := node.get("url")) is not None:
        urls = [one.string()]
    else:
        url = _secret(node, "url", environ, True, literal_ok=True)
        assert url is not None
        urls = [url]
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise node.error(
                f"Alertmanager URL must start with http:// or https:// (got {u[:8]!r}…)"
            )
    return AlertmanagerChannel(
        name,
        urls,
        send_resolved,
        timeout_s,
        _dur(node, "resolve_timeout", DEFAULT_RESOLVE_TIMEOUT_S, 60.0),
        _secret(node, "bearer_token", environ, required=False),
    )


def _check_alertmanager_repeats(s: AlertSettings, where: Located) -> None:
    """A route to Alertmanager must repeat before Alertmanager would let the alert expire."""
    for route in s.routes:
        for name in route.channels:
            ch = s.channels.get(name)
            if (
                isinstance(ch, AlertmanagerChannel)
                and route.repeat_interval_s >= ch.resolve_timeout_s
            ):
                raise where.error(
                    f"channel {name!r}: its route repeats every {route.repeat_interval_s:g} s, not "
                    f"within its resolve_timeout ({ch.resolve_timeout_s:g} s), so Alertmanager "
                    "would resolve firing alerts between repeats; lower the route's "
                    "repeat_interval or raise resolve_timeout"
                )


def _secret(
    node: Located, base: str, environ: Mapping[str, str], required: bool, literal_ok: bool = False
) -> str | None:
    if not literal_ok and (lit := node.get(base)) is not None:
        raise lit.error(
            f"{base} is a secret: give {base}_env (an environment variable) or {base}_file "
            "(e.g. a Docker secret) instead of the value"
        )
    env_node, file_node = node.get(f"{base}_env"), node.get(f"{base}_file")
    if env_node is not None:
        var = env_node.string()
        value = environ.get(var, "").strip()
        if not value:
            raise env_node.error(f"environment variable {var} is not set or empty")
        return value
    if file_node is not None:
        path = file_node.string()
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise file_node.error(f"cannot read secret file {path}: {exc.strerror}") from None
        if not value:
            raise file_node.error(f"secret file {path} is empty")
        return value
    if required:
        raise node.error(f"missing {base}_env or {base}_file")
    return None


def _route(node: Located, channels: set[str]) -> Route:
    node.check_keys(_ROUTE, required={"channels"})
    names = []
    for c in _req(node, "channels").sequence("a list of channel names"):
        name = c.string()
        if name not in channels:
            raise c.error(f"unknown channel {name!r} (configured: {', '.join(sorted(channels))})")
        names.append(name)
    matchers: dict[str, str] = {}
    if (m := node.get("match")) is not None:
        raw = {}
        for k, v in m.mapping("a mapping of label matchers").items():
            if isinstance(v.value, dict | list) or v.value is None:
                raise v.error(
                    f"match value for {k!r} must be a string (a regular expression such as "
                    f"'~critical|warning' matches several), got {type_name(v.value)}"
                )
            raw[k] = str(v.value)
        try:
            matchers = check_matchers(raw)
        except ValueError as exc:
            raise m.error(str(exc)) from None
    group_by = DEFAULT_GROUP_BY
    if (g := node.get("group_by")) is not None:
        group_by = tuple(x.string() for x in g.sequence("a list of label names"))
    cont = node.get("continue")
    return Route(
        channels=tuple(names),
        matchers=matchers,
        group_by=group_by,
        group_interval_s=_dur(node, "group_interval", 60.0, 0.0),
        repeat_interval_s=_dur(node, "repeat_interval", 4 * 3600.0, 60.0),
        continue_matching=cont.boolean() if cont is not None else False,
    )


def _dur(node: Located, key: str, default: float, minimum: float) -> float:
    child = node.get(key)
    return child.duration_s(minimum=minimum) if child is not None else default


def _req(node: Located, key: str) -> Located:
    child = node.get(key)
    if child is None:
        raise node.error(f"missing required field {key!r}")
    return child
