"""The evaluator's state as the dashboard shows it: the CLI's adapter over a real alerts.db."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.utils
import pytest
from test_dashboard_support import DEMO_END_NS, build_demo_store

from gpuwatt.alerts.db import open_db, transaction
from gpuwatt.alerts.silences import SilenceTable
from gpuwatt.alerts.state import Alert, AlertTable
from gpuwatt.cli.compose import AlertsDbView
from gpuwatt.dashboard.alerts_hook import AlertsUnavailable
from gpuwatt.dashboard.app import render_page
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.pages import alerts as alerts_page
from gpuwatt.dashboard.pages import stragglers

NS = 1_000_000_000


@pytest.fixture
def alerts_db(tmp_path: Path) -> Path:
    path = tmp_path / "alerts.db"
    con = open_db(path)
    labels = {"alertname": "GpuStraggler", "host": "node-2", "gpu": "5", "severity": "warning"}
    firing = Alert(
        "fp1", "GpuStraggler", labels, {"summary": "node-2 GPU 5 holds its job back"},
        "firing", 0.68, pending_since_ns=DEMO_END_NS - 300 * NS,
        firing_since_ns=DEMO_END_NS - 120 * NS, updated_ns=DEMO_END_NS,
    )  # fmt: skip
    with transaction(con):
        AlertTable(con).save(None, firing, DEMO_END_NS - 120 * NS)
        SilenceTable(con).add(
            {"host": "node-3"},
            author="ops",
            comment="fan swap",
            starts_ns=DEMO_END_NS,
            ends_ns=DEMO_END_NS + 10**15,
            now_ns=DEMO_END_NS,
        )
    con.close()
    return path


def _text(component: object) -> str:
    return json.dumps(component, cls=plotly.utils.PlotlyJSONEncoder)


def test_adapter_reads_active_history_and_silences(alerts_db: Path) -> None:
    view = AlertsDbView(alerts_db, clock_ns=lambda: DEMO_END_NS)
    [active] = view.active()
    assert (active.name, active.state, active.severity) == ("GpuStraggler", "firing", "warning")
    assert active.summary == "node-2 GPU 5 holds its job back"
    assert active.since_ns == DEMO_END_NS - 120 * NS
    [event] = view.history(DEMO_END_NS - 3600 * NS, DEMO_END_NS + NS)
    assert event.state == "firing" and event.labels["host"] == "node-2"
    assert view.history(0, DEMO_END_NS - 3600 * NS) == []
    [silence] = view.silences()
    assert silence.matchers == {"host": "node-3"} and silence.comment == "fan swap"


def test_no_database_yet_is_not_connected_never_none(tmp_path: Path) -> None:
    view = AlertsDbView(tmp_path / "missing.db")
    for read in (view.active, view.silences, lambda: view.history(0, 1)):
        with pytest.raises(AlertsUnavailable, match="no alert database"):
            read()
    with pytest.raises(AlertsUnavailable):
        view.silence({"host": "node-1"}, duration_s=60, author="a", comment="c")
    assert not (tmp_path / "missing.db").exists()  # the evaluator's database is never created


def test_silence_and_expire_through_the_adapter(alerts_db: Path) -> None:
    view = AlertsDbView(alerts_db, clock_ns=lambda: DEMO_END_NS)
    sid = view.silence(
        {"alertname": "GpuStraggler", "host": "node-2", "gpu": "5"},
        duration_s=3600,
        author="ops",
        comment="known",
    )
    mine = [s for s in view.silences() if s.id == sid]
    assert mine and mine[0].ends_ns == DEMO_END_NS + 3600 * NS and mine[0].author == "ops"
    view.expire(sid)
    assert all(s.id != sid for s in view.silences())
    with pytest.raises(ValueError, match="matcher"):
        view.silence({}, duration_s=60, author="ops", comment="none")


def test_every_page_counts_firing_alerts_and_the_alerts_page_lists_them(
    alerts_db: Path, tmp_path: Path
) -> None:
    store = build_demo_store(tmp_path / "demo.db", minutes=6)
    try:
        data = DashboardData(store, clock_ns=lambda: DEMO_END_NS)
        view = AlertsDbView(alerts_db, clock_ns=lambda: DEMO_END_NS)
        page = _text(render_page(stragglers, {"range": "15m"}, data, view))
        assert "alerts-firing" in page and "1 alert firing" in page
        listing = _text(render_page(alerts_page, {"range": "1h"}, data, view))
        assert "GpuStraggler" in listing and "node-2 GPU 5 holds its job back" in listing
        assert "fan swap" in listing and "host=node-3" in listing
        without = _text(render_page(stragglers, {"range": "15m"}, data, None))
        assert "alerts-firing" not in without
    finally:
        store.close()


def test_the_alerts_page_shows_notifications_that_did_not_go_out(
    alerts_db: Path, tmp_path: Path
) -> None:
    from gpuwatt.alerts.notify.base import AlertItem, Notification
    from gpuwatt.alerts.outbox import Outbox

    con = open_db(alerts_db)
    item = AlertItem("fp1", "firing", {"alertname": "GpuStraggler"}, {}, DEMO_END_NS)
    n = Notification("mail", "g", {}, "firing", (item,), DEMO_END_NS)
    with transaction(con):
        outbox = Outbox(con)
        outbox.enqueue(n, "k1", DEMO_END_NS)
        (e,) = outbox.due(DEMO_END_NS)
        con.execute(
            "UPDATE outbox SET attempts = 3, last_error = ? WHERE id = ?",
            ("ValueError: timeout_s=nan is not a positive number of seconds", e.id),
        )
    con.close()
    view = AlertsDbView(alerts_db, clock_ns=lambda: DEMO_END_NS)
    (d,) = view.deliveries()
    assert (d.channel, d.state, d.attempts) == ("mail", "retrying", 3)
    store = build_demo_store(tmp_path / "demo.db", minutes=3)
    try:
        data = DashboardData(store, clock_ns=lambda: DEMO_END_NS)
        listing = _text(render_page(alerts_page, {"range": "1h"}, data, view))
    finally:
        store.close()
    assert "Notifications not delivered" in listing
    assert "retrying to mail after 3 attempt(s)" in listing and "timeout_s=nan" in listing
