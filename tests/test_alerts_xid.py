"""The XID alert sees every sample's XIDs within its window, not only the newest sample's: a
collector samples every second and drains each XID into one sample, while the evaluator runs
every 15 s. On the embedded store, InfluxDB and VictoriaMetrics (Debian's servers on 127.0.0.1),
with the shipped rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaded_stores import store_fixture

from gpuwatt.alerts.evaluate import evaluate_rule
from gpuwatt.alerts.rules import EVENT_WINDOW_S, Rule, load_rules, parse_rules
from gpuwatt.model import GpuSample
from gpuwatt.yamlfile import load_text

NS = 1_000_000_000
T0 = 1_767_225_600 * NS
NOW = T0 + 59 * NS


def samples(make_sample: Callable[..., GpuSample]) -> list[GpuSample]:
    """A minute of 1-s samples of two GPUs: GPU 1 raises XID 79 at 20 s and GPU 0 XID 13
    (not critical) at 30 s, each in that one sample."""
    raised = {(20, 1): (79,), (30, 0): (13,)}
    return [
        make_sample(T0 + s * NS, "node1", g, xid_errors=raised.get((s, g), ()))
        for s in range(60)
        for g in (0, 1)
    ]


store = store_fixture(samples)


def shipped(name: str) -> Rule:
    (rule,) = [r for r in load_rules() if r.name == name]
    return rule


def rule(text: str) -> Rule:
    (r,) = parse_rules(load_text(text, "rules.yaml"))
    return r


def fired(rule: Rule, store: Any, now_ns: int = NOW) -> list[tuple[str, str, str]]:
    return [
        (o.target["host"], o.target["gpu"], o.detail)
        for o in evaluate_rule(rule, store, now_ns)
        if o.breach
    ]


def test_an_xid_in_a_sample_before_the_newest_fires(store: Any) -> None:
    # the newest samples (59 s) carry none: GPU 1's XID 79 is 39 s old
    assert fired(shipped("GpuCriticalXid"), store) == [("node1", "1", "XID 79")]


def test_codes_any_fires_for_every_gpu_that_raised_one(store: Any) -> None:
    any_xid = rule(
        "rules:\n  - {name: AnyXid, kind: event, codes: any, summary: '{host} {gpu}: {detail}'}\n"
    )
    assert sorted(fired(any_xid, store)) == [("node1", "0", "XID 13"), ("node1", "1", "XID 79")]


def test_an_xid_older_than_the_window_no_longer_fires(store: Any) -> None:
    critical = shipped("GpuCriticalXid")
    assert critical.query.window_s == EVENT_WINDOW_S  # type: ignore[union-attr]
    ends = T0 + 20 * NS + round(EVENT_WINDOW_S * NS)  # the window's start reaches the XID
    assert fired(critical, store, ends) == [("node1", "1", "XID 79")]
    assert fired(critical, store, ends + 1) == []
    short = rule("rules:\n  - {name: X, kind: event, codes: [79], window: 30s, summary: s}\n")
    assert fired(short, store) == []  # 39 s ago: outside 30 s
