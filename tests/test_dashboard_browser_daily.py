"""The pages operators open every day, in a real headless Chromium, at 32 and at 1,024 GPUs.

Jobs and one job's drill-down, an inference job's energy per request and per million tokens,
the node page's hardware-health panels, processes and GPU picker, zoom and a custom range in the
URL and back to live, silence and expire from the alerts page (authenticated), and the "not
connected" states; no browser console error anywhere.

Per scale one store (the demo's jobs and straggler, plus an XID and ECC errors), one dashboard
with credentials and an alert database holding one firing alert, built once per module; the
1,024-GPU data is 6 minutes of 10-s samples, the least that still shows the straggler.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import TimeoutException
from test_dashboard_support import (
    DEMO_END_NS,
    UnreachableStore,
    build_demo_store,
    chrome,
    daily_scenario,
    demo_job_steps,
    have_browser,
    wait,
)

from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.server import RunningDashboard, start

pytestmark = pytest.mark.skipif(
    not have_browser(), reason="needs Debian's chromium and chromium-driver (make test-deps)"
)

WAIT_S = 60
NS = 1_000_000_000
USER, PASSWORD = "ops", "daily-pages-test"
CREDENTIALS = {"GPUWATT_DASHBOARD_USER": USER, "GPUWATT_DASHBOARD_PASSWORD": PASSWORD}


@dataclass
class Site:
    gpus: int
    running: RunningDashboard
    straggler: tuple[str, int]  # (host, index)
    db: Path

    def url(self, path: str) -> str:
        return self.running.url.rstrip("/") + path


def _alerts_db(path: Path, host: str, gpu: int) -> Path:
    from gpuwatt.alerts.db import open_db, transaction
    from gpuwatt.alerts.state import Alert, AlertTable

    con = open_db(path)
    labels = {"alertname": "GpuStraggler", "host": host, "gpu": str(gpu), "severity": "critical"}
    firing = Alert(
        "fp1", "GpuStraggler", labels, {"summary": f"{host} GPU {gpu} holds its job back"},
        "firing", 0.68, pending_since_ns=DEMO_END_NS - 300 * NS,
        firing_since_ns=DEMO_END_NS - 120 * NS, updated_ns=DEMO_END_NS,
    )  # fmt: skip
    with transaction(con):
        AlertTable(con).save(None, firing, DEMO_END_NS - 120 * NS)
    con.close()
    return path


@pytest.fixture(scope="module", params=[32, 1024], ids=["32-gpus", "1024-gpus"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    from gpuwatt.cli.compose import AlertsDbView

    gpus = int(request.param)
    tmp = tmp_path_factory.mktemp(f"daily{gpus}")
    if gpus == 32:
        store = build_demo_store(
            tmp / "d.db", minutes=15, job_steps=True, scenario=daily_scenario(4)
        )
        straggler = ("node-2", 5)
    else:
        store = build_demo_store(
            tmp / "d.db", minutes=6, interval_s=10.0, job_steps=True, scenario=daily_scenario(128)
        )
        straggler = ("node-57", 3)
    alerts = AlertsDbView(_alerts_db(tmp / "alerts.db", *straggler), clock_ns=lambda: DEMO_END_NS)
    steps = demo_job_steps(tmp / "d.db")
    running = start(
        store, "127.0.0.1", 0, environ=CREDENTIALS, now_ns=DEMO_END_NS, alerts=alerts,
        job_steps=steps, warm_every_s=None,
    )  # fmt: skip
    yield Site(gpus, running, straggler, tmp / "d.db")
    running.stop()
    steps.close()
    store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chrome(page_load_timeout_s=WAIT_S, basic_auth=(USER, PASSWORD))
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_EVENTS_JS})
    yield driver
    driver.quit()


def open_page(browser: Any, url: str, page: str) -> str:
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(url)
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#{page}-content > *"))
    return wait(browser, lambda d: content(d, page))  # type: ignore[no-any-return]


def content(browser: Any, page: str) -> str:
    """The page's content text now ("" while a navigation replaces it)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(browser.find_element(By.ID, f"{page}-content").text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def console_errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def drawn(browser: Any, page: str) -> None:
    """Every graph of the page has its SVG, and no recomputation of the content is under way."""
    from selenium.webdriver.common.by import By

    def ok(d: Any) -> bool:
        graphs = d.find_elements(By.CSS_SELECTOR, f"#{page}-content .dash-graph")
        svgs = d.find_elements(By.CSS_SELECTOR, f"#{page}-content .dash-graph .main-svg")
        # the content stays on screen while it is recomputed: wait for the new one
        return bool(graphs) and len(svgs) >= len(graphs) and not spinning(d, page)

    wait(browser, ok)


