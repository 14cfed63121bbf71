"""Bytes on disk per GPU-sample: the embedded SQLite store against InfluxDB and VictoriaMetrics.

    .venv/bin/python bench/storage.py [--case demo|big|both] [--sqlite-only]

The same simulated samples go into each store the way production writes them: SQLite through
``SqliteStore.write_samples`` (one batch per collector round), Debian's ``influxd`` 1.6.7 through
its ``/write`` endpoint and Debian's ``victoria-metrics`` through ``/api/v2/write`` (gpuwatt's line
protocol, as the collector sends it). Each is then brought to its steady state before it is
measured: SQLite's WAL checkpointed and truncated; InfluxDB's cache snapshotted and its shards
fully compacted (the server is configured to do both after 1 s of no writes, and the bench waits
until the TSM files stop changing); VictoriaMetrics flushed and force-merged. Disk use is the sum
of the file sizes under each store's directory. SQLite (its file and, format 3, the segment
files beside it) is measured twice: as the writes leave it (its last segment still open) and at
rest (that segment closed, free pages vacuumed); the ratios are of the latter.

Cases: ``demo`` is the demo scenario (32 GPUs) over 1 h at 1 s; ``big`` is 1,024 GPUs (128 nodes
x 8, one synchronous job per 64 GPUs) over 10 min at 1 s. The servers run from the test suite's
starters (``tests/servers.py``), on 127.0.0.1 with their own temporary directories.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from servers import InfluxDB1Server, VictoriaMetricsServer, http  # noqa: E402

from gpuwatt.collector.sim.scenario import load_scenario, load_scenario_text  # noqa: E402
from gpuwatt.collector.sim.source import SimulatedClusterSource  # noqa: E402
from gpuwatt.line_protocol import LineEncoder  # noqa: E402
from gpuwatt.model import GpuSample  # noqa: E402
from gpuwatt.store.sqlite import SqliteStore  # noqa: E402

NS = 1_000_000_000
END_NS = 1_767_225_600 * NS  # fixed: the same samples every run


def big_scenario(gpus: int = 1024, minutes: int = 10) -> str:
    """``gpus`` H100s (8 per node) in synchronous jobs of 64 GPUs, as a scenario's YAML."""
    jobs = "".join(
        f"""  - id: train-{j}
    kind: training
    gpus: [{", ".join(f'"node-{n}:*"' for n in range(8 * j, 8 * j + 8))}]
    intensity: 0.7
    step_time: 1.0s
    comm_fraction: 0.15
    memory_gib: 60
"""
        for j in range(gpus // 64)
    )
    return f"""
name: big
description: {gpus} GPUs in synchronous jobs of 64 GPUs.
seed: 5
duration: {minutes}m
cluster:
  nodes: {gpus // 8}
  gpus_per_node: 8
  model: H100 SXM
jobs:
{jobs}"""


def rounds(case: str) -> Iterator[list[GpuSample]]:
    """The case's samples, one collector round at a time."""
    if case == "demo":
        scenario, minutes = load_scenario("demo"), 60
    else:
        scenario, minutes = load_scenario_text(big_scenario(), "big"), 10
    source = SimulatedClusterSource(
        scenario, start_ns=END_NS - minutes * 60 * NS, clock_ns=lambda: END_NS
    )
    source.open()
    try:
        yield from source.backfill(END_NS, interval_s=1.0, slow_interval_s=60.0)
    finally:
        source.close()


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def sqlite_bytes(batches: list[list[GpuSample]], tmp: Path) -> tuple[int, int]:
    """Bytes of the SQLite file (WAL checkpointed and truncated) as the writes leave it (the
    last segment still open) and at rest (every segment closed, as each is
    once data time has passed its end)."""
    import sqlite3

    path = tmp / "bench.db"

    def size() -> int:
        con = sqlite3.connect(path)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        return sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())  # segments too

    store = SqliteStore(path)
    try:
        for batch in batches:
            store.write_samples(batch)
        store.flush_rollups()
        as_written = size()
        store.compact()
        con = sqlite3.connect(path)
        con.execute("VACUUM")  # the head's pages, now free, returned to the file system
        con.close()
    finally:
        store.close()
    return as_written, size()


