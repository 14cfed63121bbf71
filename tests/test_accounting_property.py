"""Accounting acceptance 1 (docs/accounting.md): over random ranges, on both store backends.

A store holds 60 hours of a small simulated cluster (tests/data/accounting_cluster.yaml: a
straggler, an idle allocated GPU, a lost GPU, an energy counter reset) sampled every 30 s, with
a four-hour collector gap, late rounds, a missed round and ten minutes sampled every 10 s. The
gap, the loss and the irregular sampling lie inside hours, not on bucket boundaries. For ranges
that start and end anywhere, 1 minute to 7 days long:

- energy, GPU-hours (seen time), idle energy and straggler seconds of a range equal the sum of
  its two parts within 0.1 %;
- energy and GPU-hours are the same whether raw samples, 1-minute or 1-hour buckets serve the
  range, idle energy and straggler seconds the same from raw samples and 1-minute buckets
  (they are decided per minute; see docs/accounting.md, "Status");
- energy is the simulator's own energy (its power integral) over the seconds sampled in the
  range within 0.5 %.

The store is built once per module and backend; the InfluxDB data are loaded through the
store's own writer into Debian's influxd and rolled up there as collectors roll them
(``engine_rollups.roll_range``), so that bucketed reads come from the engine's rollups.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from gpuwatt.analytics import analyze
from gpuwatt.analytics.inputs import context_reads, joined
from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.model import GpuSample
from gpuwatt.store import engine_rollups
from gpuwatt.store.base import Store, series_many

NS = 1_000_000_000
H = 3600 * NS
T0 = 19_676 * 86_400 * NS  # a midnight (UTC), so buckets of every size start with the data
HOURS = 60
SAMPLE_S = 30
M = 60 * NS
GAP = (T0 + 30 * H + 20 * M, T0 + 34 * H + 20 * M)  # the collector is down: never stored
LATE = (T0 + 10 * H + 7 * M, T0 + 10 * H + 53 * M)  # every third round 11 s late
MISSED_NS = T0 + 12 * H + 30 * M + 30 * NS  # a round never taken
FAST = (T0 + 14 * H + 25 * M, T0 + 14 * H + 35 * M)  # sampled every 10 s
LOST_NS = T0 + 40 * H + 20 * M  # node-1 GPU 3 falls off the bus
SCENARIO = Path(__file__).parent / "data" / "accounting_cluster.yaml"
RESET_GPU = ("node-0", 1)
RESET_S = 72001  # the driver reload (tests/data/accounting_cluster.yaml)
MAX_POWER_W = 700.0  # H100 SXM


@dataclass(frozen=True, repr=False)
class Cluster:
    samples: list[GpuSample]
    #: per (host, index): sample times (ns) and the simulator's true energy (J) at each, the
    #: counter plus what it held when it restarted
    truth: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
    jobs: dict[str, str]


def _sample_times() -> list[int]:
    """When the collector samples: every 30 s, but late, missed and faster where the test's
    irregularities are."""
    times = []
    for k, t in enumerate(range(T0, T0 + HOURS * H, SAMPLE_S * NS)):
        if t == MISSED_NS:
            continue
        if LATE[0] <= t < LATE[1] and k % 3 == 0:
            t += 11 * NS
        times.append(t)
        if FAST[0] <= t < FAST[1]:
            times += [t + 10 * NS, t + 20 * NS]
    return times


def _simulate() -> Cluster:
    source = SimulatedClusterSource(load_scenario(str(SCENARIO)), start_ns=T0)
    source.open()
    samples: list[GpuSample] = []
    try:
        for k, t in enumerate(_sample_times()):
            batch = source.sample_at(t, include_slow=k % 10 == 0)
            if not GAP[0] <= t < GAP[1]:
                samples += batch
    finally:
        source.close()
    # The collector keeps its counter going over the driver reload (collector.energy); a
    # collector restarted with the reload, or Telegraf, stores NVML's own counter: energy since
    # the reload. The store gets that; the truth is the collector's continuous counter (the
    # simulator's integral, less the one second before the reload that no counter measured).
    truth = {}
    reset_ns = T0 + RESET_S * NS
    base_j = next(
        s.energy_j
        for s in reversed(samples)
        if (s.host, s.gpu_index) == RESET_GPU and s.time_ns < reset_ns and not s.lost
    )
    by_gpu: dict[tuple[str, int], list[GpuSample]] = {}
    for s in samples:
        if not s.lost:
            by_gpu.setdefault((s.host, s.gpu_index), []).append(s)
    for key, ss in by_gpu.items():
        t = np.array([s.time_ns for s in ss], dtype=np.int64)
        e = np.array([s.energy_j for s in ss], dtype=float)
        p = np.array([s.power_w for s in ss], dtype=float)
        truth[key] = (t, e, p)
    stored = [
        replace(s, energy_j=s.energy_j - base_j)
        if (s.host, s.gpu_index) == RESET_GPU and s.time_ns > reset_ns and s.energy_j is not None
        else s
        for s in samples
    ]
    jobs = {s.uuid: s.job_id for s in samples if s.job_id}
    return Cluster(stored, truth, jobs)


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return _simulate()


@pytest.fixture(scope="module", params=["sqlite", "influxdb"])
def store(request: pytest.FixtureRequest, cluster: Cluster, tmp_path_factory) -> Iterator[Store]:
    batches = [cluster.samples[i : i + 8 * 120] for i in range(0, len(cluster.samples), 8 * 120)]
    if request.param == "sqlite":
        from gpuwatt.store.sqlite import SqliteStore

        s = SqliteStore(tmp_path_factory.mktemp("acc") / "acc.db")
        for b in batches:
            s.write_samples(b)
        s.flush_rollups()  # every minute and hour rolled: levels really differ
        try:
            yield s
        finally:
            s.close()
        return
    from gpuwatt.store.influx import InfluxStore

    server = request.getfixturevalue("influxdb1")
    db = f"acc_{uuidlib.uuid4().hex[:10]}"
    server.create_database(db)
    s = InfluxStore(server.url, "", db, timeout_s=60)
    try:
        for b in batches:
            s.write_samples(b)
        # the engine's own rollups, as collectors keep them (collector.rollup_writer)
        assert engine_rollups.roll_range(s.rollups, T0, T0 + HOURS * H) > 0
        yield s
    finally:
        s.close()
        server.drop_database(db)


FIGURES = ("energy_j", "seen_s", "idle_energy_j", "straggler_s")


def figures(store: Store, cluster: Cluster, a: int, b: int, step_s: int | None) -> dict[str, float]:
    """The cluster's figures over ``[a, b)`` read at ``step_s`` (None: raw samples), through
    the readers' own input (the context rows, then the range)."""
    frame = joined(series_many(store, context_reads(a, b, step_s)))
    s = analyze(frame, now_ns=b, start_ns=a, window_s=60, jobs=cluster.jobs, step_s=step_s)
    g = s.energy_by_gpu
    if g.empty:
        return dict.fromkeys(FIGURES, 0.0)
    return {f: float(np.nansum(g[f].to_numpy(dtype=float))) for f in FIGURES}


