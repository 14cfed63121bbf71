"""Detection benchmark: shipped and bench scenarios, scored on the simulator's ground truth.

Scenarios: every shipped one (``collector/sim/scenarios``) and every ``bench/scenarios/*.yaml``
(written apart from the detector: small jobs, starved replicas, intermittent and ramped faults,
HW/SW slowdowns, locked clocks, slow hosts and links, round-robin balancing, mixed models, 2 to
512 GPUs, and healthy-but-tricky ones). Each runs with its seed and a start time 17 s past a
minute, so windows do not line up with the scenario. The simulator's GPU states are read every
second into a frame (``--pipeline``: through the fake NVML, the real sampler and a SQLite store,
as in production, slower) and ``gpuwatt.analytics.analyze`` runs on it.

Scored per scenario: every injected straggler (``STRAGGLER_FAULTS``) found on the right GPU with
the right cause within 5 windows of its onset; every idle allocation reported, a process held
without a job reported as such; nothing else flagged. Printed: each finding with its explanation,
what the naive "lowest utilisation is the straggler" rule would blame for synchronous jobs, then
precision, recall and detection delay over all scenarios.

``--sweep`` re-runs every scenario with 3 seeds and start offsets every 5 s across a minute and
checks that no verdict changes (what is flagged, where, with which cause; pass or fail).

    .venv/bin/python bench/detect.py [--window-s 60] [--scenario NAME ...] [--sweep] [--pipeline]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuwatt.analytics import ANALYSIS_FIELDS, AnalysisSummary, analyze
from gpuwatt.collector.sim.frame import attach_jobs, sample_frame
from gpuwatt.collector.sim.scenario import (
    STRAGGLER_FAULTS,
    Scenario,
    list_shipped_scenarios,
    load_scenario,
)
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
MINUTE_NS = 1_700_000_040 * NS  # a whole minute
DEFAULT_OFFSET_S = 17  # scenarios start off the minute
MAX_WINDOWS_LATE = 5
DEFAULT_DURATION_S = 20 * 60
BENCH_SCENARIOS = Path(__file__).parent / "scenarios"
SWEEP_SEED_OFFSETS = (0, 1000, 2000)
SWEEP_OFFSETS_S = tuple(range(0, 60, 5))


@dataclass
class Result:
    name: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    naive_wrong: bool | None = None
    expected: int = 0
    found: int = 0  # right GPU, right cause, in time
    false: int = 0  # flagged where nothing was injected, or with the wrong cause
    delays: list[int] = field(default_factory=list)  # windows from onset to flag
    verdict: tuple = ()


def all_scenarios() -> dict[str, Path | str]:
    out: dict[str, Path | str] = {n: n for n in list_shipped_scenarios()}
    out.update({p.stem: p for p in sorted(BENCH_SCENARIOS.glob("*.yaml"))})
    return out


def simulate(scenario: Scenario, store: SqliteStore, duration_s: float, start_ns: int) -> None:
    """Backfill ``duration_s`` of 1-s samples through the fake NVML and the real sampler."""
    src = SimulatedClusterSource(scenario, start_ns=start_ns, clock_ns=lambda: start_ns)
    src.open()
    try:
        buf = []
        for batch in src.backfill(
            start_ns + int(duration_s * NS), interval_s=1.0, slow_interval_s=10.0
        ):
            buf.extend(batch)
            if len(buf) >= 4096:
                store.write_samples(buf)
                buf = []
        if buf:
            store.write_samples(buf)
    finally:
        src.close()


def naive_pick(summary: AnalysisSummary, job_id: str, after_ns: int) -> tuple[str, int] | None:
    """The GPU the naive rule blames most often: lowest utilisation in the job, per window."""
    gw = summary.gpu_windows
    sub = gw.loc[(gw["job_id"] == job_id) & (gw["window_start_ns"] >= after_ns)]
    if sub.empty:
        return None
    lows = sub.loc[sub.groupby("window_start_ns")["utilization_gpu_pct"].idxmin()]
    top = lows.groupby(["host", "gpu_index"]).size().idxmax()
    return str(top[0]), int(top[1])


def score(scenario: Scenario, s: AnalysisSummary, window_s: float, start_ns: int) -> Result:
    r = Result(scenario.name)
    w_ns = int(window_s * NS)
    truth = scenario.ground_truth()
    expected_stragglers = [g for g in truth if g.cause in STRAGGLER_FAULTS]
    r.expected = len(expected_stragglers)
    found = {(st.host, st.gpu_index): st for st in s.stragglers}
    for g in expected_stragglers:
        onset_ns = start_ns + int(g.start_s * NS)
        onset_w = (onset_ns // w_ns) * w_ns
        st = found.pop((g.host, g.gpu_index), None)
        want = STRAGGLER_FAULTS[g.cause]
        if st is None:
            r.failures.append(f"missed {g.host} GPU {g.gpu_index} ({g.cause})")
            r.lines.append(f"  MISSED   {g.host} GPU {g.gpu_index}: injected {g.cause}")
            continue
        late = (st.flagged_ns - onset_w) // w_ns
        ok = st.cause == want and late <= MAX_WINDOWS_LATE
        if st.cause != want:
            r.false += 1
            r.failures.append(f"{g.host} GPU {g.gpu_index}: cause {st.cause}, expected {want}")
        if late > MAX_WINDOWS_LATE:
            r.failures.append(f"{g.host} GPU {g.gpu_index}: flagged {late} windows after onset")
        if ok:
            r.found += 1
            r.delays.append(int(late))
        extra = f", intermittent (duty {st.duty_cycle:.0%})" if st.intermittent else ""
        r.lines.append(
            f"  {'FOUND   ' if ok else 'WRONG   '} {g.host} GPU {g.gpu_index}: injected {g.cause} "
            f"-> {st.cause}, {st.signature} signature, flagged {late} windows after onset "
            f"(score {st.score:.2f}, severity {st.severity}, "
            f"{'active' if st.active else 'ended'}{extra})"
        )
        r.lines.append(f"           {st.explanation}")
        job = scenario.job_at(g.host, g.gpu_index, g.start_s)
        if job is not None and job.kind == "training" and len(job.gpus) > 1:
            pick = naive_pick(s, job.id, onset_w + 2 * w_ns)
            r.naive_wrong = pick != (g.host, g.gpu_index)
            who = "nothing" if pick is None else f"{pick[0]} GPU {pick[1]}"
            r.lines.append(
                f"           naive 'lowest utilisation' rule blames {who}: "
                f"{'WRONG' if r.naive_wrong else 'right'}"
            )
    for (h, i), st in found.items():
        r.false += 1
        r.failures.append(f"false straggler {h} GPU {i} ({st.cause})")
        r.lines.append(f"  FALSE    {h} GPU {i}: {st.explanation}")
    _score_idle(scenario, s, r)
    if not truth and not s.stragglers and not s.idle_allocated:
        r.lines.append("  healthy: nothing flagged")
    r.verdict = (
        tuple(sorted((st.host, st.gpu_index, st.cause) for st in s.stragglers)),
        tuple(
            sorted((i.host, i.gpu_index, i.idle_class) for i in s.idle if i.idle_class != "free")
        ),
        not r.failures,
    )
    return r


def _actionable(s: AnalysisSummary) -> list:
    """Idle GPUs someone should act on: all but the free ones."""
    return [i for i in s.idle if i.idle_class != "free"]


def _score_idle(scenario: Scenario, s: AnalysisSummary, r: Result) -> None:
    """Idle allocations (idle jobs, idle processes of a job) and processes held without a job."""
    expected: dict[tuple[str, int], str] = {}
    for g in scenario.ground_truth():
        if g.cause == "idle_allocated":
            expected[(g.host, g.gpu_index)] = "allocated_idle" if g.job_id else "held_no_job"
    reported = {(i.host, i.gpu_index): i for i in _actionable(s)}
    for key, want in sorted(expected.items()):
        got = reported.pop(key, None)
        hit = got is not None and got.idle_class == want
        r.lines.append(
            f"  {'FOUND   ' if hit else 'MISSED  '} {key[0]} GPU {key[1]}: {want}"
            + (f" -- {got.explanation}" if got is not None else "")
        )
        if not hit:
            r.failures.append(f"missed {want} {key[0]} GPU {key[1]}")
    for (h, i), got in sorted(reported.items()):
        r.failures.append(f"false {got.idle_class} {h} GPU {i}")
        r.lines.append(f"  FALSE    {h} GPU {i}: {got.explanation}")


def run(
    name: str,
    source: Path | str,
    window_s: float,
    max_duration_s: float,
    *,
    seed_offset: int = 0,
    offset_s: int = DEFAULT_OFFSET_S,
    pipeline: bool = False,
) -> Result:
    scenario = load_scenario(source)
    if seed_offset:
        scenario = dataclasses.replace(scenario, seed=scenario.seed + seed_offset)
    start_ns = MINUTE_NS + offset_s * NS
    duration_s = min(scenario.duration_s or DEFAULT_DURATION_S, max_duration_s)
    end_ns = start_ns + int(duration_s * NS)
    t0 = time.perf_counter()
    if pipeline:
        with tempfile.TemporaryDirectory() as tmp:
            store = SqliteStore(Path(tmp) / "detect.db")
            try:
                simulate(scenario, store, duration_s, start_ns)
                frame = store.series(start_ns, end_ns, ANALYSIS_FIELDS)
            finally:
                store.close()
    else:
        frame = sample_frame(scenario, duration_s, start_ns)
    t_sim = time.perf_counter() - t0
    frame = attach_jobs(frame, scenario, start_ns)
    t0 = time.perf_counter()
    summary = analyze(frame, now_ns=end_ns, window_s=window_s)
    t_an = time.perf_counter() - t0
    result = score(scenario, summary, window_s, start_ns)
    result.lines.insert(
        0,
        f"{name}: {scenario.cluster.gpu_count} GPUs, {duration_s / 60:.0f} min of 1-s samples, "
        f"seed {scenario.seed}, start {offset_s} s past the minute "
        f"(simulated in {t_sim:.1f} s, analysed in {t_an:.2f} s)",
    )
    return result


def sweep(names: dict[str, Path | str], window_s: float, max_duration_s: float) -> int:
    """Every scenario with 3 seeds x start offsets every 5 s: does any verdict change?"""
    changed = 0
    for name, source in names.items():
        verdicts: dict[tuple, list[str]] = {}
        for seed_offset in SWEEP_SEED_OFFSETS:
            for off in SWEEP_OFFSETS_S:
                r = run(
                    name, source, window_s, max_duration_s, seed_offset=seed_offset, offset_s=off
                )
                verdicts.setdefault(r.verdict, []).append(f"seed+{seed_offset}/{off}s")
        runs = sum(len(v) for v in verdicts.values())
        stable = len(verdicts) == 1 and next(iter(verdicts))[2]
        changed += not stable
        print(f"  sweep {name}: {runs} runs, {len(verdicts)} verdict(s)", end="")
        if stable:
            print(", all passing")
        else:
            print()
            for v, where in verdicts.items():
                print(f"    {'pass' if v[2] else 'FAIL'} {v[0]} {v[1]} in {', '.join(where[:6])}")
    print(f"sweep: {len(names) - changed} of {len(names)} scenarios keep one passing verdict")
    return changed


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
    ap.add_argument("--sweep", action="store_true", help="also 3 seeds x offsets every 5 s")
    ap.add_argument("--pipeline", action="store_true", help="sample through NVML and SQLite")
    args = ap.parse_args(argv)
    known = all_scenarios()
    names = {n: known[n] for n in args.scenario} if args.scenario else known
    results = [
        run(n, src, args.window_s, args.max_duration_s, pipeline=args.pipeline)
        for n, src in names.items()
    ]
    for r in results:
        print("\n".join(r.lines))
        print(f"  => {'PASS' if not r.failures else 'FAIL: ' + '; '.join(r.failures)}\n")
    sync = [r for r in results if r.naive_wrong is not None]
    wrong = sum(1 for r in sync if r.naive_wrong)
    print(
        f"naive 'lowest utilisation is the straggler' rule: wrong in {wrong} of {len(sync)} "
        "synchronous-training straggler cases"
    )
    expected = sum(r.expected for r in results)
    tp = sum(r.found for r in results)
    fp = sum(r.false for r in results)
    delays = [d for r in results for d in r.delays]
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / expected if expected else 1.0
    print(
        f"stragglers: {expected} injected, {tp} found with the right cause in time, {fp} false "
        f"or wrong; precision {precision:.2f}, recall {recall:.2f}"
    )
    if delays:
        print(
            f"detection delay (windows from onset to flag): mean {np.mean(delays):.1f}, "
            f"max {max(delays)}"
        )
    failed = [r.name for r in results if r.failures]
    print(f"detector: {len(results) - len(failed)} of {len(results)} scenarios pass")
    changed = sweep(names, args.window_s, args.max_duration_s) if args.sweep else 0
    return 1 if failed or changed else 0


if __name__ == "__main__":
    sys.exit(main())
