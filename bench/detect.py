"""Detection benchmark: every shipped scenario through the real pipeline, scored on ground truth.

For each scenario in ``collector/sim/scenarios``: the simulator runs behind the fake NVML, the
real ``NvmlSampler`` samples it every second into a temporary ``SqliteStore``, the window is read
back and ``gpuwatt.analytics.analyze`` runs on it. Printed per scenario: what was flagged against
the ground truth (GPU, cause, windows from onset to flag) and, for synchronous training, what the
naive rule "lowest utilisation is the straggler" would have blamed instead.

Pass criteria (exit status 1 when any fails): every injected straggler (thermal_slowdown,
power_brake) found on the right GPU with the right cause within 5 windows of its onset; every
idle-allocated GPU reported; nothing else flagged (so nothing at all in healthy scenarios).

    .venv/bin/python bench/detect.py [--window-s 60] [--scenario NAME ...] [--max-duration-s S]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwatt.analytics import ANALYSIS_FIELDS, AnalysisSummary, analyze
from gpuwatt.collector.sim.scenario import Scenario, list_shipped_scenarios, load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
START_NS = 1_700_000_040 * NS  # a whole minute, so windows start with the scenario
MAX_WINDOWS_LATE = 5
DEFAULT_DURATION_S = 20 * 60
STRAGGLER_CAUSES = {"thermal_slowdown": "thermal", "power_brake": "power_brake"}


@dataclass
class Result:
    name: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    naive_wrong: bool | None = None


def simulate(scenario: Scenario, store: SqliteStore, duration_s: float) -> None:
    """Backfill ``duration_s`` of 1-s samples through the fake NVML and the real sampler."""
    src = SimulatedClusterSource(scenario, start_ns=START_NS, clock_ns=lambda: START_NS)
    src.open()
    try:
        buf = []
        for batch in src.backfill(
            START_NS + int(duration_s * NS), interval_s=1.0, slow_interval_s=10.0
        ):
            buf.extend(batch)
            if len(buf) >= 4096:
                store.write_samples(buf)
                buf = []
        if buf:
            store.write_samples(buf)
    finally:
        src.close()


def attach_jobs(frame: pd.DataFrame, scenario: Scenario) -> pd.DataFrame:
    """The simulator's own job resolver: the scenario's job on each GPU at each sample time."""
    job = np.full(len(frame), None, dtype=object)
    t_s = (frame["time_ns"].to_numpy() - START_NS) / NS
    hosts = frame["host"].to_numpy()
    idx = frame["gpu_index"].to_numpy()
    for j in scenario.jobs:
        on = np.zeros(len(frame), dtype=bool)
        for h, i in j.gpus:
            on |= (hosts == h) & (idx == i)
        on &= t_s >= j.start_s
        if j.end_s is not None:
            on &= t_s < j.end_s
        job[on] = j.id
    return frame.assign(job_id=job)


def naive_pick(summary: AnalysisSummary, job_id: str, after_ns: int) -> tuple[str, int] | None:
    """The GPU the naive rule blames most often: lowest utilisation in the job, per window."""
    gw = summary.gpu_windows
    sub = gw.loc[(gw["job_id"] == job_id) & (gw["window_start_ns"] >= after_ns)]
    if sub.empty:
        return None
    lows = sub.loc[sub.groupby("window_start_ns")["utilization_gpu_pct"].idxmin()]
    top = lows.groupby(["host", "gpu_index"]).size().idxmax()
    return str(top[0]), int(top[1])


def score(scenario: Scenario, s: AnalysisSummary, window_s: float) -> Result:
    r = Result(scenario.name)
    w_ns = int(window_s * NS)
    truth = scenario.ground_truth()
    expected_stragglers = [g for g in truth if g.cause in STRAGGLER_CAUSES]
    expected_idle = {(g.host, g.gpu_index) for g in truth if g.cause == "idle_allocated"}
    found = {(st.host, st.gpu_index): st for st in s.stragglers}
    for g in expected_stragglers:
        onset_ns = START_NS + int(g.start_s * NS)
        onset_w = (onset_ns // w_ns) * w_ns
        st = found.pop((g.host, g.gpu_index), None)
        want = STRAGGLER_CAUSES[g.cause]
        if st is None:
            r.failures.append(f"missed {g.host} GPU {g.gpu_index} ({g.cause})")
            r.lines.append(f"  MISSED   {g.host} GPU {g.gpu_index}: injected {g.cause}")
            continue
        late = (st.flagged_ns - onset_w) // w_ns
        ok = st.cause == want and late <= MAX_WINDOWS_LATE
        if st.cause != want:
            r.failures.append(f"{g.host} GPU {g.gpu_index}: cause {st.cause}, expected {want}")
        if late > MAX_WINDOWS_LATE:
            r.failures.append(f"{g.host} GPU {g.gpu_index}: flagged {late} windows after onset")
        r.lines.append(
            f"  {'FOUND   ' if ok else 'WRONG   '} {g.host} GPU {g.gpu_index}: injected {g.cause} "
            f"-> {st.cause}, {st.signature} signature, flagged {late} windows after onset "
            f"(score {st.score:.2f}, severity {st.severity})"
        )
        r.lines.append(f"           {st.explanation}")
        job = scenario.job_at(g.host, g.gpu_index, g.start_s)
        if job is not None and job.kind == "training":
            pick = naive_pick(s, job.id, onset_w + 2 * w_ns)
            r.naive_wrong = pick != (g.host, g.gpu_index)
            who = "nothing" if pick is None else f"{pick[0]} GPU {pick[1]}"
            r.lines.append(
                f"           naive 'lowest utilisation' rule blames {who}: "
                f"{'WRONG' if r.naive_wrong else 'right'}"
            )
    for (h, i), st in found.items():
        r.failures.append(f"false straggler {h} GPU {i} ({st.cause})")
        r.lines.append(f"  FALSE    {h} GPU {i}: {st.explanation}")
    reported = {(i.host, i.gpu_index) for i in s.idle_allocated}
    for h, i in sorted(expected_idle):
        hit = (h, i) in reported
        r.lines.append(f"  {'FOUND   ' if hit else 'MISSED  '} {h} GPU {i}: idle allocated")
        if not hit:
            r.failures.append(f"missed idle allocated {h} GPU {i}")
    for h, i in sorted(reported - expected_idle):
        r.failures.append(f"false idle allocated {h} GPU {i}")
        r.lines.append(f"  FALSE    {h} GPU {i}: reported idle allocated")
    if not truth and not s.stragglers and not s.idle_allocated:
        r.lines.append("  healthy: nothing flagged")
    sw = s.straggler_windows
    if not sw.empty:
        innocent = ~sw["uuid"].isin([st.uuid for st in s.stragglers])
        busy = sw.loc[innocent & sw["busy"].astype(bool)]
        if not busy.empty:
            r.lines.append(
                f"  margin: lowest clock score of any other busy GPU {busy['score'].min():.2f} "
                f"(hard threshold 0.75); {int(busy['anomalous'].sum())} transient anomalous "
                "GPU-windows, none persistent"
            )
    return r


def run(name: str, window_s: float, max_duration_s: float) -> Result:
    scenario = load_scenario(name)
    duration_s = min(scenario.duration_s or DEFAULT_DURATION_S, max_duration_s)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "detect.db")
        try:
            t0 = time.perf_counter()
            simulate(scenario, store, duration_s)
            t_sim = time.perf_counter() - t0
            end_ns = START_NS + int(duration_s * NS)
            frame = store.series(START_NS, end_ns, ANALYSIS_FIELDS)
        finally:
            store.close()
    frame = attach_jobs(frame, scenario)
    t0 = time.perf_counter()
    summary = analyze(frame, now_ns=end_ns, window_s=window_s)
    t_an = time.perf_counter() - t0
    result = score(scenario, summary, window_s)
    result.lines.insert(
        0,
        f"{name}: {scenario.cluster.gpu_count} GPUs, {duration_s / 60:.0f} min of 1-s samples "
        f"(simulated + sampled + stored in {t_sim:.1f} s, analysed in {t_an:.2f} s)",
    )
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    ap.add_argument(
        "--max-duration-s",
        type=float,
        default=30 * 60,
        help="simulate at most this long per scenario (default 30 min)",
    )
    args = ap.parse_args(argv)
    names = args.scenario or list_shipped_scenarios()
    results = [run(n, args.window_s, args.max_duration_s) for n in names]
    for r in results:
        print("\n".join(r.lines))
        print(f"  => {'PASS' if not r.failures else 'FAIL: ' + '; '.join(r.failures)}\n")
    sync = [r for r in results if r.naive_wrong is not None]
    wrong = sum(1 for r in sync if r.naive_wrong)
    print(
        f"naive 'lowest utilisation is the straggler' rule: wrong in {wrong} of {len(sync)} "
        "synchronous-training straggler cases"
    )
    failed = [r.name for r in results if r.failures]
    print(f"detector: {len(results) - len(failed)} of {len(results)} scenarios pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
