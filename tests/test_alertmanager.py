"""Alerts pushed to a real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1.

What arrives is read back through Alertmanager's own API (``GET /api/v2/alerts``) and from the
webhook Alertmanager itself notifies (a receiver on 127.0.0.1): labels, annotations, startsAt,
endsAt and generatorURL as sent, firing then resolved, retried through the outbox while
Alertmanager is down.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from servers import _Server, free_port, http
from test_alerts_helpers import SlackStandIn

from gpuwatt.alerts.clock import NS_PER_S
from gpuwatt.alerts.db import open_db, transaction
from gpuwatt.alerts.dispatch import ChannelWorkers
from gpuwatt.alerts.notify import alertmanager
from gpuwatt.alerts.notify.alertmanager import AlertmanagerChannel, label_name
from gpuwatt.alerts.notify.base import (
    AlertItem,
    Delivered,
    Notification,
    Rejected,
    RetryLater,
)
from gpuwatt.alerts.notify.base import (
    test_notification as make_test_notification,
)
from gpuwatt.alerts.notify.http import post_json
from gpuwatt.alerts.outbox import PENDING, SENT, Outbox
from gpuwatt.alerts.settings import parse_alert_settings
from gpuwatt.errors import ConfigError
from gpuwatt.yamlfile import load_text

ALERTMANAGER = "prometheus-alertmanager"
EXTERNAL_URL = "https://gpuwatt.example.org/alerts"
MS = 1_000_000  # Alertmanager keeps times to the millisecond


class AlertmanagerServer(_Server):
    """Alertmanager alone (no cluster peers), notifying one webhook at once for every group."""

    binary = ALERTMANAGER
    ready_path = "/-/ready"

    def __init__(self, webhook_url: str) -> None:
        super().__init__()
        self.config_path = self.tmp / "alertmanager.yml"
        self.config_path.write_text(
            json.dumps(
                {
                    "route": {
                        "receiver": "capture",
                        "group_by": ["alertname"],
                        "group_wait": "0s",
                        "group_interval": "1s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [
                        {
                            "name": "capture",
                            "webhook_configs": [{"url": webhook_url, "send_resolved": True}],
                        }
                    ],
                }
            )
        )

    def _argv(self) -> list[str]:
        return [
            ALERTMANAGER,
            f"--config.file={self.config_path}",
            f"--storage.path={self.tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip port: a single instance
            "--log.level=warn",
        ]

    def alerts(self) -> list[dict[str, Any]]:
        status, body = http("GET", f"{self.url}/api/v2/alerts")
        assert status == 200, body
        return json.loads(body)


@pytest.fixture(scope="module")
def receiver() -> Iterator[SlackStandIn]:
    with SlackStandIn() as server:
        yield server


@pytest.fixture(scope="module")
def am(receiver: SlackStandIn) -> Iterator[AlertmanagerServer]:
    assert shutil.which(ALERTMANAGER), "install Debian's prometheus-alertmanager (make test-deps)"
    server = AlertmanagerServer(receiver.url)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def _ts(text: str) -> int:
    """Alertmanager's RFC 3339 time in ns (to the microsecond; it may print fewer digits)."""
    whole, _, frac = text.rstrip("Z").partition(".")
    base = datetime.fromisoformat(whole + "+00:00").timestamp()
    return round(base) * NS_PER_S + int((frac or "0").ljust(9, "0")[:9])


def _same_time(text: str, t_ns: int) -> bool:
    return abs(_ts(text) - t_ns) < MS