#: Whether the loading spinner over a page's content is up (dcc.Loading: the content's
#: container, then the layer that holds the spinner while it spins).
SPINNING_JS = """
const c = document.getElementById(arguments[0] + '-content');
if (!c) return false;
const outer = c.parentElement.parentElement;
return outer.children.length > 1 && outer.children[1].children.length > 0;
"""


def spinning(browser: Any, page: str) -> bool:
    return bool(browser.execute_script(SPINNING_JS, page))


def click_id(browser: Any, id_: str, by: str = "id") -> None:
    """Click the element with this id (or XPath, ``by="xpath"``), looking it up again if a
    re-render replaced it."""

    def go(d: Any) -> bool:
        el = d.find_element(by, id_)
        if not el.is_displayed():
            return False
        el.click()
        return True

    wait(browser, go)


def until_it_takes(
    browser: Any, url: str, page: str, act: Any, took: Any, *, wait_s: float = 15, tries: int = 3
) -> Any:
    """``act()`` until ``took(driver)`` holds within ``wait_s``, at most ``tries`` times; each
    retry on a freshly loaded ``url``. An action that lands while the page redraws is lost, as
    it would be for a user (seen on a loaded test machine); None if it never took."""
    for attempt in range(tries):
        if attempt:
            open_page(browser, url, page)
            if page == "node":
                drawn(browser, page)
        act()
        with contextlib.suppress(TimeoutException):
            return wait(browser, took, wait_s)
    return None


#: Installed in every document the browser loads (before the page's own scripts), it keeps in
#: the tab's ``sessionStorage`` (so a reload does not lose it): each load and unload, each
#: pointer press, release and click (the element it reached, its button, whether the pressed
#: element was still in the page at the release), each change of visibility, and each request
#: the page sends with its answer's status and first bytes: for a failure message
#: (``callbacks_said``).
RECORD_EVENTS_JS = """
(function () {
    var KEY = 'gwEvents';
    function keep(entry) {
        try {
            var all = JSON.parse(sessionStorage.getItem(KEY) || '[]');
            entry.t = Math.round(performance.timeOrigin + performance.now());
            entry.n = all.length ? all[all.length - 1].n + 1 : 0;
            all.push(entry);
            sessionStorage.setItem(KEY, JSON.stringify(all.slice(-60)));
        } catch (e) {}
    }
    window.gwKeep = keep;
    keep({ev: 'load', url: location.pathname + location.search});
    var pressed = null;
    ['pointerdown', 'mousedown', 'mouseup', 'click'].forEach(function (type) {
        document.addEventListener(type, function (ev) {
            var t = ev.target;
            var b = t && t.closest ? t.closest('button') : null;
            var cls = String((t && t.className) || '').slice(0, 60);
            var entry = {ev: type, x: ev.clientX, y: ev.clientY, trusted: ev.isTrusted,
                         target: (t && t.tagName) + ' ' + cls,
                         button: b ? (b.id || b.textContent).slice(0, 100) : null};
            if (type === 'mousedown') { pressed = t; }
            if (type === 'mouseup' && pressed) { entry.pressedStillThere = pressed.isConnected; }
            keep(entry);
        }, true);
    });
    document.addEventListener('visibilitychange', function () {
        keep({ev: 'visibility', state: document.visibilityState});
    });
    window.addEventListener('pagehide', function () { keep({ev: 'pagehide'}); });
    var fetch0 = window.fetch;
    window.fetch = function (url, opts) {
        var asked = String((opts && opts.body) || '').slice(0, 120);
        var call = {ev: 'request', url: String(url), asked: asked,
                    sent: Math.round(performance.timeOrigin + performance.now())};
        return fetch0.apply(this, arguments).then(function (resp) {
            call.status = resp.status;
            resp.clone().text().then(function (t) { call.said = t.slice(0, 160); keep(call); });
            return resp;
        }, function (err) { call.error = String(err); keep(call); throw err; });
    };
})();
"""


def recorded_events(browser: Any) -> list[dict[str, Any]]:
    """What ``RECORD_EVENTS_JS`` kept in this tab, oldest first."""
    kept = browser.execute_script("return sessionStorage.getItem('gwEvents') || '[]';")
    return list(json.loads(kept))


