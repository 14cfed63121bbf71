"""Acceptance 3 and 4: flapping with for + keep_firing_for, silences, node down, restarts.

Samples are written to a real SqliteStore; a real Slack stand-in receives what goes out; time is
a ManualClock advanced by the test (nothing sleeps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from test_alerts_helpers import T0_NS, SlackStandIn

from gpuwatt.alerts.clock import NS_PER_S, ManualClock
from gpuwatt.alerts.db import open_db, transaction
from gpuwatt.alerts.notify.slack import SlackChannel
from gpuwatt.alerts.rules import Rule, load_rules, parse_rules
from gpuwatt.alerts.service import Evaluator
from gpuwatt.model import GpuSample
from gpuwatt.store.sqlite import SqliteStore
from gpuwatt.yamlfile import load_text

HOT_RULE = """
rules:
  - name: Hot
    kind: threshold
    metric: temperature_gpu_c
    aggregation: max
    window: 15s
    op: ">"
    threshold: 85
    for: 30s
    keep_firing_for: 60s
    severity: critical
    summary: "{host} GPU {gpu} at {value:.0f} °C"
"""

TempFn = Callable[[float, str, int], float | None]  # (t_s, host, gpu) -> °C, None = silent


def sample(t_s: float, host: str, gpu: int, temp_c: float) -> GpuSample:
    return GpuSample(T0_NS + round(t_s * NS_PER_S), host, gpu, f"GPU-{host}-{gpu}",
                     "NVIDIA H100 80GB HBM3", temperature_gpu_c=temp_c)  # fmt: skip


class Rig:
    """Store + evaluator + Slack stand-in; ``run`` writes samples and evaluates on the clock."""

    def __init__(self, tmp: Path, rules: list[Rule], slack: SlackStandIn) -> None:
        self.tmp, self.rules, self.slack = tmp, rules, slack
        self.clock = ManualClock(T0_NS)
        self.store = SqliteStore(tmp / "store.db")
        self.t_s = 0.0
        self.open()

    def open(self) -> None:
        self.con = open_db(self.tmp / "alerts.db")
        channels = {"slack": SlackChannel("slack", self.slack.url, timeout_s=5)}
        self.ev = Evaluator(self.rules, self.store, self.con, channels=channels, routes=[],
                            clock=self.clock, cluster="c1")  # fmt: skip

    def restart(self) -> None:
        self.con.close()
        self.open()

    def close(self) -> None:
        self.con.close()
        self.store.close()

    def run(self, until_s: float, temp: TempFn, gpus: list[tuple[str, int]]) -> None:
        while self.t_s <= until_s:
            t = self.t_s
            batch = [sample(t, h, g, c) for h, g in gpus if (c := temp(t, h, g)) is not None]
            if batch:
                self.store.write_samples(batch)
            if round(t) % 15 == 0:
                self.clock.set_ns(T0_NS + round(t * NS_PER_S))
                self.ev.evaluate()
                self.ev.deliver()
            self.t_s += 5.0

    def sent(self) -> list[str]:
        return [b["text"] for b in self.slack.bodies]


@contextmanager
def rig(tmp: Path, rules_yaml: str = HOT_RULE, rules: list[Rule] | None = None) -> Iterator[Rig]:
    with SlackStandIn() as slack:
        r = Rig(tmp, rules or parse_rules(load_text(rules_yaml, "rules.yaml")), slack)
        try:
            yield r
        finally:
            r.close()


def flapping(t: float, host: str, gpu: int) -> float:
    if t < 60 or 400 <= t < 700 or t >= 1000:
        return 70.0
    if 150 <= t < 400 or 700 <= t < 1000:  # flaps: hot for 15 s, cool for 15 s ...
        return 90.0 if int(t // 15) % 2 == 0 else 70.0
    return 90.0


def test_flapping_signal_one_firing_and_one_resolved_per_episode(tmp_path: Path) -> None:
    with rig(tmp_path) as r:
        r.run(1300, flapping, [("node-0", 0)])
        sent = r.sent()
        history = [(h["from_state"], h["to_state"]) for h in reversed(r.ev.alerts.history())]
    assert sent == [
        "[FIRING:1] Hot (cluster=c1)\nFiring: node-0 GPU 0 at 90 °C",
        "[RESOLVED:1] Hot (cluster=c1)\nResolved: node-0 GPU 0 at 70 °C",
        "[FIRING:1] Hot (cluster=c1)\nFiring: node-0 GPU 0 at 90 °C",
        "[RESOLVED:1] Hot (cluster=c1)\nResolved: node-0 GPU 0 at 70 °C",
    ]
    assert history == [
        ("inactive", "pending"), ("pending", "firing"), ("firing", "resolved"),
        ("resolved", "pending"), ("pending", "firing"), ("firing", "resolved"),
    ]  # fmt: skip


def test_short_blip_stays_pending_and_sends_nothing(tmp_path: Path) -> None:
    with rig(tmp_path) as r:
        r.run(300, lambda t, h, g: 90.0 if 60 <= t < 70 else 70.0, [("node-0", 0)])
        sent, history = r.sent(), r.ev.alerts.history()
    assert sent == []
    assert [(h["from_state"], h["to_state"]) for h in reversed(history)] == [
        ("inactive", "pending"),
        ("pending", "inactive"),
    ]


def test_silence_suppresses_matching_alerts_and_nothing_else(tmp_path: Path) -> None:
    gpus = [("node-0", 0), ("node-1", 0), ("node-1", 1)]
    with rig(tmp_path) as r:
        with transaction(r.con):
            r.ev.silences.add(
                {"host": "node-0"},
                author="ana",
                comment="fan swap, ticket 42",
                starts_ns=T0_NS,
                ends_ns=T0_NS + 3600 * NS_PER_S,
                now_ns=T0_NS,
            )
        r.run(120, lambda t, h, g: 90.0 if (h, g) != ("node-1", 1) else 60.0, gpus)
        sent = r.sent()
        active = {a.labels["host"]: (a.state, a.suppressed) for a in r.ev.alerts.active()}
    assert sent == ["[FIRING:1] Hot (cluster=c1)\nFiring: node-1 GPU 0 at 90 °C"]
    assert active == {"node-0": ("firing", "silence:1"), "node-1": ("firing", "")}


def test_node_down_suppresses_its_gpu_alerts_and_raises_one_collector_down(
    tmp_path: Path,
) -> None:
    shipped = {r.name: r for r in load_rules()}
    rules = parse_rules(load_text(HOT_RULE, "rules.yaml"))
    rules += [shipped["CollectorDown"], shipped["GpuLostOrMissing"]]
    gpus = [(f"node-{h}", g) for h in range(2) for g in range(4)]

    def temp(t: float, host: str, gpu: int) -> float | None:
        if host == "node-0" and 120 <= t < 500:
            return None  # node-0's collector is silent
        return 90.0 if (host, gpu) == ("node-0", 0) and t < 120 else 70.0

    with rig(tmp_path, rules=rules) as r:
        r.run(600, temp, gpus)
        sent = r.sent()
        history = [(h["rule"], h["to_state"], h["at_ns"]) for h in reversed(r.ev.alerts.history())]
    down_summary = (
        "node-0: collector silent (no sample from node-0 for {} s); its GPU alerts are suppressed"
    )
    assert sent == [
        "[FIRING:1] Hot (cluster=c1)\nFiring: node-0 GPU 0 at 90 °C",
        "[FIRING:1] CollectorDown (cluster=c1)\nFiring: " + down_summary.format(155),
        "[RESOLVED:1] CollectorDown (cluster=c1)\nResolved: " + down_summary.format(380),
        "[RESOLVED:1] Hot (cluster=c1)\nResolved: node-0 GPU 0 at 70 °C",
    ]
    assert not any(rule == "GpuLostOrMissing" for rule, _, _ in history)


def test_restart_resends_nothing_and_forgets_nothing(tmp_path: Path) -> None:
    def hot(t: float, h: str, g: int) -> float:
        return 90.0 if 30 <= t < 300 else 70.0

    with rig(tmp_path) as r:
        r.run(150, hot, [("node-0", 0)])
        assert len(r.sent()) == 1
        r.restart()
        r.run(250, hot, [("node-0", 0)])
        assert len(r.sent()) == 1  # still firing: nothing re-sent after the restart
        r.restart()
        r.run(500, hot, [("node-0", 0)])
        sent = r.sent()
        rows = r.ev.outbox.entries()
    assert [s.split("\n")[0] for s in sent] == ["[FIRING:1] Hot (cluster=c1)",
                                                "[RESOLVED:1] Hot (cluster=c1)"]  # fmt: skip
    assert [(e.state, e.attempts) for e in rows] == [("sent", 1), ("sent", 1)]


def test_scheduler_wiring_starts_and_stops_without_waiting(tmp_path: Path) -> None:
    import threading

    from gpuwatt.alerts.service import run

    with rig(tmp_path) as r:
        stop = threading.Event()
        stop.set()  # returns at once: checks the APScheduler wiring, never waits for a job
        run(r.ev, evaluation_interval_s=15.0, stop=stop)
