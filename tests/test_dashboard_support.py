"""Shared helpers for the dashboard tests: a small, deterministic demo store and a browser.

Not a test module (no tests); imported by tests/test_dashboard_*.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.errors import StoreUnavailable
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
#: 2026-01-01 00:20 UTC: the demo's data is 20 minutes long and ends here (injected clock).
DEMO_END_NS = 1_767_225_600 * NS + 20 * 60 * NS
DEMO_MINUTES = 20
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def content_body(page: str, query: dict[str, str]) -> dict[str, Any]:
    """The request the browser sends for a page's content (its args, no refresh yet): what
    the tests and ``bench/callback_times.py`` POST to ``/_dash-update-component``."""
    out = f"{page}-content"
    return {
        "output": f"{out}.children",
        "outputs": {"id": out, "property": "children"},
        "inputs": [
            {"id": f"{page}-args", "property": "data", "value": query},
            {"id": f"{page}-refresh", "property": "n_intervals", "value": None},
        ],
        "changedPropIds": [f"{page}-args.data"],
        "state": [],
    }


def build_demo_store(
    path: Path,
    *,
    minutes: int = DEMO_MINUTES,
    interval_s: float = 5.0,
    job_steps: bool = False,
    scenario: Any = None,
) -> Any:
    """The shipped demo scenario backfilled into SQLite: 32 GPUs, node-2 GPU 5 straggling
    (thermal slowdown from minute 4). Deterministic: seeded scenario, injected times.
    ``job_steps``: the training job also reports its steps and the inference job its requests
    (``demo_job_steps(path)`` reads them), as ``gpuwatt demo`` does. ``scenario``: another
    (parsed) scenario than the demo."""
    end = DEMO_END_NS
    source = SimulatedClusterSource(
        scenario if scenario is not None else load_scenario("demo"),
        start_ns=end - minutes * 60 * NS,
        clock_ns=lambda: end,
    )
    source.open()
    if job_steps:
        from gpuwatt.collector.sim.serving import SimulatedServingReporter
        from gpuwatt.collector.sim.work import SimulatedWorkReporter
        from gpuwatt.store.job_steps import SqliteJobStepStore

        steps_store = SqliteJobStepStore(path)
        work = SimulatedWorkReporter(source.simulator, start_ns=source.start_ns)
        serving = SimulatedServingReporter(source.simulator, start_ns=source.start_ns)
        source.after_sample = lambda: steps_store.write_job_steps(work.poll() + serving.poll())
    store = SqliteStore(path)
    for batch in source.backfill(end, interval_s=interval_s, slow_interval_s=60.0):
        store.write_samples(batch)
    source.close()
    if job_steps:
        steps_store.close()
    store.flush_rollups()
    return store


#: Faults added to the daily-use scenarios (health panels): an XID, ECC errors, a power brake.
HEALTH_FAULTS = """
  - kind: xid
    gpu: node-1:2
    start: 2m
    code: 79
  - kind: ecc_errors
    gpu: node-1:4
    start: 1m
    sbe_per_h: 600
    dbe_count: 1
"""


def daily_scenario(nodes: int) -> Any:
    """The demo's jobs and straggler on ``nodes`` 8-GPU nodes (4: the demo itself), with the
    health faults above: what the operators' daily pages are tested on at 32 and 1,024 GPUs.
    At scale the training job spans every node but the last eight (which serve and idle), and
    the straggler starts after 1 minute (the data is kept short)."""
    from gpuwatt.collector.sim.scenario import load_scenario_text, scenario_path

    text = scenario_path("demo").read_text(encoding="utf-8")
    if nodes != 4:
        last = nodes - 1
        text = (
            text.replace("nodes: 4", f"nodes: {nodes}")
            .replace('"node-[0-2]:*"', f'"node-[0-{last - 1}]:*"')
            .replace('"node-3:0-6"', f'"node-{last}:0-6"')
            .replace('"node-3:7"', f'"node-{last}:7"')
            .replace("gpu: node-2:5\n    start: 4m", "gpu: node-57:3\n    start: 1m")
        )
    return load_scenario_text(text + HEALTH_FAULTS)


def demo_job_steps(path: Path) -> Any:
    from gpuwatt.store.job_steps import SqliteJobStepStore

    return SqliteJobStepStore(path)


class UnreachableStore:
    """A store whose every read fails as a store that cannot be reached does."""

    def latest(self, *, since_ns: int | None = None) -> list[Any]:
        raise StoreUnavailable("connection refused (influxdb:8086)")

    def series(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("connection refused (influxdb:8086)")

    def write_samples(self, samples: Any) -> None:
        raise StoreUnavailable("connection refused")

    def write_lines(self, lines: Any) -> None:
        raise StoreUnavailable("connection refused")

    def count_samples(self, start_ns: int, end_ns: int) -> int:
        raise StoreUnavailable("connection refused")

    def close(self) -> None:
        pass


def have_browser() -> bool:
    return (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()) or bool(
        shutil.which("chromium") and shutil.which("chromedriver")
    )


def chrome(
    *,
    page_load_timeout_s: float = 60.0,
    window_size: str = "1400,1000",
    basic_auth: tuple[str, str] | None = None,
    hide_scrollbars: bool = False,
) -> Any:
    """Debian's headless Chromium through Debian's chromedriver (nothing is downloaded),
    its console kept for the tests to read; with ``basic_auth`` (user, password) every request
    carries those credentials (the dashboard's authenticated actions). Also what
    ``tools/screenshots.py`` takes its pictures with."""
    import base64

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--window-size={window_size}",
        *(["--hide-scrollbars"] if hide_scrollbars else []),
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(page_load_timeout_s)
    if basic_auth is not None:
        token = base64.b64encode(":".join(basic_auth).encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
        )
    return driver


def wait(driver: Any, cond: Any, timeout: float = 60.0, poll_s: float = 0.5) -> Any:
    """Until ``cond(driver)`` holds; an element that a re-render replaced or removed meanwhile
    (the page redraws itself) is looked up again on the next try instead of failing the test."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, poll_frequency=poll_s, ignored_exceptions=ignored).until(
        cond
    )


def energy_today_text(store: Any, now_ns: int) -> str:
    """The overview's "Energy today" as a new dashboard (no cache shared) shows it."""
    from gpuwatt.dashboard.components import figure_text
    from gpuwatt.dashboard.data import DashboardData

    data = DashboardData(store, clock_ns=lambda: now_ns)
    try:
        today = data.energy_today(now_ns).cluster["energy_kwh"]
    finally:
        data.close()
    assert today.value
    return figure_text(today.value, "kWh")
