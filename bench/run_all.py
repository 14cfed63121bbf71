"""Run gpuwatt's benchmarks one after another and print their figures (``make bench``).

Each benchmark is also a command of its own (see its docstring). The long ones (the 1-hour,
1,024-GPU analysis and the 24-hour dashboard backfill) run only with ``--all``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

QUICK = [
    ["collector_cost.py"],
    ["encode.py"],
    ["spool_replay.py"],
    ["sqlite_ingest.py"],
    ["detect.py"],
    ["storage.py", "--case", "demo"],
    ["promql_read.py", "--gpus", "128", "--minutes", "20"],
]
LONG = [
    ["analysis_speed.py"],
    ["collector_process.py"],
    ["dashboard.py"],
    ["served_render.py"],
    ["storage.py", "--case", "big"],
    ["promql_read.py"],
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--all", action="store_true", help="also the long benchmarks")
    args = ap.parse_args()
    failed = 0
    for argv in QUICK + (LONG if args.all else []):
        print(f"\n=== bench/{' '.join(argv)}", flush=True)
        failed += subprocess.call([sys.executable, str(HERE / argv[0]), *argv[1:]]) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
