"""Acceptance 2 and 3: the outbox against real servers on 127.0.0.1, time on a ManualClock.

Slack stand-in answering 429 + Retry-After: 3, 500 twice then 200, 404 channel_not_found; an
SMTP server that is down for a while; restarts of the outbox's process (a reopened database).
"""

from __future__ import annotations

from pathlib import Path

from test_alerts_helpers import T0_NS, Reply, SlackStandIn, SmtpServer, free_port, parts

from gpuwatt.alerts.clock import NS_PER_S, ManualClock
from gpuwatt.alerts.db import open_db, transaction
from gpuwatt.alerts.notify import slack, webhook
from gpuwatt.alerts.notify.base import AlertItem, Notification, shorten
from gpuwatt.alerts.notify.email import EmailChannel
from gpuwatt.alerts.notify.slack import SlackChannel
from gpuwatt.alerts.notify.webhook import WebhookChannel
from gpuwatt.alerts.outbox import FAILED, PENDING, SENT, Outbox


def gpu_alert(host: str, gpu: int, summary: str = "", status: str = "firing") -> AlertItem:
    labels = {"alertname": "GpuTemperatureHigh", "cluster": "c1", "severity": "critical",
              "host": host, "gpu": str(gpu)}  # fmt: skip
    return AlertItem(
        fingerprint=f"fp-{host}-{gpu}",
        status=status,
        labels=labels,
        annotations={"summary": summary or f"{host} GPU {gpu} at 91 °C"},
        starts_ns=T0_NS,
        ends_ns=T0_NS + 60 * NS_PER_S if status == "resolved" else None,
    )


def note(channel: str, *alerts: AlertItem, status: str = "firing") -> Notification:
    return Notification(
        channel=channel,
        group_key='0:{"alertname":"GpuTemperatureHigh","cluster":"c1"}',
        group_labels={"alertname": "GpuTemperatureHigh", "cluster": "c1"},
        status=status,
        alerts=alerts,
        created_ns=T0_NS,
        seq=1,
    )


def queue(con, n: Notification) -> Outbox:  # type: ignore[no-untyped-def]
    outbox = Outbox(con)
    with transaction(con):
        assert outbox.enqueue(n, "k1", T0_NS)
        assert not outbox.enqueue(n, "k1", T0_NS)  # idempotent by key
    return outbox


def test_slack_429_waits_for_retry_after_on_the_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock(T0_NS)
    con = open_db(tmp_path / "a.db")
    n = note("slack", gpu_alert("node-2", 5))
    try:
        with SlackStandIn() as server:
            server.script = [Reply(429, "rate_limited", {"Retry-After": "3"})]
            channels = {"slack": SlackChannel("slack", server.url, timeout_s=5)}
            outbox = queue(con, n)
            assert outbox.deliver_due(channels, clock.now_ns()).retrying == 1
            assert outbox.deliver_due(channels, clock.advance_s(2.999)).sent == 0
            assert len(server.bodies) == 1
            assert outbox.deliver_due(channels, clock.advance_s(0.001)).sent == 1
            outbox.deliver_due(channels, clock.advance_s(3600))
            bodies = server.bodies
            paths = [r["path"] for r in server.requests]
    finally:
        con.close()
    assert bodies == [slack.render(n), slack.render(n)]  # the same message, delivered once
    assert paths == ["/services/T000/B000/XXXXSECRETXXXX"] * 2
    (entry,) = Outbox(con := open_db(tmp_path / "a.db")).entries()
    con.close()
    assert (entry.state, entry.attempts, entry.done_ns) == (SENT, 2, T0_NS + 3 * NS_PER_S)


def test_slack_500_twice_then_200_backs_off_and_delivers_once(tmp_path: Path) -> None:
    clock = ManualClock(T0_NS)
    con = open_db(tmp_path / "a.db")
    try:
        with SlackStandIn() as server:
            server.script = [Reply(500, "oops"), Reply(503, "busy")]
            channels = {"slack": SlackChannel("slack", server.url, timeout_s=5)}
            outbox = queue(con, note("slack", gpu_alert("node-2", 5)))
            outbox.deliver_due(channels, clock.now_ns())  # 500 -> back off 5 s
            outbox.deliver_due(channels, clock.advance_s(4.9))
            assert len(server.bodies) == 1
            outbox.deliver_due(channels, clock.advance_s(0.1))  # 503 -> back off 10 s
            (e,) = outbox.entries()
            assert (e.state, e.attempts, e.next_attempt_ns) == (PENDING, 2, T0_NS + 15 * NS_PER_S)
            assert "HTTP 503: busy" in e.last_error and "SECRET" not in e.last_error
            outbox.deliver_due(channels, clock.advance_s(10))  # 200 ok
            outbox.deliver_due(channels, clock.advance_s(3600))
            assert len(server.bodies) == 3
            assert [x.state for x in outbox.entries()] == [SENT]
    finally:
        con.close()


