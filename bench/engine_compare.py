"""bench/dashboard.py --store influxdb|victoriametrics: the dashboard on an engine, side by side.

The same cluster as the embedded store's run is loaded into the engine (``engine_load``), from a
process of its own, as collectors write from theirs. Each timing process first computes every
preset, as a server's warmer does in its first seconds. For each page and range the content
callback's p95 is printed cold (the dashboard's cache emptied before each request) and served
(from the cache the warmer keeps), for: the embedded store; the engine read through its rollups
(``engine_rollups``), the rollup points it read before kept in memory and checked against the
engine's point counts (``rollup_cache``), as on a running server; the same with nothing kept
(cold only: every point read from the engine, as a server's first requests are); and the
engine read as before rollups, every bucket aggregated from raw
samples with ``GROUP BY time()`` / ``avg_over_time`` (``use_rollups=False``), whose cold p95
divided by the rollups' is the ratio beaten. Each of the three is timed in a process of its own
(``in_own_process``), one after the other, every range of one before the next. Beside each
engine figure, the median CPU of a cold callback in the dashboard's process and in the engine's
server, and their sum divided by the machine's cores: no cold callback can take less time than
that here, whatever runs in parallel (on a 2-core machine the engine and the dashboard share
both). Then the warmer's cost: CPU of the dashboard's process and of the engine's server per
recomputation of each preset, and the engine's share of a core at the warmer's periods.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from callback_times import CallbackTimes, open_embedded, time_callbacks
from engine_load import Engine, EngineAt, in_own_process, load_elsewhere, process_cpu_s

from gpuwatt.dashboard.app import create_app
from gpuwatt.dashboard.server import WARM_EVERY_S, WARM_PRESETS_EVERY_S, freeze_startup_heap
from gpuwatt.dashboard.timerange import DEFAULT_RANGE, PRESETS, parse_range
from gpuwatt.malloc_tuning import tune_for_large_reads

COLD_TARGET_S = 0.5
CORES = os.cpu_count() or 1
SERVED_TARGET_S = 0.1


@dataclass(frozen=True)
class StoreAt:
    """A store a timing process opens: the embedded store's file, or an engine (its rollups
    or its raw ``GROUP BY``), and the engine server's pid for its CPU."""

    db: Path | None = None
    engine: EngineAt | None = None
    use_rollups: bool = True
    engine_pid: int | None = None
    #: keep the rollup points read in memory (``rollup_cache``), as the dashboard does; False:
    #: every read from the engine (a server's first reads, before it kept any)
    keep_chunks: bool = True

    def open(self) -> Any:
        if self.engine is None:
            assert self.db is not None
            return open_embedded(self.db)
        store = self.engine.store(use_rollups=self.use_rollups)
        if not self.keep_chunks:
            store.rollup_cache_bytes = 0
        return store

    def engine_cpu_s(self) -> Callable[[], float] | None:
        pid = self.engine_pid
        return None if pid is None else (lambda: process_cpu_s(pid))


@dataclass(frozen=True)
class Timed:
    """What one store's timing process measured: per range label, per page; the load
    average when each range began; the warmer's CPU per preset (dashboard, engine), if asked."""

    pages: dict[str, dict[str, CallbackTimes]]
    load_average: dict[str, str]
    warm: dict[str, tuple[float, float]] | None


#: the engine read with no rollup points kept in memory: every cold callback reads all it needs
#: from the engine (what a server's first requests cost)
NOTHING_KEPT = "nothing kept"


