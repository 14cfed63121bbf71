"""Alerts: active, history, silences (from the alert evaluator once one is connected)."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc

from gpuwatt.dashboard.components import page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.timerange import fmt_ns

PAGE = "alerts"
PATH = "/alerts"
NAME = "Alerts"
ORDER = 6
NEEDS_DATA = False


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


def _rows(alerts: list[Any]) -> Any:
    if not alerts:
        return dmc.Text("none", c="dimmed")
    return dmc.Stack(
        [
            dmc.Text(
                f"[{a.severity}] {a.state} since {fmt_ns(a.since_ns)} UTC: {a.name} - {a.summary}",
                size="sm",
            )
            for a in alerts
        ],
        gap=2,
    )


def render(ctx: PageContext) -> list[Any]:
    if ctx.alerts is None:
        return [
            dmc.Alert(
                "No alert evaluator is connected to this dashboard. Run `gpuwatt alerts` "
                "against the same store; its active alerts and history will show here.",
                title="alerts not connected",
                color="gray",
                id="alerts-placeholder",
            )
        ]
    out = [
        section("Active", _rows(ctx.alerts.active())),
        section("History", _rows(ctx.alerts.history(ctx.range.start_ns, ctx.range.end_ns))),
    ]
    silences = getattr(ctx.alerts, "silences", None)
    if silences is not None:
        out.append(section("Silences and maintenance windows", _silence_rows(silences())))
    deliveries = getattr(ctx.alerts, "deliveries", None)
    if deliveries is not None:
        out.append(section("Notifications not delivered", _delivery_rows(deliveries())))
    return out


def _delivery_rows(deliveries: list[Any]) -> Any:
    """Messages a channel owes (retrying) or gave up on (failed), with the channel's error."""
    if not deliveries:
        return dmc.Text("none: every notification went out", c="dimmed", id="deliveries-none")
    return dmc.Stack(
        [
            dmc.Text(
                f"{d.state} to {d.channel} after {d.attempts} attempt(s), queued "
                f"{fmt_ns(d.created_ns)} UTC: {d.error}",
                size="sm",
                c="red" if d.state == "failed" else "orange",
            )
            for d in deliveries
        ],
        gap=2,
        id="deliveries",
    )


def _silence_rows(silences: list[Any]) -> Any:
    if not silences:
        return dmc.Text("none", c="dimmed", id="silences-none")
    return dmc.Stack(
        [
            dmc.Text(
                f"{s.kind} {', '.join(f'{k}={v}' for k, v in sorted(s.matchers.items()))}: "
                f"{fmt_ns(s.starts_ns)} - {fmt_ns(s.ends_ns)} UTC, by {s.author}: {s.comment}",
                size="sm",
            )
            for s in silences
        ],
        gap=2,
        id="silences",
    )
