"""Small building blocks shared by the pages (Dash components; no data access)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dash_mantine_components as dmc
from dash import dcc, html

from gpuwatt.analytics import Figure, Quality
from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.figures import Fig
from gpuwatt.dashboard.timerange import PRESETS, TimeRange

REFRESH_CHOICES: tuple[str, ...] = ("off", "5s", "10s", "30s", "60s", "5m")
DEFAULT_REFRESH = "60s"
_REFRESH_MS = {"off": 0, "5s": 5_000, "10s": 10_000, "30s": 30_000, "60s": 60_000, "5m": 300_000}
#: Pages whose data is one node's (cheap to re-read): the only ones offered refresh below 30 s.
FAST_REFRESH_PAGES = frozenset({"node"})
_GRAPH_SEQ = itertools.count()

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


def refresh_ms(query: Mapping[str, str], page: str = "") -> int:
    """The auto-refresh period the URL asks for; below 30 s only on a node view (a cluster
    page at 1,000 GPUs re-analyses the whole range: 5 s would keep a core busy)."""
    ms = _REFRESH_MS.get(query.get("refresh", DEFAULT_REFRESH), _REFRESH_MS[DEFAULT_REFRESH])
    if 0 < ms < 30_000 and page not in FAST_REFRESH_PAGES:
        return 30_000
    return ms


def refresh_choices(page: str) -> tuple[str, ...]:
    if page in FAST_REFRESH_PAGES:
        return REFRESH_CHOICES
    return tuple(r for r in REFRESH_CHOICES if not 0 < _REFRESH_MS[r] < 30_000)


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
    choices = refresh_choices(page)
    refresh = query.get("refresh", DEFAULT_REFRESH)
    refresh = refresh if refresh in choices else DEFAULT_REFRESH
    interval = refresh_ms(query, page)
    fixed = "from" in query or "end" in query
    controls = dmc.Group(
        [
            dmc.Tooltip(
                dmc.SegmentedControl(
                    id="range-picker", data=list(PRESETS), value=preset, size="xs"
                ),
                label="time range (kept in the URL: share the link). "
                "Drag across any time chart to zoom in.",
                multiline=True,
                w=260,
            ),
            range_inputs(query),
            dmc.Button(
                "back to live",
                id="range-live",
                size="compact-xs",
                variant="light",
                display="inline-block" if fixed else "none",
            ),
            dmc.Select(
                id="refresh-picker",
                data=[{"value": r, "label": f"refresh {r}"} for r in choices],
                value=refresh,
                size="xs",
                w=120,
                allowDeselect=False,
            ),
        ],
        gap="xs",
        className="gw-controls",
    )
    return html.Div(
        [
            dmc.Group(
                [dmc.Title(title, order=2), controls],
                justify="space-between",
                mb="sm",
                className="gw-page-head",
            ),
            dcc.Store(id=f"{page}-args", data=dict(query)),
            dcc.Interval(
                id=f"{page}-refresh", interval=max(interval, 1000), disabled=interval == 0
            ),
            *extra,
            # "reading the store: 3 of 8 reads done" while the content's reads run (the tick
            # runs only then: see ``app._register_callbacks``)
            html.Div(
                html.Div(id=f"{page}-progress", className="gw-progress"),
                id=f"{page}-progress-box",
            ),
            dcc.Interval(id=f"{page}-progress-tick", interval=PROGRESS_TICK_MS),
            # While the content is recomputed (a refresh, a new range) the old content stays
            # visible, dimmed, and takes clicks: hiding it (Dash's default) lost a click or
            # closed a dropdown that landed during a refresh. The spinner's layer lets clicks
            # through (gpuwatt.css, ``.gw-loading``).
            dcc.Loading(
                html.Div(id=f"{page}-content"),
                id=f"{page}-loading",
                type="dot",
                delay_show=300,
                overlay_style=LOADING_OVERLAY,
                parent_className="gw-loading",
            ),
        ]
    )


#: The content under the loading spinner: visible and dimmed (Dash hides it by default).
LOADING_OVERLAY = {"visibility": "visible", "opacity": 0.55, "transition": "opacity 0.2s"}

#: How often a page asks how far its reads have come while they run.
PROGRESS_TICK_MS = 500


def range_inputs(query: Mapping[str, str]) -> Any:
    """A custom from/to range (UTC; ISO 8601 or epoch seconds), applied to the URL."""
    return dmc.Popover(
        [
            dmc.PopoverTarget(
                dmc.Button("from / to", id="range-custom", size="compact-xs", variant="default")
            ),
            dmc.PopoverDropdown(
                dmc.Stack(
                    [
                        dmc.TextInput(
                            id="range-from",
                            label="from (UTC)",
                            placeholder="2026-01-01 08:00",
                            value=query.get("from", ""),
                            size="xs",
                        ),
                        dmc.TextInput(
                            id="range-to",
                            label="to (UTC, empty: now)",
                            placeholder="2026-01-01 12:00",
                            value=query.get("to", ""),
                            size="xs",
                        ),
                        dmc.Button("apply", id="range-apply", size="compact-sm"),
                    ],
                    gap=6,
                )
            ),
        ],
        position="bottom-end",
        withArrow=True,
        shadow="md",
        trapFocus=False,
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


def figure_text(value: float | None, unit: str) -> str:
    """An analytics figure's value with its unit, SI-prefixed where the unit takes one."""
    if value is None:
        return fmt.NA
    if unit == "kWh":
        return fmt.energy_kwh(value)
    if unit == "W":
        return fmt.watts(value)
    if unit == "TFLOPS":
        return fmt.tflops(value)
    if unit == "kg":
        return fmt.mass_kg(value)
    if unit in ("%", "°C"):
        return f"{fmt.plain(value)} {unit}"
    if unit == "TFLOPS/W":
        return fmt.tflops_per_w(value)
    if len(unit) == 3 and unit.isupper():  # a currency code
        return fmt.money(value, unit)
    return f"{fmt.plain(value)} {unit}".strip()


