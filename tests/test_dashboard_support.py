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


def build_demo_store(
    path: Path, *, minutes: int = DEMO_MINUTES, interval_s: float = 5.0, job_steps: bool = False
) -> Any:
    """The shipped demo scenario backfilled into SQLite: 32 GPUs, node-2 GPU 5 straggling
    (thermal slowdown from minute 4). Deterministic: seeded scenario, injected times.
    ``job_steps``: the training job also reports its steps and the inference job its requests
    (``demo_job_steps(path)`` reads them), as ``gpuwatt demo`` does."""
    end = DEMO_END_NS
    source = SimulatedClusterSource(
        load_scenario("demo"), start_ns=end - minutes * 60 * NS, clock_ns=lambda: end
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


def chrome() -> Any:
    """Debian's headless Chromium through Debian's chromedriver (nothing is downloaded)."""
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
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
