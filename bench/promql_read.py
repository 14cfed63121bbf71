"""Reading a Prometheus-compatible engine at cluster scale: buckets in the engine vs. raw reads.

    .venv/bin/python bench/promql_read.py [--gpus 1024] [--minutes 60] [--interval-s 10]

Loads a simulated cluster (``--gpus`` H100s in synchronous jobs of 64) into Debian's
``victoria-metrics`` as dcgm-exporter series (the test fixtures' own conversion), then times what
the dashboard's default view reads: every analysis field of the whole range at 1-minute steps,
through ``open_store("victoriametrics://...?source=dcgm").series`` (PromQL ``avg_over_time`` /
``last_over_time`` per metric, in parallel), against the naive way: the raw samples read and
bucketed client-side. Each read is repeated; the first (cold) and the median of the rest are
printed with the ratio. Then the dashboard's data layer as a page callback runs it (read and
analysis of the range, cold), on VictoriaMetrics and on the embedded store holding the same
samples, side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from prom_fixtures import dcgm_exposition  # noqa: E402
from servers import VictoriaMetricsServer, http  # noqa: E402
from storage import big_scenario  # noqa: E402

from gpuwatt.analytics import ANALYSIS_FIELDS  # noqa: E402
from gpuwatt.collector.sim.scenario import load_scenario_text  # noqa: E402
from gpuwatt.collector.sim.source import SimulatedClusterSource  # noqa: E402
from gpuwatt.dashboard.data import DashboardData  # noqa: E402
from gpuwatt.dashboard.timerange import parse_range  # noqa: E402
from gpuwatt.store import LAST_VALUE_ATTRS, open_store  # noqa: E402
from gpuwatt.store.sqlite import SqliteStore  # noqa: E402

NS = 1_000_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1024, help="a multiple of 64, up to 1,024")
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--interval-s", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    end = (time.time_ns() // (60 * NS)) * 60 * NS
    start = end - args.minutes * 60 * NS
    scenario = load_scenario_text(big_scenario(args.gpus, args.minutes), "bench")
    t = time.perf_counter()
    source = SimulatedClusterSource(scenario, start_ns=start, clock_ns=lambda: end)
    source.open()
    samples = [
        s for b in source.backfill(end, interval_s=args.interval_s, slow_interval_s=60.0) for s in b
    ]
    source.close()
    print(f"{args.gpus} GPUs x {args.minutes} min at {args.interval_s:g} s: "
          f"{len(samples):,} samples (simulated in {time.perf_counter() - t:.0f} s)")  # fmt: skip
    server = VictoriaMetricsServer()
    server.start()
    try:
        t = time.perf_counter()
        lines = dcgm_exposition(samples, openmetrics=False).splitlines()
        for i in range(0, len(lines), 200_000):
            chunk = ("\n".join(lines[i : i + 200_000]) + "\n").encode()
            status, body = http(
                "POST", f"{server.url}/api/v1/import/prometheus", data=chunk, timeout_s=600
            )
            assert status in (200, 204), body[:200]
        server.force_flush()
        print(f"loaded into victoria-metrics in {time.perf_counter() - t:.0f} s")
        url = server.url.replace("http://", "victoriametrics://") + "?source=dcgm&timeout=5m"
        fields = list(ANALYSIS_FIELDS)

        def engine() -> int:
            with open_store(url) as store:
                return len(store.series(start, end, fields, step_s=60))

        def naive() -> int:
            with open_store(url) as store:
                raw = store.series(start, end, fields)
            raw["bucket"] = raw["time_ns"] // (60 * NS) * (60 * NS)
            agg = {f: ("last" if f in LAST_VALUE_ATTRS else "mean") for f in fields}
            return len(raw.groupby(["bucket", "uuid"]).agg(agg))

        results = {}
        for name, fn in (("engine buckets (gpuwatt)", engine), ("raw + client-side", naive)):
            times, rows = [], 0
            for _ in range(args.repeat):
                t = time.perf_counter()
                rows = fn()
                times.append(time.perf_counter() - t)
            results[name] = (times[0], statistics.median(times[1:]) if len(times) > 1 else times[0])
            print(f"{name:<26} rows {rows:>8,}  first {times[0] * 1000:8.0f} ms  "
                  f"median {results[name][1] * 1000:8.0f} ms")  # fmt: skip
        (_, fast), (_, slow) = results.values()
        print(f"ratio: the raw read takes {slow / fast:.1f}x the engine-bucketed read")
        print("\nthe dashboard's default view, cold (read + analysis, a new data layer each time):")
        with tempfile.TemporaryDirectory() as tmp:
            sqlite = SqliteStore(Path(tmp) / "same.db")
            for i in range(0, len(samples), 4096):
                sqlite.write_samples(samples[i : i + 4096])
            sqlite.flush_rollups()
            views = {}
            for name, store in (("VictoriaMetrics", open_store(url)), ("embedded SQLite", sqlite)):
                times = []
                for _ in range(args.repeat):
                    data = DashboardData(store, clock_ns=lambda: end)
                    tr, _ = parse_range({"from": str(start // NS), "to": str(end // NS)}, end)
                    t = time.perf_counter()
                    view = data.window(tr)
                    times.append(time.perf_counter() - t)
                    data.close()
                views[name] = statistics.median(times)
                found = sorted((s.host, s.gpu_index) for s in view.stragglers)
                print(f"{name:<26} median {views[name] * 1000:8.0f} ms  "
                      f"(p100 {max(times) * 1000:.0f} ms; stragglers {found})")  # fmt: skip
                store.close()
        vm, embedded = views.values()
        print(f"ratio: VictoriaMetrics takes {vm / embedded:.1f}x the embedded store")
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
