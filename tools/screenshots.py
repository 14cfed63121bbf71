"""Screenshots of every dashboard page at 1,600 and 800 px wide, light and dark, in one command.

    .venv/bin/python tools/screenshots.py [--out build/screenshots] [--readme docs/screenshots]
    make screenshots

The data is the demo scenario (4 x 8 H100: the thermal straggler on node-2 GPU 5, a training job
reporting its steps, the inference replicas reporting their requests) backfilled for 20 minutes
into a temporary embedded store, with an alert database holding one firing alert; the dashboard
runs on 127.0.0.1 with a frozen clock, so the same code gives the same pictures. Pages are
driven in Debian's headless Chromium (as the browser tests do) and captured whole (the page's
full height). ``--readme DIR`` also copies the README's pictures (``README_SHOTS``) there.
Needs the test extra (selenium) and Debian's chromium + chromium-driver.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NS = 1_000_000_000
END_NS = 1_767_225_600 * NS + 20 * 60 * NS  # 2026-01-01 00:20 UTC
MINUTES = 20
WIDTHS = (1600, 800)
THEMES = ("light", "dark")
#: (name, path): every page, and the drill-downs an operator opens from them.
PAGES: tuple[tuple[str, str], ...] = (
    ("overview", "/?range=15m"),
    ("balance", "/balance?range=15m"),
    ("stragglers", "/stragglers?range=15m"),
    ("efficiency", "/efficiency?range=15m"),
    ("jobs", "/jobs?range=15m"),
    ("job-training", "/jobs?range=15m&job=llm-pretrain"),
    ("job-inference", "/jobs?range=15m&job=chat-serving"),
    ("node", "/node?range=15m&host=node-2&gpu=5"),
    ("health", "/health?range=15m"),
    ("reports", "/reports?range=15m"),
    ("alerts", "/alerts?range=1h"),
)
#: The pictures the README shows.
README_SHOTS = (
    "overview-1600-light.png",
    "jobs-1600-dark.png",
    "job-inference-1600-light.png",
    "overview-800-dark.png",
)
WAIT_S = 90
#: The dashboard runs with authentication, so the alerts page shows its silence and expire
#: actions; the browser sends these credentials (throwaway: the server binds 127.0.0.1 only).
CREDENTIALS = {"GPUWATT_DASHBOARD_USER": "ops", "GPUWATT_DASHBOARD_PASSWORD": "screenshots"}


def build_store(path: Path) -> Any:
    """The demo scenario's samples, job steps and served requests over ``MINUTES``."""
    from gpuwatt.collector.sim.scenario import load_scenario
    from gpuwatt.collector.sim.serving import SimulatedServingReporter
    from gpuwatt.collector.sim.source import SimulatedClusterSource
    from gpuwatt.collector.sim.work import SimulatedWorkReporter
    from gpuwatt.store.job_steps import SqliteJobStepStore
    from gpuwatt.store.sqlite import SqliteStore

    source = SimulatedClusterSource(
        load_scenario("demo"), start_ns=END_NS - MINUTES * 60 * NS, clock_ns=lambda: END_NS
    )
    source.open()
    steps = SqliteJobStepStore(path)
    work = SimulatedWorkReporter(source.simulator, start_ns=source.start_ns)
    serving = SimulatedServingReporter(source.simulator, start_ns=source.start_ns)
    source.after_sample = lambda: steps.write_job_steps(work.poll() + serving.poll())
    store = SqliteStore(path)
    for batch in source.backfill(END_NS, interval_s=5.0, slow_interval_s=60.0):
        store.write_samples(batch)
    source.close()
    steps.close()
    store.flush_rollups()
    return store


def build_alerts(path: Path) -> Path:
    """One firing alert (the straggler) and one planned maintenance window."""
    from gpuwatt.alerts.db import open_db, transaction
    from gpuwatt.alerts.silences import MAINTENANCE, SilenceTable
    from gpuwatt.alerts.state import Alert, AlertTable

    con = open_db(path)
    labels = {"alertname": "GpuStraggler", "host": "node-2", "gpu": "5", "severity": "warning"}
    summary = "node-2 GPU 5 runs 33 % below its peers: hardware thermal slowdown (check fans)"
    firing = Alert(
        "fp1", "GpuStraggler", labels, {"summary": summary}, "firing", 0.67,
        pending_since_ns=END_NS - 600 * NS, firing_since_ns=END_NS - 480 * NS, updated_ns=END_NS,
    )  # fmt: skip
    with transaction(con):
        AlertTable(con).save(None, firing, END_NS - 480 * NS)
        SilenceTable(con).add(
            {"host": "node-3"}, author="ops", comment="PSU swap", starts_ns=END_NS + 3600 * NS,
            ends_ns=END_NS + 5 * 3600 * NS, now_ns=END_NS, kind=MAINTENANCE,
        )  # fmt: skip
    con.close()
    return path