def callbacks_said(browser: Any, page: str, *ids: str) -> str:
    """What a page shows (its content and the elements ``ids``), where the browser stands (its
    windows, URL, visibility and focus), the events and requests ``RECORD_EVENTS_JS`` kept and
    the browser's console: why an action did not take."""
    from selenium.webdriver.common.by import By

    shown = [f"content: {content(browser, page)[:300]!r}"]
    for id_ in ids:
        found = browser.find_elements(By.ID, id_)
        shown.append(f"#{id_}: {found[0].text[:300]!r}" if found else f"#{id_}: absent")
    state = browser.execute_script(
        "return [location.href, document.visibilityState, document.hasFocus(),"
        " window.innerWidth, window.innerHeight];"
    )
    shown.append(f"windows: {len(browser.window_handles)}; url, visibility, focus, size: {state}")
    kept = recorded_events(browser)
    shown += [f"recorded: {e}" for e in kept[-25:]] or ["nothing recorded"]
    shown += [f"console: {e['level']} {e['message'][:200]}" for e in browser.get_log("browser")]
    return "\n".join(shown)


def last_event(browser: Any) -> int:
    """The number of the newest event ``RECORD_EVENTS_JS`` kept (-1: none yet)."""
    return max((e["n"] for e in recorded_events(browser)), default=-1)


def seen_since(browser: Any, after: int, kinds: set[str], button_text: str = "") -> bool:
    return any(
        e["n"] > after and e["ev"] in kinds and button_text in str(e.get("button"))
        for e in recorded_events(browser)
    )


def click_in_page(browser: Any, xpath: str, button_text: str, *, tries: int = 3) -> None:
    """Click the button at ``xpath`` until the page sees a click on a button showing
    ``button_text`` (``RECORD_EVENTS_JS``), at most ``tries`` times, 3 s apart. A click the
    driver sends while the page replaces the element under it can vanish between the press
    and the release: the browser then sends none, and a user would click again. If no press
    of the driver's reached the page at all (CI lost this test's clicks at stops 32-35, before
    presses were recorded; never seen here), the button is clicked from the page's script,
    which the page handles as any click; the record keeps it as "script click"."""
    first = last_event(browser)
    for _ in range(tries):
        before = last_event(browser)
        click_id(browser, xpath, by="xpath")
        with contextlib.suppress(TimeoutException):
            if wait(browser, lambda d, b=before: seen_since(d, b, {"click"}, button_text), 3, 0.2):
                return
    if not seen_since(browser, first, {"pointerdown", "mousedown"}):
        browser.execute_script(
            "window.gwKeep({ev: 'script click'});"
            "document.evaluate(arguments[0], document, null, 9, null).singleNodeValue.click();",
            xpath,
        )


def click_link(browser: Any, text: str) -> None:
    from selenium.webdriver.common.by import By

    link = wait(browser, lambda d: d.find_element(By.LINK_TEXT, text))
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", link)
    link.click()


def test_energy_today_fills_in_after_a_cold_overview(browser: Any, site: Site) -> None:
    """With nothing cached (no warmer here) the overview is drawn with a placeholder for
    "Energy today", which its own request then fills with the figure."""
    from selenium.webdriver.common.by import By
    from test_dashboard_support import energy_today_text

    data = site.running.data
    assert data is not None
    data.clear_cache()
    open_page(browser, site.url("/?range=15m"), "overview")
    shown = energy_today_text(data.store, DEMO_END_NS)  # not through the site's cache
    wait(browser, lambda d: d.find_element(By.ID, "kpi-energy-today").text == shown)
    assert console_errors(browser) == []


def test_jobs_page_and_drill_down(browser: Any, site: Site) -> None:
    host, idx = site.straggler
    open_page(browser, site.url("/jobs?range=15m"), "jobs")
    jobs = ("llm-pretrain", "chat-serving", "notebook-17")

    def listed(d: Any) -> str:
        text = content(d, "jobs")
        return text if all(j in text for j in jobs) else ""

    text = wait(browser, listed)
    assert "3 jobs in this range" in text
    assert console_errors(browser) == []
    click_link(browser, "llm-pretrain")
    wait(browser, lambda d: "job=llm-pretrain" in d.current_url)
    wait(browser, lambda d: "job llm-pretrain" in content(d, "jobs"))
    detail = content(browser, "jobs")
    assert "VERDICT" in detail.upper() and f"{host} GPU {idx}" in detail
    assert "straggler" in detail
    drawn(browser, "jobs")
    assert console_errors(browser) == []
    # the straggler's row links to its node page with the GPU picked
    click_link(browser, f"{host} GPU {idx}")
    wait(browser, lambda d: f"host={host}" in d.current_url and f"gpu={idx}" in d.current_url)
    wait(browser, lambda d: f"GPU {idx} highlighted" in content(d, "node"))
    assert console_errors(browser) == []


