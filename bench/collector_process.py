"""The collector process as it runs, CPU from /proc, the simulator's share taken out.

Run: ``.venv/bin/python bench/collector_process.py [--seconds 120] [--against /tmp/base]``

Started together, for the same time, on the same machine:

- ``gpuwatt collect --simulate demo --interval 1`` of this tree, writing to the embedded store
  (SQLite) through its spool: sampling, spool, store write, commits, APScheduler, all of it;
- the same command of another checkout (``--against``, e.g. ``git worktree add /tmp/base
  <commit>``), side by side, with its own store and spool;
- the simulator alone (``--simulator-alone``): the demo's 32 simulated GPUs advanced each second
  and the fake NVML answering the calls a sampler makes (logged once at start, replayed each
  tick: fast ticks, and the slow cadence's extra calls every ``slow_interval_s``), and one thread
  per simulated node waiting on the fake's XID event set as the collector's listener does.

After a warm-up (imports, store creation, first rollups), each process's CPU time (user + system,
all threads: ``/proc/<pid>/stat``) is read at the start and the end of the measured window. The
collector's own cost is its CPU less the simulator's. Target (issue 16, acceptance 3): at most
0.3 % of one core for the 32-GPU demo at 1 s. The simulated job resolver (``dataclasses.replace``
per sample, ``collector.sim.source``) stays in the collector's share.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_PCT = 0.3
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of process ``pid``: user + system of every thread, living or ended, from
    ``/proc/<pid>/stat`` (clock ticks), and the run time of its living threads summed from
    ``/proc/<pid>/task/*/schedstat`` (nanoseconds: the finer of the two, as every thread of the
    collector lives as long as it runs)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    run_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError):  # a thread that ended meanwhile
            run_ns += int((task / "schedstat").read_text().split()[0])
    return ticks_s, run_ns / 1e9


def collector(tree: Path, tmp: Path, name: str, seconds: float) -> subprocess.Popen[str]:
    """``gpuwatt collect`` of checkout ``tree`` (its code first on the path), writing to SQLite."""
    argv = [
        sys.executable,
        "-m",
        "gpuwatt",
        "collect",
        "--simulate",
        "demo",
        "--interval",
        "1",
        "--duration",
        str(seconds),
        "--store",
        f"sqlite:///{tmp / name}.db",
        "--spool",
        str(tmp / f"{name}-spool"),
    ]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def simulator(seconds: float) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--simulator-alone", "--seconds", str(seconds)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def xid_waits(fake: Any, stop: threading.Event) -> None:
    """What the fake costs the XID listener of one node: its event-set waits (200 ms each, as
    ``collector.xid_events`` waits), timing out."""
    import pynvml

    from gpuwatt.collector.xid_events import DEFAULT_WAIT_MS

    event_set = fake.nvmlEventSetCreate()
    for i in range(fake.nvmlDeviceGetCount()):
        handle = fake.nvmlDeviceGetHandleByIndex(i)
        fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    while not stop.is_set():
        with suppress(pynvml.NVMLError):
            fake.nvmlEventSetWait(event_set, DEFAULT_WAIT_MS)


def simulator_alone(seconds: float) -> None:
    """The simulator's share of ``collect --simulate demo``: advance, answer the NVML calls."""
    import pynvml
    from recording_nvml import RecordingNvml

    from gpuwatt.collector.nvml_source import NvmlSampler
    from gpuwatt.collector.sim.fake_nvml import FakeNvml
    from gpuwatt.collector.sim.scenario import load_scenario
    from gpuwatt.collector.sim.simulator import Simulator
    from gpuwatt.config import CollectorConfig

    slow_interval_s = CollectorConfig().slow_interval_s
    sim = Simulator(load_scenario("demo"))
    fakes = [RecordingNvml(FakeNvml(sim.cluster, host)) for host in sim.cluster.hosts()]
    samplers = [
        NvmlSampler(fake, host, xid_events=False)  # type: ignore[arg-type]
        for fake, host in zip(fakes, sim.cluster.hosts(), strict=True)
    ]
    logs = {}
    for sampler in samplers:
        sampler.open()
    for t_s, slow in ((1.0, True), (2.0, False)):
        for fake in fakes:
            fake.log = []
        sim.advance_to(t_s)
        for sampler in samplers:
            sampler.sample(include_slow=slow)
        logs[slow] = [call for fake in fakes for call in fake.log or []]
    for fake in fakes:
        fake.log = None
    stop = threading.Event()
    for fake in fakes:
        threading.Thread(target=xid_waits, args=(fake, stop), daemon=True).start()
    start = time.monotonic()
    last_slow = start
    tick = 0
    while (elapsed := time.monotonic() - start) < seconds:
        slow = time.monotonic() - last_slow >= slow_interval_s
        if slow:
            last_slow = time.monotonic()
        sim.advance_to(2.0 + elapsed)
        for fn, args, kwargs in logs[slow]:
            with suppress(pynvml.NVMLError):
                fn(*args, **kwargs)
        tick += 1
        time.sleep(max(0.0, start + tick - time.monotonic()))
    stop.set()
    print(f"simulator alone: {tick} ticks, {len(logs[False])} NVML calls per tick", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--against", type=Path, help="another checkout, run side by side")
    ap.add_argument("--simulator-alone", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.simulator_alone:
        simulator_alone(args.seconds)
        return
    total_s = args.warmup + args.seconds + 5
    with tempfile.TemporaryDirectory(prefix="gpuwatt-process-") as tmp_name:
        tmp = Path(tmp_name)
        procs = {"this tree": collector(ROOT, tmp, "this", total_s)}
        if args.against is not None:
            procs[f"against {args.against}"] = collector(
                args.against.resolve(), tmp, "base", total_s
            )
        procs["simulator alone"] = simulator(total_s)
        try:
            time.sleep(args.warmup)
            before = {k: cpu_s(p.pid) for k, p in procs.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)
            after = {k: cpu_s(p.pid) for k, p in procs.items()}
            window_s = time.monotonic() - t0
            outputs = {k: p.communicate(timeout=120)[0] for k, p in procs.items()}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.communicate()
    for name, p in procs.items():
        if p.returncode != 0:
            raise SystemExit(f"{name} failed ({p.returncode}):\n{outputs[name][-2000:]}")
    pct = {k: (after[k][1] - before[k][1]) / window_s * 100 for k in procs}
    coarse = {k: (after[k][0] - before[k][0]) / window_s * 100 for k in procs}
    sim_pct = pct.pop("simulator alone")
    print(
        f"{window_s:.0f} s measured after {args.warmup:.0f} s of warm-up; demo scenario "
        f"(32 simulated GPUs) at 1 s into SQLite; CPU from /proc/<pid>/task/*/schedstat "
        f"(/proc/<pid>/stat in brackets, {1 / CLOCK_TICKS * 1000:.0f} ms resolution)"
    )
    print(f"  simulator alone: {sim_pct:6.3f} % of one core [{coarse['simulator alone']:.3f} %]")
    own = {}
    for name, value in pct.items():
        out = outputs[name]
        m = re.search(r"(\d+) GPU samples taken, (\d+) delivered, (\d+) kept", out)
        stored = f"{m[1]} samples taken, {m[2]} delivered" if m else "no summary: " + out[-300:]
        own[name] = value - sim_pct
        print(
            f"  {name}: {value:6.3f} % of one core [{coarse[name]:.3f} %]; own (less the "
            f"simulator): {own[name]:6.3f} % [{coarse[name] - coarse['simulator alone']:.3f} %] "
            f"({stored})"
        )
    ours = own["this tree"]
    verdict = "met" if ours <= TARGET_PCT else "MISSED"
    print(f"collector's own cost: {ours:.3f} % of one core (target <= {TARGET_PCT} %: {verdict})")
    for name, value in own.items():
        if name != "this tree" and value > 0:
            print(f"ratio this tree / {name.removeprefix('against ')}: {ours / value:.2f}")


if __name__ == "__main__":
    main()