def _wait_for(predicate: Any, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def gpu_alert(name: str, host: str, gpu: int, now_ns: int, status: str = "firing") -> AlertItem:
    return AlertItem(
        fingerprint=f"{name}-{host}-{gpu}",
        status=status,
        labels={
            "alertname": name,
            "severity": "critical",
            "cluster": "hpc",
            "host": host,
            "gpu": str(gpu),
            "uuid": f"GPU-{gpu:08d}-aaaa-bbbb-cccc-000000000000",
        },
        annotations={
            "summary": f"{host} GPU {gpu} at 91 °C",
            "runbook_url": "https://runbooks.example.org/gpu-temperature",
        },
        starts_ns=now_ns - 120 * NS_PER_S,
        ends_ns=now_ns - NS_PER_S if status == "resolved" else None,
    )


def note(channel: str, now_ns: int, *alerts: AlertItem, status: str = "firing") -> Notification:
    return Notification(
        channel=channel,
        group_key="0:test",
        group_labels={"alertname": alerts[0].labels["alertname"]},
        status=status,
        alerts=alerts,
        created_ns=now_ns,
        seq=1,
        external_url=EXTERNAL_URL,
    )


def _received(receiver: SlackStandIn, alertname: str, status: str) -> list[dict[str, Any]]:
    return [
        a
        for b in receiver.bodies
        for a in b["alerts"]
        if a["labels"].get("alertname") == alertname and a["status"] == status
    ]


def test_firing_then_resolved_as_alertmanager_records_and_notifies_them(
    am: AlertmanagerServer, receiver: SlackStandIn
) -> None:
    now_ns = time.time_ns()
    items = [gpu_alert("GpuTemperatureHigh", "node-3", g, now_ns) for g in (0, 5)]
    channel = AlertmanagerChannel("am", [am.url], resolve_timeout_s=1200.0)
    result = channel.send(note("am", now_ns, *items))
    assert isinstance(result, Delivered), result

    stored = {a["labels"]["gpu"]: a for a in am.alerts()}
    assert set(stored) == {"0", "5"}
    for item in items:
        got = stored[item.labels["gpu"]]
        assert got["labels"] == item.labels
        assert got["annotations"] == item.annotations
        assert got["startsAt"].endswith("Z") and _same_time(got["startsAt"], item.starts_ns)
        assert _same_time(got["endsAt"], now_ns + 1200 * NS_PER_S)
        assert got["generatorURL"] == EXTERNAL_URL
        assert got["status"]["state"] == "active"
    # Alertmanager routes them on: its webhook gets both, firing, with our labels
    _wait_for(
        lambda: len(_received(receiver, "GpuTemperatureHigh", "firing")) >= 2,
        "Alertmanager's firing notification",
    )
    sent_on = _received(receiver, "GpuTemperatureHigh", "firing")
    assert {a["labels"]["host"] for a in sent_on} == {"node-3"}
    assert {a["generatorURL"] for a in sent_on} == {EXTERNAL_URL}

    later_ns = time.time_ns()
    resolved = [gpu_alert("GpuTemperatureHigh", "node-3", g, later_ns, "resolved") for g in (0, 5)]
    assert isinstance(channel.send(note("am", later_ns, *resolved, status="resolved")), Delivered)
    assert [a for a in am.alerts() if a["labels"]["alertname"] == "GpuTemperatureHigh"] == []
    _wait_for(
        lambda: len(_received(receiver, "GpuTemperatureHigh", "resolved")) >= 2,
        "Alertmanager's resolved notification",
    )
    (gone,) = {a["endsAt"] for a in _received(receiver, "GpuTemperatureHigh", "resolved")}
    assert _same_time(gone, resolved[0].ends_ns or 0)


def test_label_names_alertmanager_would_refuse_are_rewritten(am: AlertmanagerServer) -> None:
    now_ns = time.time_ns()
    item = AlertItem(
        fingerprint="odd",
        status="firing",
        labels={"alertname": "OddLabels", "gpu.uuid": "GPU-1", "1st": "x", "empty": ""},
        annotations={"summary": "names with dots", "runbook-url": "https://r.example.org"},
        starts_ns=now_ns,
    )
    assert isinstance(AlertmanagerChannel("am", [am.url]).send(note("am", now_ns, item)), Delivered)
    (got,) = [a for a in am.alerts() if a["labels"]["alertname"] == "OddLabels"]
    assert got["labels"] == {"alertname": "OddLabels", "gpu_uuid": "GPU-1", "_1st": "x"}
    assert got["annotations"] == {
        "summary": "names with dots",
        "runbook_url": "https://r.example.org",
    }
    assert label_name("0") == "_0" and label_name("a-b.c") == "a_b_c"


def test_what_alertmanager_refuses_is_a_permanent_rejection(am: AlertmanagerServer) -> None:
    """Alertmanager answers 400 to a body outside its v2 schema (an alert without labels); the
    channel's HTTP layer takes that as final: the same message would be refused again."""
    result = post_json(f"{am.url}/api/v2/alerts", [{"labels": {}}], timeout_s=10.0)
    assert isinstance(result, Rejected), result
    assert "HTTP 400" in result.reason and "/api/v2/alerts" not in result.reason  # no path shown
    wrong_path = AlertmanagerChannel("am", [am.url + "/api/v1"])
    now_ns = time.time_ns()
    assert isinstance(wrong_path.send(note("am", now_ns, gpu_alert("X", "n", 0, now_ns))), Rejected)


def test_down_then_up_is_retried_through_the_outbox_and_dispatch(
    tmp_path: Path, receiver: SlackStandIn
) -> None:
    port = free_port()
    config = load_text(
        f"""
channels:
  am:
    type: alertmanager
    urls: ["http://127.0.0.1:{port}"]
    resolve_timeout: 20m
    bearer_token_file: {tmp_path / "token"}
routes:
  - channels: [am]
    repeat_interval: 5m
""",
        "gpuwatt.yaml",
    )
    (tmp_path / "token").write_text("am-secret\n")
    settings = parse_alert_settings(config, environ={})
    channel = settings.channels["am"]
    assert isinstance(channel, AlertmanagerChannel)
    assert channel.resolve_timeout_s == 1200.0 and channel.bearer_token == "am-secret"
    assert "am-secret" not in repr(channel) and str(port) not in repr(channel)

    con = open_db(tmp_path / "alerts.db")
    lock = threading.Lock()
    now_ns = time.time_ns()
    n = note("am", now_ns, gpu_alert("GpuXidCritical", "node-9", 2, now_ns))
    outbox = Outbox(con)
    with transaction(con):
        outbox.enqueue(n, "am|0:test|1", now_ns)
    workers = ChannelWorkers(outbox, settings.channels, lock, time.time_ns)
    server = AlertmanagerServer(receiver.url)
    server.port = port
    try:
        assert workers.dispatch() == 1  # nobody listens on the port yet
        workers.join(30.0)
        with lock:
            (entry,) = outbox.entries()
        assert entry.state == PENDING and entry.attempts == 1
        assert f"127.0.0.1:{port}" in entry.last_error and "unreachable" in entry.last_error

        server.start()
        with lock:  # the back-off has passed
            con.execute("UPDATE outbox SET next_attempt_ns = 0")
        assert workers.dispatch() == 1
        workers.join(30.0)
        with lock:
            (entry,) = outbox.entries()
        assert (entry.state, entry.attempts) == (SENT, 2)
        (got,) = [a for a in server.alerts() if a["labels"]["alertname"] == "GpuXidCritical"]
        assert got["labels"]["host"] == "node-9"
    finally:
        server.cleanup()
        con.close()


def test_one_instance_down_is_retried_for_all(am: AlertmanagerServer) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    channel = AlertmanagerChannel("am", [am.url, down])
    now_ns = time.time_ns()
    result = channel.send(note("am", now_ns, gpu_alert("HaPair", "node-1", 1, now_ns)))
    assert isinstance(result, RetryLater) and "unreachable" in result.reason
    # the live instance has it already; a retry sends it again and Alertmanager merges the two
    assert isinstance(
        channel.send(note("am", now_ns, gpu_alert("HaPair", "node-1", 1, now_ns))), RetryLater
    )
    assert len([a for a in am.alerts() if a["labels"]["alertname"] == "HaPair"]) == 1


def test_render_is_alertmanagers_postable_alert_list() -> None:
    now_ns = 1_750_000_000 * NS_PER_S
    firing = gpu_alert("A", "h", 0, now_ns)
    resolved = gpu_alert("A", "h", 1, now_ns, "resolved")
    body = alertmanager.render(note("am", now_ns, firing, resolved), 600.0)
    assert [sorted(a) for a in body] == [
        ["annotations", "endsAt", "generatorURL", "labels", "startsAt"]
    ] * 2
    assert body[0]["endsAt"] == "2025-06-15T15:16:40.000000Z"  # now + 600 s
    assert body[1]["endsAt"] == "2025-06-15T15:06:39.000000Z"  # when it resolved
    assert alertmanager.alerts_url("http://am:9093/") == "http://am:9093/api/v2/alerts"
    assert alertmanager.alerts_url("http://am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"


def test_a_test_notification_reaches_alertmanager_and_ends_by_itself(
    am: AlertmanagerServer,
) -> None:
    now_ns = time.time_ns()
    n = make_test_notification("am", now_ns)
    channel = AlertmanagerChannel("am", [am.url])  # default resolve_timeout: 5 h
    assert isinstance(channel.send(n), Delivered)
    (got,) = [a for a in am.alerts() if a["labels"]["alertname"] == "GpuwattTestNotification"]
    assert got["labels"] == {"alertname": "GpuwattTestNotification", "severity": "info"}
    assert _same_time(got["endsAt"], now_ns + 300 * NS_PER_S)  # not paging anyone for 5 h


def test_a_route_that_repeats_too_rarely_for_alertmanager_is_refused() -> None:
    config = load_text(
        """
channels:
  am: {type: alertmanager, url: "http://127.0.0.1:9093", resolve_timeout: 30m}
routes:
  - {channels: [am], repeat_interval: 1h}
""",
        "gpuwatt.yaml",
    )
    with pytest.raises(ConfigError, match="resolve_timeout"):
        parse_alert_settings(config, environ={})
