"""Acceptance 1: the demo scenario's thermal fault -> exactly one Slack message and one email when
it fires, one of each when it resolves, through real servers on 127.0.0.1 (aiosmtpd with STARTTLS
+ AUTH, or implicit TLS; an HTTP server standing in for Slack). Time is a ManualClock."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_alerts_helpers import (
    SMTP_PASSWORD,
    SMTP_USER,
    T0_NS,
    SlackStandIn,
    SmtpServer,
    drive,
    make_cert,
    parts,
)

from gpuwatt.alerts.clock import ManualClock
from gpuwatt.alerts.db import open_db
from gpuwatt.alerts.notify.email import EmailChannel
from gpuwatt.alerts.notify.slack import SlackChannel
from gpuwatt.alerts.rules import load_rules
from gpuwatt.alerts.service import Evaluator
from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.store.sqlite import SqliteStore

RUNBOOK = "https://github.com/gpuwatt/gpuwatt/blob/main/docs/runbooks.md#gputemperaturehigh"


def demo_with_fault_ending(end_s: float):  # type: ignore[no-untyped-def]
    """The shipped demo; its thermal fault (node-2 GPU 5 from 4 min) ends at ``end_s``."""
    sc = load_scenario("demo")
    (fault,) = sc.faults
    assert fault.kind == "thermal_slowdown" and fault.gpu == ("node-2", 5)
    return dataclasses.replace(sc, faults=(dataclasses.replace(fault, end_s=end_s),))


@pytest.mark.parametrize("security", ["starttls", "tls"])
def test_demo_thermal_fault_one_message_each_way(tmp_path: Path, security: str) -> None:
    cert = make_cert(tmp_path)
    rules = [r for r in load_rules() if r.name == "GpuTemperatureHigh"]
    source = SimulatedClusterSource(demo_with_fault_ending(600.0), start_ns=T0_NS)
    source.open()
    clock = ManualClock(T0_NS)
    con = open_db(tmp_path / "alerts.db")
    try:
        with (
            SlackStandIn() as slack,
            SmtpServer(security, cert) as smtp,
            SqliteStore(tmp_path / "store.db") as store,
        ):
            channels = {
                "slack": SlackChannel("slack", slack.url),
                "email": EmailChannel(
                    "email", "127.0.0.1", smtp.port, "gpuwatt@example.org",
                    ["oncall@example.org"], security=security, username=SMTP_USER,
                    password=SMTP_PASSWORD, timeout_s=5.0, ca_file=str(cert[0]),
                ),
            }  # fmt: skip
            ev = Evaluator(rules, store, con, channels=channels, routes=[], clock=clock,
                           cluster="demo")  # fmt: skip
            fired_at = resolved_at = None
            for t in drive(ev, source, store, clock, from_s=0, until_s=1080):
                if len(slack.bodies) == 1 and fired_at is None:
                    fired_at = t
                if len(slack.bodies) == 2 and resolved_at is None:
                    resolved_at = t
            bodies = slack.bodies
            messages = list(smtp.messages)
            auth = list(smtp.mailbox.auth_logins)
    finally:
        con.close()
        source.close()

    # exactly one message per channel when it fires (6 min: fault at 4, 1 min mean, for 1 min)
    # and one when it resolves (fault ends at 10 min, cools, keep_firing_for 2 min)
    assert (fired_at, resolved_at) == (360.0, 780.0)
    assert len(bodies) == 2 and len(messages) == 2
    assert auth == [SMTP_USER, SMTP_USER]
    assert bodies[0] == {
        "text": "[FIRING:1] GpuTemperatureHigh (cluster=demo)\n"
        "Firing: node-2 GPU 5 at 90 °C (limit 85 °C, mean over 1m)",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text",
                                        "text": "[FIRING:1] GpuTemperatureHigh (cluster=demo)"}},
            {"type": "section", "text": {"type": "mrkdwn", "text":
                "*Firing*\n• node-2 GPU 5 at 90 °C (limit 85 °C, mean over 1m)"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text":
                ":red_circle: firing · sent 2025-06-15 15:12:40 UTC · "
                f"<{RUNBOOK}|runbook>"}]},
        ],
    }  # fmt: skip
    assert bodies[1]["text"] == (
        "[RESOLVED:1] GpuTemperatureHigh (cluster=demo)\n"
        "Resolved: node-2 GPU 5 at 74 °C (limit 85 °C, mean over 1m)"
    )
    assert bodies[1]["blocks"][2]["elements"][0]["text"].startswith(
        ":large_green_circle: resolved · sent 2025-06-15 15:19:40 UTC"
    )
    fire, resolve = messages
    assert fire["Subject"] == "[FIRING:1] GpuTemperatureHigh (cluster=demo)"
    assert resolve["Subject"] == "[RESOLVED:1] GpuTemperatureHigh (cluster=demo)"
    assert fire["From"] == "gpuwatt@example.org" and fire["To"] == "oncall@example.org"
    assert fire["X-Gpuwatt-Status"] == "firing"
    text, html = parts(fire)
    assert text == (
        "[FIRING:1] GpuTemperatureHigh (cluster=demo)\n\nFiring:\n"
        "  - node-2 GPU 5 at 90 °C (limit 85 °C, mean over 1m)\n\n"
        f"Runbook: {RUNBOOK}\nSent by gpuwatt at 2025-06-15 15:12:40 UTC\n"
    )
    assert "<li>node-2 GPU 5 at 90 °C (limit 85 °C, mean over 1m)</li>" in html
    assert f'<a href="{RUNBOOK}">' in html
    assert "Resolved:\n  - node-2 GPU 5 at 74 °C" in parts(resolve)[0]
