"""Accounting acceptance 2 (issue 13's first paragraph, docs/accounting.md): after 46 minutes
of the demo, the dashboard's 1h, 6h, 24h, 7d and "today" views, ``gpuwatt analyze`` and
``gpuwatt report`` cover the same seconds and say the same: energy, GPU-hours per job and the
straggler's minutes (they said 12.3, 13.1 and 25.6 kWh; 48.0 and 18.8 GPU-h; 0 straggler minutes
at 7 days for a straggler active for 33 minutes)."""

from __future__ import annotations

import csv
import io
import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_cli import gpuwatt

from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.timerange import iso_s, parse_range
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
MIDNIGHT_NS = 1_767_225_600 * NS  # 2026-01-01 00:00 UTC
END_NS = MIDNIGHT_NS + 50 * 60 * NS
MINUTES = 46  # of data, from 00:04: every view below holds all of it
VIEWS = ("1h", "6h", "24h", "7d")


def _demo_db(path: Path, start_ns: int, end_ns: int, interval_s: float, slow_s: float) -> Path:
    """The demo scenario simulated from ``start_ns`` to ``end_ns`` into a new embedded store."""
    source = SimulatedClusterSource(
        load_scenario("demo"), start_ns=start_ns, clock_ns=lambda: end_ns
    )
    source.open()
    with SqliteStore(path) as store:
        for batch in source.backfill(end_ns, interval_s=interval_s, slow_interval_s=slow_s):
            store.write_samples(batch)
        store.flush_rollups()
    source.close()
    return path


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("views") / "demo.db"
    return _demo_db(path, END_NS - MINUTES * 60 * NS, END_NS, 5.0, 60.0)


