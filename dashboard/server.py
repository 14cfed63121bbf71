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
from dashboard.data import DashboardData
from dashboard.timerange import parse_range
from gpuwatt.config import Config
from gpuwatt.store.base import Store

log = logging.getLogger("gpuwatt.dashboard")

#: How often the default view's data is recomputed in the background (about 1 s of CPU per
#: recomputation at 1,024 GPUs on a small machine; nothing noticeable at a few dozen).
WARM_EVERY_S = 30.0


@dataclass
class RunningDashboard:
    url: str
    server: BaseWSGIServer
    thread: threading.Thread
    data: DashboardData | None = None

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout_s)
        if self.data is not None:
            self.data.close()


def start(
    store: Store,
    host: str = "127.0.0.1",
    port: int = 8050,
    *,
    config: Config | None = None,
    environ: Mapping[str, str] | None = None,
    alerts: AlertsSource | None = None,
    warm_every_s: float | None = WARM_EVERY_S,
    **app_kwargs: Any,
) -> RunningDashboard:
    """Serve the dashboard from a background thread; returns at once with the address.

    The default view's data is computed before the first visitor asks and kept current every
    ``warm_every_s`` (None: not at all). Raises ``ConfigError`` for a non-loopback ``host``
    without credentials, ``OSError`` when the port is taken. ``port=0`` picks a free port.
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
    data: DashboardData = app.server.config["GPUWATT_DATA"]
    if warm_every_s is not None:
        data.start_warming([parse_range({}, data.now_ns())[0]], every_s=warm_every_s)
    log.info("dashboard serving on %s%s", url, " (authentication required)" if credentials else "")
    return RunningDashboard(url, server, thread, data)


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
