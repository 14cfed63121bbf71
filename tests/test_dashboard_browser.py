"""The dashboard in a real headless Chromium (Debian's chromium + chromedriver via selenium).

One browser and one server per module (starting Chromium costs seconds on a small machine). The
data is the demo scenario, 15 minutes, 32 GPUs: small enough for software rendering.
"""

from __future__ import annotations

import csv
import io
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from test_dashboard_support import DEMO_END_NS, build_demo_store, chrome, have_browser, wait

from gpuwatt.dashboard.server import RunningDashboard, start

pytestmark = pytest.mark.skipif(
    not have_browser(), reason="needs Debian's chromium and chromium-driver (make test-deps)"
)

WAIT_S = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDashboard]:
    store = build_demo_store(tmp_path_factory.mktemp("browser") / "demo.db", minutes=15)
    running = start(store, "127.0.0.1", 0, environ={}, now_ns=DEMO_END_NS)
    yield running
    running.stop()
    store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chrome(page_load_timeout_s=WAIT_S)
    yield driver
    driver.quit()


def open_page(browser: Any, server: RunningDashboard, path: str, page: str) -> str:
    """Load ``path`` and wait until the page's content callback has filled it; its text."""
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(server.url.rstrip("/") + path)
    selector = f"#{page}-content > *"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, selector))
    return browser.find_element(By.ID, f"{page}-content").text


def console_errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


PAGES = [
    ("/?range=15m", "overview", "Worst stragglers"),
    ("/balance?range=15m", "balance", "Imbalance index"),
    ("/stragglers?range=15m", "stragglers", "node-2 GPU 5"),
    ("/efficiency?range=15m", "efficiency", "Energy per job"),
    ("/node?range=15m&host=node-2&gpu=5", "node", "throttle onsets"),
    ("/reports?range=15m", "reports", "report by gpu"),
    ("/alerts?range=15m", "alerts", "alerts not connected"),
]


@pytest.mark.parametrize(("path", "page", "expect"), PAGES, ids=[p[1] for p in PAGES])
def test_every_page_loads_without_console_errors(
    browser: Any, server: RunningDashboard, path: str, page: str, expect: str
) -> None:
    text = open_page(browser, server, path, page)
    assert expect.lower() in text.lower()
    from selenium.webdriver.common.by import By

    # the figures were drawn (plotly puts an SVG per graph)
    if page not in ("reports", "alerts"):
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg"))
    assert console_errors(browser) == []


def test_overview_names_the_demo_straggler_and_cause(
    browser: Any, server: RunningDashboard
) -> None:
    text = open_page(browser, server, "/?range=15m", "overview")
    assert "node-2 GPU 5" in text
    assert "thermal" in text
    assert "hardware thermal slowdown" in text
    assert "32 / 32" in text


def test_stragglers_page_shows_the_explanation(browser: Any, server: RunningDashboard) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, "/stragglers?range=15m", "stragglers")
    explanations = browser.find_elements(By.CSS_SELECTOR, ".straggler-explanation")
    assert explanations
    first = explanations[0].text
    assert first.startswith("GPU 5 on node-2 runs at")
    assert "peer median" in first and "check fans, airflow" in first


def test_time_range_change_goes_to_the_url_and_back(browser: Any, server: RunningDashboard) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, "/stragglers?range=15m", "stragglers")
    label = browser.find_element(By.XPATH, "//label[normalize-space()='6h']")
    label.click()
    wait(browser, lambda d: "range=6h" in d.current_url)
    wait(browser, lambda d: "last 6h" in d.find_element(By.ID, "stragglers-content").text)
    # the nav links carry the range to the other pages
    nav = browser.find_element(By.LINK_TEXT, "Overview")
    assert "range=6h" in nav.get_attribute("href")
    # the URL reproduces the view: open it afresh
    url = browser.current_url
    browser.get("about:blank")
    browser.get(url)
    wait(browser, lambda d: "last 6h" in d.find_element(By.ID, "stragglers-content").text)
    assert "node-2 GPU 5" in browser.find_element(By.ID, "stragglers-content").text
    assert console_errors(browser) == []


def test_garbled_url_says_what_is_wrong(browser: Any, server: RunningDashboard) -> None:
    text = open_page(browser, server, "/?range=%27%3BDROP&from=&refresh=xyz", "overview")
    assert "URL not understood" in text
    assert console_errors(browser) == []
    text = open_page(browser, server, "/?from=2026-01-01T00:10&to=2026-01-01T00:00", "overview")
    assert "ends before it starts" in text


def test_csv_download_link(browser: Any, server: RunningDashboard) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, "/reports?range=15m", "reports")
    browser.find_element(By.XPATH, "//label[normalize-space()='node']").click()
    wait(browser, lambda d: "by=node" in d.current_url)
    link = wait(
        browser,
        lambda d: (
            d.find_element(By.ID, "download-report")
            if "by node" in d.find_element(By.ID, "download-report").text
            else None
        ),
    )
    href = link.get_attribute("href")
    assert "by=node" in href and "range=15m" in href
    with urllib.request.urlopen(href, timeout=30) as resp:
        assert "attachment" in resp.headers["Content-Disposition"]
        rows = list(csv.reader(io.StringIO(resp.read().decode())))
    assert rows[0][:3] == ["host", "gpus", "gpu_hours_h"]
    assert "energy_kwh" in rows[0] and "straggler_minutes_min" in rows[0]
    assert [r[0] for r in rows[1:]] == ["node-0", "node-1", "node-2", "node-3"]
    minutes = {r[0]: float(r[rows[0].index("straggler_minutes_min")]) for r in rows[1:]}
    assert minutes["node-2"] > 0 and minutes["node-0"] == 0


def test_dark_mode_switch(browser: Any, server: RunningDashboard) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, "/efficiency?range=15m", "efficiency")
    root = browser.find_element(By.TAG_NAME, "html")
    assert root.get_attribute("data-mantine-color-scheme") == "light"
    browser.find_element(By.CSS_SELECTOR, "#dark-switch").click()
    wait(
        browser,
        lambda d: (
            d.find_element(By.TAG_NAME, "html").get_attribute("data-mantine-color-scheme") == "dark"
        ),
    )
    browser.find_element(By.CSS_SELECTOR, "#dark-switch").click()
    assert console_errors(browser) == []