def test_inference_job_energy_per_request_and_per_million_tokens(browser: Any, site: Site) -> None:
    from selenium.webdriver.common.by import By

    from gpuwatt.dashboard.jobs import job_rows
    from gpuwatt.dashboard.serving import served_by_job

    open_page(browser, site.url("/jobs?range=15m&job=chat-serving"), "jobs")
    served = wait(browser, lambda d: d.find_element(By.ID, "job-served")).text
    # the same figures, computed here from the stores the server reads
    data = site.running.data
    from gpuwatt.dashboard.timerange import parse_range

    win = data.window(parse_range({"range": "15m"}, DEMO_END_NS)[0])
    steps = demo_job_steps(site.db)
    try:
        s = served_by_job(steps.job_steps(win.summary.start_ns, win.summary.now_ns))["chat-serving"]
    finally:
        steps.close()
    row = next(r for r in job_rows(win.summary, win.stragglers, []) if r.job_id == "chat-serving")
    wh = row.energy_kwh * 1000.0
    assert s.requests > 100 and s.tokens > 10 * s.requests
    assert fmt.si(s.requests) in served
    assert fmt.si(s.per_thousand_requests(wh), "Wh") in served
    assert fmt.si(s.per_million_tokens(wh), "Wh") in served
    assert fmt.si(s.latency_p95_s, "s") in served
    assert "ENERGY / 1K REQUESTS" in served.upper() and "LATENCY P50 / P95 / P99" in served.upper()
    assert console_errors(browser) == []


def test_node_page_health_panels_processes_and_gpu_picker(browser: Any, site: Site) -> None:
    from selenium.webdriver.common.by import By

    host = "node-1"
    open_page(browser, site.url(f"/node?range=15m&host={host}"), "node")
    drawn(browser, "node")
    # a panel is drawn with its title, or says why it has nothing to draw (ECC and remapped
    # rows are slow-cadence counters: see the report on the rollups' last value)
    titles = " | ".join(
        t.text
        for t in browser.find_elements(
            By.CSS_SELECTOR, "#node-content .gtitle, #node-content .annotation-text"
        )
    ).lower()
    for panel in (
        "fan",
        "power limit",
        "pcie throughput",
        "nvlink throughput",
        "ecc",
        "remapped rows",
        "clock-event reasons",
    ):
        assert panel in titles, (panel, titles)
    # a constant memory value (the job's 68 GiB) reads among distinct ticks, not one label each
    for plot in browser.find_elements(By.CSS_SELECTOR, "#node-content .js-plotly-plot"):
        title = plot.find_elements(By.CSS_SELECTOR, ".gtitle")
        if title and title[0].text == "memory used":
            ticks = [t.text for t in plot.find_elements(By.CSS_SELECTOR, ".ytick text")]
            assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks
            break
    else:
        raise AssertionError("no memory chart on the node page")
    text = content(browser, "node").lower()
    assert "hardware health" in text and "processes now" in text
    procs = browser.find_element(By.ID, "processes").text
    assert "pid" in procs and "GPU memory" in procs
    assert "GPU 0" in procs and "GiB" in procs
    assert console_errors(browser) == []
    # pick GPU 4 with the picker: the URL follows and the view highlights it
    option = until_it_takes(
        browser,
        site.url(f"/node?range=15m&host={host}"),
        "node",
        lambda: click_id(browser, "gpu-picker"),
        lambda d: next(
            (o for o in d.find_elements(By.CSS_SELECTOR, "[role=option]") if o.text == "GPU 4"),
            None,
        ),
    )
    assert option is not None, "the GPU picker's dropdown never opened"
    option.click()
    wait(browser, lambda d: "gpu=4" in d.current_url)
    wait(browser, lambda d: "GPU 4 highlighted" in content(d, "node"))
    procs = browser.find_element(By.ID, "processes").text
    assert "GPU 4" in procs and "GPU 0" not in procs
    assert console_errors(browser) == []


#: Per chart: the XID trace's labels, times, and the markers its SVG draws.
XID_TRACES_JS = """
return Array.from(document.querySelectorAll('#node-content .js-plotly-plot')).map(gd => {
  const i = (gd.data || []).findIndex(t => t.name === 'XID');
  if (i < 0) return null;
  const drawn = Array.from(gd.querySelectorAll('g.trace')).filter(
    g => g.__data__ && g.__data__[0] && g.__data__[0].trace.name === 'XID');
  return {text: gd.data[i].text, x: gd.data[i].x,
          points: drawn.reduce((n, g) => n + g.querySelectorAll('path.point').length, 0)};
});
"""


