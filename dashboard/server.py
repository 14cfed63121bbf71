"""Serving the dashboard: in the foreground (``serve``) or beside a collector (``start``).

Both refuse a non-loopback bind without credentials (``dashboard.auth``) before anything listens.
The server is werkzeug's threaded WSGI server: fine for the handful of users one dashboard has;
behind a reverse proxy, or for more users, run ``dashboard.wsgi:application``-style
``create_app(store).server`` under any WSGI server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server

from dashboard.alerts_hook import AlertsSource
from dashboard.app import create_app
from dashboard.auth import load_credentials, require_credentials_for
from gpuwatt.config import Config
from gpuwatt.store.base import Store

log = logging.getLogger("gpuwatt.dashboard")


@dataclass
class RunningDashboard:
    url: str
    server: BaseWSGIServer
    thread: threading.Thread

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout_s)


def start(
    store: Store,
    host: str = "127.0.0.1",
    port: int = 8050,
    *,
    config: Config | None = None,
    environ: Mapping[str, str] | None = None,
    alerts: AlertsSource | None = None,
    **app_kwargs: Any,
) -> RunningDashboard:
    """Serve the dashboard from a background thread; returns at once with the address.

    Raises ``ConfigError`` for a non-loopback ``host`` without credentials, ``OSError`` when the
    port is taken. ``port=0`` picks a free port (see ``.url``).
    """
    credentials = load_credentials(environ)
    require_credentials_for(host, credentials)
    app = create_app(store, config=config, credentials=credentials, alerts=alerts, **app_kwargs)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = make_server(host, port, app.server, threaded=True)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/"
    thread = threading.Thread(target=server.serve_forever, name="gpuwatt-dashboard", daemon=True)
    thread.start()
    log.info("dashboard serving on %s%s", url, " (authentication required)" if credentials else "")
    return RunningDashboard(url, server, thread)


def serve(
    store: Store,
    host: str = "127.0.0.1",
    port: int = 8050,
    stop_event: threading.Event | None = None,
    **kwargs: Any,
) -> None:
    """Serve until ``stop_event`` is set (or forever, without one)."""
    running = start(store, host, port, **kwargs)
    print(f"gpuwatt dashboard: {running.url}", flush=True)
    try:
        (stop_event or threading.Event()).wait()
    finally:
        running.stop()
