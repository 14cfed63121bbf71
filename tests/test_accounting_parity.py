"""One computation (docs/accounting.md): the alert evaluator builds its analysis input as the
CLI does (rows, read level, job attribution), so the idle allocated GPU the CLI and dashboard
show on the demo (node-3 GPU 7 under notebook-17) raises exactly one ``GpuIdleAllocated``."""

from __future__ import annotations

import json
from pathlib import Path

from test_alerts_helpers import T0_NS, drive

from gpuwatt.alerts.clock import ManualClock
from gpuwatt.alerts.db import open_db
from gpuwatt.alerts.rules import load_rules
from gpuwatt.alerts.service import Evaluator
from gpuwatt.analytics import analyze
from gpuwatt.analytics.inputs import read_analysis_input
from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000


def test_the_demo_idle_allocated_gpu_raises_one_alert_as_the_cli_shows_it(
    tmp_path: Path,
) -> None:
    rules = [r for r in load_rules() if r.name == "GpuIdleAllocated"]
    source = SimulatedClusterSource(load_scenario("demo"), start_ns=T0_NS)
    source.open()
    clock = ManualClock(T0_NS)
    con = open_db(tmp_path / "alerts.db")
    try:
        with SqliteStore(tmp_path / "store.db") as store:
            ev = Evaluator(rules, store, con, channels={}, routes=[], clock=clock, cluster="demo")
            for _ in drive(ev, source, store, clock, from_s=0, until_s=1200):
                pass
            end_ns = T0_NS + 1200 * NS + 1
            data = read_analysis_input(store, end_ns - 900 * NS, end_ns)
            cli = analyze(data.frame, now_ns=end_ns, start_ns=end_ns - 900 * NS, jobs=data.jobs)
        fired = con.execute(
            "SELECT labels FROM history WHERE rule = 'GpuIdleAllocated' AND to_state = 'firing'"
        ).fetchall()
    finally:
        con.close()
        source.close()
    shown = {(i.host, i.gpu_index, data.jobs.get(i.uuid)) for i in cli.idle_allocated}
    assert shown == {("node-3", 7, "notebook-17")}
    assert len(fired) == 1
    labels = json.loads(fired[0][0])
    assert (labels.get("host"), str(labels.get("gpu"))) == ("node-3", "7"), labels