def test_node_page_marks_the_xid_on_the_time_axis(browser: Any, site: Site) -> None:
    """The scenario's XID 79 on node-1 GPU 2 (HEALTH_FAULTS) is a marker on every time chart
    of its node, at the time of the sample that carried it; a node without XIDs has none."""
    import numpy as np
    from selenium.webdriver.common.by import By

    from gpuwatt.store.base import xid_events

    found = xid_events(site.running.data.store, 0, DEMO_END_NS + 1, ["node-1"])
    assert found is not None and len(found) == 1
    when = str(np.datetime64(int(found["time_ns"].iloc[0]), "ns").astype("datetime64[s]"))
    open_page(browser, site.url("/node?range=15m&host=node-1"), "node")
    drawn(browser, "node")
    assert "1 XID events marked" in browser.find_element(By.ID, "xid-marks").text
    charts = browser.execute_script(XID_TRACES_JS)
    marked = [c for c in charts if c is not None]
    assert len(marked) >= 6, charts  # the node's metrics, and the health panels with data
    for c in marked:
        assert c["text"] == ["GPU 2: XID 79"] and c["x"] == [when] and c["points"] == 1, c
    assert console_errors(browser) == []
    open_page(browser, site.url("/node?range=15m&host=node-0"), "node")
    drawn(browser, "node")
    assert "no XID events" in browser.find_element(By.ID, "xid-marks").text
    assert all(c is None for c in browser.execute_script(XID_TRACES_JS))


def test_health_page_lists_the_gpus_that_need_a_person(browser: Any, site: Site) -> None:
    text = open_page(browser, site.url("/health?range=15m"), "health")
    drawn(browser, "health")
    assert f"/ {site.gpus}" in text  # "Healthy n / N"
    assert "fan %" in text.lower() and "ecc dbe" in text.lower() and "limit" in text.lower()
    host, idx = site.straggler
    assert f"{host} GPU {idx}" in text  # the straggler: hot and throttled, in the first rows
    assert "throttled: hardware thermal slowdown" in text.lower() or "hot (" in text
    # the ECC GPU's slow counters (sampled once a minute), not "not measured"
    assert "uncorrectable ECC errors: 1" in text and "row remapping pending" in text
    assert console_errors(browser) == []


