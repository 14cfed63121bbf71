"""Serving the dashboard: in the foreground (``serve``) or beside a collector (``start``).

Both refuse a non-loopback bind without credentials (``dashboard.auth``) before anything listens.
The server is werkzeug's threaded WSGI server: fine for the handful of users one dashboard has;
behind a reverse proxy, or for more users, run ``gpuwatt.dashboard.wsgi:application``-style
``create_app(store).server`` under any WSGI server.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server

from gpuwatt.config import Config
from gpuwatt.dashboard.alerts_hook import AlertsSource
from gpuwatt.dashboard.app import create_app
from gpuwatt.dashboard.auth import load_credentials, require_credentials_for
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.timerange import PRESETS, parse_range
from gpuwatt.malloc_tuning import tune_for_large_reads
from gpuwatt.store.base import Store

log = logging.getLogger("gpuwatt.dashboard")

#: How often the default view's data is recomputed in the background (0.35 s of CPU per
#: recomputation at 1,024 GPUs on a small machine; nothing noticeable at a few dozen).
WARM_EVERY_S = 30.0
#: The other preset ranges: less often, but within the cache's ``max_stale_s`` (300 s), so a
#: visitor is always served at once (and a refresh follows in the background).
WARM_PRESETS_EVERY_S = 120.0
#: ``start`` returns once the default view is computed, or after this long.
FIRST_WARM_TIMEOUT_S = 30.0


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
        gc.unfreeze()  # what start froze is collected again (a process that goes on: tests)


def freeze_startup_heap() -> None:
    """Move what the server holds once started (modules, the app, the first views) out of the
    cyclic garbage collector's reach (``gc.freeze``). A full collection otherwise walks all of
    it: served from the cache, a 1 h page of 1,024 GPUs on VictoriaMetrics takes ~30 ms, and the
    2 callbacks in 360 a full collection fell in took 70-93 ms; frozen, those took 12-24 ms
    (CHANGELOG). Frozen objects are still freed when no longer referenced; only cycles among
    them stay."""
    gc.collect()
    gc.freeze()


def start(
    store: Store,
    host: str = "127.0.0.1",
    port: int = 8050,
    *,
    config: Config | None = None,
    environ: Mapping[str, str] | None = None,
    alerts: AlertsSource | None = None,
    warm_every_s: float | None = WARM_EVERY_S,
    warm_presets_every_s: float | None = WARM_PRESETS_EVERY_S,
    **app_kwargs: Any,
) -> RunningDashboard:
    """Serve the dashboard from a background thread; returns with the address once the
    default view's data is computed (at most ``FIRST_WARM_TIMEOUT_S``).

    The default view is kept current every ``warm_every_s`` and the other preset ranges every
    ``warm_presets_every_s`` (None: not at all), in the background: no visitor of a preset
    waits for a cold read and analysis. Raises ``ConfigError`` for a non-loopback ``host``
    without credentials, ``OSError`` when the port is taken. ``port=0`` picks a free port.
    """
    credentials = load_credentials(environ)
    require_credentials_for(host, credentials)
    tune_for_large_reads()  # before the server's threads start
    app = create_app(store, config=config, credentials=credentials, alerts=alerts, **app_kwargs)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = make_server(host, port, app.server, threaded=True)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/"
    thread = threading.Thread(target=server.serve_forever, name="gpuwatt-dashboard", daemon=True)
    thread.start()
    data: DashboardData = app.server.config["GPUWATT_DATA"]
    if warm_every_s is not None:
        now_ns = data.now_ns()
        default = parse_range({}, now_ns)[0]
        plan = [(default, warm_every_s)]
        if warm_presets_every_s is not None:
            for preset in PRESETS:
                tr = parse_range({"range": preset}, now_ns)[0]
                if tr.preset != default.preset:
                    plan.append((tr, warm_presets_every_s))
        data.start_warming(plan).wait(FIRST_WARM_TIMEOUT_S)
    freeze_startup_heap()
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
