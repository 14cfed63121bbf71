"""Alerts: active (severity colours, links to the GPU and node), history, silences, notifications
not delivered; silence an alert and expire a silence from the page when the user is authenticated.

Writes are Dash callbacks (HTTP POSTs) and offered only when the dashboard runs with credentials
(``GPUWATT_DASHBOARD_USER``/``_PASSWORD``): with authentication off (a loopback bind) anyone who
can reach the port could silence alerts, so the page is read-only and says how to silence from
the command line instead. An evaluator or database that cannot be reached is "not connected",
never "none".
"""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
from dash import dcc, html

from gpuwatt.dashboard.alerts_hook import AlertView
from gpuwatt.dashboard.components import page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.timerange import fmt_ns

PAGE = "alerts"
PATH = "/alerts"
NAME = "Alerts"
ORDER = 6
NEEDS_DATA = False
SEVERITY_COLOR = {"critical": "red", "warning": "orange", "info": "blue"}
#: The labels that pick out one alert for a silence from the page.
SILENCE_KEYS = ("alertname", "host", "gpu")
SILENCE_FOR = (("1h", 3600), ("4h", 4 * 3600), ("24h", 86_400), ("7d", 7 * 86_400))
READ_ONLY_NOTE = (
    "Read-only: silencing from this page needs the dashboard's authentication "
    "(GPUWATT_DASHBOARD_USER and GPUWATT_DASHBOARD_PASSWORD). From a shell: "
    "`gpuwatt alerts silence --match host=node-3 --duration 2h --comment ...`."
)


def layout(**query: str) -> Any:
    # the outcome of a silence or an expiry (``alert_actions``) and the click that asked for it,
    # outside the redrawn content
    return page_frame(PAGE, NAME, query, html.Div(id="alerts-action"), dcc.Store(id="alerts-click"))


def silence_matchers(a: AlertView) -> dict[str, str]:
    """The labels a silence of this one alert matches (its rule, node and GPU)."""
    out = {k: a.labels[k] for k in SILENCE_KEYS if a.labels.get(k)}
    out.setdefault("alertname", a.name)
    return out


def matchers_key(matchers: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(matchers.items()))


def parse_matchers_key(key: str) -> dict[str, str]:
    out = {}
    for part in key.split(","):
        name, sep, value = part.partition("=")
        if sep and name:
            out[name] = value
    return out


def target_link(ctx: PageContext, labels: dict[str, str]) -> Any:
    """A link to the alert's GPU (node page, GPU picked) or node; nothing for a cluster alert."""
    host = labels.get("host")
    if not host:
        return None
    gpu = labels.get("gpu")
    params = {"host": host, **({"gpu": gpu} if gpu and gpu.isdigit() else {})}
    text = f"{host} GPU {gpu}" if "gpu" in params else host
    return dcc.Link(text, href=ctx.link("/node", **params), className="gw-alert-target")


def alert_row(ctx: PageContext, a: AlertView, *, can_act: bool) -> Any:
    color = SEVERITY_COLOR.get(a.severity, "gray")
    bits: list[Any] = [
        dmc.Badge(a.severity, color=color, variant="filled", size="sm", w=80),
        dmc.Badge(a.state, color=color if a.state == "firing" else "gray", variant="light"),
        dmc.Text(a.name, fw=600, size="sm"),
    ]
    link = target_link(ctx, a.labels)
    if link is not None:
        bits.append(link)
    bits.append(dmc.Text(f"{a.summary} (since {fmt_ns(a.since_ns)} UTC)", size="sm"))
    if a.runbook_url:
        bits.append(html.A("runbook", href=a.runbook_url, target="_blank", rel="noopener"))
    if can_act and a.state in ("firing", "pending"):
        key = matchers_key(silence_matchers(a))
        bits.append(
            dmc.Button(
                "silence",
                id={"type": "alert-silence", "m": key},
                size="compact-xs",
                variant="light",
                color="gray",
            )
        )
    return dmc.Group(bits, gap="xs", wrap="wrap", className=f"gw-alert gw-alert-{a.severity}")


def _rows(ctx: PageContext, alerts: list[AlertView], id_: str, *, can_act: bool = False) -> Any:
    if not alerts:
        return dmc.Text("none", c="dimmed", id=f"{id_}-none")
    return dmc.Stack([alert_row(ctx, a, can_act=can_act) for a in alerts], gap=4, id=id_)


def not_connected(reason: str) -> Any:
    return dmc.Alert(
        f"{reason} Active alerts, history and silences show here once the evaluator's database "
        "can be read; until then this page cannot say whether anything fires.",
        title="alerts not connected",
        color="orange",
        id="alerts-not-connected",
    )


def actions_bar(can_act: bool) -> Any:
    if not can_act:
        return dmc.Text(READ_ONLY_NOTE, size="xs", c="dimmed", id="alerts-read-only")
    return dmc.Group(
        [
            dmc.Select(
                id="silence-for",
                label="silence for",
                data=[label for label, _ in SILENCE_FOR],
                value="1h",
                allowDeselect=False,
                size="xs",
                w=90,
                # the live refresh redraws this bar: what the user chose or typed stays
                persistence=True,
                persistence_type="memory",
            ),
            dmc.TextInput(
                id="silence-comment",
                label="comment",
                placeholder="why (kept with the silence)",
                size="xs",
                w=320,
                persistence=True,
                persistence_type="memory",
            ),
        ],
        gap="sm",
        align="end",
        mb="xs",
    )


def render(ctx: PageContext) -> list[Any]:
    can_act = ctx.can_act
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
    try:
        active = ctx.alerts.active()
        history = ctx.alerts.history(ctx.range.start_ns, ctx.range.end_ns)
        silences_of = getattr(ctx.alerts, "silences", None)
        silences = silences_of() if silences_of is not None else None
        deliveries_of = getattr(ctx.alerts, "deliveries", None)
        deliveries = deliveries_of() if deliveries_of is not None else None
    except Exception as exc:  # unreachable, unreadable: said, never shown as "none"
        return [not_connected(str(exc)[:300] or type(exc).__name__)]
    out = [
        actions_bar(can_act),
        section("Active", _rows(ctx, active, "alerts-active", can_act=can_act)),
        section("History", _rows(ctx, history, "alerts-history")),
    ]
    if silences is not None:
        out.append(
            section("Silences and maintenance windows", _silence_rows(silences, can_act=can_act))
        )
    if deliveries is not None:
        out.append(section("Notifications not delivered", _delivery_rows(deliveries)))
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


def _silence_rows(silences: list[Any], *, can_act: bool = False) -> Any:
    if not silences:
        return dmc.Text("none", c="dimmed", id="silences-none")
    rows = []
    for s in silences:
        text = dmc.Text(
            f"{s.kind} {', '.join(f'{k}={v}' for k, v in sorted(s.matchers.items()))}: "
            f"{fmt_ns(s.starts_ns)} - {fmt_ns(s.ends_ns)} UTC, by {s.author}: {s.comment}",
            size="sm",
        )
        bits = [text]
        if can_act and getattr(s, "id", None) is not None:
            bits.append(
                dmc.Button(
                    "expire",
                    id={"type": "silence-expire", "id": int(s.id)},
                    size="compact-xs",
                    variant="light",
                    color="gray",
                )
            )
        rows.append(dmc.Group(bits, gap="xs", className="gw-silence"))
    return dmc.Stack(rows, gap=2, id="silences")
