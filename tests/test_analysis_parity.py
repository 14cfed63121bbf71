"""One computation: the dashboard's data layer and the alert evaluator find the same things on the
demo (the stragglers with their cause and explanation, the idle allocated GPU), and the idle
allocated GPU raises exactly one GpuIdleAllocated alert (it never fired: the evaluator analysed
without the jobs the dashboard and the CLI use)."""

from __future__ import annotations

import re
from pathlib import Path

from test_dashboard_support import DEMO_END_NS, build_demo_store

from gpuwatt.alerts.clock import ManualClock
from gpuwatt.alerts.db import open_db
from gpuwatt.alerts.evaluate import evaluate_rule
from gpuwatt.alerts.rules import load_rules
from gpuwatt.alerts.service import Evaluator
from gpuwatt.alerts.state import AlertTable
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.timerange import parse_range

NS = 1_000_000_000


def test_dashboard_and_alerts_agree_on_the_demo(tmp_path: Path) -> None:
    store = build_demo_store(tmp_path / "demo.db", minutes=15)
    rules = {r.name: r for r in load_rules()}
    try:
        data = DashboardData(store, clock_ns=lambda: DEMO_END_NS)
        start = (DEMO_END_NS - 15 * 60 * NS) // NS
        tr, _ = parse_range({"from": str(start), "to": str(DEMO_END_NS // NS)}, DEMO_END_NS)
        summary = data.window(tr).summary
        data.close()
        assert summary is not None
        board_stragglers = {
            (s.host, str(s.gpu_index)): s.explanation for s in summary.active_stragglers
        }
        board_idle = {(i.host, str(i.gpu_index)) for i in summary.idle_allocated}
        alert_stragglers = {
            (o.target["host"], o.target["gpu"]): o.detail
            for o in evaluate_rule(rules["GpuStraggler"], store, DEMO_END_NS)
            if o.breach
        }
        alert_idle = {
            (o.target["host"], o.target["gpu"])
            for o in evaluate_rule(rules["GpuIdleAllocated"], store, DEMO_END_NS)
            if o.breach
        }
        assert set(board_stragglers) == set(alert_stragglers) == {("node-2", "5")}
        assert "job llm-pretrain" in alert_stragglers[("node-2", "5")]
        assert "thermal" in alert_stragglers[("node-2", "5")]
        assert board_idle == alert_idle == {("node-3", "7")}

        con = open_db(tmp_path / "alerts.db")
        ev = Evaluator([rules["GpuIdleAllocated"]], store, con, channels={}, routes=[],
                       clock=ManualClock(DEMO_END_NS))  # fmt: skip
        ev.evaluate()
        ev.evaluate()
        firing = [a for a in AlertTable(con).active() if a.state == "firing"]
        con.close()
        assert [(a.rule, a.labels["host"], a.labels["gpu"]) for a in firing] == [
            ("GpuIdleAllocated", "node-3", "7")
        ]
    finally:
        store.close()


ALERT_FINDING = {"GpuStraggler": "straggler", "GpuIdleAllocated": "idle"}


def test_cli_dashboard_csv_and_alerts_have_the_same_findings(tmp_path: Path) -> None:
    """Acceptance 4: the set of (GPU, finding, cause, severity) on the demo is the same in
    ``gpuwatt analyze``, the dashboard's data layer, the CSV report and the alert evaluator's
    firing alerts (their labels); the idle allocated GPU raises exactly one alert."""
    import time

    from test_cli import gpuwatt

    from gpuwatt.analytics.findings import findings
    from gpuwatt.dashboard.csv_export import build_report

    db = tmp_path / "demo.db"
    store = build_demo_store(db, minutes=15)
    rules = [r for r in load_rules() if r.name in ALERT_FINDING]
    try:
        data = DashboardData(store, clock_ns=lambda: DEMO_END_NS)
        tr, _ = parse_range({"range": "15m"}, DEMO_END_NS)
        summary = data.window(tr).summary
        data.close()
        con = open_db(tmp_path / "alerts.db")
        ev = Evaluator(rules, store, con, channels={}, routes=[], clock=ManualClock(DEMO_END_NS))
        ev.evaluate()
        ev.evaluate()
        firing = [a for a in AlertTable(con).active() if a.state == "firing"]
        con.close()
    finally:
        store.close()
    board = {(f.host, str(f.gpu_index), f.finding, f.cause, f.severity) for f in findings(summary)}
    report = build_report(summary, "gpu")
    csv_rows = {
        (r.host, str(r.gpu_index), r.finding, r.cause, r.severity)
        for r in report.itertuples()
        if r.finding
    }
    since_s = (time.time_ns() - (DEMO_END_NS - 15 * 60 * NS)) // NS
    out = gpuwatt("analyze", "--store", f"sqlite:///{db}", "--since", f"{since_s}s", home=tmp_path)
    assert out.returncode == 0, out.stderr
    cli = {
        (m[1], m[2], m[3], m[4], m[5])
        for m in re.finditer(
            r"^  (\S+) GPU (\d+): (\w+), cause (\w+), severity (\w+)$", out.stdout, re.M
        )
    }
    alerts = {
        (a.labels["host"], a.labels["gpu"], ALERT_FINDING[a.rule], a.labels["cause"],
         a.labels["severity"])
        for a in firing
    }  # fmt: skip
    assert ("node-2", "5", "straggler", "thermal", "critical") in board
    assert board == csv_rows == cli, (board, csv_rows, cli)
    # the evaluator raises stragglers and allocated idle GPUs only
    raisable = {f for f in board if f[2] == "straggler" or f[3] == "allocated_idle"}
    assert alerts == raisable
    assert [a.rule for a in firing].count("GpuIdleAllocated") == 1
