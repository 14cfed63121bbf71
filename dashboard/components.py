"""Small building blocks shared by the pages (Dash components; no data access)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dash_mantine_components as dmc
from dash import dcc, html

from gpuwatt.analytics import Figure, Quality
from gpuwatt.dashboard.figures import Fig
from gpuwatt.dashboard.timerange import PRESETS, TimeRange

REFRESH_CHOICES: tuple[str, ...] = ("off", "30s", "60s", "5m")
DEFAULT_REFRESH = "60s"
_REFRESH_MS = {"off": 0, "30s": 30_000, "60s": 60_000, "5m": 300_000}

QUALITY_TEXT: dict[str, str] = {
    Quality.MEASURED.value: "measured",
    Quality.MEASURED_COUNTER.value: "measured (energy counter)",
    Quality.INTEGRATED_POWER.value: "estimated (power integrated over time)",
    Quality.GPM_ESTIMATE.value: "estimated (GPM pipe activity x peak)",
    Quality.MODEL_ESTIMATE.value: "estimated (a model over measured inputs)",
    Quality.REPORTED.value: "reported by the application",
    Quality.UPPER_BOUND.value: "upper bound (SM activity x tensor peak)",
    Quality.NOT_AVAILABLE.value: "not available",
}
QUALITY_SHORT: dict[str, str] = {
    Quality.MEASURED.value: "measured",
    Quality.MEASURED_COUNTER.value: "measured",
    Quality.INTEGRATED_POWER.value: "estimated",
    Quality.GPM_ESTIMATE.value: "estimated",
    Quality.MODEL_ESTIMATE.value: "estimated",
    Quality.REPORTED.value: "reported",
    Quality.UPPER_BOUND.value: "upper bound",
    Quality.NOT_AVAILABLE.value: "not available",
}
QUALITY_COLOR: dict[str, str] = {
    Quality.MEASURED.value: "green",
    Quality.MEASURED_COUNTER.value: "green",
    Quality.INTEGRATED_POWER.value: "yellow",
    Quality.GPM_ESTIMATE.value: "yellow",
    Quality.MODEL_ESTIMATE.value: "yellow",
    Quality.REPORTED.value: "green",
    Quality.UPPER_BOUND.value: "orange",
    Quality.NOT_AVAILABLE.value: "gray",
}


def refresh_ms(query: Mapping[str, str]) -> int:
    return _REFRESH_MS.get(query.get("refresh", DEFAULT_REFRESH), _REFRESH_MS[DEFAULT_REFRESH])


def page_frame(page: str, title: str, query: Mapping[str, str], *extra: Any) -> html.Div:
    """The skeleton every page shares: title, range controls, a loading area for the content.

    The page's content callback fires on ``<page>-args`` (the URL's query, set when the page is
    rendered) and on the auto-refresh interval.
    """
    preset = query.get("range") if query.get("range") in PRESETS else None
    if "from" in query or "end" in query:
        preset = None
    if not query.get("range") and "from" not in query:
        preset = "1h"
    refresh = query.get("refresh", DEFAULT_REFRESH)
    interval = refresh_ms(query)
    return html.Div(
        [
            dmc.Group(
                [
                    dmc.Title(title, order=2),
                    dmc.Group(
                        [
                            dmc.Tooltip(
                                dmc.SegmentedControl(
                                    id="range-picker",
                                    data=list(PRESETS),
                                    value=preset,
                                    size="xs",
                                ),
                                label="time range (kept in the URL: share the link)",
                            ),
                            dmc.Select(
                                id="refresh-picker",
                                data=[
                                    {"value": r, "label": f"refresh {r}"} for r in REFRESH_CHOICES
                                ],
                                value=refresh if refresh in REFRESH_CHOICES else DEFAULT_REFRESH,
                                size="xs",
                                w=130,
                                allowDeselect=False,
                            ),
                        ],
                        gap="sm",
                    ),
                ],
                justify="space-between",
                mb="sm",
            ),
            dcc.Store(id=f"{page}-args", data=dict(query)),
            dcc.Interval(
                id=f"{page}-refresh", interval=max(interval, 1000), disabled=interval == 0
            ),
            *extra,
            dcc.Loading(html.Div(id=f"{page}-content"), type="dot", delay_show=300),
        ]
    )


def range_line(tr: TimeRange, problem: str | None) -> list[Any]:
    out: list[Any] = [
        dmc.Text(f"{tr.label}, {bucket_text(tr.step_s)} buckets", size="sm", c="dimmed", mb="xs")
    ]
    if problem:
        out.insert(0, notice(problem, "yellow", title="URL not understood", id_="range-problem"))
    return out


def bucket_text(step_s: int) -> str:
    if step_s % 3600 == 0:
        return f"{step_s // 3600}-hour"
    return f"{step_s // 60}-minute"


def notice(message: str, color: str, *, title: str, id_: str | None = None) -> dmc.Alert:
    kwargs: dict[str, Any] = {"id": id_} if id_ else {}
    return dmc.Alert(message, title=title, color=color, mb="sm", **kwargs)


def empty_state(message: str = "no data in this range") -> dmc.Alert:
    return dmc.Alert(
        "Pick a longer range, or check that a collector is writing to this store.",
        title=message,
        color="gray",
        id="empty-state",
    )


def error_state(message: str) -> dmc.Alert:
    return dmc.Alert(message, title="cannot show this view", color="red", id="error-state")


def kpi(label: str, value: str, help_text: str, *, color: str | None = None, id_: str = "") -> Any:
    """A labelled number; the explanation of the metric appears on hover."""
    body = dmc.Paper(
        [
            dmc.Text(label, size="xs", c="dimmed", tt="uppercase", fw=700),
            dmc.Text(value, size="xl", fw=700, id=id_ or f"kpi-{_slug(label)}", **_color(color)),
        ],
        p="sm",
        withBorder=True,
        radius="md",
    )
    return dmc.Tooltip(body, label=help_text, multiline=True, w=320, withArrow=True)


def figure_kpi(label: str, fig: Figure, help_text: str, fmt: str = ".3g") -> Any:
    """A KPI for an analytics ``Figure``: value, unit and its quality badge (or why absent)."""
    if fig.value is None:
        value = "n/a"
        help_text = f"{help_text} Not available: {fig.reason or 'no data'}."
    else:
        value = f"{fig.value:{fmt}} {fig.unit}".strip()
        help_text = f"{help_text} Quality: {QUALITY_TEXT.get(fig.quality.value, fig.quality)}."
        if fig.reason:
            help_text += f" {fig.reason}."
    return dmc.Stack([kpi(label, value, help_text), quality_badge(fig.quality.value)], gap=2)


def quality_badge(quality: str, reason: str = "") -> Any:
    text = QUALITY_SHORT.get(quality, quality)
    reason = f"{QUALITY_TEXT.get(quality, quality)}. {reason}".strip(". ") if reason else ""
    reason = reason or QUALITY_TEXT.get(quality, quality)
    badge = dmc.Badge(text, color=QUALITY_COLOR.get(quality, "gray"), variant="light", size="sm")
    return dmc.Tooltip(badge, label=reason, multiline=True, w=300) if reason else badge


def data_table(
    head: Sequence[str], rows: Iterable[Sequence[Any]], *, id_: str | None = None, **props: Any
) -> dmc.Table:
    """A table as *one* Dash component (Mantine's ``data`` prop): cells are plain text.

    A table built from ``TableTr``/``TableTd`` children is one Dash component per cell, and
    the Dash renderer's start-up and every store update cost time per component (a 20-row
    report preview was ~370 components, about a second of main-thread time in Chromium).
    """
    data: dict[str, Any] = {"body": [["" if v is None else str(v) for v in row] for row in rows]}
    if len(head):
        data["head"] = [str(h) for h in head]
    kwargs: dict[str, Any] = {"id": id_} if id_ else {}
    return dmc.Table(data=data, **kwargs, **props)


def graph(fig: Fig, id_: str | None = None) -> Any:
    kwargs: dict[str, Any] = {"id": id_} if id_ else {}
    return dcc.Graph(
        figure=fig,
        config={"displaylogo": False, "responsive": True},
        className="gw-graph",
        **kwargs,
    )


def section(title: str, *children: Any, help_text: str = "") -> Any:
    head: Any = dmc.Title(title, order=4)
    if help_text:
        head = dmc.Tooltip(head, label=help_text, multiline=True, w=360, position="top-start")
    return dmc.Paper([head, *children], p="md", withBorder=True, radius="md", mb="md")


def _color(color: str | None) -> dict[str, str]:
    """``c=`` only when set: a null color prop is an error in Mantine."""
    return {"c": color} if color else {}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
