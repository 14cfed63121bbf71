"""The app as functions: every page renders from the demo store, empty and unreachable stores
become messages (no traceback in the log), figures stay within their point budget, auth."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plotly.io
import pytest
from test_dashboard_support import (
    DEMO_END_NS,
    UnreachableStore,
    build_demo_store,
    energy_today_text,
)

from gpuwatt.dashboard import figures
from gpuwatt.dashboard.app import PAGES, create_app, render_page
from gpuwatt.dashboard.auth import Credentials, load_credentials, require_credentials_for
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.pages import node, overview, stragglers
from gpuwatt.dashboard.server import start
from gpuwatt.errors import ConfigError
from gpuwatt.store.sqlite import SqliteStore


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> SqliteStore:
    store = build_demo_store(tmp_path_factory.mktemp("app") / "demo.db", minutes=15)
    yield store
    store.close()


@pytest.fixture(scope="module")
def data(demo_store: SqliteStore) -> DashboardData:
    return DashboardData(demo_store, clock_ns=lambda: DEMO_END_NS)


def text_of(component: Any) -> str:
    """All text and figures of a component tree, as JSON (what the browser would receive)."""
    return json.dumps(component, cls=plotly.utils.PlotlyJSONEncoder)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.PAGE)
def test_every_page_renders_on_the_demo(page: Any, data: DashboardData) -> None:
    out = render_page(page, {"range": "15m", "host": "node-2", "gpu": "5"}, data)
    text = text_of(out)
    assert "error-state" not in text and "empty-state" not in text
    assert "last 15m" in text


def test_overview_names_the_straggler_and_its_cause(data: DashboardData) -> None:
    text = text_of(render_page(overview, {"range": "15m"}, data))
    assert "node-2 GPU 5" in text
    assert "thermal" in text and "GPU 5 on node-2 runs at" in text
    assert "32 / 32" in text  # GPUs up


def test_stragglers_page_explains_and_plots_against_peers(data: DashboardData) -> None:
    text = text_of(render_page(stragglers, {"range": "15m"}, data))
    assert "straggler-explanation" in text and "check fans, airflow" in text
    assert "peer median" in text and "peers p10-p90" in text


def test_drill_down_marks_throttle_onsets(data: DashboardData) -> None:
    text = text_of(render_page(node, {"range": "15m", "host": "node-2", "gpu": "5"}, data))
    assert "throttle onsets marked" in text
    assert "hardware thermal slowdown" in text
    missing = text_of(render_page(node, {"range": "15m", "host": "<script>"}, data))
    assert "No node named" in missing and "error-state" not in missing


def test_empty_range_says_so(data: DashboardData) -> None:
    far = {"from": "2020-01-01T00:00:00Z", "to": "2020-01-01T01:00:00Z"}
    for page in PAGES:
        text = text_of(render_page(page, far, data))
        assert "error-state" not in text
        if page.PAGE != "alerts":
            assert "no data in this range" in text


def test_garbled_url_is_explained(data: DashboardData) -> None:
    text = text_of(render_page(overview, {"range": "';DROP TABLE", "x": "\x00"}, data))
    assert "URL not understood" in text and "showing the last 1h instead" in text
    assert "node-2 GPU 5" in text  # and the default range is still shown


def test_unreachable_store_is_a_message_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = DashboardData(UnreachableStore(), clock_ns=lambda: DEMO_END_NS)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO)
    for page in PAGES:
        text = text_of(render_page(page, {"range": "1h"}, data))
        if getattr(page, "NEEDS_DATA", True):
            assert "store not reachable" in text and "connection refused" in text
        else:
            assert "error-state" not in text
    assert caplog.records, "the failure is logged"
    for r in caplog.records:
        assert r.exc_info is None and "Traceback" not in r.getMessage()


def test_a_failing_view_is_contained(data: DashboardData, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        PAGE = "broken"

        @staticmethod
        def render(ctx: Any) -> list[Any]:
            raise KeyError("boom")

    text = text_of(render_page(Broken, {}, data))  # type: ignore[arg-type]
    assert "this view failed (KeyError)" in text
    assert all(r.exc_info is None for r in caplog.records)


def test_figures_stay_within_the_point_budget(data: DashboardData) -> None:
    from gpuwatt.dashboard.timerange import parse_range

    tr, _ = parse_range({"range": "15m"}, DEMO_END_NS)
    s = data.window(tr).summary
    heat = figures.node_gpu_heatmap(overview.newest_per_gpu(s.gpu_windows))
    assert figures.point_count(heat) == 32
    th = figures.time_heatmap(s.gpu_windows)
    assert figures.point_count(th) <= 32 * 15
    assert all(t["type"] != "scattergl" for t in th["data"])
    assert figures.empty_figure("x")["data"] == []


def test_time_heatmap_switches_to_nodes_beyond_64_gpus() -> None:
    import pandas as pd

    rows = [
        {"gpu": f"h{h}:{g}", "host": f"h{h}", "gpu_index": g, "window_start_ns": w,
         "utilization_gpu_pct": 50.0}
        for h in range(16) for g in range(8) for w in range(3)
    ]  # fmt: skip
    fig = figures.time_heatmap(pd.DataFrame(rows))
    assert len(fig["data"][0]["y"]) == 16


# --- auth -------------------------------------------------------------------------------------


def test_non_loopback_bind_without_credentials_refuses(demo_store: SqliteStore) -> None:
    require_credentials_for("127.0.0.1", None)
    require_credentials_for("::1", None)
    require_credentials_for("localhost", None)
    for host in ("0.0.0.0", "10.1.2.3", "::", "gpu-head"):
        with pytest.raises(ConfigError, match="without authentication"):
            require_credentials_for(host, None)
    with pytest.raises(ConfigError, match="GPUWATT_DASHBOARD_PASSWORD"):
        start(demo_store, "0.0.0.0", 0, environ={})


def test_credentials_from_env_or_file(tmp_path: Path) -> None:
    assert load_credentials({}) is None
    c = load_credentials({"GPUWATT_DASHBOARD_USER": "ops", "GPUWATT_DASHBOARD_PASSWORD": "s3"})
    assert c == Credentials("ops", "s3") and "s3" not in repr(c)
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    c2 = load_credentials({"GPUWATT_DASHBOARD_PASSWORD_FILE": str(f)})
    assert c2 is not None and (c2.user, c2.password) == ("gpuwatt", "from-file")
    with pytest.raises(ConfigError, match="cannot read"):
        load_credentials({"GPUWATT_DASHBOARD_PASSWORD_FILE": str(tmp_path / "nope")})


# A password no page content can contain by chance (a 2-letter one could
# appear in an asset fingerprint).
SECRET = "Zq7-not-in-any-page-9Xw"


def test_unauthenticated_requests_get_401(demo_store: SqliteStore) -> None:
    app = create_app(demo_store, now_ns=DEMO_END_NS, credentials=Credentials("ops", SECRET))
    client = app.server.test_client()
    for path in (
        "/",
        "/stragglers",
        "/download/report.csv",
        "/_dash-layout",
        "/assets/gpuwatt.css",
    ):
        resp = client.get(path)
        assert resp.status_code == 401, path
        assert resp.headers["WWW-Authenticate"].startswith("Basic")
    wrong = base64.b64encode(b"ops:nope").decode()
    assert client.get("/", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
    good = base64.b64encode(b"ops:" + SECRET.encode()).decode()
    resp = client.get("/", headers={"Authorization": f"Basic {good}"})
    assert resp.status_code == 200
    # The page must not echo the password (a long, distinctive one, so that
    # no asset hash or timestamp can contain it by chance).
    assert SECRET.encode() not in resp.data and good.encode() not in resp.data


def test_served_over_http_with_auth(demo_store: SqliteStore) -> None:
    import urllib.error
    import urllib.request

    env = {"GPUWATT_DASHBOARD_USER": "ops", "GPUWATT_DASHBOARD_PASSWORD": "pw"}
    running = start(demo_store, "127.0.0.1", 0, environ=env, now_ns=DEMO_END_NS)
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(running.url, timeout=10)
        assert err.value.code == 401
        err.value.close()
        req = urllib.request.Request(
            running.url, headers={"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
    finally:
        running.stop()


def test_assets_are_local(demo_store: SqliteStore) -> None:
    """No page asks for anything on another host (the dashboard works offline)."""
    client = create_app(demo_store, now_ns=DEMO_END_NS).server.test_client()
    html = client.get("/").get_data(as_text=True)
    assert "unpkg" not in html and "cdn.jsdelivr" not in html and "fonts.googleapis" not in html


def test_cache_serves_stale_while_refreshing_in_background() -> None:
    import threading

    data = DashboardData(UnreachableStore(), ttl_s=0.0, max_stale_s=60.0)  # type: ignore[arg-type]
    calls: list[int] = []
    refreshed = threading.Event()

    def compute() -> int:
        calls.append(1)
        if len(calls) == 2:
            refreshed.set()
        return len(calls)

    cache = data.cache
    assert cache.get(("k",), compute) == 1  # cold: computed now
    assert cache.get(("k",), compute) == 1  # stale: returned at once, refresh started
    assert refreshed.wait(10)
    data.close()
    assert cache.get(("k",), compute) in (2, 3)
    cache.max_stale_s = 0.0  # too old to serve: computed synchronously
    assert cache.get(("k",), compute) == len(calls)
    data.close()


def test_recent_straggler_shows_on_coarse_ranges(data: DashboardData) -> None:
    """On 6 h (5-minute windows) the 11-minute-old straggler has not persisted over three
    windows of the range, but the newest hour, analysed per minute, still shows it."""
    for page in (overview, stragglers):
        text = text_of(render_page(page, {"range": "6h"}, data))
        assert "5-minute buckets" in text
        assert "node-2 GPU 5" in text and "check fans, airflow" in text


# --- plotly.js bundle ---------------------------------------------------------------------------

#: Trace types in plotly.js's cartesian partial bundle (served from dashboard/assets/).
CARTESIAN_TRACES = {
    "bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
    "image", "pie", "scatter", "scatterternary", "violin",
}  # fmt: skip


def test_plotly_bundle_is_the_installed_plotly_version(demo_store: SqliteStore) -> None:
    """The served partial bundle is the plotly.js version the installed plotly/dash expect."""
    from plotly.offline import get_plotlyjs_version

    from gpuwatt.dashboard.app import ASSETS

    version = get_plotlyjs_version()
    bundle = ASSETS / f"plotly-cartesian-{version}.min.js"
    assert bundle.is_file(), sorted(p.name for p in ASSETS.iterdir())
    assert f"(cartesian - minified) v{version}" in bundle.read_text()[:300]
    client = create_app(demo_store, now_ns=DEMO_END_NS).server.test_client()
    html = client.get("/").get_data(as_text=True)
    assert f"/assets/plotly-cartesian-{version}.min.js" in html


def test_figures_use_only_bundled_trace_types(data: DashboardData) -> None:
    from dash import dcc

    def graphs(c: Any) -> Iterator[Any]:
        if isinstance(c, list | tuple):
            for x in c:
                yield from graphs(x)
        elif isinstance(c, dcc.Graph):
            yield c
        elif hasattr(c, "children"):
            yield from graphs(c.children)

    seen = set()
    for page in PAGES:
        for g in graphs(render_page(page, {"range": "15m", "host": "node-2", "gpu": "5"}, data)):
            seen |= {t["type"] for t in g.figure["data"]}
    assert seen and seen <= CARTESIAN_TRACES, seen - CARTESIAN_TRACES


def _post(client: Any, output_id: str, input_id: str, prop: str, value: Any) -> str:
    """A callback request as the browser sends it; the response text."""
    body = {
        "output": f"{output_id}.children",
        "outputs": {"id": output_id, "property": "children"},
        "inputs": [{"id": input_id, "property": prop, "value": value}],
        "changedPropIds": [f"{input_id}.{prop}"],
        "state": [],
    }
    resp = client.post("/_dash-update-component", json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    return str(resp.get_data(as_text=True))


def test_energy_today_follows_the_overview_in_its_own_request(demo_store: SqliteStore) -> None:
    """A cold overview does not wait for a day's read: it draws a placeholder and the input of
    the callback that fills it; once the figure is cached it is drawn in the page."""
    app = create_app(demo_store, now_ns=DEMO_END_NS)
    client = app.server.test_client()
    data = app.server.config["GPUWATT_DATA"]
    shown = energy_today_text(demo_store, DEMO_END_NS)

    def content() -> str:
        body = {
            "output": "overview-content.children",
            "outputs": {"id": "overview-content", "property": "children"},
            "inputs": [
                {"id": "overview-args", "property": "data", "value": {"range": "15m"}},
                {"id": "overview-refresh", "property": "n_intervals", "value": None},
            ],
            "changedPropIds": ["overview-args.data"],
            "state": [],
        }
        resp = client.post("/_dash-update-component", json=body)
        assert resp.status_code == 200
        return str(resp.get_data(as_text=True))

    cold = content()
    assert overview.TODAY_ASK_ID in cold and overview.TODAY_ID in cold
    assert shown not in cold  # not read for the page
    kpi = _post(client, overview.TODAY_ID, overview.TODAY_ASK_ID, "data", DEMO_END_NS)
    assert shown in kpi and "Energy today" in kpi
    served = content()
    assert shown in served and overview.TODAY_ASK_ID not in served
    data.close()
