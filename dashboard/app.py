"""``create_app(store)``: the Dash application, built from an injected store (and clock).

Pages are registered with ``dash.register_page`` (layouts are static skeletons that read only the
URL's query); the data arrives through thin callbacks registered on *this* app, which parse the
range from the URL, fetch the cached ``WindowData`` and hand it to the page's ``render``.
The view's state (range, refresh, grouping, node) lives in the URL, so a link reproduces it.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import dash
import dash_mantine_components as dmc
from dash import ALL, Dash, Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from gpuwatt.analytics import Tariff
from gpuwatt.config import Config
from gpuwatt.dashboard import alert_actions, csv_export
from gpuwatt.dashboard.alerts_hook import AlertActions, AlertsSource, firing_count
from gpuwatt.dashboard.auth import Credentials, install_basic_auth
from gpuwatt.dashboard.components import (
    DEFAULT_REFRESH,
    empty_state,
    error_state,
    notice,
    range_line,
    straggler_banner,
)
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.data import DashboardData, DataError
from gpuwatt.dashboard.pages import (
    alerts,
    balance,
    efficiency,
    health,
    jobs,
    node,
    overview,
    reports,
    stragglers,
)
from gpuwatt.dashboard.read_cache import describe
from gpuwatt.dashboard.read_progress import view_key
from gpuwatt.dashboard.timerange import (
    DEFAULT_RANGE,
    MIN_SPAN_S,
    NS_PER_S,
    PRESETS,
    TimeRange,
    iso_s,
    parse_instant_ns,
    parse_range,
    query_dict,
    to_search,
)
from gpuwatt.dashboard.window_data import WindowData
from gpuwatt.dashboard.work_data import JobWorkSource
from gpuwatt.store.base import Store
from gpuwatt.store.job_steps import JobStepStore

log = logging.getLogger("gpuwatt.dashboard")

PAGES: tuple[ModuleType, ...] = (
    overview,
    balance,
    stragglers,
    efficiency,
    jobs,
    node,
    health,
    reports,
    alerts,
)
ASSETS = Path(__file__).parent / "assets"
RANGE_KEYS = ("range", "from", "to", "end", "refresh")
#: Pages visitors asked for this recently are drawn again each time their range is computed again
#: in the background (``redraw_viewed``).
REDRAW_VIEWED_S = 600.0


def _clock(now_ns: Callable[[], int] | int | None) -> Callable[[], int]:
    if now_ns is None:
        return time.time_ns
    if isinstance(now_ns, int):
        fixed = now_ns
        return lambda: fixed
    return now_ns


def tariff_from(config: Config | None) -> Tariff:
    if config is None:
        return Tariff()
    e = config.energy
    return Tariff(e.price_per_kwh, e.carbon_g_per_kwh, e.currency)


def _query(args: dict[str, Any] | None) -> dict[str, str]:
    """A page's args (its URL query) as text."""
    return {str(k): str(v) for k, v in (args or {}).items() if v is not None}


def render_page(
    page: ModuleType,
    args: dict[str, Any] | None,
    data: DashboardData,
    alerts_source: AlertsSource | None = None,
    work: JobWorkSource | None = None,
    *,
    can_act: bool = False,
) -> list[Any]:
    """The content of one page for the query in ``args``; never raises.

    A bad range is corrected and said; an unreachable store or an empty range becomes a
    message on the page; anything unexpected is logged as one line and shown as an error state.
    """
    query = _query(args)
    now = data.now_ns()
    tr, problem = parse_range(query, now)
    head = [*alerts_line(firing_count(alerts_source)), *range_line(tr, problem)]
    try:
        if getattr(page, "NEEDS_DATA", True):
            # what the page reads after the window, started before the window is read (the
            # page's ``prefetch`` only starts reads)
            prefetch = getattr(page, "prefetch", None)
            if prefetch is not None:
                prefetch(data, tr, query, now)
            win = data.window(tr)
            if win.empty:
                return [*head, empty_state()]
        else:
            win = None
        ctx = PageContext(data, win, tr, query, now, alerts_source, work, can_act)  # type: ignore[arg-type]
        if win is not None and win.partial is not None:  # the engine was too slow for all
            head.append(notice(win.partial.label, "yellow", title="Partial data", id_="partial"))
        if win is not None and getattr(page, "STRAGGLER_BANNER", True):
            banner = straggler_banner(win.active_stragglers, ctx.link)
            head += [banner] if banner is not None else []
        return [*head, *_drawn(page, ctx, data)]
    except DataError as exc:
        return [*head, error_state(exc.message)]
    except Exception as exc:  # a bug in one view must not take the page down
        log.error("page %s failed: %s: %s", page.PAGE, type(exc).__name__, str(exc)[:200])
        log.debug("page %s failed", page.PAGE, exc_info=True)
        return [*head, error_state(f"this view failed ({type(exc).__name__}); see the log")]