def browser() -> Any:
    """The dashboard tests' headless Chromium (``tests/test_dashboard_support.chrome``), 1,600
    px wide, sending the dashboard's credentials."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_dashboard_support import chrome

    user, password = (
        CREDENTIALS["GPUWATT_DASHBOARD_USER"],
        CREDENTIALS["GPUWATT_DASHBOARD_PASSWORD"],
    )
    return chrome(
        page_load_timeout_s=WAIT_S,
        window_size="1600,1000",
        basic_auth=(user, password),
        hide_scrollbars=True,
    )


def settle(driver: Any, page_id: str) -> None:
    """Until the page's content is there, every graph drawn, and no loading spinner left."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def ready(d: Any) -> bool:
        if not d.find_elements(By.CSS_SELECTOR, f"#{page_id}-content > *"):
            return False
        graphs = d.find_elements(By.CSS_SELECTOR, ".dash-graph")
        svgs = d.find_elements(By.CSS_SELECTOR, ".dash-graph .main-svg")
        busy = d.find_elements(By.CSS_SELECTOR, "[data-dash-is-loading='true']")
        return len(svgs) >= len(graphs) and not busy

    WebDriverWait(driver, WAIT_S).until(ready)
    time.sleep(0.5)  # plotly's and the grid's last layout pass


def capture(driver: Any, url: str, page_id: str, width: int, theme: str, out: Path) -> list[str]:
    """One full-height PNG of ``url``; the browser console's errors while it loaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_window_size(width, 1000)
    driver.get_log("browser")
    driver.get(url)
    settle(driver, page_id)
    want = "dark" if theme == "dark" else "light"
    html = driver.find_element(By.TAG_NAME, "html")
    if html.get_attribute("data-mantine-color-scheme") != want:
        driver.find_element(By.CSS_SELECTOR, "#dark-switch").click()
        WebDriverWait(driver, WAIT_S).until(
            lambda d: (
                d.find_element(By.TAG_NAME, "html").get_attribute("data-mantine-color-scheme")
                == want
            )
        )
        settle(driver, page_id)
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        },
    )
    out.write_bytes(base64.b64decode(shot["data"]))
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/screenshots"))
    ap.add_argument("--readme", type=Path, help="also copy the README's pictures here")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gpuwatt.cli.compose import AlertsDbView
    from gpuwatt.config import Config
    from gpuwatt.dashboard.server import start
    from gpuwatt.store.job_steps import SqliteJobStepStore

    args.out.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "demo.db"
        print(f"building the demo store ({MINUTES} minutes, 32 GPUs)", flush=True)
        store = build_store(db)
        alerts = AlertsDbView(build_alerts(Path(tmp) / "alerts.db"), clock_ns=lambda: END_NS)
        steps = SqliteJobStepStore(db)
        running = start(
            store, "127.0.0.1", 0, environ=CREDENTIALS, now_ns=END_NS, alerts=alerts,
            job_steps=steps,
            config=Config(),  # the default price and carbon intensity, as `gpuwatt demo` has
        )  # fmt: skip
        driver = browser()
        try:
            for theme in THEMES:
                for width in WIDTHS:
                    for name, path in PAGES:
                        page_id = "jobs" if name.startswith("job") else name
                        out = args.out / f"{name}-{width}-{theme}.png"
                        url = running.url.rstrip("/") + path
                        for e in capture(driver, url, page_id, width, theme, out):
                            errors.append(f"{out.name}: {e}")
                        print(f"  {out}  {out.stat().st_size / 1e3:.0f} kB", flush=True)
        finally:
            driver.quit()
            running.stop()
            steps.close()
            store.close()
    if args.readme is not None:
        args.readme.mkdir(parents=True, exist_ok=True)
        for name in README_SHOTS:
            shutil.copyfile(args.out / name, args.readme / name)
        print(f"README pictures copied to {args.readme}")
    for e in errors:
        print(f"browser console error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
