"""bench/dashboard.py --store influxdb|victoriametrics: the dashboard on an engine, side by side.

The same cluster as the embedded store's run is loaded into the engine (``engine_load``). For
each page and range the content callback's p95 is printed cold (cache emptied before each
request) and served (from the cache the warmer keeps), for: the embedded store; the engine read
through its rollups (``engine_rollups``); and the engine read as before rollups, every bucket
aggregated from raw samples with ``GROUP BY time()`` / ``avg_over_time`` (``use_rollups=False``),
whose cold p95 divided by the rollups' is the ratio beaten. Beside each engine figure, the
median CPU of a cold callback in this process and in the engine's server, and their sum divided
by the machine's cores: no cold callback can take less time than that here, whatever runs in
parallel (on a 2-core machine the engine and the dashboard share both). Then the warmer's cost:
CPU of this process and of the engine's server per recomputation of each preset, and the
engine's share of a core at the warmer's periods.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from engine_load import Engine, load

from gpuwatt.dashboard.app import create_app
from gpuwatt.dashboard.server import WARM_EVERY_S, WARM_PRESETS_EVERY_S
from gpuwatt.dashboard.timerange import DEFAULT_RANGE, PRESETS, parse_range

COLD_TARGET_S = 0.5
CORES = os.cpu_count() or 1
SERVED_TARGET_S = 0.1


def compare(
    kind: str,
    cluster: Any,
    embedded_store: Any,
    end_ns: int,
    ranges: list[tuple[str, dict[str, str]]],
    time_callbacks: Callable[[Any, int, dict[str, str]], dict[str, Any]],
    repeat: int,
    raw_repeat: int,
) -> bool:
    """Print the side-by-side tables; True when the engine met every target."""
    engine = Engine(kind, end_ns)
    try:
        size = f"{cluster.gpus} GPUs x {cluster.hours} h every {cluster.interval_s} s"
        print(f"\nloading {size} into {kind} (gzip'd line protocol, parallel batches; rollups)")
        t = time.perf_counter()
        n = load(engine, cluster)
        dt = time.perf_counter() - t
        print(f"  {n:,} samples in {dt:.0f} s ({n / dt:,.0f}/s); engine CPU {engine.cpu_s():.0f} s")
        time.sleep(5.0)  # let the engine settle (compactions, flushes) before timing reads
        apps = {
            "embedded": create_app(embedded_store, now_ns=end_ns),
            kind: create_app(engine.store(), now_ns=end_ns),
            "raw GROUP BY": create_app(engine.store(use_rollups=False), now_ns=end_ns),
        }
        ok = True
        for label, query in ranges:
            # the machine's load beside the figures: a busy machine's wall times are longer
            load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"\n{label}: callback p95 in ms, cold / served (load average {load_avg})")
            print(
                f"  {'page':11s} {'embedded':>15s} {kind:>17s} {'raw GROUP BY':>15s}  ratio"
                f"  {kind} cold: median ms; CPU ms of this process + the engine, "
                f"/ {CORES} cores"
            )
            results = {}
            for name, app in apps.items():
                reps = raw_repeat if name == "raw GROUP BY" else repeat
                if reps > 0:  # --raw-repeat 0: the raw GROUP BY not timed
                    cpu = None if name == "embedded" else engine.cpu_s
                    results[name] = time_callbacks(app, reps, query, cpu)
            for page in results[kind]:
                e, g = results["embedded"][page], results[kind][page]
                met = g.cold_p95_s <= COLD_TARGET_S and g.served_p95_s <= SERVED_TARGET_S
                ok &= met
                raw = f"{'-':>7s} / {'-':>4s}  {'-':>5s} "
                if "raw GROUP BY" in results:
                    r = results["raw GROUP BY"][page]
                    raw = (
                        f"{r.cold_p95_s * 1e3:7.0f} / {r.served_p95_s * 1e3:4.0f}  "
                        f"{r.cold_p95_s / max(g.cold_p95_s, 1e-9):5.1f}x"
                    )
                both_s = g.cold_cpu_median_s + g.cold_engine_cpu_median_s
                print(
                    f"  {page:11s} {e.cold_p95_s * 1e3:6.0f} / {e.served_p95_s * 1e3:5.0f}  "
                    f"{g.cold_p95_s * 1e3:7.0f} / {g.served_p95_s * 1e3:5.0f}  {raw}"
                    f"  {g.cold_median_s * 1e3:5.0f}; {g.cold_cpu_median_s * 1e3:4.0f} + "
                    f"{g.cold_engine_cpu_median_s * 1e3:4.0f}, {both_s / CORES * 1e3:4.0f}"
                    + ("" if met else "  <- MISSED target")
                )
        print(f"\nthe warmer on {kind}: one recomputation of each preset (median of {repeat})")
        share = warm_share(apps[kind], engine, repeat)
        ok &= share < 10.0
        return ok
    finally:
        engine.close()


def warm_share(app: Any, engine: Engine, repeat: int) -> float:
    """Per preset: CPU of this process and of the engine per recomputation; returns the
    engine's share of a core (%) at the warmer's periods."""
    data = app.server.config["GPUWATT_DATA"]
    data.clear_cache()
    order = [DEFAULT_RANGE, *(p for p in PRESETS if p != DEFAULT_RANGE)]
    ours: dict[str, list[float]] = {p: [] for p in order}
    theirs: dict[str, list[float]] = {p: [] for p in order}
    for _ in range(repeat):
        for preset in order:
            tr = parse_range({"range": preset}, data.now_ns())[0]
            c, e = time.process_time(), engine.cpu_s()
            data._warm(tr)
            if preset == DEFAULT_RANGE:  # the overview's "Energy today" is warmed with it
                data._warm_today()
            ours[preset].append(time.process_time() - c)
            theirs[preset].append(engine.cpu_s() - e)
    engine_per_10min = ours_per_10min = 0.0
    for preset in order:
        every_s = WARM_EVERY_S if preset == DEFAULT_RANGE else WARM_PRESETS_EVERY_S
        o, t = statistics.median(ours[preset]), statistics.median(theirs[preset])
        ours_per_10min += o * 600 / every_s
        engine_per_10min += t * 600 / every_s
        what = f"{preset} and today's energy" if preset == DEFAULT_RANGE else preset
        print(f"  {what:22s} dashboard {o * 1e3:5.0f} ms CPU, engine {t * 1e3:5.0f} ms CPU, "
              f"every {every_s:.0f} s")  # fmt: skip
    share = engine_per_10min / 6
    print(f"  engine: {engine_per_10min:.1f} s of CPU per 10 minutes ({share:.1f} % of a core; "
          f"target < 10 %); dashboard: {ours_per_10min / 6:.1f} % of a core")  # fmt: skip
    return share
