"""Served pages are not drawn again (``dashboard/render_cache.py``): a page whose content comes
from its view's window (and the job-step source's results) is drawn once per window object, the
same content as a fresh drawing; a refreshed window, another query or another page draws again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plotly.utils
import pytest
from test_dashboard_support import DEMO_END_NS, build_demo_store, content_body, demo_job_steps

from gpuwatt.dashboard.app import PAGES, create_app, render_page
from gpuwatt.dashboard.pages import balance, health, jobs
from gpuwatt.dashboard.render_cache import RenderCache
from gpuwatt.store.sqlite import SqliteStore


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqliteStore]:
    store = build_demo_store(tmp_path_factory.mktemp("render") / "demo.db", minutes=15)
    yield store
    store.close()


def _json(component: Any) -> str:
    return json.dumps(component, cls=plotly.utils.PlotlyJSONEncoder)


def _numbered(text: str) -> str:
    """A drawing with its zoomable graphs' ids unnumbered (each drawing numbers them anew)."""
    return re.sub(r'("name": "[a-z0-9-]+)-\d+"', r'\1-N"', text)


def _content(client: Any, page: Any, query: dict[str, str]) -> str:
    resp = client.post("/_dash-update-component", json=content_body(page.PAGE, query))
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    return str(resp.get_data(as_text=True))


def test_the_cache_draws_once_per_input_objects_and_query() -> None:
    cache, drawn = RenderCache(max_entries=2), []

    def draw(tag: str) -> Any:
        return lambda: drawn.append(tag) or [tag]

    win, other = object(), object()
    assert cache.get("p", (win,), {"range": "1h"}, draw("a")) == ["a"]
    assert cache.get("p", (win,), {"range": "1h"}, draw("b")) == ["a"]  # kept
    assert cache.get("p", (other,), {"range": "1h"}, draw("c")) == ["c"]  # a new window
    assert cache.get("p", (win,), {"range": "6h"}, draw("d")) == ["d"]  # another query
    assert drawn == ["a", "c", "d"]
    # the oldest entry went (two kept): drawn again
    assert cache.get("p", (win,), {"range": "1h"}, draw("e")) == ["e"]
    # one more input object that is not the same: drawn again
    assert cache.get("p", (win, object()), {"range": "1h"}, draw("f")) == ["f"]
    cache.clear()
    assert cache.get("p", (win,), {"range": "6h"}, draw("g")) == ["g"]


def test_views_are_remembered_newest_first_and_bounded() -> None:
    from gpuwatt.dashboard import render_cache

    cache = RenderCache()
    for i in range(render_cache.MAX_VIEWS + 10):
        cache.note_view("balance", {"range": f"{i + 1}h"})
    cache.note_view("balance", {"range": "1h"})  # asked again: kept as the newest
    views = cache.viewed(60.0)
    assert len(views) == render_cache.MAX_VIEWS
    assert views[-1] == ("balance", {"range": "1h"}) and ("balance", {"range": "2h"}) not in views
    assert cache.viewed(-1.0) == []  # older than asked for: forgotten


class _Window:
    """Takes a weak reference, as ``WindowData`` does."""


def test_a_drawing_does_not_keep_its_window_in_memory() -> None:
    import gc
    import weakref

    cache = RenderCache()
    win, steps = _Window(), [1, 2]  # a window, and job-step results (no weak reference)
    gone = weakref.ref(win)
    assert cache.get("p", (win, steps), {}, lambda: ["a"]) == ["a"]
    assert cache.get("p", (win, steps), {}, lambda: ["not drawn"]) == ["a"]
    del win
    gc.collect()
    assert gone() is None  # freed although its drawing was kept
    # a new window (whatever its id) is drawn, and the freed window's entry is dropped
    assert cache.get("p", (_Window(), steps), {}, lambda: ["b"]) == ["b"]
    assert len(cache._entries) == 1