def render_inputs(page: ModuleType, ctx: PageContext) -> tuple[object, ...] | None:
    """What the page's content is drawn from, where the page says (``RENDERS_FROM_WINDOW``):
    the view's window, and the job-step source's results for it where the page draws from them
    too (``RENDERS_FROM_WORK``; the source caches them); None: not known, drawn every time
    (``render_cache``)."""
    if ctx.win is None or not getattr(page, "RENDERS_FROM_WINDOW", False):
        return None
    if ctx.work is None or not getattr(page, "RENDERS_FROM_WORK", False):
        return (ctx.win,)
    return (ctx.win, ctx.work.work(ctx.win), ctx.work.served(ctx.win))


def _drawn(page: ModuleType, ctx: PageContext, data: DashboardData) -> list[Any]:
    """The page's own content: as drawn before where it was drawn from the same objects
    (``render_inputs``, ``render_cache``), else drawn now."""
    inputs = render_inputs(page, ctx)
    if inputs is None:
        return list(page.render(ctx))
    return data.rendered.get(page.PAGE, inputs, ctx.query, lambda: page.render(ctx))


def redraw_viewed(
    data: DashboardData,
    alerts_source: AlertsSource | None,
    work: JobWorkSource | None,
    tr: TimeRange,
    win: WindowData,
) -> None:
    """After the live range ``tr`` was computed again in the background (its new window
    ``win``; ``DashboardData.on_recomputed``): the pages visitors asked for on it in the last
    ``REDRAW_VIEWED_S`` drawn from ``win``, so that their next request is served as drawn
    (``render_cache``), not drawn while the visitor waits. Nothing is read: only the pages' own
    content is drawn, not the lines above it (alerts firing, the range), which each request
    makes."""
    if win.empty:
        return
    pages = {p.PAGE: p for p in PAGES}
    span_ns = tr.end_ns - tr.start_ns
    now = data.now_ns()
    for name, query in data.rendered.viewed(REDRAW_VIEWED_S):
        r, _ = parse_range(query, now)
        if not (r.live and r.step_s == tr.step_s and r.end_ns - r.start_ns == span_ns):
            continue
        try:
            _drawn(pages[name], PageContext(data, win, r, query, now, alerts_source, work), data)
        except DataError:
            pass  # the page will say it when asked
        except Exception as exc:  # a bug in one view must not stop the others or the warmer
            log.error("page %s failed to draw after warming: %s", name, describe(exc))


def read_progress_text(data: DashboardData, args: dict[str, Any] | None) -> str:
    """How far the reads of the page's view have come ("" when none is in flight)."""
    query = {str(k): str(v) for k, v in (args or {}).items() if v is not None}
    tr, _ = parse_range(query, data.now_ns())
    return data.progress.text(view_key(tr))


def alerts_line(firing: int | None) -> list[Any]:
    """The count of firing alerts, at the top of every page (nothing when none fire)."""
    if not firing:
        return []
    return [
        dcc.Link(
            dmc.Badge(f"{firing} alert{'s' if firing != 1 else ''} firing", color="red"),
            href="/alerts",
            id="alerts-firing",
        )
    ]


def _not_found(**_query: str) -> Any:
    return dmc.Alert(
        dcc.Link("Back to the overview", href="/"),
        title="No such page",
        color="yellow",
        id="not-found",
    )