def influx_bytes(lines: list[str]) -> int:
    server = InfluxDB1Server()
    # Snapshot the cache and compact fully after a second without writes (defaults: 10 min, 4 h).
    server.config_path.write_text(
        server.config_path.read_text().replace(
            '  index-version = "inmem"\n',
            '  index-version = "inmem"\n'
            '  cache-snapshot-write-cold-duration = "1s"\n'
            '  compact-full-write-cold-duration = "1s"\n',
        )
    )
    server.start()
    try:
        server.create_database("bench")
        for i in range(0, len(lines), 5000):
            server.write_lines("bench", lines[i : i + 5000])
        data = server.tmp / "data"
        wal = server.tmp / "wal"
        last, stable_since = -1, time.monotonic()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until the WAL is empty and the TSM files settle
            size = tree_bytes(data)
            if size != last or tree_bytes(wal) > 0:
                last, stable_since = size, time.monotonic()
            elif time.monotonic() - stable_since > 5:
                break
            time.sleep(1)
        return tree_bytes(data) + tree_bytes(wal)
    finally:
        server.cleanup()


def victoria_bytes(lines: list[str]) -> int:
    server = VictoriaMetricsServer()
    server.start()
    try:
        for i in range(0, len(lines), 5000):
            body = "\n".join(lines[i : i + 5000]).encode()
            status, answer = http("POST", f"{server.url}/write", data=body, timeout_s=60)
            if status not in (200, 204):
                raise RuntimeError(f"victoria-metrics /write {status}: {answer[:200]!r}")
        server.force_flush()
        month = time.strftime("%Y_%m", time.gmtime(END_NS / NS))
        http("GET", f"{server.url}/internal/force_merge?partition_prefix={month}", timeout_s=300)
        time.sleep(3)
        server.force_flush()
        return tree_bytes(server.data_dir)
    finally:
        server.cleanup()


def run(case: str, sqlite_only: bool = False) -> None:
    t = time.perf_counter()
    batches = list(rounds(case))
    samples = sum(len(b) for b in batches)
    gpus = len({s.uuid for b in batches for s in b})
    print(f"\n{case}: {gpus} GPUs, {samples:,} GPU-samples (simulated in "
          f"{time.perf_counter() - t:.0f} s)")  # fmt: skip
    encoder = LineEncoder()
    lines = [line for batch in batches for line in encoder.encode_many(batch)]
    with tempfile.TemporaryDirectory() as tmp:
        open_head, at_rest = sqlite_bytes(batches, Path(tmp))
    sizes = {"SQLite (gpuwatt)": at_rest, "SQLite, segment open": open_head}
    if sqlite_only:  # the servers take minutes
        for name, size in sizes.items():
            print(f"{name:<20} {size:>14,} {size / samples:>9.1f} B/sample")
        return
    sizes["InfluxDB 1.6.7"] = influx_bytes(lines)
    sizes["VictoriaMetrics"] = victoria_bytes(lines)
    print(f"{'store':<20} {'bytes':>14} {'B/sample':>9} {'SQLite / it':>12}")
    for name, size in sizes.items():
        print(f"{name:<20} {size:>14,} {size / samples:>9.1f} {at_rest / size:>11.2f}x")
    target = at_rest / samples <= 40 and sizes["InfluxDB 1.6.7"] >= 2 * at_rest
    print(f"target <= 40 B/sample and >= 2x smaller than InfluxDB: {'ok' if target else 'MISSED'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("demo", "big", "both"), default="both")
    ap.add_argument("--sqlite-only", action="store_true", help="the embedded store alone")
    args = ap.parse_args()
    for case in ("demo", "big") if args.case == "both" else (args.case,):
        run(case, args.sqlite_only)


if __name__ == "__main__":
    main()