def _drag_across(browser: Any, page: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    layer = browser.find_elements(By.CSS_SELECTOR, f"#{page}-content .js-plotly-plot .nsewdrag")[0]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", layer)
    w = layer.size["width"]
    chain = ActionChains(browser)
    chain.move_to_element_with_offset(layer, -w // 4, 0).click_and_hold()
    chain.move_by_offset(w // 8, 0).move_by_offset(w // 8, 0).release().perform()


def test_zoom_custom_range_and_back_to_live(browser: Any, site: Site) -> None:
    from selenium.webdriver.common.by import By

    host, idx = site.straggler
    open_page(browser, site.url(f"/node?range=15m&host={host}&gpu={idx}"), "node")
    drawn(browser, "node")
    until_it_takes(
        browser,
        site.url(f"/node?range=15m&host={host}&gpu={idx}"),
        "node",
        lambda: _drag_across(browser, "node"),
        lambda d: "from=" in d.current_url and "to=" in d.current_url,
    )
    wait(browser, lambda d: "from=" in d.current_url and "to=" in d.current_url)
    assert "range=" not in browser.current_url and f"host={host}" in browser.current_url
    wait(browser, lambda d: "UTC" in content(d, "node") and "last 15m" not in content(d, "node"))
    assert console_errors(browser) == []
    click_id(browser, "range-live")
    wait(browser, lambda d: "from=" not in d.current_url)
    assert f"host={host}" in browser.current_url
    wait(browser, lambda d: "last " in content(d, "node"))  # a live range again
    # a custom from/to typed in
    click_id(browser, "range-custom")
    start = wait(browser, lambda d: d.find_element(By.ID, "range-from"))
    wait(browser, lambda d: start.is_displayed())
    start.clear()
    start.send_keys("2026-01-01T00:08:00")
    end = browser.find_element(By.ID, "range-to")
    end.clear()
    end.send_keys("2026-01-01T00:18:00")
    click_id(browser, "range-apply")
    wait(browser, lambda d: "from=2026-01-01T00" in d.current_url)
    wait(browser, lambda d: "00:08" in content(d, "node") and "00:18" in content(d, "node"))
    click_id(browser, "range-live")
    wait(browser, lambda d: "from=" not in d.current_url)
    assert console_errors(browser) == []


def test_silence_and_expire_from_the_alerts_page(browser: Any, site: Site) -> None:
    from selenium.webdriver.common.by import By

    host, idx = site.straggler
    text = open_page(browser, site.url("/alerts?range=1h"), "alerts")
    assert "GpuStraggler" in text and f"{host} GPU {idx}" in text and "critical" in text.lower()
    link = browser.find_element(By.LINK_TEXT, f"{host} GPU {idx}")
    assert f"host={host}" in link.get_attribute("href") and f"gpu={idx}" in link.get_attribute(
        "href"
    )
    from gpuwatt.cli.compose import AlertsDbView

    db = AlertsDbView(site.db.parent / "alerts.db", clock_ns=lambda: DEMO_END_NS)
    assert db.silences() == []  # none before the click: what follows is the click's doing

    def silence() -> None:
        comment = browser.find_element(By.ID, "silence-comment")
        if comment.get_attribute("value") != "fan swap tonight":
            comment.clear()
            comment.send_keys("fan swap tonight")
        click_in_page(browser, "//button[normalize-space()='silence']", "silence")

    until_it_takes(
        browser, site.url("/alerts?range=1h"), "alerts", silence, lambda d: db.silences(), wait_s=20
    )
    # if none was made: what the page said (the outcome line, "not silenced: ..." on a
    # failure), the callbacks the browser sent since the last try and what they got, its console
    assert len(db.silences()) == 1, callbacks_said(browser, "alerts", "alerts-action")
    # The page's live refresh may redraw the content (and drop the one-off result line) at any
    # moment: wait for what the click made, the silence listed with its author and comment.
    wait(
        browser, lambda d: f"by {USER}: fan swap tonight" in d.find_element(By.ID, "silences").text
    )
    silences = browser.find_element(By.ID, "silences").text
    assert f"gpu={idx}" in silences and f"host={host}" in silences
    # The silence is in the evaluator's database, by the authenticated user, for this GPU.
    (made,) = db.silences()
    assert (made.author, made.comment) == (USER, "fan swap tonight")
    assert made.matchers.get("host") == host and made.matchers.get("gpu") == str(idx)
    # The result line, where the live refresh has not redrawn it yet, names that silence.
    for r in browser.find_elements(By.ID, "alerts-action-result"):
        assert f"silence {made.id} created" in r.text
    click_in_page(browser, "//button[normalize-space()='expire']", "expire")
    wait(browser, lambda d: d.find_elements(By.ID, "silences-none"))
    assert db.silences() == []
    assert console_errors(browser) == []


def _silence_request(url: str, matchers_key: str, auth: bool = False) -> urllib.request.Request:
    """The POST a click on an alert's "silence" button makes (Dash's callback request: the click
    relayed by the browser into ``alerts-click``)."""
    import base64

    button = {"m": matchers_key, "type": "alert-silence"}
    body = {
        "output": "..alerts-action.children...alerts-refresh.n_intervals..",
        "outputs": [
            {"id": "alerts-action", "property": "children"},
            {"id": "alerts-refresh", "property": "n_intervals"},
        ],
        "inputs": [{"id": "alerts-click", "property": "data", "value": {"id": button, "at": 1}}],
        "changedPropIds": ["alerts-click.data"],
        "state": [
            {"id": "silence-for", "property": "value", "value": "1h"},
            {"id": "silence-comment", "property": "value", "value": "by POST"},
            {"id": "alerts-refresh", "property": "n_intervals", "value": 0},
        ],
    }
    headers = {"Content-Type": "application/json"}
    if auth:
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    return urllib.request.Request(
        url.rstrip("/") + "/_dash-update-component", data=json.dumps(body).encode(), headers=headers
    )


def test_the_alerts_page_takes_no_action_without_authentication(browser: Any, site: Site) -> None:
    """Without credentials the page is read-only, and the callback does not exist."""
    from gpuwatt.cli.compose import AlertsDbView

    alerts = AlertsDbView(site.db.parent / "alerts.db", clock_ns=lambda: DEMO_END_NS)
    running = start(
        site.running.data.store, "127.0.0.1", 0, environ={}, now_ns=DEMO_END_NS, alerts=alerts,
        warm_every_s=None,
    )  # fmt: skip
    try:
        text = open_page(browser, running.url.rstrip("/") + "/alerts", "alerts")
        assert "GpuStraggler" in text and "Read-only" in text
        from selenium.webdriver.common.by import By

        assert not browser.find_elements(By.XPATH, "//button[normalize-space()='silence']")
        assert console_errors(browser) == []
        # the request a click on "silence" sends: refused here (no such callback without
        # credentials), and taken by the authenticated server (so it is the right request)
        key = "alertname=GpuStraggler"
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(_silence_request(running.url, key), timeout=30)
        assert alerts.silences() == []
        with urllib.request.urlopen(_silence_request(site.running.url, key, auth=True)) as resp:
            assert resp.status == 200 and b"created" in resp.read()
        (made,) = alerts.silences()
        assert (made.author, made.comment, made.matchers) == (
            USER,
            "by POST",
            {"alertname": "GpuStraggler"},
        )
        alerts.expire(made.id)
    finally:
        running.stop()


def test_not_connected_when_the_evaluator_or_the_store_cannot_be_reached(
    browser: Any, site: Site, tmp_path: Path
) -> None:
    if site.gpus != 32:
        pytest.skip("independent of the cluster's size: checked once")
    from gpuwatt.cli.compose import AlertsDbView

    missing = AlertsDbView(tmp_path / "no-evaluator" / "alerts.db")
    running = start(
        site.running.data.store, "127.0.0.1", 0, environ={}, now_ns=DEMO_END_NS,
        alerts=missing, warm_every_s=None,
    )  # fmt: skip
    try:
        text = open_page(browser, running.url.rstrip("/") + "/alerts", "alerts")
        assert "alerts not connected" in text and "no alert database" in text
        assert "none" not in text.split()
        overview = open_page(browser, running.url.rstrip("/") + "/?range=15m", "overview")
        assert "n/a" in overview  # firing alerts: not "0"
        assert console_errors(browser) == []
    finally:
        running.stop()
    down = start(
        UnreachableStore(), "127.0.0.1", 0, environ={}, now_ns=DEMO_END_NS, warm_every_s=None
    )
    try:
        for path, page in (("/?range=15m", "overview"), ("/jobs", "jobs"), ("/health", "health")):
            text = open_page(browser, down.url.rstrip("/") + path, page)
            assert "connection refused" in text, (page, text)
            assert console_errors(browser) == []
    finally:
        down.stop()


#: The element at the centre of the first silence button: the button, or what covers it.
ELEMENT_AT_SILENCE_JS = """
const b = Array.from(document.querySelectorAll('#alerts-content button'))
  .find(e => e.textContent.trim() === 'silence');
const r = b.getBoundingClientRect();
const at = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
return b.contains(at);
"""


def test_content_stays_visible_and_clickable_while_it_is_recomputed(
    browser: Any, site: Site
) -> None:
    """While a page's content is recomputed (here: the alerts source holds its answer) the old
    content stays on screen under the spinner and a click reaches it: a refresh that hid it
    lost the clicks and closed the dropdowns that landed on it."""
    import threading

    from selenium.webdriver.common.by import By

    from gpuwatt.cli.compose import AlertsDbView

    if site.gpus != 32:
        pytest.skip("independent of the cluster's size: checked once")
    release = threading.Event()

    class Held(AlertsDbView):
        holding = False

        def active(self) -> Any:
            if self.holding:
                release.wait(60)
            return super().active()

    alerts = Held(site.db.parent / "alerts.db", clock_ns=lambda: DEMO_END_NS)
    running = start(
        site.running.data.store, "127.0.0.1", 0, environ=CREDENTIALS, now_ns=DEMO_END_NS,
        alerts=alerts, warm_every_s=None,
    )  # fmt: skip
    try:
        open_page(browser, running.url.rstrip("/") + "/alerts?range=1h", "alerts")
        assert browser.execute_script(ELEMENT_AT_SILENCE_JS)
        alerts.holding = True
        # recompute the content: a silence (its callback redraws the page from the source)
        comment = browser.find_element(By.ID, "silence-comment")
        comment.clear()
        comment.send_keys("held")
        click_id(browser, "//button[normalize-space()='silence']", by="xpath")
        # the spinner is up (the page waits on the held source) ...
        wait(browser, lambda d: spinning(d, "alerts"), 30)
        # ... over the old content, which is shown and takes a click at the button's centre
        rows = browser.find_element(By.ID, "alerts-content")
        assert rows.is_displayed() and "GpuStraggler" in rows.text
        assert browser.execute_script(ELEMENT_AT_SILENCE_JS)
        release.set()
        wait(browser, lambda d: not spinning(d, "alerts"))
        assert "created" in browser.find_element(By.ID, "alerts-action").text
        assert console_errors(browser) == []
    finally:
        release.set()
        running.stop()
        for made in alerts.silences():  # the module's other tests start with none
            alerts.expire(made.id)


def test_read_progress_stops_asking_once_a_refresh_has_drawn_the_content(
    browser: Any, site: Site
) -> None:
    """The live refresh (the page's interval counting one more) recomputes the content; the
    count of reads done is asked for only until the new content arrives, not for good after."""
    import time

    from selenium.webdriver.common.by import By

    if site.gpus != 32:
        pytest.skip("independent of the cluster's size: checked once")
    open_page(browser, site.url("/?range=15m"), "overview")
    drawn(browser, "overview")
    before = last_event(browser)
    # what the page's dcc.Interval does at each refresh
    browser.execute_script("dash_clientside.set_props('overview-refresh', {n_intervals: 1});")

    def content_answer(d: Any) -> dict[str, Any] | None:
        for e in recorded_events(d):
            if e["n"] > before and e["ev"] == "request" and "overview-content" in e["asked"]:
                return e
        return None

    arrived = wait(browser, content_answer)
    assert arrived["status"] == 200
    drawn(browser, "overview")
    time.sleep(3)  # a tick left on asks twice a second
    asked_after = [
        e for e in recorded_events(browser)
        if e["n"] > before and e["ev"] == "request" and "overview-progress" in e["asked"]
        and e["sent"] > arrived["t"]
    ]  # fmt: skip
    assert len(asked_after) <= 1, asked_after  # one tick may be on its way as the content lands
    assert (
        browser.find_element(By.ID, "overview-progress-box").value_of_css_property("display")
        == "none"
    )
    assert console_errors(browser) == []


def held_through_a_refresh(browser: Any, page: str, find: Callable[[Any], Any]) -> list[Any]:
    """Press the element ``find`` finds, let the page's live refresh (its ``dcc.Interval``
    counting one more) redraw it, release on its redrawn twin: the events recorded from the
    press on. Checks what the browser did: a release with the pressed element gone, and no
    click of its own (a click recorded is the page's, ``assets/redrawn_clicks.js``: not
    trusted)."""
    from selenium.webdriver.common.action_chains import ActionChains

    element = wait(browser, find)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    browser.execute_script("window.gwPressed = arguments[0];", element)
    before = last_event(browser)
    ActionChains(browser).move_to_element(element).click_and_hold().perform()
    try:
        browser.execute_script(f"dash_clientside.set_props('{page}-refresh', {{n_intervals: 99}});")
        wait(browser, lambda d: d.execute_script("return !window.gwPressed.isConnected;"))
        wait(browser, lambda d: find(d).is_displayed())
    finally:  # never left held for the module's other tests
        ActionChains(browser).release().perform()
    wait(
        browser, lambda d: [e for e in recorded_events(d) if e["n"] > before and e["ev"] == "click"]
    )
    kept = [e for e in recorded_events(browser) if e["n"] > before]
    assert any(e["ev"] == "mouseup" and e.get("pressedStillThere") is False for e in kept), kept
    assert not [e for e in kept if e["ev"] == "click" and e["trusted"]], kept
    return kept


def test_a_silence_click_whose_button_is_redrawn_between_press_and_release_still_counts(
    browser: Any, site: Site
) -> None:
    """The live refresh redraws the alerts page while the user holds the button down: the
    browser sends no click (the press and the release reached two elements), and the page
    takes the release on the redrawn button as the click."""
    from selenium.webdriver.common.by import By

    from gpuwatt.cli.compose import AlertsDbView

    if site.gpus != 32:
        pytest.skip("independent of the cluster's size: checked once")
    db = AlertsDbView(site.db.parent / "alerts.db", clock_ns=lambda: DEMO_END_NS)
    assert db.silences() == []
    open_page(browser, site.url("/alerts?range=1h"), "alerts")
    silence = "//button[normalize-space()='silence']"
    held_through_a_refresh(browser, "alerts", lambda d: d.find_element(By.XPATH, silence))
    (one,) = wait(browser, lambda d: db.silences(), 20)
    assert one.matchers.get("host") == site.straggler[0] and one.author == USER
    db.expire(one.id)
    assert console_errors(browser) == []


def test_a_link_redrawn_between_press_and_release_is_still_followed(
    browser: Any, site: Site
) -> None:
    """Any page, any link: the jobs page's live refresh redraws its job list while the user
    holds a job's link down; the browser sends no click, and the page follows the redrawn link
    (``assets/redrawn_clicks.js``)."""
    from selenium.webdriver.common.by import By

    if site.gpus != 32:
        pytest.skip("independent of the cluster's size: checked once")
    open_page(browser, site.url("/jobs?range=15m"), "jobs")
    held_through_a_refresh(browser, "jobs", lambda d: d.find_element(By.LINK_TEXT, "llm-pretrain"))
    wait(browser, lambda d: "job=llm-pretrain" in d.current_url)
    wait(browser, lambda d: "job llm-pretrain" in content(d, "jobs"))
    assert console_errors(browser) == []