def test_a_served_page_is_drawn_once_per_window_and_the_same_as_drawn_afresh(
    demo_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(demo_store, now_ns=DEMO_END_NS, cache_ttl_s=3600.0)
    client = app.server.test_client()
    data = app.server.config["GPUWATT_DATA"]
    calls: list[str] = []
    for page in (balance, jobs, health):
        real = page.render
        monkeypatch.setattr(
            page, "render", lambda ctx, real=real, p=page: calls.append(p.PAGE) or real(ctx)
        )
    query = {"range": "15m"}
    first = _content(client, balance, query)
    again = _content(client, balance, query)
    assert first == again and calls == ["balance"]
    # the content is what a new drawing from the same window gives
    data.rendered.clear()
    fresh = _json(render_page(balance, query, data))
    assert calls == ["balance", "balance"]
    served = json.dumps(json.loads(again)["response"]["balance-content"]["children"])
    assert '-N"' in _numbered(served)  # the graphs' ids were there to unnumber
    assert _numbered(json.dumps(json.loads(fresh))) == _numbered(served)
    # another query draws again; a page without RENDERS_FROM_WINDOW is drawn every time
    _content(client, balance, {"range": "1h"})
    _content(client, health, query)
    _content(client, health, query)
    assert calls.count("health") == 2 and calls.count("balance") == 3
    # a refreshed window (a new object) draws again
    data.cache.clear()
    _content(client, balance, query)
    assert calls.count("balance") == 4
    # the jobs page is kept with the window and the job-step source's results
    _content(client, jobs, query)
    _content(client, jobs, query)
    assert calls.count("jobs") == 1


def test_the_jobs_page_is_drawn_again_when_the_job_steps_are_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept with the job-step source's results as well: once they are read again (its cache
    expired), the page is drawn again although the window is the same."""
    store = build_demo_store(tmp_path / "demo.db", minutes=15, job_steps=True)
    steps = demo_job_steps(tmp_path / "demo.db")
    try:
        app = create_app(store, now_ns=DEMO_END_NS, cache_ttl_s=3600.0, job_steps=steps)
        client = app.server.test_client()
        calls: list[str] = []
        real = jobs.render
        monkeypatch.setattr(jobs, "render", lambda ctx: calls.append("jobs") or real(ctx))
        query = {"range": "15m", "job": "llm-pretrain"}
        first = _content(client, jobs, query)
        assert "llm-pretrain" in first and _content(client, jobs, query) == first
        assert calls == ["jobs"]
        # as when the job-step source's cache has expired: read again, new objects
        app.server.config["GPUWATT_WORK"]._cache.clear()
        _content(client, jobs, query)
        assert calls == ["jobs", "jobs"]
    finally:
        steps.close()
        store.close()


def test_the_warmer_draws_the_viewed_pages_of_a_range_it_computed_again(
    demo_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the warmer has computed a live range again, the pages visitors asked for on it
    are drawn from the new window at once: their next request is served as drawn. Pages not
    asked for, and other ranges' pages, are not drawn."""
    from gpuwatt.dashboard.pages import stragglers
    from gpuwatt.dashboard.timerange import parse_range

    app = create_app(demo_store, now_ns=DEMO_END_NS, cache_ttl_s=3600.0)
    client = app.server.test_client()
    data = app.server.config["GPUWATT_DATA"]
    calls: list[str] = []
    for page in (balance, stragglers):
        real = page.render
        monkeypatch.setattr(
            page, "render", lambda ctx, real=real, p=page: calls.append(p.PAGE) or real(ctx)
        )
    _content(client, balance, {"range": "15m"})
    _content(client, stragglers, {"range": "1h"})
    assert calls == ["balance", "stragglers"]
    before = data.window(parse_range({"range": "15m"}, DEMO_END_NS)[0])
    data._warm(parse_range({"range": "15m"}, DEMO_END_NS)[0])  # what the warmer does
    assert data.window(parse_range({"range": "15m"}, DEMO_END_NS)[0]) is not before
    assert calls == ["balance", "stragglers", "balance"]  # drawn by the warmer, for 15m only
    served = _content(client, balance, {"range": "15m"})
    assert calls == ["balance", "stragglers", "balance"] and "balance-content" in served
    # a range the warmer failed to compute again: nothing drawn, nothing read again
    from gpuwatt.dashboard.read_cache import DataError

    tried: list[Any] = []

    def unreachable(tr: Any) -> Any:
        tried.append(tr)
        raise DataError("store not reachable", unreachable=True)

    monkeypatch.setattr(data, "_window", unreachable)
    data.cache.clear()
    data._warm(parse_range({"range": "15m"}, DEMO_END_NS)[0])
    assert calls == ["balance", "stragglers", "balance"] and len(tried) == 1


