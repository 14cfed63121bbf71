"""SQLite ingest and rollup read rate.

    .venv/bin/python bench/sqlite_ingest.py [--gpus 1024] [--seconds 660] [--read-hour]

Writes ``--seconds`` rounds of ``--gpus`` full samples (every metric) through
``SqliteStore.write_samples``, one batch per round as a collector fleet's writer (or a spool
replay) would, and prints GPU-samples/s (target >= 100,000 on one core). Rollups, retention and
the compaction of the closed 10-minute block into chunks (the default 660 s passes one block's
end) run inside the timed writes. With ``--read-hour`` it then writes a full hour and times
``series(step_s=60)`` over it.

Each batch is built just before its write and only the ``write_samples`` calls are timed
(building samples is the collector's cost, not the store's). The machine is shared: CPU time is
printed next to wall time; run it a few times and read the best.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from encode import T0_NS, full_sample

from gpuwatt.store.sqlite import SqliteStore


def rounds(gpus: int, seconds: int, start_s: int = 0):
    hosts = [f"node{g // 8:04d}" for g in range(gpus)]
    templates = [full_sample(T0_NS, hosts[g], g % 8) for g in range(gpus)]
    for t in range(start_s, start_s + seconds):
        ts = T0_NS + t * 1_000_000_000
        # Same metrics each round (building samples is the collector's cost, not the store's).
        yield [dataclasses.replace(s, time_ns=ts) for s in templates]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=660)
    ap.add_argument("--read-hour", action="store_true", help="also time series(step_s=60) over 1 h")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        try:
            n = 0
            dt = cpu = 0.0
            for batch in rounds(args.gpus, args.seconds):
                t, c = time.perf_counter(), time.process_time()
                store.write_samples(batch)
                dt += time.perf_counter() - t
                cpu += time.process_time() - c
                n += len(batch)
            rate = n / dt
            verdict = "ok" if rate >= 100_000 else "MISSED"
            print(f"write_samples: {n} GPU-samples ({args.gpus} GPUs x {args.seconds} s)")
            print(
                f"               wall {dt:.2f} s, CPU {cpu:.2f} s "
                f"({cpu / n * 1e6:.2f} µs/sample: {n / cpu:,.0f}/s of CPU)"
            )
            print(
                f"               {rate:,.0f} GPU-samples/s, {dt / n * 1e6:.2f} µs/sample "
                f"(target >= 100,000/s: {verdict}; ratio {rate / 100_000:.2f})"
            )
            size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 1e6
            print(f"{'':15}database + WAL: {size_mb:.0f} MB ({size_mb * 1e6 / n:.0f} B/row)")
            if args.read_hour:
                for batch in rounds(args.gpus, max(0, 3600 - args.seconds + 60), args.seconds):
                    store.write_samples(batch)
                t = time.perf_counter()
                df = store.series(T0_NS, T0_NS + 3600 * 1_000_000_000, step_s=60)
                dt = time.perf_counter() - t
                print(
                    f"series(step_s=60) over 1 h x {args.gpus} GPUs: {len(df)} rows in {dt:.3f} s "
                    f"({len(df) / dt:,.0f} rows/s)"
                )
                t = time.perf_counter()
                df = store.series(T0_NS, T0_NS + 3600 * 1_000_000_000, ["power_w"], step_s=60)
                dt = time.perf_counter() - t
                print(f"series(['power_w'], step_s=60): {len(df)} rows in {dt:.3f} s")
        finally:
            store.close()


if __name__ == "__main__":
    main()