def _register_pages() -> None:
    for page in PAGES:
        dash.register_page(
            page.__name__,
            path=page.PATH,
            name=page.NAME,
            order=page.ORDER,
            title=f"gpuwatt · {page.NAME}",
            layout=page.layout,
        )
    dash.register_page("not_found_404", path="/404", layout=_not_found, title="gpuwatt")


def _shell() -> Any:
    """Title, page links and the theme switch. From Mantine's ``lg`` breakpoint (1200 px) the
    links are inline; below, one "pages" menu, so nothing overlaps at 800 px."""
    links = [
        dcc.Link(p.NAME, href=p.PATH, id={"type": "nav", "page": p.PAGE}, className="gw-nav")
        for p in PAGES
    ]
    nav = dmc.Group(links, gap="md", visibleFrom="lg", wrap="nowrap", className="gw-nav-row")
    menu = dmc.Menu(
        [
            dmc.MenuTarget(dmc.Button("pages", variant="default", size="xs", id="nav-menu")),
            dmc.MenuDropdown(
                [
                    dmc.MenuItem(p.NAME, href=p.PATH, id={"type": "nav-item", "page": p.PAGE})
                    for p in PAGES
                ]
            ),
        ],
        position="bottom-start",
    )
    header = dmc.Group(
        [
            dmc.Group(
                [dmc.Title("gpuwatt", order=3), nav, html.Div(menu, className="gw-nav-menu")],
                gap="lg",
                wrap="nowrap",
            ),
            dmc.Switch(id="dark-switch", label="dark", persistence=True, size="sm"),
        ],
        justify="space-between",
        wrap="nowrap",
        h="100%",
        px="md",
    )
    return dmc.MantineProvider(
        dmc.AppShell(
            [
                dmc.AppShellHeader(header),
                dmc.AppShellMain(html.Div(dash.page_container, className="gw-main")),
            ],
            header={"height": 56},
            padding="md",
        ),
        id="provider",
        forceColorScheme="light",
    )


