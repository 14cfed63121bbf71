"""``demo-scenario.json``: where a demo's scenario stood, used only for the same store,
scenario and seed."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpuwatt.cli import demo_clock
from gpuwatt.cli.common import load_scenario

NS = 1_000_000_000
STORE = "influxdb://ops:s3cret@db.example:8086/gpus?token=abc"


def test_the_scenario_time_is_read_back_for_the_same_store_and_scenario(tmp_path: Path) -> None:
    path = demo_clock.clock_path(tmp_path / "demo-spool")
    demo, healthy = load_scenario("demo"), load_scenario("healthy")
    demo_clock.save(path, STORE, demo, zero_ns=1_000 * NS)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "s3cret" not in text and "abc" not in text and "db.example" not in text
    assert demo_clock.scenario_time_s(path, STORE, demo, 1_300 * NS) == 300.0
    # another store, another scenario, a time before the scenario's start: from 0
    assert demo_clock.scenario_time_s(path, "sqlite:///other.db", demo, 1_300 * NS) == 0.0
    assert demo_clock.scenario_time_s(path, STORE, healthy, 1_300 * NS) == 0.0
    assert demo_clock.scenario_time_s(path, STORE, demo, 999 * NS) == 0.0


def test_a_missing_or_damaged_file_starts_the_scenario_from_0(tmp_path: Path) -> None:
    path = tmp_path / demo_clock.FILE_NAME
    demo = load_scenario("demo")
    assert demo_clock.scenario_time_s(path, STORE, demo, NS) == 0.0
    for text in ("{", "[]", '{"version": 2}', '{"version": 1, "zero_ns": "0"}'):
        path.write_text(text)
        assert demo_clock.scenario_time_s(path, STORE, demo, NS) == 0.0


def test_a_file_that_cannot_be_written_is_logged_and_the_demo_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")  # a file where the directory would be
    path = demo_clock.clock_path(blocked / "demo-spool" / "x")
    with caplog.at_level("WARNING", logger="gpuwatt"):
        demo_clock.save(path, STORE, load_scenario("demo"), zero_ns=NS)
    assert "not kept" in caplog.text and not path.exists()