def time_store(
    at: StoreAt,
    end_ns: int,
    ranges: list[tuple[str, dict[str, str]]],
    repeat: int,
    warm_repeat: int,
) -> Timed:
    """Every range's pages timed on one store. ``compare`` runs it in a process of its own
    (``in_own_process``) for each store, as a dashboard server holds its store alone: timed one
    after the other in one process, the engine's cold callbacks used more CPU after the embedded
    store's and the raw reads' had run."""
    tune_for_large_reads()  # as ``dashboard.server.start``, before the store's threads start
    app = create_app(at.open(), now_ns=end_ns)
    # as ``dashboard.server.start``: the default view computed, then the heap frozen
    data = app.server.config["GPUWATT_DATA"]
    data._warm(parse_range({}, data.now_ns())[0])
    freeze_startup_heap()
    # then, as the server's warmer in its first seconds, every other preset (an engine's store
    # keeps the rollup points they read: ``rollup_cache``); each cold request below empties
    # the dashboard's own cache first
    for preset in PRESETS:
        if preset != DEFAULT_RANGE:
            data._warm(parse_range({"range": preset}, data.now_ns())[0])
    pages, loads = {}, {}
    for label, query in ranges:
        # the machine's load beside the figures: a busy machine's wall times are longer
        loads[label] = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        pages[label] = time_callbacks(app, repeat, query, at.engine_cpu_s())
    warm = warm_cpu(app, at, warm_repeat) if warm_repeat > 0 else None
    return Timed(pages, loads, warm)


def compare(
    kind: str,
    cluster: Any,
    db: Path,
    end_ns: int,
    ranges: list[tuple[str, dict[str, str]]],
    repeat: int,
    raw_repeat: int,
) -> bool:
    """Print the side-by-side tables; True when the engine met every target."""
    engine = Engine(kind, end_ns)
    try:
        size = f"{cluster.gpus} GPUs x {cluster.hours} h every {cluster.interval_s} s"
        print(f"\nloading {size} into {kind} (gzip'd line protocol, parallel batches; rollups)")
        t = time.perf_counter()
        n = load_elsewhere(engine, cluster)
        dt = time.perf_counter() - t
        print(f"  {n:,} samples in {dt:.0f} s ({n / dt:,.0f}/s); engine CPU {engine.cpu_s():.0f} s")
        pid = engine.server._proc.pid
        waited_s, share = settle(pid)
        print(f"  the engine settled in {waited_s:.0f} s ({share:.1f} % of a core over the "
              f"last {SETTLE_WINDOW_S:.0f} s) before any read is timed")  # fmt: skip
        stores = {
            "embedded": (StoreAt(db=db), repeat, 0),
            kind: (StoreAt(engine=engine.at, engine_pid=pid), repeat, repeat),
            NOTHING_KEPT: (StoreAt(engine=engine.at, engine_pid=pid, keep_chunks=False),
                           repeat, 0),
            "raw GROUP BY": (StoreAt(engine=engine.at, use_rollups=False, engine_pid=pid),
                             raw_repeat, 0),
        }  # fmt: skip
        timed: dict[str, Timed] = {}
        for name, (at, reps, warm_reps) in stores.items():
            if reps > 0:  # --raw-repeat 0: the raw GROUP BY not timed
                settle(pid)  # the previous timing's reads done in the engine too
                print(f"  timing {name} in a process of its own", flush=True)
                timed[name] = in_own_process(time_store, at, end_ns, ranges, reps, warm_reps)
        ok = True
        for label, _query in ranges:
            print(f"\n{label}: callback p95 in ms, cold / served "
                  f"(load average {timed[kind].load_average[label]})")  # fmt: skip
            print(
                f"  {'page':11s} {'embedded':>15s} {kind:>17s} {'nothing kept':>12s} "
                f"{'raw GROUP BY':>15s}  ratio"
                f"  {kind} cold: median ms; CPU ms of this process + the engine, "
                f"/ {CORES} cores"
            )
            for page, g in timed[kind].pages[label].items():
                e = timed["embedded"].pages[label][page]
                met = g.cold_p95_s <= COLD_TARGET_S and g.served_p95_s <= SERVED_TARGET_S
                ok &= met
                raw = f"{'-':>7s} / {'-':>4s}  {'-':>5s} "
                if "raw GROUP BY" in timed:
                    r = timed["raw GROUP BY"].pages[label][page]
                    raw = (
                        f"{r.cold_p95_s * 1e3:7.0f} / {r.served_p95_s * 1e3:4.0f}  "
                        f"{r.cold_p95_s / max(g.cold_p95_s, 1e-9):5.1f}x"
                    )
                both_s = g.cold_cpu_median_s + g.cold_engine_cpu_median_s
                bare = timed[NOTHING_KEPT].pages[label][page].cold_p95_s
                print(
                    f"  {page:11s} {e.cold_p95_s * 1e3:6.0f} / {e.served_p95_s * 1e3:5.0f}  "
                    f"{g.cold_p95_s * 1e3:7.0f} / {g.served_p95_s * 1e3:5.0f}  "
                    f"{bare * 1e3:8.0f}     {raw}"
                    f"  {g.cold_median_s * 1e3:5.0f}; {g.cold_cpu_median_s * 1e3:4.0f} + "
                    f"{g.cold_engine_cpu_median_s * 1e3:4.0f}, {both_s / CORES * 1e3:4.0f}"
                    + ("" if met else "  <- MISSED target")
                )
        print(f"\nthe warmer on {kind}: one recomputation of each preset (median of {repeat})")
        warm = timed[kind].warm
        assert warm is not None
        ok &= warm_share(warm) < 10.0
        return ok
    finally:
        engine.close()


