"""``gpuwatt collect --metrics-port``: the latest samples as a Prometheus scrape target."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prom_fixtures import PrometheusServer, have_prometheus
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpuwatt.collector.exposition import LatestSamples
from gpuwatt.model import EnergyMethod, GpuSample
from gpuwatt.schema import REASON_HW_SLOWDOWN, REASON_SW_POWER_CAP
from gpuwatt.store import open_store

NS = 1_000_000_000
URL_IN_LOG = re.compile(r"serving /metrics on (http://[\d.]+:\d+/metrics)")


def _scrape(latest: LatestSamples) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.exposition import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(latest)
    text = generate_latest(registry).decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _gpu(index: int, **kw: object) -> GpuSample:
    base: dict[str, object] = {
        "time_ns": 1_700_000_000 * NS,
        "host": "node-1",
        "gpu_index": index,
        "uuid": f"GPU-{index}",
        "name": "NVIDIA H100 80GB HBM3",
    }
    base.update(kw)
    return GpuSample(**base)  # type: ignore[arg-type]


def test_units_absent_metrics_lost_gpus_and_counters() -> None:
    latest = LatestSamples()
    busy = _gpu(
        0,
        utilization_gpu_pct=87.0,
        power_w=650.5,
        sm_clock_mhz=1410.0,
        energy_j=1234.5,
        energy_method=EnergyMethod.COUNTER,
        clock_event_reasons=REASON_HW_SLOWDOWN | REASON_SW_POWER_CAP,
        xid_errors=(79,),
        job_id="train-7",
    )
    latest.update([busy, _gpu(1, lost=True, power_w=None)])
    latest.update([busy, _gpu(1, lost=True)])  # a second tick: XIDs add up, values are the newest
    page = _scrape(latest)

    up = {labels["gpu"]: value for labels, value in page["gpuwatt_gpu_up"]}
    assert up == {"0": 1.0, "1": 0.0}
    ((labels, util),) = page["gpuwatt_gpu_utilization_ratio"]
    assert labels == {
        "host": "node-1",
        "gpu": "0",
        "uuid": "GPU-0",
        "name": "NVIDIA H100 80GB HBM3",
        "job_id": "train-7",
    }
    assert util == pytest.approx(0.87)
    assert page["gpuwatt_sm_clock_hertz"][0][1] == pytest.approx(1.41e9)
    assert page["gpuwatt_power_watts"][0][1] == pytest.approx(650.5)
    # not measured is absent, never 0; a lost GPU has no gauges at all
    assert "gpuwatt_gpu_temperature_celsius" not in page
    assert all(labels["gpu"] == "0" for labels, _ in page["gpuwatt_power_watts"])
    ((labels, joules),) = page["gpuwatt_energy_joules_total"]
    assert joules == 1234.5 and labels["method"] == "counter"
    reasons = {labels["reason"]: v for labels, v in page["gpuwatt_clock_event_reason_active"]}
    assert reasons == {
        "sw_power_cap": 1.0,
        "hw_slowdown": 1.0,
        "sw_thermal": 0.0,
        "hw_thermal": 0.0,
        "hw_power_brake": 0.0,
    }
    assert [v for _, v in page["gpuwatt_xid_errors_total"]] == [2.0]  # one XID in each tick


@contextlib.contextmanager
def running_collector(tmp_path: Path) -> Iterator[str]:
    """``gpuwatt collect --simulate demo --metrics-port 0``; yields its /metrics URL."""
    env = {**os.environ, "GPUWATT_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("GPUWATT_STORE", None)
    log_path = tmp_path / "collector.log"
    with log_path.open("w") as log:  # a file, not a pipe: an unread pipe would block the logger
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gpuwatt", "collect", "--simulate", "demo"),
                *("--interval", "0.5", "--duration", "90"),
                *("--store", f"sqlite:///{tmp_path / 'x.db'}", "--spool", str(tmp_path / "spool")),
                *("--metrics-port", "0"),
            ],
            env=env,
            stderr=log,
        )
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            match = re.search(
                r"serving /metrics on (http://[\d.]+:\d+/metrics)", log_path.read_text()
            )
            url = match.group(1) if match else None
            time.sleep(0.2)
        assert url is not None, f"no /metrics log line: {log_path.read_text()[-2000:]}"
        assert url.startswith("http://127.0.0.1:")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs Debian's prometheus (promtool)")
def test_a_running_collector_serves_metrics_that_promtool_accepts(tmp_path: Path) -> None:
    with running_collector(tmp_path) as url:
        deadline = time.monotonic() + 60
        text = ""
        while "gpuwatt_power_watts{" not in text and time.monotonic() < deadline:
            time.sleep(0.5)
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.strip() == "" and check.stderr.strip() == ""  # no lint complaint
        families = {f.name: f for f in text_string_to_metric_families(text)}
        up = [s for s in families["gpuwatt_gpu_up"].samples]
        assert len(up) == 32  # the demo cluster: 4 nodes x 8 GPUs
        assert families["gpuwatt_energy_joules"].type == "counter"
        assert all(s.value > 0 for s in families["gpuwatt_power_watts"].samples)


@pytest.mark.skipif(not have_prometheus(), reason="needs Debian's prometheus")
def test_prometheus_scraping_collectors_is_a_gpuwatt_store(tmp_path: Path) -> None:
    """Prometheus scrapes a running collector; prometheus:// then reads the same GPUs back."""
    with running_collector(tmp_path) as url:
        target = url.removeprefix("http://").removesuffix("/metrics")
        server = PrometheusServer(scrape_targets=[target])
        try:
            store = open_store(server.url.replace("http://", "prometheus://"))
            latest: list[GpuSample] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                latest = store.latest()
                if len(latest) == 32 and all(s.power_w for s in latest):
                    # two scrapes at least, so that a bucket holds more than one sample
                    frame = store.series(time.time_ns() - 30 * NS, time.time_ns(), ["power_w"])
                    if frame.groupby("uuid").size().min() >= 2:
                        break
                time.sleep(1)
            assert len(latest) == 32, [s.uuid for s in latest]
            assert {s.host for s in latest} == {f"node-{n}" for n in range(4)}
            assert all(s.name == "NVIDIA H100 80GB HBM3" and not s.lost for s in latest)
            assert all(s.power_w and s.power_w > 0 for s in latest)
            assert all(s.energy_j and s.energy_j > 0 for s in latest)
            now = time.time_ns()
            buckets = store.series(now - 60 * NS, now, ["power_w", "energy_j"], step_s=10)
            assert set(buckets["uuid"]) == {s.uuid for s in latest}
            assert buckets["power_w"].gt(0).all()
            store.close()
        finally:
            server.cleanup()
