"""Two versions of gpuwatt timed on one load of an engine: an A/B of code, not of loads.

    git worktree add /tmp/a <commit>          # the version to compare with (B: this checkout)
    .venv/bin/python bench/engine_ab.py victoriametrics|influxdb /tmp/a . [--presets 1h,6h]
                                       [--repeat 5] [--rounds 2] [--gpus 1024] [--hours 24]
                                       [--interval-s 10]

Why: the engine's CPU per cold callback differed 2-3x between two loads of the same cluster into
the same engine (VictoriaMetrics, 1,024 GPUs x 24 h: 240-600 ms against ~180 ms per 1 h view on
the same code), so ``bench/dashboard.py`` run on two days compares loads as much as code. Here
the cluster is loaded once (``engine_load``); then, in each round, every page of every range is
timed cold by each tree in turn (the order alternating between rounds), each in a fresh
interpreter importing that tree's gpuwatt and its ``bench/engine_compare.time_store``, as
``bench/dashboard.py`` times it. Printed per range and page: each tree's cold p95 (the highest
over the rounds), the ratio B/A, and the medians of the dashboard's and the engine's CPU per cold
callback; then the sums.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backfill import Cluster, cluster_arguments
from callback_times import END_NS
from engine_compare import settle
from engine_load import Engine, load_elsewhere

#: Run in a fresh interpreter with a tree's gpuwatt: its ``time_store`` on the loaded engine,
#: the figures as JSON on the last line of stdout.
_TIMER = """
import json, sys
from engine_compare import StoreAt, time_store
from engine_load import EngineAt
kind, url, server_url, pid, end_ns, presets, repeat = json.loads(sys.argv[1])
at = StoreAt(engine=EngineAt(kind, url, server_url, end_ns), engine_pid=pid)
timed = time_store(at, end_ns, [(p, {"range": p}) for p in presets], repeat, 0)
print(json.dumps({r: {page: [t.cold_p95_s, t.cold_cpu_median_s, t.cold_engine_cpu_median_s]
                      for page, t in pages.items() if page != "alerts"}
                  for r, pages in timed.pages.items()}))
"""


def time_tree(tree: Path, spec: list[object]) -> dict[str, dict[str, list[float]]]:
    """``_TIMER`` with ``tree``'s gpuwatt and bench modules first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "bench")])}
    out = subprocess.run(
        [sys.executable, "-c", _TIMER, json.dumps(spec)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, dict[str, list[float]]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("influxdb", "victoriametrics"))
    ap.add_argument("a", type=Path, help="the tree to compare with")
    ap.add_argument("b", type=Path, help="the tree compared")
    ap.add_argument("--presets", default="1h,6h")
    ap.add_argument("--repeat", type=int, default=5, help="cold callbacks per page and round")
    ap.add_argument("--rounds", type=int, default=2)
    cluster_arguments(ap, interval_s=10.0)
    args = ap.parse_args()
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    engine = Engine(args.kind, END_NS)
    try:
        cluster = Cluster(args.gpus, args.hours, args.interval_s, END_NS)
        print(f"loading {cluster.gpus} GPUs x {cluster.hours} h every {cluster.interval_s} s "
              f"into {args.kind}", flush=True)  # fmt: skip
        load_elsewhere(engine, cluster)
        pid = engine.server._proc.pid
        at = engine.at
        spec = [args.kind, at.url, at.server_url, pid, END_NS, args.presets.split(","),
                args.repeat]  # fmt: skip
        got: dict[str, list[dict[str, dict[str, list[float]]]]] = {"A": [], "B": []}
        for r in range(args.rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                settle(pid)
                print(f"  round {r + 1}: {name} ({trees[name]})", flush=True)
                got[name].append(time_tree(trees[name], spec))
    finally:
        engine.close()
    sums = {"A": 0.0, "B": 0.0}
    for preset in args.presets.split(","):
        print(f"\n{preset}: cold p95 ms (highest of {args.rounds} rounds); B/A; "
              "median CPU ms per cold callback, dashboard + engine, A / B")  # fmt: skip
        for page in got["A"][0][preset]:
            fig = {n: [run[preset][page] for run in got[n]] for n in ("A", "B")}
            p95 = {n: max(f[0] for f in fig[n]) * 1e3 for n in fig}
            cpu = {n: statistics.median(f[1] for f in fig[n]) * 1e3 for n in fig}
            eng = {n: statistics.median(f[2] for f in fig[n]) * 1e3 for n in fig}
            sums["A"] += p95["A"]
            sums["B"] += p95["B"]
            ratio = p95["B"] / p95["A"]
            a_cpu, b_cpu = (f"{cpu[n]:4.0f} + {eng[n]:4.0f}" for n in ("A", "B"))
            print(f"  {page:11s} A {p95['A']:5.0f}  B {p95['B']:5.0f}  {ratio:4.2f}   "
                  f"{a_cpu} / {b_cpu}")  # fmt: skip
    print(f"\nsum of the p95s: A {sums['A'] / 1e3:.2f} s, B {sums['B'] / 1e3:.2f} s, "
          f"B/A {sums['B'] / sums['A']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