def simulator_energy_j(cluster: Cluster, a: int, b: int) -> float:
    """The simulator's energy over the seconds sampled in ``[a, b)``: each sample stands for the
    time since its GPU's previous one (a run's first sample: one interval at its power), as
    long as that is no more than three sampling intervals (docs/accounting.md, rule 3)."""
    total = 0.0
    for t, e, p in cluster.truth.values():
        i = np.flatnonzero((t >= a) & (t < b))
        if not len(i):
            continue
        dt = np.where(i > 0, t[i] - t[np.maximum(i - 1, 0)], 0)
        joined_run = (i > 0) & (dt <= 3 * SAMPLE_S * NS)
        total += float(
            np.sum(np.where(joined_run, e[i] - e[np.maximum(i - 1, 0)], p[i] * SAMPLE_S))
        )
    return total


def _close(x: float, y: float, rel: float, abs_: float) -> bool:
    return abs(x - y) <= max(rel * max(abs(x), abs(y)), abs_)


#: Absolute slack per figure: float rounding (a part can hold almost nothing).
ABS = {"energy_j": 1.0, "seen_s": 1e-3, "idle_energy_j": 1.0, "straggler_s": 1e-3}
#: Straggler seconds from raw samples and from minutes: one window apart at most (a minute keeps
#: the clock-event reasons of its newest sample, raw samples all of theirs).
STRAGGLER_LEVELS_S = 60.0

