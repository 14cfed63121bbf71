"""Partial results from a slow engine (``dashboard.partial_reads``), against a real InfluxDB
(Debian's influxd, ``conftest.influx_db``) behind a real HTTP proxy that holds every query for
the older part of the range until the test ends: the store's read timeout then fires on those
parts alone, and the dashboard shows the newest part with a label instead of an error."""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pandas as pd
import pytest
from servers import http

from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.partial_reads import Partial, joined_partial, read_in_parts, split_read
from gpuwatt.dashboard.timerange import TimeRange
from gpuwatt.model import GpuSample
from gpuwatt.store.base import SeriesRead
from gpuwatt.store.influx import InfluxStore

pytestmark = pytest.mark.servers

NS = 1_000_000_000
HOUR_NS = 3600 * NS
T0 = 1_760_000_400 * NS  # on an hour boundary
END = T0 + 3 * HOUR_NS
SLOW_BEFORE = END - HOUR_NS  # queries reaching back before this are held
FIELDS = ["power_w", "utilization_gpu_pct"]


class _Holding(ThreadingHTTPServer):
    daemon_threads = True
    upstream = ""
    release = threading.Event()
    held = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Holding

    def do_GET(self) -> None:
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("q", [""])[0]
        since = re.search(r"time >= (\d+)", q)
        if since and int(since.group(1)) < SLOW_BEFORE:
            self.server.held += 1
            self.server.release.wait(60)  # the engine "works" on it past the client's timeout
        status, body = http("GET", self.server.upstream + self.path)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_store(influx_db, make_sample: Callable[..., GpuSample]) -> Iterator[InfluxStore]:
    """Reads time out after 2 s on the held queries (they are released when the test ends)."""
    with _behind_proxy(influx_db, make_sample, timeout_s=2.0) as (store, _):
        yield store


@pytest.fixture
def held_store(
    influx_db, make_sample: Callable[..., GpuSample]
) -> Iterator[tuple[InfluxStore, threading.Event]]:
    """Reads wait for the held queries until the test sets the event."""
    with _behind_proxy(influx_db, make_sample, timeout_s=60.0) as held:
        yield held


@contextmanager
def _behind_proxy(
    influx_db, make_sample: Callable[..., GpuSample], *, timeout_s: float
) -> Iterator[tuple[InfluxStore, threading.Event]]:
    server, db = influx_db
    with InfluxStore(server.url, "", db) as direct:
        direct.write_samples(
            [
                make_sample(t, host=f"node{g // 2}", gpu_index=g % 2, power_w=100.0 + g + t % 7)
                for t in range(T0, END, 30 * NS)
                for g in range(4)
            ]
        )
    proxy = _Holding(("127.0.0.1", 0), _Handler)
    proxy.upstream = server.url
    proxy.release = threading.Event()
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    try:
        with InfluxStore(url, "", db, timeout_s=timeout_s, use_rollups=False) as store:
            yield store, proxy.release
    finally:
        proxy.release.set()
        proxy.shutdown()
        proxy.server_close()


def test_parts_cover_the_read_on_bucket_boundaries_newest_first() -> None:
    read = SeriesRead(T0 + 17 * NS, END - 5 * NS, FIELDS, 300)
    parts = split_read(read)
    assert 2 <= len(parts) <= 6
    assert [p.end_ns for p in parts[1:]] == [p.start_ns for p in parts[:-1]]  # newest first
    assert parts[0].end_ns == read.end_ns and parts[-1].start_ns == read.start_ns
    assert all(p.start_ns % (300 * NS) == 0 for p in parts[:-1])  # buckets stay whole
    assert split_read(SeriesRead(T0, T0 + 60 * NS, FIELDS, 60)) == [
        SeriesRead(T0, T0 + 60 * NS, FIELDS, 60)
    ]


def test_reads_sent_in_several_calls_say_what_is_missing_of_them_all() -> None:
    long = SeriesRead(T0, END, FIELDS, 300)  # 6 parts when read in parts
    short = SeriesRead(END - 60 * NS, END, FIELDS, 60)  # too short to cut: 1 part
    assert joined_partial(([long], None), ([short], None)) is None
    cut = Partial(1, 2, ((T0, T0 + HOUR_NS),))
    both = joined_partial(([long], None), ([short, short], cut))
    assert both == Partial(7, 8, ((T0, T0 + HOUR_NS),))
    assert both is not None and "7 of 8 parts" in both.label


