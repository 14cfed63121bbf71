"""The dashboard's content callbacks timed in-process, cold and served, for bench/dashboard.py
and bench/engine_compare.py (which runs them in a process of their own per store, as a
dashboard server runs alone in its process)."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from backfill import STRAGGLER

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_dashboard_support import content_body

from gpuwatt.dashboard.app import PAGES
from gpuwatt.dashboard.pages import overview
from gpuwatt.dashboard.timerange import DEFAULT_RANGE
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
#: 2026-01-01 20:00 UTC: the data end late in a day, as a page is mostly viewed (at midnight
#: the overview's "Energy today" covered a minute and cost nothing; at 20:00 it is 20 hours).
END_NS = (1_767_225_600 + 20 * 3600) * NS
STRAGGLER_JOB = f"train-{STRAGGLER[0] * 8 // 64:02d}"  # backfill: 8 jobs of 64 GPUs


def callback_body(page: Any, query: dict[str, str]) -> dict[str, Any]:
    return content_body(page.PAGE, query)


@dataclass(frozen=True)
class CallbackTimes:
    cold_median_s: float  # empty cache: a range no one has viewed (wall)
    cold_p95_s: float
    cold_cpu_median_s: float  # the same, CPU time of this process
    served_p95_s: float  # a range in the cache: kept warm, or viewed in the last few minutes
    size_bytes: int
    #: CPU of the engine's server per cold callback (median; NaN: the embedded store)
    cold_engine_cpu_median_s: float = float("nan")


def today_body() -> dict[str, Any]:
    """The request that fills the overview's "Energy today" when the page drew it without the
    figure (``pages.overview.register``)."""
    return {
        "output": f"{overview.TODAY_ID}.children",
        "outputs": {"id": overview.TODAY_ID, "property": "children"},
        "inputs": [{"id": overview.TODAY_ASK_ID, "property": "data", "value": END_NS}],
        "changedPropIds": [f"{overview.TODAY_ASK_ID}.data"],
        "state": [],
    }


def bench_pages() -> list[tuple[str, Callable[[dict[str, str]], dict[str, Any]]]]:
    """Every page's content request for a query, with the node page on the straggler's node
    and GPU, the jobs page's drill-down of the straggler's job beside the job list, and the
    overview's "Energy today", which a cold overview asks for in a request of its own."""
    out: list[tuple[str, Callable[[dict[str, str]], dict[str, Any]]]] = []
    for page in PAGES:
        out.append(
            (
                page.PAGE,
                lambda q, page=page: callback_body(page, {**q, "host": "node-057", "gpu": "3"}),
            )
        )
        if page.PAGE == "overview":
            out.append(("today kWh", lambda q: today_body()))
        if page.PAGE == "jobs":
            out.append(
                (
                    "job detail",
                    lambda q, page=page: callback_body(page, {**q, "job": STRAGGLER_JOB}),
                )
            )
    return out


def time_callbacks(
    app: Any, repeat: int, query: dict[str, str], engine_cpu_s: Callable[[], float] | None = None
) -> dict[str, CallbackTimes]:
    """Per page: the content callback cold (cache emptied before each request) and served
    from the cache (what a visitor of the kept-warm default view, or of a range viewed in the
    last few minutes, waits for: the page built from cached data). The background refresh that
    keeps an entry current costs what a cold request costs, off the request path.
    ``engine_cpu_s``: the engine server's CPU so far, to give its share of each cold callback."""
    client = app.server.test_client()
    data = app.server.config["GPUWATT_DATA"]
    out = {}
    for label, body_of in bench_pages():
        body = body_of(query)
        cold, cold_cpu, engine_cpu, served, size = [], [], [], [], 0
        for _ in range(repeat):
            data.clear_cache()
            e = engine_cpu_s() if engine_cpu_s else 0.0
            t, c = time.perf_counter(), time.process_time()
            resp = client.post("/_dash-update-component", json=body)
            cold.append(time.perf_counter() - t)
            cold_cpu.append(time.process_time() - c)
            while data.cache.refreshing:  # reads the page started for later, done before
                time.sleep(0.01)
            engine_cpu.append(engine_cpu_s() - e if engine_cpu_s else float("nan"))
            assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
            size = len(resp.data)
        ttl, data.cache.ttl_s = data.cache.ttl_s, 3600.0
        for _ in range(repeat):
            t = time.perf_counter()
            client.post("/_dash-update-component", json=body)
            served.append(time.perf_counter() - t)
        data.cache.ttl_s = ttl
        while data.cache.refreshing:  # let the background refresh finish before the next page
            time.sleep(0.05)
        out[label] = CallbackTimes(
            statistics.median(cold),
            float(np.percentile(cold, 95)),
            statistics.median(cold_cpu),
            float(np.percentile(served, 95)),
            size,
            statistics.median(engine_cpu),
        )
    return out


def warm_costs(app: Any, repeat: int) -> dict[str, float]:
    """Per preset range: the median CPU time of one recomputation by the server's warmer (the
    default view first, as the warmer orders them: the coarse ranges share its newest hour)."""
    from gpuwatt.dashboard.timerange import PRESETS, parse_range

    data = app.server.config["GPUWATT_DATA"]
    data.clear_cache()
    order = [DEFAULT_RANGE, *(p for p in PRESETS if p != DEFAULT_RANGE)]
    cpu: dict[str, list[float]] = {p: [] for p in order}
    for _ in range(repeat):
        for preset in order:
            tr = parse_range({"range": preset}, data.now_ns())[0]
            c = time.process_time()
            data._warm(tr)
            if preset == DEFAULT_RANGE:  # the overview's "Energy today" is warmed with it
                data._warm_today()
            cpu[preset].append(time.process_time() - c)
    return {p: statistics.median(v) for p, v in cpu.items()}


def open_embedded(db: Path) -> SqliteStore:
    """The bench's embedded store (raw samples kept a week: the backfilled day stays whole)."""
    return SqliteStore(db, retention_raw_s=7 * 86_400)