ranges = st.tuples(
    st.integers(T0 - 2 * H, T0 + (HOURS + 1) * H),  # start
    st.integers(60 * NS, 7 * 24 * H),  # length
    st.floats(0.001, 0.999),  # where the range is split
)


@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example reads the store 10 times
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example((T0 + 3 * H + 29 * NS, 40 * 60 * NS, 0.5))  # the 40 minutes from :29
@example((T0 + 20 * H - 50 * NS, 2 * 60 * NS, 0.37))  # across the counter reset
@example((T0 + 25 * H + 17 * NS, 4 * H, 0.31))  # the straggler's onset, split inside it
@example((T0 + 29 * H + 59 * 60 * NS, 5 * H, 0.1))  # across the collector gap
@example((T0 + 30 * H + 19 * 60 * NS + 3, 30 * 60 * NS, 0.5))  # the gap's start, inside an hour
@example((T0 + 34 * H + 7 * 60 * NS, 2 * H, 0.11))  # the gap's end, inside an hour
@example((T0 + 39 * H + 58 * 60 * NS + 7, 3 * 60 * NS, 0.5))  # before the GPU is lost
@example((T0 + 40 * H + 3 * 60 * NS + 7, 30 * 60 * NS, 0.55))  # the GPU lost, inside an hour
@example((T0 + 9 * H + 55 * 60 * NS, 2 * H, 0.47))  # late rounds and a missed one
@example((T0 + 14 * H + 20 * 60 * NS + 5, 20 * 60 * NS, 0.5))  # a faster sampling
@example((T0 - 2 * H, 7 * 24 * H, 0.5))  # everything: seven days
@example((T0 + 30 * H + 32 * 60 * NS + 7, 14_255 * NS, 0.86))  # from inside the collector gap
@example((T0 + 5 * H + 5 * 60 * NS + 45_130_000_000, 72 * NS, 0.833))  # a part without a sample
@given(r=ranges)
def test_a_range_is_the_sum_of_its_parts_at_every_level_and_the_power_drawn(
    store: Store, cluster: Cluster, r: tuple[int, int, float]
) -> None:
    a, length, split = r
    b = a + length
    m = a + max(1, min(length - 1, round(length * split)))
    minute = figures(store, cluster, a, b, 60)
    raw = figures(store, cluster, a, b, None)
    hour = figures(store, cluster, a, b, 3600)
    parts = [figures(store, cluster, a, m, 60), figures(store, cluster, m, b, 60)]
    # A counter run that starts inside the range (a restart, the collector's return) is filled
    # from power over its first row's slot: rows of different sizes place a restart's row
    # differently, by up to one sampling interval of that GPU, and an hour's mean power is not
    # its counter (sampled power misses what happens between samples: here up to ~1 %).
    slack = {**ABS, "straggler_s": STRAGGLER_LEVELS_S}
    if a - H < T0 + RESET_S * NS < b + H:
        slack["energy_j"] += MAX_POWER_W * SAMPLE_S
    hour_slack = dict(slack)
    if a < GAP[1] + H and GAP[1] < b:
        hour_slack["energy_j"] += 0.01 * MAX_POWER_W * 3600 * 8
    for f in FIGURES:
        total = parts[0][f] + parts[1][f]
        assert _close(minute[f], total, 1e-3, ABS[f]), (f, minute[f], parts)
        assert _close(raw[f], minute[f], 1e-3, slack[f]), (f, "raw", raw[f], minute[f])
    for f in ("energy_j", "seen_s"):
        assert _close(hour[f], minute[f], 1e-3, hour_slack[f]), (f, "hour", hour[f], minute[f])
    want_j = simulator_energy_j(cluster, a, b)
    assert _close(raw["energy_j"], want_j, 5e-3, ABS["energy_j"]), (raw["energy_j"], want_j)
    assert _close(minute["energy_j"], want_j, 5e-3, ABS["energy_j"])
    # seen time is never longer than the range, per GPU, but for the slot of a sample taken
    # just before the range's end (a sample's slot counts in the range of its sample)
    assert minute["seen_s"] <= 8 * ((b - a) / NS + SAMPLE_S) + 1e-6


