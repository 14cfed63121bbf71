"""Safe by default: loopback binds are open, any other bind needs credentials.

Credentials come from the environment (``GPUWATT_DASHBOARD_USER`` and
``GPUWATT_DASHBOARD_PASSWORD``) or from a file (``GPUWATT_DASHBOARD_PASSWORD_FILE``, one line;
the user then defaults to ``gpuwatt``), never from the command line. Requests are checked with
HTTP Basic authentication (put TLS in front: a reverse proxy). The password never reaches a page
or a log line.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatt.errors import ConfigError

ENV_USER = "GPUWATT_DASHBOARD_USER"
ENV_PASSWORD = "GPUWATT_DASHBOARD_PASSWORD"
ENV_PASSWORD_FILE = "GPUWATT_DASHBOARD_PASSWORD_FILE"
DEFAULT_USER = "gpuwatt"
REALM = "gpuwatt"


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str = field(repr=False)

    def check(self, user: str, password: str) -> bool:
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return ok_user and ok_password


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_credentials(environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Credentials from the environment or the password file; None when none are configured."""
    env = os.environ if environ is None else environ
    user = env.get(ENV_USER, "").strip() or DEFAULT_USER
    password = env.get(ENV_PASSWORD, "")
    if not password and env.get(ENV_PASSWORD_FILE):
        path = env[ENV_PASSWORD_FILE]
        try:
            password = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                ENV_PASSWORD_FILE, None, f"cannot read {path}: {exc.strerror}"
            ) from None
        if not password:
            raise ConfigError(ENV_PASSWORD_FILE, None, f"password file {path} is empty")
    return Credentials(user, password) if password else None


def require_credentials_for(host: str, credentials: Credentials | None) -> None:
    """Refuse to serve a non-loopback address without credentials (raises ConfigError)."""
    if credentials is None and not is_loopback(host):
        raise ConfigError(
            "--host",
            None,
            f"refusing to serve the dashboard on {host} without authentication: set "
            f"{ENV_USER} and {ENV_PASSWORD} (or {ENV_PASSWORD_FILE}), or bind 127.0.0.1",
        )


def _parse_basic(header: str) -> tuple[str, str] | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def install_basic_auth(server: Any, credentials: Credentials) -> None:
    """Every request to the Flask ``server`` must carry the credentials, else 401."""
    from flask import Response, request

    @server.before_request
    def _check() -> Response | None:
        given = _parse_basic(request.headers.get("Authorization", ""))
        if given is not None and credentials.check(*given):
            return None
        return Response(
            "authentication required\n",
            status=401,
            mimetype="text/plain",
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
        )
