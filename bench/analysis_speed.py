"""Analysis speed: the whole analysis of 1,024 GPUs over the last hour, read from SQLite.

    .venv/bin/python bench/analysis_speed.py [--gpus 1024] [--seconds 3600] [--db PATH]
                                             [--base CHECKOUT]

Fills a temporary ``SqliteStore`` with ``--seconds`` of 1-second samples of ``--gpus`` simulated
H100s (the seeded simulator: 64-GPU synchronous training jobs, inference, one thermal and one
power-brake straggler, an idle job), then times, on this one process:

* reading the hour as 1-minute rollups (``series(step_s=60)``) plus the jobs (``latest()``),
* ``analyze()`` on that frame (balance, stragglers, energy, TFLOPS/W): target <= 1 s,
* reading the same hour raw, for comparison.

``--base CHECKOUT`` also times ``analyze()`` of another checkout (e.g. a ``git worktree`` of an
earlier commit) on the very same frame, side by side: each side runs in its own process with its
checkout first on ``PYTHONPATH``, the two alternate for 3 rounds, and the best CPU time of each is
compared (the ratio is this checkout's over the base's).

Samples are built straight from the simulator's state (not through the fake NVML, whose per-call
cost is the collector's benchmark, not this one). ``--db`` keeps the database for a re-run.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pandas as pd

from gpuwatt.analytics import ANALYSIS_FIELDS, analyze
from gpuwatt.collector.sim.scenario import load_scenario_text
from gpuwatt.collector.sim.simulator import Simulator
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
T0_NS = 1_700_000_040 * NS
T = TypeVar("T")


def scenario_yaml(gpus: int) -> str:
    nodes = max(1, gpus // 8)
    jobs = []
    per_job_nodes = 8 if nodes >= 18 else max(1, (nodes - 2) // 2)
    n_train = max(1, (nodes - 2) // per_job_nodes)
    for j in range(n_train):
        a, b = j * per_job_nodes, (j + 1) * per_job_nodes - 1
        jobs.append(
            f"  - {{id: train-{j}, kind: training, gpus: ['node-[{a}-{b}]:*'], intensity: 0.7}}"
        )
    used = n_train * per_job_nodes
    if used < nodes - 1:
        jobs.append(
            f"  - {{id: serve, kind: inference, gpus: ['node-[{used}-{nodes - 2}]:*'], load: 0.7}}"
        )
    jobs.append(f"  - {{id: notebook, kind: idle, gpus: ['node-{nodes - 1}:0-1'], memory_gib: 8}}")
    return f"""
name: speed
seed: 7
cluster: {{nodes: {nodes}, gpus_per_node: 8, model: H100 SXM}}
jobs:
{chr(10).join(jobs)}
faults:
  - {{kind: thermal_slowdown, gpu: node-1:5, start: 20m}}
  - {{kind: power_brake, gpu: node-{min(9, nodes - 3)}:2, start: 30m}}
"""


def fill(store: SqliteStore, gpus: int, seconds: int) -> None:
    sim = Simulator(load_scenario_text(scenario_yaml(gpus)))
    states = sim.gpus
    jobs = [sim.job_of(s.host, s.index) for s in states]
    prev_tensor = [0.0] * len(states)
    prev_hmma = [0.0] * len(states)
    prev_fp32 = [0.0] * len(states)
    for t in range(seconds):
        sim.advance_to(float(t))
        ts = T0_NS + t * NS
        batch = []
        for k, s in enumerate(states):
            ten, hm, f32 = s.tensor_any_active_s, s.tensor_hmma_active_s, s.fp32_active_s
            batch.append(
                GpuSample(
                    time_ns=ts,
                    host=s.host,
                    gpu_index=s.index,
                    uuid=s.uuid,
                    name=s.name,
                    utilization_gpu_pct=s.utilization_gpu_pct,
                    memory_used_bytes=s.memory_used_bytes,
                    temperature_gpu_c=round(s.temperature_c),
                    power_w=s.power_w,
                    power_limit_w=s.power_limit_w,
                    energy_j=s.energy_mj / 1000.0,
                    energy_method=EnergyMethod.COUNTER,
                    sm_clock_mhz=s.sm_clock_mhz,
                    clock_event_reasons=s.clock_event_reasons,
                    tensor_active_pct=(ten - prev_tensor[k]) * 100.0 if t else None,
                    tensor_hmma_active_pct=(hm - prev_hmma[k]) * 100.0 if t else None,
                    fp32_active_pct=(f32 - prev_fp32[k]) * 100.0 if t else None,
                    processes=tuple(ProcessSample(p, m) for p, m in s.processes),
                    job_id=jobs[k],
                )
            )
            prev_tensor[k], prev_hmma[k], prev_fp32[k] = ten, hm, f32
        store.write_samples(batch)


def timed(fn: Callable[[], T], repeat: int = 3) -> tuple[float, T]:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


_SIDE = """
import pickle, sys, time
from gpuwatt.analytics import analyze
frame, jobs, start_ns, end_ns, window_s = pickle.load(open(sys.argv[1], "rb"))
best = float("inf")
for _ in range(3):
    c = time.process_time()
    s = analyze(frame, now_ns=end_ns, start_ns=start_ns, window_s=window_s, jobs=jobs)
    best = min(best, time.process_time() - c)