#: the engine counts as settled once it uses less than this share of a core over the window
SETTLE_SHARE_PCT = 3.0
SETTLE_WINDOW_S = 5.0


def settle(pid: int, most_s: float = 600.0) -> tuple[float, float]:
    """Wait until the engine's background work after the load (VictoriaMetrics merges its
    parts, InfluxDB compacts its shards) is done: (seconds waited, its last share of a core in
    %), instead of a fixed 5 s, so that no timing runs beside an engine still compacting. (Added
    when the bench's cold timings ran above those of a plain process, the embedded store's 6 h
    pages 541-704 ms against ~400-426 ms; it was not the cause: at 1,024 GPUs x 24 h both
    VictoriaMetrics and InfluxDB were idle within 5 s of the load.)"""
    t0 = time.monotonic()
    while True:
        before = process_cpu_s(pid)
        time.sleep(SETTLE_WINDOW_S)
        share = (process_cpu_s(pid) - before) / SETTLE_WINDOW_S * 100
        if share < SETTLE_SHARE_PCT or time.monotonic() - t0 > most_s:
            return time.monotonic() - t0, share


def warm_cpu(app: Any, at: StoreAt, repeat: int) -> dict[str, tuple[float, float]]:
    """Per preset: the median CPU of this process and of the engine per recomputation."""
    engine_cpu_s = at.engine_cpu_s()
    assert engine_cpu_s is not None
    data = app.server.config["GPUWATT_DATA"]
    data.clear_cache()
    order = [DEFAULT_RANGE, *(p for p in PRESETS if p != DEFAULT_RANGE)]
    ours: dict[str, list[float]] = {p: [] for p in order}
    theirs: dict[str, list[float]] = {p: [] for p in order}
    for _ in range(repeat):
        for preset in order:
            tr = parse_range({"range": preset}, data.now_ns())[0]
            c, e = time.process_time(), engine_cpu_s()
            data._warm(tr)
            if preset == DEFAULT_RANGE:  # the overview's "Energy today" is warmed with it
                data._warm_today()
            ours[preset].append(time.process_time() - c)
            theirs[preset].append(engine_cpu_s() - e)
    return {p: (statistics.median(ours[p]), statistics.median(theirs[p])) for p in order}


def warm_share(warm: dict[str, tuple[float, float]]) -> float:
    """Print the warmer's CPU per preset; returns the engine's share of a core (%) at the
    warmer's periods."""
    engine_per_10min = ours_per_10min = 0.0
    for preset, (o, t) in warm.items():
        every_s = WARM_EVERY_S if preset == DEFAULT_RANGE else WARM_PRESETS_EVERY_S
        ours_per_10min += o * 600 / every_s
        engine_per_10min += t * 600 / every_s
        what = f"{preset} and today's energy" if preset == DEFAULT_RANGE else preset
        print(f"  {what:22s} dashboard {o * 1e3:5.0f} ms CPU, engine {t * 1e3:5.0f} ms CPU, "
              f"every {every_s:.0f} s")  # fmt: skip
    share = engine_per_10min / 6
    print(f"  engine: {engine_per_10min:.1f} s of CPU per 10 minutes ({share:.1f} % of a core; "
          f"target < 10 %); dashboard: {ours_per_10min / 6:.1f} % of a core")  # fmt: skip
    return share