def test_a_slow_engine_gives_the_newest_parts_and_says_what_is_missing(
    slow_store: InfluxStore, influx_db
) -> None:
    server, db = influx_db
    read = SeriesRead(T0, END, FIELDS, 60)
    (frame,), partial = read_in_parts(slow_store, [read])
    assert 0 < partial.answered < partial.total
    assert partial.missing[0][0] == T0 and partial.missing[-1][1] <= SLOW_BEFORE
    assert partial.label.startswith(
        f"partial: the engine answered {partial.answered} of {partial.total} parts"
    )
    answered_from = partial.missing[-1][1]
    with InfluxStore(server.url, "", db, use_rollups=False) as direct:
        want = direct.series(answered_from, END, FIELDS, step_s=60)
    assert len(want)
    pd.testing.assert_frame_equal(frame, want)


def test_the_dashboard_shows_a_partial_view_not_an_error(slow_store: InfluxStore) -> None:
    data = DashboardData(slow_store, clock_ns=lambda: END)
    try:
        tr = TimeRange(T0, END, 60, "3 hours", None, False)
        window = data.window(tr)
    finally:
        data.close()
    assert window.partial is not None and not window.empty
    assert window.frame["time_ns"].min() >= SLOW_BEFORE - HOUR_NS
    assert window.frame["time_ns"].max() == END - 60 * NS
    assert window.summary.gpus == 4
    assert "partial: the engine answered" in window.partial.label


@contextmanager
def _overview_in_chrome(store: InfluxStore, range_: str) -> Iterator[tuple[Any, Any]]:
    """Headless Chromium on the overview of the last ``range_``, served from ``store`` with no
    warmer (skips the test where Debian's chromium is not installed); the browser and the
    running dashboard."""
    from test_dashboard_support import chrome, have_browser

    if not have_browser():
        pytest.skip("needs Debian's chromium and chromium-driver (make test-deps)")
    from gpuwatt.dashboard.server import start

    running = start(
        store, "127.0.0.1", 0, environ={}, now_ns=END, warm_every_s=None,
        warm_presets_every_s=None,
    )  # fmt: skip
    driver = chrome()
    try:
        driver.set_page_load_timeout(60)
        driver.get(running.url.rstrip("/") + f"/?range={range_}")
        yield driver, running
    finally:
        driver.quit()
        running.stop()


def test_the_page_says_partial_in_a_real_browser(slow_store: InfluxStore) -> None:
    """The overview of the last 3 hours in headless Chromium: figures from the parts that
    arrived and the "Partial data" notice, not an error page."""
    from selenium.webdriver.common.by import By
    from test_dashboard_support import wait

    with _overview_in_chrome(slow_store, "3h") as (driver, _):
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#overview-content > *"))
        text = driver.find_element(By.ID, "overview-content").text
        notice = driver.find_element(By.ID, "partial").text
    assert "Partial data" in notice and "the engine answered" in notice
    assert "Worst stragglers" in text and "store not reachable" not in text


def test_a_slow_page_says_how_many_reads_are_done_in_a_real_browser(
    held_store: tuple[InfluxStore, threading.Event],
) -> None:
    """The last hour: while the engine holds the read of the context before it, the overview
    says how many of its reads are done above the loading indicator; once the held read
    arrives the count goes and the figures are drawn. The same again when the live refresh
    recomputes the page."""
    from selenium.webdriver.common.by import By
    from test_dashboard_support import wait

    store, release = held_store
    progress = re.compile(r"reading the store: ([1-9]\d*) of (\d+) reads done")

    def counted_while_held(driver: Any) -> None:
        # "0 of 2" at first; then the hour arrives, the context before it is held
        wait(
            driver,
            lambda d: progress.search(d.find_element(By.ID, "overview-progress").text),
            poll_s=0.1,
        )
        match = progress.search(driver.find_element(By.ID, "overview-progress").text)
        assert match is not None
        done, total = int(match.group(1)), int(match.group(2))
        assert 0 < done < total

    with _overview_in_chrome(store, "1h") as (driver, running):
        counted_while_held(driver)
        assert not driver.find_elements(By.CSS_SELECTOR, "#overview-content > *")
        release.set()
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#overview-content > *"))
        wait(driver, lambda d: d.find_element(By.ID, "overview-progress").text == "", 10)
        text = driver.find_element(By.ID, "overview-content").text
        assert "Worst stragglers" in text and "Partial data" not in text
        # a live refresh (the page's interval counting one more) with nothing cached
        release.clear()
        running.data.clear_cache()
        driver.execute_script("dash_clientside.set_props('overview-refresh', {n_intervals: 1});")
        counted_while_held(driver)
        release.set()
        wait(driver, lambda d: d.find_element(By.ID, "overview-progress").text == "", 10)
        assert "Worst stragglers" in driver.find_element(By.ID, "overview-content").text