print(best, len(s.stragglers))
"""


def side_by_side(frame_path: Path, checkouts: dict[str, Path], rounds: int = 3) -> dict[str, float]:
    """Best ``analyze()`` CPU seconds of each checkout on the pickled frame, alternating."""
    best = dict.fromkeys(checkouts, float("inf"))
    for _ in range(rounds):
        for name, root in checkouts.items():
            env = {**os.environ, "PYTHONPATH": str(root)}
            out = subprocess.run(
                [sys.executable, "-c", _SIDE, str(frame_path)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=root,
            ).stdout.split()
            best[name] = min(best[name], float(out[0]))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--db", type=Path, help="keep (or reuse) the database at this path")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--base", type=Path, help="a checkout to compare analyze() with")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "speed.db"
        fresh = not path.exists()
        store = SqliteStore(path)
        try:
            if fresh:
                t = time.perf_counter()
                fill(store, args.gpus, args.seconds)
                store.flush_rollups()
                print(
                    f"filled {args.gpus} GPUs x {args.seconds} s = {args.gpus * args.seconds:,} "
                    f"samples in {time.perf_counter() - t:.0f} s"
                )
            end_ns = T0_NS + args.seconds * NS
            start_ns = end_ns - 3600 * NS

            def read_rollup() -> tuple[pd.DataFrame, dict[str, str]]:
                frame = store.series(start_ns, end_ns, ANALYSIS_FIELDS, step_s=60)
                jobs = {s.uuid: s.job_id for s in store.latest() if s.job_id}
                return frame, jobs

            t_read, (frame, jobs) = timed(read_rollup)
            c0 = time.process_time()
            t_an, summary = timed(
                lambda: analyze(
                    frame, now_ns=end_ns, start_ns=start_ns, window_s=args.window_s, jobs=jobs
                )
            )
            cpu_an = (time.process_time() - c0) / 3
            t_raw, raw = timed(lambda: store.series(start_ns, end_ns, ANALYSIS_FIELDS), repeat=1)
            compared: dict[str, float] = {}
            if args.base is not None:
                frame_path = Path(tmp) / "frame.pkl"
                with frame_path.open("wb") as fh:
                    pickle.dump((frame, jobs, start_ns, end_ns, args.window_s), fh)
                here = Path(__file__).resolve().parents[1]
                compared = side_by_side(frame_path, {"this": here, "base": args.base.resolve()})
        finally:
            store.close()
    verdict = "ok" if t_an <= 1.0 else "MISSED"
    print(f"read 1 h as 1-min rollups + latest(): {t_read:6.3f} s  ({len(frame):,} rows)")
    print(
        f"analyze() on it:                      {t_an:6.3f} s  (CPU {cpu_an:.3f} s; "
        f"target <= 1 s: {verdict})"
    )
    print(f"read + analyze:                       {t_read + t_an:6.3f} s")
    print(f"read the same hour raw:               {t_raw:6.3f} s  ({len(raw):,} rows)")
    print(
        f"found: {len(summary.stragglers)} stragglers "
        + ", ".join(f"{s.host}:{s.gpu_index} {s.cause}" for s in summary.stragglers)
        + f"; {len(summary.idle_allocated)} idle allocated GPUs"
    )
    if compared:
        print(
            f"analyze() CPU, side by side (best of 3 alternating rounds): this "
            f"{compared['this']:.3f} s, base {args.base} {compared['base']:.3f} s, "
            f"ratio {compared['this'] / compared['base']:.2f}x"
        )


if __name__ == "__main__":
    main()