def _report(db: Path, home: Path, start: str, by: str) -> list[dict[str, str]]:
    """``gpuwatt report`` as a user runs it, over the range ending at the demo's end."""
    out = gpuwatt(
        "report", "--store", f"sqlite:///{db}", "--from", start, "--to", iso_s(END_NS),
        "--by", by, "--out", "-", home=home,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return list(csv.DictReader(io.StringIO(out.stdout)))


def _analyze_kwh(db: Path, home: Path) -> tuple[float, float]:
    """``gpuwatt analyze`` over the range that ends now and starts an hour before the demo's
    end (the demo's data are in the past): its energy (kWh) and GPU-hours."""
    since_s = (time.time_ns() - (END_NS - 3600 * NS)) // NS
    out = gpuwatt("analyze", "--store", f"sqlite:///{db}", "--since", f"{since_s}s", home=home)
    assert out.returncode == 0, out.stderr
    energy = re.search(r"^\s+energy\s+([\d.e+]+) kWh", out.stdout, re.M)
    hours = re.search(r"^\s+GPU-hours \(time seen\)\s+([\d.e+]+) h", out.stdout, re.M)
    assert energy and hours, out.stdout
    return float(energy.group(1)), float(hours.group(1))


def test_every_view_report_and_analysis_agree_on_the_same_seconds(
    demo_db: Path, tmp_path: Path
) -> None:
    with SqliteStore(demo_db) as store:
        data = DashboardData(store, clock_ns=lambda: END_NS)
        try:
            views, windows = {}, {}
            for preset in VIEWS:
                tr, problem = parse_range({"range": preset}, END_NS)
                assert problem is None and tr.live
                windows[preset] = data.window(tr)
                views[preset] = windows[preset].summary
            today = data.energy_today(END_NS).cluster["energy_kwh"]
        finally:
            data.close()
    energy = {p: s.cluster["energy_kwh"].value for p, s in views.items()}
    hours = {p: s.cluster["gpu_hours"].value for p, s in views.items()}
    straggler = {p: s.cluster["straggler_minutes"].value for p, s in views.items()}
    one_hour = views["1h"]
    print("energy_kwh", energy, "gpu_hours", hours, "straggler_min", straggler)  # pytest -s
    assert energy["1h"] is not None and energy["1h"] > 0
    # 32 GPUs seen for the 46 minutes
    assert hours["1h"] == pytest.approx(32 * MINUTES / 60, rel=1e-3)
    assert straggler["1h"] is not None and straggler["1h"] > 20  # node-2 GPU 5, from minute ~4
    for p in VIEWS:
        assert energy[p] == pytest.approx(energy["1h"], rel=1e-3), (p, energy)
        assert hours[p] == pytest.approx(hours["1h"], rel=1e-3), (p, hours)
        assert straggler[p] == pytest.approx(straggler["1h"], rel=1e-3), (p, straggler)
    assert today.value == pytest.approx(energy["1h"], rel=1e-3)
    assert {s.quality for s in (today, one_hour.cluster["energy_kwh"])} == {
        one_hour.cluster["energy_kwh"].quality
    }

    # verdicts that do not depend on the range shown: the idle GPU, the straggler's onset
    idle = {
        p: {(i.host, i.gpu_index, round(i.idle_energy_j or 0)) for i in s.idle}
        for p, s in views.items()
    }
    assert all(v == idle["1h"] for v in idle.values()), idle
    assert {(h, i) for h, i, _ in idle["1h"]} == {("node-3", 7)}
    onsets = {
        p: {(x.host, x.gpu_index, x.onset_ns) for x in w.active_stragglers}
        for p, w in windows.items()
    }
    assert all(v == onsets["1h"] for v in onsets.values()), onsets
    assert {(h, i) for h, i, _ in onsets["1h"]} == {("node-2", 5)}

    cli_kwh, cli_hours = _analyze_kwh(demo_db, tmp_path)
    assert cli_kwh == pytest.approx(energy["1h"], rel=1e-3)
    assert cli_hours == pytest.approx(hours["1h"], rel=1e-3)

    # gpuwatt report --by job over 1 hour, 24 hours and 7 days: the same GPU-hours and energy
    reports = {start: _report(demo_db, tmp_path, start, "job") for start in ("1h", "24h", "7d")}
    per_job = {
        start: {r["job_id"]: (float(r["gpu_hours_h"]), float(r["energy_kwh"])) for r in rows}
        for start, rows in reports.items()
    }
    assert set(per_job["1h"]) == {"llm-pretrain", "chat-serving", "notebook-17"}
    train_h, _ = per_job["1h"]["llm-pretrain"]
    assert train_h == pytest.approx(24 * MINUTES / 60, rel=1e-3)
    for start, jobs in per_job.items():
        assert set(jobs) == set(per_job["1h"]), start
        for job, (h, kwh) in jobs.items():
            assert h == pytest.approx(per_job["1h"][job][0], rel=1e-3), (start, job)
            assert kwh == pytest.approx(per_job["1h"][job][1], rel=1e-3), (start, job)
    # the straggler's minutes in a 7-day report are those of the 1-hour report
    by_gpu = {start: _report(demo_db, tmp_path, start, "gpu") for start in ("1h", "7d")}
    minutes = {
        start: next(
            float(r["straggler_minutes_min"])
            for r in rows
            if (r["host"], r["gpu_index"]) == ("node-2", "5")
        )
        for start, rows in by_gpu.items()
    }
    assert minutes["1h"] > 20 and minutes["7d"] == pytest.approx(minutes["1h"], rel=1e-3)


@pytest.fixture(scope="module")
def day_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo from 00:00 to 20:00, sampled every minute."""
    path = tmp_path_factory.mktemp("day") / "day.db"
    return _demo_db(path, MIDNIGHT_NS, MIDNIGHT_NS + 20 * 3600 * NS, 60.0, 300.0)


@pytest.mark.parametrize("hours_in", [0.5, 1.7, 2.5, 5.9, 6.2, 19.4])
@pytest.mark.parametrize("in_minutes", [True, False])
def test_energy_today_is_the_energy_of_a_view_of_the_day(
    day_db: Path, hours_in: float, in_minutes: bool
) -> None:
    """The overview's "Energy today" is the energy a view of the day shows, in its windows:
    minutes where the view is accounted in minutes (a small cluster), else the view's buckets
    (``in_minutes=False``: a cluster too large for that, whose day is read in hours once it is
    6 h old, not in 5-minute buckets)."""
    now_ns = MIDNIGHT_NS + round(hours_in * 3600) * NS
    end_ns = now_ns - now_ns % (60 * NS) + 60 * NS  # the current minute included
    with SqliteStore(day_db) as store:
        data = DashboardData(store, clock_ns=lambda: now_ns)
        if not in_minutes:
            data.accounting_max_gpu_minutes = 0
        asked: list[int | None] = []
        series_many = store.series_many

        def recorded(reads: Any, **kw: Any) -> Any:
            asked.extend(r.step_s for r in reads)
            return series_many(reads, **kw)

        try:
            store.series_many = recorded  # type: ignore[method-assign]
            today = data.energy_today(now_ns).cluster["energy_kwh"]
            store.series_many = series_many  # type: ignore[method-assign]
            query = {"from": iso_s(MIDNIGHT_NS), "to": iso_s(end_ns)}
            tr, problem = parse_range(query, now_ns)
            assert problem is None
            view = data.window(tr).summary.cluster["energy_kwh"]
        finally:
            data.close()
    coarse = 60 if hours_in <= 2 else 300 if hours_in <= 6 else 3600
    assert set(asked) == {60 if in_minutes else coarse}
    assert view.value is not None and view.value > 0
    assert today.value == pytest.approx(view.value, rel=1e-9), (hours_in, asked)
    assert today.quality == view.quality


def test_energy_today_in_a_new_minute_is_served_then_read_again(day_db: Path) -> None:
    """A visitor in a new minute gets the figure of the minute before at once (it is keyed by
    the day, as a live view), read again in the background up to the new minute."""
    clock = [MIDNIGHT_NS + 19 * 3600 * NS + 30 * NS]
    with SqliteStore(day_db) as store:
        data = DashboardData(store, clock_ns=lambda: clock[0], ttl_s=0.0)
        fresh = DashboardData(store, clock_ns=lambda: clock[0])
        try:
            before = data.energy_today(clock[0]).cluster["energy_kwh"].value
            clock[0] += 120 * NS
            served = data.energy_today(clock[0]).cluster["energy_kwh"].value
            deadline = time.monotonic() + 60
            while data.cache.refreshing and time.monotonic() < deadline:
                time.sleep(0.05)
            data.cache.ttl_s = 3600.0
            again = data.energy_today(clock[0]).cluster["energy_kwh"].value
            expected = fresh.energy_today(clock[0]).cluster["energy_kwh"].value
        finally:
            data.close()
            fresh.close()
    assert before is not None and expected is not None
    assert served == before  # not read while the visitor waits
    assert expected > before  # two more minutes of a running cluster
    assert again == pytest.approx(expected, rel=1e-12)