def test_slack_404_is_permanent_recorded_and_visible(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    clock = ManualClock(T0_NS)
    db = tmp_path / "a.db"
    con = open_db(db)
    try:
        with SlackStandIn() as server:
            server.script = [Reply(404, "channel_not_found")]
            channels = {"slack": SlackChannel("slack", server.url, timeout_s=5)}
            outbox = queue(con, note("slack", gpu_alert("node-2", 5)))
            report = outbox.deliver_due(channels, clock.now_ns())
            outbox.deliver_due(channels, clock.advance_s(86_400))
            assert (report.failed, len(server.bodies)) == (1, 1)  # not retried
            (e,) = outbox.entries(FAILED)
    finally:
        con.close()
    assert e.attempts == 1
    assert e.last_error.startswith("rejected: http://127.0.0.1:")
    assert e.last_error.endswith("/… answered HTTP 404: channel_not_found")
    from gpuwatt.cli.alerts import main

    cfg = tmp_path / "gpuwatt.yaml"
    cfg.write_text(f"alerts:\n  state_db: {db}\n")
    assert main(["alerts", "status", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "FAILED notification 1 to slack: rejected:" in out and "channel_not_found" in out


def test_unreachable_endpoint_is_retried(tmp_path: Path) -> None:
    con = open_db(tmp_path / "a.db")
    try:
        url = f"http://127.0.0.1:{free_port()}/hook"
        outbox = queue(con, note("slack", gpu_alert("node-2", 5)))
        report = outbox.deliver_due({"slack": SlackChannel("slack", url, timeout_s=2)}, T0_NS)
        (e,) = outbox.entries()
    finally:
        con.close()
    assert report.retrying == 1 and e.state == PENDING and "unreachable" in e.last_error


def test_smtp_down_then_back_across_restarts_delivered_once(tmp_path: Path) -> None:
    clock = ManualClock(T0_NS)
    db = tmp_path / "a.db"
    server = SmtpServer("plain", None)  # a local relay; not started yet: down
    email = EmailChannel("email", "127.0.0.1", server.port, "gpuwatt@example.org",
                         ["ops@example.org"], security="none", timeout_s=2)  # fmt: skip
    channels = {"email": email}
    n = note("email", gpu_alert("node-2", 5, "node-2 GPU 5 at 91 °C <b>&</b>"))
    con = open_db(db)
    queue(con, n).deliver_due(channels, clock.now_ns())  # refused -> retry in 5 s
    con.close()  # the evaluator process stops ...
    for step_s in (5, 10):  # ... restarts, still down
        con = open_db(db)
        Outbox(con).deliver_due(channels, clock.advance_s(step_s))
        con.close()
    with server:
        con = open_db(db)
        try:
            outbox = Outbox(con)
            outbox.deliver_due(channels, clock.advance_s(19.9))
            assert server.messages == []  # 40 s back-off not over yet
            outbox.deliver_due(channels, clock.advance_s(0.1))
            (e,) = outbox.entries()
        finally:
            con.close()
        con = open_db(db)  # another restart: nothing is sent again
        Outbox(con).deliver_due(channels, clock.advance_s(86_400))
        con.close()
        messages = list(server.messages)
    assert (e.state, e.attempts) == (SENT, 4)
    assert len(messages) == 1
    text, html = parts(messages[0])
    assert "node-2 GPU 5 at 91 °C <b>&</b>" in text
    assert "<li>node-2 GPU 5 at 91 °C &lt;b&gt;&amp;&lt;/b&gt;</li>" in html  # escaped


def test_slack_summarises_hundreds_of_gpus_within_limits() -> None:
    alerts = [gpu_alert(f"node-{h:03d}", g) for h in range(40) for g in range(8)]
    body = slack.render(note("slack", *alerts))
    assert len(body["text"]) <= 3000 and len(body["blocks"]) <= 50
    section = body["blocks"][1]["text"]["text"]
    assert len(section) <= 3000
    lines = section.split("\n")
    assert lines[1] == "• node-000 GPU 0 at 91 °C"
    assert len(lines) == 1 + 10 + 1
    assert lines[-1] == (
        "• … and 310 more, 310 GPUs, on 39 nodes: node-001, node-002, node-003, node-004, "
        "node-005 and 34 more nodes"
    )
    assert body["blocks"][0]["text"]["text"] == "[FIRING:320] GpuTemperatureHigh (cluster=c1)"


def test_shorten_never_cuts_mid_word() -> None:
    text = "alpha beta gamma delta"
    assert shorten(text, 100) == text
    assert shorten(text, 13) == "alpha beta…"
    assert shorten(text, 16) == "alpha beta…"  # "gamma" would be cut: dropped whole
    assert shorten("x" * 50, 10) == "x" * 9 + "…"  # one word longer than the limit


def test_webhook_posts_alertmanager_v4_json(tmp_path: Path) -> None:
    n = note("am", gpu_alert("node-2", 5), gpu_alert("node-2", 6, status="resolved"))
    with SlackStandIn() as server:
        channel = WebhookChannel("am", server.url, timeout_s=5)
        result = channel.send(n)
        bodies = server.bodies
    assert type(result).__name__ == "Delivered"
    labels = {"alertname": "GpuTemperatureHigh", "cluster": "c1", "severity": "critical",
              "host": "node-2"}  # fmt: skip
    assert bodies == [
        {
            "version": "4",
            "groupKey": '0:{"alertname":"GpuTemperatureHigh","cluster":"c1"}',
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "am",
            "groupLabels": {"alertname": "GpuTemperatureHigh", "cluster": "c1"},
            "commonLabels": labels,
            "commonAnnotations": {},
            "externalURL": "",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {**labels, "gpu": "5"},
                    "annotations": {"summary": "node-2 GPU 5 at 91 °C"},
                    "startsAt": "2025-06-15T15:06:40.000000Z",
                    "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "",
                    "fingerprint": "fp-node-2-5",
                },
                {
                    "status": "resolved",
                    "labels": {**labels, "gpu": "6"},
                    "annotations": {"summary": "node-2 GPU 6 at 91 °C"},
                    "startsAt": "2025-06-15T15:06:40.000000Z",
                    "endsAt": "2025-06-15T15:07:40.000000Z",
                    "generatorURL": "",
                    "fingerprint": "fp-node-2-6",
                },
            ],
        }
    ]
    assert webhook.render(n, "am", max_alerts=1)["truncatedAlerts"] == 1
