"""Where the running collector's CPU goes, thread by thread.

    python bench/collector_threads.py [--seconds 30] [--interval 1] [--simulate SCENARIO]

Runs ``gpuwatt collect`` (real NVML, or a simulated cluster) into a fresh embedded store in this
process, while a monitor thread reads each thread's CPU time from ``/proc/self/task`` and names
it by its Python thread. The first 5 s (start-up, imports, first GPM reads) are left out. Prints
each thread's share of one core and the process total; with ``--simulate`` the simulator's share
is inside the sampling thread (``bench/collector_process.py`` takes it out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatt.cli.main import main as gpuwatt_main  # noqa: E402

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
WARM_UP_S = 5.0


def thread_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) of every thread of this process, by native thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return out


def monitor(stop: threading.Event, seen: dict[int, tuple[str, float, float]]) -> None:
    """Every 0.5 s after the warm-up: each thread's name, its CPU at its first reading after the
    warm-up, and at its latest reading."""
    start = time.monotonic()
    while not stop.wait(0.5):
        if time.monotonic() - start < WARM_UP_S:
            continue
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid, cpu in thread_cpu_s().items():
            name, first, _ = seen.get(tid, (names.get(tid, f"thread-{tid}"), cpu, cpu))
            seen[tid] = (name, first, cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--simulate", help="a scenario name; default: this machine's GPUs")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="gpuwatt-threads-"))
    os.environ["GPUWATT_HOME"] = str(home)
    argv = ["collect", "--store", f"sqlite:///{home}/threads.db"]
    argv += ["--interval", str(args.interval), "--duration", str(args.seconds)]
    if args.simulate:
        argv += ["--simulate", args.simulate]
    seen: dict[int, tuple[str, float, float]] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=monitor, args=(stop, seen), name="bench-monitor")
    watcher.start()
    t0 = time.monotonic()
    rc = gpuwatt_main(argv)
    wall_s = time.monotonic() - t0 - WARM_UP_S
    stop.set()
    watcher.join()
    rows: dict[str, float] = {}
    for name, first, last in seen.values():
        if name == "bench-monitor":
            continue
        rows[name] = rows.get(name, 0.0) + last - first
    report = {
        "rc": rc,
        "window_s": round(wall_s, 1),
        "threads_pct_of_a_core": {
            n: round(100 * c / wall_s, 3) for n, c in sorted(rows.items(), key=lambda kv: -kv[1])
        },
        "total_pct_of_a_core": round(100 * sum(rows.values()) / wall_s, 3),
        "cpu_ms_per_tick": round(1e3 * sum(rows.values()) / (wall_s / args.interval), 2),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
