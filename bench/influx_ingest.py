"""What sets the speed of a spool replay into InfluxDB: the sender's CPU against influxd's own.

    .venv/bin/python bench/influx_ingest.py [--samples 60000] [--runs 2]

The demo scenario's samples as the collector spools them for InfluxDB (gpuwatt's line protocol,
~1 kB and ~45 fields a line) are POSTed to Debian's ``influxd`` 1.6.7 (started on 127.0.0.1 as
the tests start it, ``tests/servers.py``) in the ways gpuwatt's side could change: lines per
POST, timestamp precision (the demo's times are whole seconds, so ``s`` sends the same points
with 9 digits fewer), gzip, and POSTs in parallel. For each: lines per second of wall time,
lines per CPU-second of influxd (from its ``/proc/<pid>/stat``) and of the sender (this
process), side by side in one run; the best of ``--runs`` for each. The database is dropped
before each variant.

Issue 16, acceptance 4 asks 50,000 lines/s into the InfluxDB path: if influxd needs a CPU-second
per ~30,000 lines whatever the sender does, the wall rate is influxd's CPU rate times the cores
it gets, and no change on gpuwatt's side reaches the target on a machine of two shared cores.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import threading
import time
from pathlib import Path

import urllib3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from servers import InfluxDB1Server  # noqa: E402
from spool_replay import demo_ticks, process_cpu_s  # noqa: E402

from gpuwatt.line_protocol import LineEncoder  # noqa: E402

#: (name, lines per POST, precision, gzip, POSTs in parallel)
VARIANTS: list[tuple[str, int, str, bool, int]] = [
    ("ns, 4,096 lines/POST (as now)", 4096, "ns", False, 1),
    ("ns, 20,000 lines/POST", 20000, "ns", False, 1),
    ("s precision, 4,096 lines/POST", 4096, "s", False, 1),
    ("ns, gzip level 1", 4096, "ns", True, 1),
    ("ns, 2 POSTs in parallel", 4096, "ns", False, 2),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=60_000)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    encoder = LineEncoder()
    lines = [line for tick in demo_ticks(args.samples) for line in encoder.encode_many(tick)]
    n = len(lines)
    print(f"{n:,} lines of the demo scenario, {sum(map(len, lines)) / n:,.0f} bytes each")
    server = InfluxDB1Server()
    server.start()
    assert server._proc is not None
    pid = server._proc.pid
    pool = urllib3.PoolManager(maxsize=4)

    def post(body: bytes, precision: str, gz: bool) -> None:
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if gz:
            body = gzip.compress(body, 1)
            headers["Content-Encoding"] = "gzip"
        url = f"{server.url}/write?db=bench&precision={precision}"
        answer = pool.request("POST", url, body=body, headers=headers)
        if answer.status != 204:
            raise RuntimeError(f"/write {answer.status}: {answer.data[:200]!r}")

    def once(batch: int, precision: str, gz: bool, parallel: int) -> tuple[float, float, float]:
        server.query("DROP DATABASE bench", method="POST")
        server.create_database("bench")
        sent = lines if precision == "ns" else [line[:-9] for line in lines]
        bodies = iter(["\n".join(sent[i : i + batch]).encode() for i in range(0, n, batch)])
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    body = next(bodies, None)
                if body is None:
                    return
                post(body, precision, gz)

        srv, wall, own = process_cpu_s(pid), time.perf_counter(), time.process_time()
        threads = [threading.Thread(target=worker) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall, own = time.perf_counter() - wall, time.process_time() - own
        return wall, process_cpu_s(pid) - srv, own

    try:
        print(f"{'variant':<34} {'lines/s wall':>13} {'influxd lines/CPU-s':>20} "
              f"{'sender lines/CPU-s':>19}")  # fmt: skip
        for name, batch, precision, gz, parallel in VARIANTS:
            results = [once(batch, precision, gz, parallel) for _ in range(args.runs)]
            wall, srv, own = min(results, key=lambda r: r[0])
            print(f"{name:<34} {n / wall:>13,.0f} {n / srv:>20,.0f} {n / own:>19,.0f}")
    finally:
        server.stop()
        server.cleanup()


if __name__ == "__main__":
    main()