def test_a_stale_view_refreshed_in_the_background_is_drawn_there_too(
    demo_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view older than the cache's ttl is served as it was and computed again in the
    background; the viewed pages are drawn from the new window there, so the next request
    finds them drawn (as after the warmer)."""
    import time

    app = create_app(demo_store, now_ns=DEMO_END_NS, cache_ttl_s=2.0)
    client = app.server.test_client()
    data = app.server.config["GPUWATT_DATA"]
    calls: list[str] = []
    real = balance.render
    monkeypatch.setattr(balance, "render", lambda ctx: calls.append("balance") or real(ctx))
    _content(client, balance, {"range": "15m"})  # cold: drawn for the request
    time.sleep(2.1)
    _content(client, balance, {"range": "15m"})  # stale: served as drawn, refreshed behind
    deadline = time.monotonic() + 30
    while (data.cache.refreshing or len(calls) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == ["balance", "balance"]  # the second drawing: in the refresh
    _content(client, balance, {"range": "15m"})  # the new window, fresh: served as drawn
    assert calls == ["balance", "balance"]


def test_a_live_views_job_step_results_are_kept_while_it_is_served(tmp_path: Path) -> None:
    """The job-step source computes a live view's results once (a view computed again has a
    new end, and gets its own); a fixed range's are read again after the source's ttl."""
    from gpuwatt.dashboard.data import DashboardData
    from gpuwatt.dashboard.timerange import parse_range
    from gpuwatt.dashboard.work_data import JobWorkSource

    store = build_demo_store(tmp_path / "demo.db", minutes=15, job_steps=True)
    steps = demo_job_steps(tmp_path / "demo.db")
    try:
        data = DashboardData(store, clock_ns=lambda: DEMO_END_NS)
        work = JobWorkSource(steps, ttl_s=0.0)  # every result older than its ttl
        live = data.window(parse_range({"range": "15m"}, DEMO_END_NS)[0])
        fixed = data.window(
            parse_range({"from": "2026-01-01T00:05:00Z", "to": "2026-01-01T00:20:00Z"}, 0)[0]
        )
        assert live.range.live and not fixed.range.live
        assert work.work(live) and work.work(live) is work.work(live)
        assert work.work(fixed) is not work.work(fixed)
    finally:
        steps.close()
        store.close()


def test_every_page_that_says_so_draws_only_from_its_window() -> None:
    """A page kept by the cache reads nothing but its context's window, query, range step and
    the job-step source (``RENDERS_FROM_WORK``): no other read of the store, nor the
    clock, nor the range's ends (a live range's move with every request; its step does not)."""
    import inspect

    for page in PAGES:
        if not getattr(page, "RENDERS_FROM_WINDOW", False):
            continue
        source = inspect.getsource(page)
        assert "ctx.data" not in source and "ctx.now_ns" not in source, page.PAGE
        assert "ctx.alerts" not in source and "ctx.can_act" not in source, page.PAGE
        uses = set(re.findall(r"ctx\.range\.?[a-z_]*", source))
        assert uses <= {"ctx.range.step_s"}, (page.PAGE, uses)
        if "ctx.work" in source:
            assert getattr(page, "RENDERS_FROM_WORK", False), page.PAGE
