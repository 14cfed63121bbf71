"""Accounting, overlaps and restarts (docs/accounting.md): `gpuwatt demo` stopped and started
again on the same store carries on from its newest sample instead of backfilling over it, its
simulated GPUs' energy counters carry on too (as a real GPU's do across a collector's restart),
and the energy over the whole range stays the power drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_cli import gpuwatt

from gpuwatt.analytics import analyze
from gpuwatt.analytics.quality import Quality
from gpuwatt.model import GpuSample
from gpuwatt.store import open_store
from gpuwatt.store.base import SEEN_COLUMN


def _power_integral_j(frame: pd.DataFrame) -> float:
    """Trapezoids of power between consecutive samples of each GPU, over the time it was seen:
    a gap of more than three sampling intervals (the time between the two runs, however long
    the second took to start) left out, and the first sample after one standing for one
    interval at its power (docs/accounting.md, rule 3)."""
    total = 0.0
    for _, g in frame.sort_values("time_ns").groupby("uuid"):
        t = g["time_ns"].to_numpy() / 1e9
        p = g["power_w"].to_numpy()
        dt = np.diff(t)
        step = np.median(dt)
        keep = dt <= 3 * step
        total += float(np.sum(((p[1:] + p[:-1]) / 2 * dt)[keep]))
        total += float(p[0] + np.sum(p[1:][~keep])) * step
    return total


def test_demo_run_four_times_carries_on_and_counts_every_second_once(tmp_path: Path) -> None:
    args = ("demo", "--backfill", "300", "--duration", "1", "--no-dashboard", "--no-alerts")
    first = gpuwatt(*args, home=tmp_path)
    assert first.returncode == 0, first.stderr
    after, newest_then = _stored(tmp_path), _newest(tmp_path)
    for _ in range(3):  # three restarts: as many counter steps as would read as two writers
        before = after
        again = gpuwatt(*args, home=tmp_path)
        assert again.returncode == 0, again.stderr
        assert "carrying on from there" in again.stdout
        after = _stored(tmp_path)
        # the earlier samples are untouched: nothing was written over their times
        newest_before = int(before["time_ns"].max())
        # (but for the seen time of each GPU's newest sample, which now has a next one)
        kept = after.loc[after["time_ns"] <= newest_before].reset_index(drop=True)
        kept, was = (f.drop(columns=SEEN_COLUMN, errors="ignore") for f in (kept, before))
        assert kept.equals(was.reset_index(drop=True))
        assert len(after) > len(before)
        # the scenario carried on too: its training job (from 30 s) runs in the new samples,
        # and its straggler (hot from 4 min on) stays as hot as it was, not cooled to idle
        now = _newest(tmp_path)
        assert min(s.time_ns for s in now.values()) > newest_before
        assert "llm-pretrain" in {s.job_id for s in now.values()}
        hot_c = newest_then[("node-2", 5)].temperature_gpu_c
        assert hot_c is not None and hot_c > 80.0
        assert (now[("node-2", 5)].temperature_gpu_c or 0.0) > hot_c - 5.0
        newest_then = now
        # and so did its step count: the new run's steps are numbered after the old ones
        steps = _steps(tmp_path)
        new_steps = steps.loc[steps["time_ns"] > newest_before, "step"]
        assert (
            len(new_steps)
            and new_steps.min() > steps.loc[steps["time_ns"] <= newest_before, "step"].max()
        )
    assert not after.duplicated(["uuid", "time_ns"]).any()
    steps = _steps(tmp_path).sort_values("time_ns")
    assert steps["step"].is_monotonic_increasing and not steps["step"].duplicated().any()
    # every GPU's energy counter went on across the restarts: never back, never a jump (its
    # rise over any step, the time between two runs included, at a GPU's power: under 1 kW)
    by_uuid = after.sort_values(["uuid", "time_ns"]).groupby("uuid")
    rise_w = (by_uuid["energy_j"].diff() / (by_uuid["time_ns"].diff() / 1e9)).dropna()
    assert (rise_w >= 0).all() and rise_w.max() < 1000.0
    # energy over the whole range: the power drawn, all of it from the counters
    s = analyze(after, now_ns=int(after["time_ns"].max()) + 1, start_ns=0)
    by_gpu = s.energy_by_gpu
    assert set(by_gpu["energy_quality"]) == {Quality.MEASURED_COUNTER.value}
    assert (by_gpu["energy_conflicts"] == 0).all()
    assert not [n for n in s.notes if "energy counter" in n], s.notes
    energy_j = float(by_gpu["energy_j"].sum())
    assert energy_j == pytest.approx(_power_integral_j(after), rel=0.005)


def _steps(home: Path) -> pd.DataFrame:
    """The training job's recorded steps (rank 0)."""
    from gpuwatt.store.job_steps import open_job_step_store

    store = open_job_step_store(f"sqlite:///{home / 'gpuwatt.db'}")
    try:
        steps = store.job_steps(0, 2**62, job_ids=["llm-pretrain"])
    finally:
        store.close()
    return steps.loc[steps["rank"] == 0]


def _stored(home: Path) -> pd.DataFrame:
    store = open_store(f"sqlite:///{home / 'gpuwatt.db'}")
    try:
        return store.series(0, 2**62, ["power_w", "energy_j"])
    finally:
        store.close()


def _newest(home: Path) -> dict[tuple[str, int], GpuSample]:
    """Every GPU's newest sample, by (host, index)."""
    store = open_store(f"sqlite:///{home / 'gpuwatt.db'}")
    try:
        return {(s.host, s.gpu_index): s for s in store.latest()}
    finally:
        store.close()