def test_the_lost_gpu_is_listed_and_its_lost_time_is_in_no_figure(
    store: Store, cluster: Cluster
) -> None:
    a, b = T0 + 39 * H, T0 + 42 * H
    frame = joined(series_many(store, context_reads(a, b, 60)))
    s = analyze(frame, now_ns=b, start_ns=a, window_s=60, jobs=cluster.jobs, step_s=60)
    (lost,) = s.lost
    assert (lost.host, lost.gpu_index) == ("node-1", 3)
    assert lost.last_seen_ns is not None and lost.last_seen_ns >= LOST_NS - 60 * NS
    assert LOST_NS <= lost.lost_since_ns < LOST_NS + 60 * NS
    g = s.energy_by_gpu.set_index(["host", "gpu_index"])
    # 80 minutes seen of three hours, to the sample; the other GPUs all three
    assert g.loc[("node-1", 3), "seen_s"] == pytest.approx(80 * 60, abs=SAMPLE_S)
    assert g.drop(index=("node-1", 3))["seen_s"].to_numpy() == pytest.approx(3 * 3600)


@pytest.mark.parametrize("step_s", [None, 60, 3600])
def test_time_counts_only_while_seen_to_the_second_at_every_level(
    store: Store, cluster: Cluster, step_s: int | None
) -> None:
    """Over whole hours around events inside them, every level gives each GPU the time it was
    seen, to the second: the collector gap's four hours, the lost GPU's time after its loss,
    and the irregular sampling none."""
    if not _knows_seen_time(store):
        pytest.skip("this store does not give the seen time of a bucket (docs/accounting.md)")
    cases = [
        ((T0 + 30 * H, T0 + 35 * H), {k: 3600.0 for k in cluster.truth}),
        ((T0 + 40 * H, T0 + 41 * H), {k: 3600.0 for k in cluster.truth} | {("node-1", 3): 1200.0}),
        ((T0 + 10 * H, T0 + 11 * H), {k: 3600.0 for k in cluster.truth}),
        ((T0 + 14 * H, T0 + 15 * H), {k: 3600.0 for k in cluster.truth}),
    ]
    for (a, b), want in cases:
        frame = joined(series_many(store, context_reads(a, b, step_s)))
        s = analyze(frame, now_ns=b, start_ns=a, window_s=60, jobs=cluster.jobs, step_s=step_s)
        g = s.energy_by_gpu.set_index(["host", "gpu_index"])["seen_s"]
        got = {k: float(v) for k, v in g.items()}
        assert got == pytest.approx(want, abs=1.0), ((a - T0) / H, step_s, got)


def _knows_seen_time(store: Store) -> bool:
    from gpuwatt.store.base import SEEN_COLUMN

    return SEEN_COLUMN in store.series(T0, T0 + H, ["power_w"], step_s=60).columns
