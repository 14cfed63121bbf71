"""Silence an alert and expire a silence from the alerts page.

Registered only when the dashboard has credentials and its alerts source takes actions
(``alerts_hook.AlertActions``): every callback is then an HTTP POST behind HTTP Basic
authentication, and the silence's author is the authenticated user. Dash sends callbacks as
``application/json``, which a page on another origin cannot POST without a CORS preflight that
this server never grants. The outcome is said above the page's content, which is drawn again.
"""

from __future__ import annotations

import logging
from typing import Any

import dash_mantine_components as dmc
from dash import Dash, Input, Output, State
from dash.exceptions import PreventUpdate

from gpuwatt.dashboard.alerts_hook import AlertActions
from gpuwatt.dashboard.pages import alerts as alerts_page

log = logging.getLogger("gpuwatt.dashboard")
DEFAULT_COMMENT = "silenced from the dashboard"


def request_user() -> str:
    """The authenticated user of this request (HTTP Basic); "dashboard" outside a request."""
    from flask import has_request_context, request

    if has_request_context() and request.authorization and request.authorization.username:
        return str(request.authorization.username)[:64]
    return "dashboard"


def clicked(click: Any) -> dict[str, Any]:
    """The id of the button in ``alerts-click``; PreventUpdate if there is none."""
    trig = click.get("id") if isinstance(click, dict) else None
    if not isinstance(trig, dict):
        raise PreventUpdate
    return dict(trig)


def outcome(message: str, ok: bool) -> Any:
    return dmc.Alert(
        message,
        color="green" if ok else "red",
        id="alerts-action-result",
        withCloseButton=True,
        mb="sm",
    )


def register(app: Dash, actions: AlertActions) -> None:
    """One callback for both actions, fed by the clicks that ``assets/alert_actions.js`` relays
    into ``alerts-click`` (outside the redrawn content). Its outcome goes to
    ``alerts-action`` above the content, and it bumps the page's refresh counter so that the
    content is drawn again from the evaluator's database. Nothing but the page's own callback
    writes the content (no ``allow_duplicate`` outputs to keep apart)."""
    durations = dict(alerts_page.SILENCE_FOR)

    @app.callback(
        Output("alerts-action", "children"),
        Output("alerts-refresh", "n_intervals"),
        Input("alerts-click", "data"),
        State("silence-for", "value"),
        State("silence-comment", "value"),
        State("alerts-refresh", "n_intervals"),
        prevent_initial_call=True,
    )
    def _act(
        click: dict[str, Any] | None,
        for_: str | None,
        comment: str | None,
        refreshes: int | None,
    ) -> tuple[Any, int]:
        trig = clicked(click)
        if trig.get("type") == "alert-silence":
            head = _silence(actions, trig, durations.get(for_ or "1h", 3600), for_, comment)
        else:
            head = _expire(actions, int(trig["id"]))
        return head, (refreshes or 0) + 1


def _silence(
    actions: AlertActions, trig: dict[str, Any], duration_s: int, for_: str | None,
    comment: str | None,
) -> Any:  # fmt: skip
    matchers = alerts_page.parse_matchers_key(str(trig.get("m", "")))
    text = (comment or "").strip()[:500] or DEFAULT_COMMENT
    user = request_user()
    try:
        sid = actions.silence(matchers, duration_s=duration_s, author=user, comment=text)
    except Exception as exc:  # a bad matcher, the database gone: said on the page
        log.warning("silence from the dashboard failed: %s", str(exc)[:200])
        return outcome(f"not silenced: {str(exc)[:200]}", False)
    log.info("silence %s created from the dashboard by %s", sid, user)
    key = alerts_page.matchers_key(matchers)
    return outcome(f"silence {sid} created for {for_ or '1h'}: {key}", True)


def _expire(actions: AlertActions, sid: int) -> Any:
    try:
        actions.expire(sid)
    except Exception as exc:
        log.warning("expiring silence %s failed: %s", sid, str(exc)[:200])
        return outcome(f"silence {sid} not expired: {str(exc)[:200]}", False)
    log.info("silence %s expired from the dashboard by %s", sid, request_user())
    return outcome(f"silence {sid} expired", True)