def figure_kpi(label: str, fig: Figure, help_text: str) -> Any:
    """A KPI for an analytics ``Figure``: value, unit and its quality badge (or why absent)."""
    if fig.value is None:
        value = "n/a"
        help_text = f"{help_text} Not available: {fig.reason or 'no data'}."
    else:
        value = figure_text(fig.value, fig.unit)
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


#: Plotly's mode bar: on hover only (CSS fades it in), without the buttons nobody here uses.
GRAPH_CONFIG: dict[str, Any] = {
    "displaylogo": False,
    "responsive": True,
    "displayModeBar": "hover",
    "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
}


def graph(fig: Fig, id_: str | None = None, *, zoom: bool = False) -> Any:
    """A plotly graph. ``zoom``: a chart over time whose x-axis span, when the user drags
    across it, becomes the view's range (the URL's from/to; see ``app``)."""
    config: Any = dict(GRAPH_CONFIG)
    if zoom:
        name = f"{id_ or _slug(_title(fig)) or 'chart'}-{next(_GRAPH_SEQ)}"  # unique on a page
        graph_id: Any = {"type": "zoom-graph", "name": name}
        wrapper: dict[str, Any] = {"id": id_} if id_ else {}
        return html.Div(
            dcc.Graph(figure=fig, config=config, className="gw-graph gw-zoom", id=graph_id),
            **wrapper,
        )
    kwargs: dict[str, Any] = {"id": id_} if id_ else {}
    return dcc.Graph(figure=fig, config=config, className="gw-graph", **kwargs)


def _title(fig: Fig) -> str:
    title = fig.get("layout", {}).get("title", {})
    return str(title.get("text", "")) if isinstance(title, dict) else str(title)


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


def straggler_banner(stragglers: Sequence[Any], link: Any, shown: int = 3) -> Any:
    """One line naming the active stragglers, on every page that does not list them anyway: at
    1,000 GPUs a per-node or per-job view must not average the slow GPU away. ``link(path,
    **params)`` builds a link that keeps the view's range."""
    if not stragglers:
        return None
    items: list[Any] = [dmc.Badge("straggler", color="red", variant="filled", size="sm")]
    for s in list(stragglers)[:shown]:
        cause = s.cause.replace("_", " ")
        items.append(
            dcc.Link(
                f"{s.host} GPU {s.gpu_index} ({cause}{', job ' + s.job_id if s.job_id else ''})",
                href=link("/node", host=s.host, gpu=str(s.gpu_index)),
                className="straggler-link",
            )
        )
    if len(stragglers) > shown:
        items.append(dcc.Link(f"and {len(stragglers) - shown} more", href=link("/stragglers")))
    return dmc.Group(items, gap="sm", mb="xs", id="straggler-banner")