def _url_param(app: Dash, component: str, param: str, default: str | None = None) -> None:
    """Changing ``component`` writes ``param`` into the URL (the page re-renders from it)."""

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input(component, "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def _update(value: str | None, search: str | None) -> str:
        if not value:
            raise PreventUpdate
        query = query_dict(search)
        if param == "range":
            for key in ("from", "to", "end"):
                query.pop(key, None)
        if query.get(param) == value or (param not in query and value == default):
            raise PreventUpdate  # a control announcing its initial value changes nothing
        query[param] = value
        return to_search(query)


#: (tick disabled, progress style): on and shown when the page's args or its refresh change...
PROGRESS_ON_JS = "function(args, n) { return [false, {}]; }"
#: ... off and hidden when the content arrives. Two callbacks, not one with both triggers: Dash
#: holds a callback whose input is the output of a pending one (the content) until that one
#: is done, and then fires it once with both triggers, which left the tick on for good after
#: the first refresh (two requests a second from every open page).
PROGRESS_OFF_JS = "function(children) { return [true, {display: 'none'}]; }"


def _register_callbacks(
    app: Dash,
    data: DashboardData,
    alerts_source: AlertsSource | None,
    work: JobWorkSource | None = None,
    can_act: bool = False,
) -> None:
    for page in PAGES:

        def make(page: ModuleType = page) -> None:
            @app.callback(
                Output(f"{page.PAGE}-content", "children"),
                Input(f"{page.PAGE}-args", "data"),
                Input(f"{page.PAGE}-refresh", "n_intervals"),
            )
            def _content(args: dict[str, Any] | None, _n: int | None) -> list[Any]:
                if getattr(page, "RENDERS_FROM_WINDOW", False):
                    data.rendered.note_view(page.PAGE, _query(args))
                return render_page(page, args, data, alerts_source, work, can_act=can_act)

            # The progress count is asked for only while the content is computed: the tick runs
            # from the page's first render, and from new args or a refresh, until the content
            # arrives; the count is hidden then. Switched in the browser: Dash's ``running=``
            # did this before, and with it clicks, drags and dropdowns now and then sent no
            # callback at all (the browser tests lost them; not since).
            app.clientside_callback(
                PROGRESS_ON_JS,
                Output(f"{page.PAGE}-progress-tick", "disabled"),
                Output(f"{page.PAGE}-progress-box", "style"),
                Input(f"{page.PAGE}-args", "data"),
                Input(f"{page.PAGE}-refresh", "n_intervals"),
            )
            app.clientside_callback(
                PROGRESS_OFF_JS,
                Output(f"{page.PAGE}-progress-tick", "disabled", allow_duplicate=True),
                Output(f"{page.PAGE}-progress-box", "style", allow_duplicate=True),
                Input(f"{page.PAGE}-content", "children"),
                prevent_initial_call=True,
            )

            @app.callback(
                Output(f"{page.PAGE}-progress", "children"),
                Input(f"{page.PAGE}-progress-tick", "n_intervals"),
                State(f"{page.PAGE}-args", "data"),
                prevent_initial_call=True,
            )
            def _progress(_n: int | None, args: dict[str, Any] | None) -> str:
                return read_progress_text(data, args)

        make()

    for page in PAGES:  # a page's own callbacks (the overview's "Energy today")
        register = getattr(page, "register", None)
        if register is not None:
            register(app, data)

    if can_act:
        alert_actions.register(app, alerts_source)  # type: ignore[arg-type]  # can_act: AlertActions

    _url_param(app, "range-picker", "range", DEFAULT_RANGE)
    _url_param(app, "refresh-picker", "refresh", DEFAULT_REFRESH)
    _url_param(app, "report-by", "by", "gpu")
    _url_param(app, "host-picker", "host")
    _url_param(app, "gpu-picker", "gpu")

    for kind in ("nav", "nav-item"):

        @app.callback(
            Output({"type": kind, "page": ALL}, "href"),
            Input("url", "search"),
            State({"type": kind, "page": ALL}, "id"),
        )
        def _nav(search: str | None, ids: list[dict[str, str]]) -> list[str]:
            query = query_dict(search)
            keep = to_search({k: v for k, v in query.items() if k in RANGE_KEYS})
            paths = {p.PAGE: p.PATH for p in PAGES}
            return [paths[i["page"]] + keep for i in ids]

    _register_range_callbacks(app)

    app.clientside_callback(
        "function(on) { return on ? 'dark' : 'light'; }",
        Output("provider", "forceColorScheme"),
        Input("dark-switch", "checked"),
    )


def zoom_query(relayout: dict[str, Any] | None, query: dict[str, str]) -> dict[str, str] | None:
    """The URL query after a drag across a time chart (plotly's ``relayoutData``): the span
    becomes ``from``/``to`` (UTC, whole seconds; at least ``MIN_SPAN_S``). None when the
    event is not a zoom of a time axis (autosize, a y-axis zoom, a double-click reset)."""
    if not relayout:
        return None
    lo = hi = None
    for key, value in relayout.items():
        if re.fullmatch(r"xaxis\d*\.range\[0\]", key):
            lo = value
        elif re.fullmatch(r"xaxis\d*\.range\[1\]", key):
            hi = value
        elif re.fullmatch(r"xaxis\d*\.range", key) and isinstance(value, list) and len(value) == 2:
            lo, hi = value
    if lo is None or hi is None:
        return None
    start, end = parse_instant_ns(str(lo)), parse_instant_ns(str(hi))
    if start is None or end is None or end <= start:
        return None
    if (end - start) < MIN_SPAN_S * NS_PER_S:
        mid = (start + end) // 2
        start, end = mid - MIN_SPAN_S * NS_PER_S // 2, mid + MIN_SPAN_S * NS_PER_S // 2
    out = {k: v for k, v in query.items() if k not in ("range", "end", "from", "to")}
    out["from"] = iso_s(start)
    out["to"] = iso_s(end)
    return out


#: In the browser: a drag across a time chart, as ``{"relayout": <plotly's relayoutData>, "at":
#: <ms>}`` in ``zoom-relayout`` (outside the pages' redrawn content); nothing for the other
#: relayout events. The charts are a pattern-matching input, so every redraw of a page fires the
#: callback they feed (autosize); when that was the server callback, a drag made while that
#: request was on its way sent nothing (lost three times in a row on a loaded machine, as clicks
#: on the alerts page were, which ``assets/alert_actions.js`` now relays from the document).
ZOOM_JS = """
function(_relayouts) {
    const axis = /^xaxis\\d*\\.range(\\[[01]\\])?$/;
    for (const t of window.dash_clientside.callback_context.triggered) {
        const v = t.value;
        if (v && typeof v === 'object' && Object.keys(v).some(k => axis.test(k))) {
            return {relayout: v, at: Date.now()};
        }
    }
    return window.dash_clientside.no_update;
}
"""


def _register_range_callbacks(app: Dash) -> None:
    """Zoom on any time chart, the custom from/to range, and back to live: all through the
    URL's query, from which the page re-renders."""
    app.clientside_callback(
        ZOOM_JS,
        Output("zoom-relayout", "data"),
        Input({"type": "zoom-graph", "name": ALL}, "relayoutData"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("zoom-relayout", "data"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def _zoom(zoom: dict[str, Any] | None, search: str | None) -> str:
        relayout = zoom.get("relayout") if isinstance(zoom, dict) else None
        query = zoom_query(relayout, query_dict(search))
        if query is None:
            raise PreventUpdate
        return to_search(query)

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("range-apply", "n_clicks"),
        State("range-from", "value"),
        State("range-to", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def _custom(n: int | None, start: str | None, end: str | None, search: str | None) -> str:
        if not n or not (start or "").strip():
            raise PreventUpdate
        query = {k: v for k, v in query_dict(search).items() if k not in ("range", "end", "to")}
        query["from"] = start.strip()  # type: ignore[union-attr]
        if (end or "").strip():
            query["to"] = end.strip()  # type: ignore[union-attr]
        return to_search(query)  # a time not understood is said on the page (parse_range)

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("range-live", "n_clicks"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def _live(n: int | None, search: str | None) -> str:
        if not n:
            raise PreventUpdate
        query = {k: v for k, v in query_dict(search).items() if k not in ("from", "to", "end")}
        if query.get("range") not in PRESETS:
            query.pop("range", None)
        return to_search(query)


def create_app(
    store: Store,
    *,
    now_ns: Callable[[], int] | int | None = None,
    config: Config | None = None,
    credentials: Credentials | None = None,
    alerts: AlertsSource | None = None,
    cache_ttl_s: float = 10.0,
    job_steps: JobStepStore | None = None,
) -> Dash:
    """The dashboard for ``store``. ``now_ns`` injects the clock (an int freezes it: tests).

    With ``credentials`` every request (pages, callbacks, assets, CSV routes) needs HTTP Basic
    authentication. ``alerts`` connects the alert evaluator (see ``gpuwatt.dashboard.alerts_hook``);
    ``job_steps`` the store of application-reported job steps (reported TFLOPS and MFU per job).
    The alerts page offers silence and expire only with ``credentials`` and an ``alerts`` source
    that implements ``AlertActions``; otherwise it is read-only.
    """
    data = DashboardData(
        store, clock_ns=_clock(now_ns), tariff=tariff_from(config), ttl_s=cache_ttl_s
    )
    app = Dash(
        __name__,
        use_pages=True,
        pages_folder="",
        assets_folder=str(ASSETS),
        title="gpuwatt",
        update_title=None,  # type: ignore[arg-type]  # Dash: None keeps the tab title
        suppress_callback_exceptions=True,
        serve_locally=True,
    )
    _register_pages()
    app.layout = html.Div(
        [dcc.Location(id="url", refresh="callback-nav"), dcc.Store(id="zoom-relayout"), _shell()]
    )
    work = None
    if job_steps is not None:
        precision = config.collector.tensor_precision if config is not None else "bf16"
        work = JobWorkSource(job_steps, tensor_precision=precision, ttl_s=cache_ttl_s)
    # Writes (silence, expire) only behind authentication: see gpuwatt.dashboard.alert_actions.
    can_act = credentials is not None and isinstance(alerts, AlertActions)
    _register_callbacks(app, data, alerts, work, can_act)
    csv_export.register_routes(app.server, data, work)
    if credentials is not None:
        install_basic_auth(app.server, credentials)
    data.on_recomputed = functools.partial(redraw_viewed, data, alerts, work)
    app.server.config["GPUWATT_DATA"] = data
    app.server.config["GPUWATT_WORK"] = work
    return app
