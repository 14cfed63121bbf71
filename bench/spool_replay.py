"""Spool replay after an outage, end to end: the collector's ``Flusher`` draining a full spool.

Run: ``.venv/bin/python bench/spool_replay.py [--samples 120000]``

The samples are the demo scenario's (32 simulated GPUs, 1 s apart), spooled as the collector
spools them (not timed). Then, timed, ``Flusher.flush()`` drains the spool as a collector does
when its store comes back: read a batch, deliver it, move the cursor (fsync'd), until empty.

- into the embedded store (``SqliteStore``) from the binary spool it now gets: as rows (the
  frames decoded straight into the store's columns, ``write_rows``, as the flusher does now),
  and, for comparison in the same run, as ``GpuSample`` objects (``write_samples``, as before);
  and from a text spool an earlier version left (every line parsed);
- into the InfluxDB path from the text spool (the lines sent as spooled, no parsing), twice:

  - against Debian's ``influxd`` 1.6.7 started on 127.0.0.1 as the tests start it
    (``tests/servers.py``): the whole path, the server's ingest included;
  - against ``write_standin.py``, a process on 127.0.0.1 that speaks InfluxDB 1.x's ``/write``
    (``/ping``, then POSTs whose bodies it decodes, checks and counts, answering 204) and stores
    nothing: gpuwatt's side of the path alone (spool read, batching, HTTP POST), which is what
    the target is about; influxd's own ingest is a property of the server and the machine.

Each figure is samples (lines) per second of wall time, with the flusher process's CPU time
beside it, for the best of ``--runs`` replays (the one least slowed by other load); the store's
count (the stand-in's count of lines) is checked after each replay. For the two servers, their
own CPU for the same lines is printed too: on a machine of few cores influxd's, not the sending,
sets the wall time. Targets (issue 16, acceptance 4): >= 100,000 samples/s into SQLite, >= 50,000
lines/s into the InfluxDB path (gpuwatt's side: the stand-in figure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers import InfluxDB1Server, http  # noqa: E402

from gpuwatt.collector import spool_frames  # noqa: E402
from gpuwatt.collector.runtime import Flusher  # noqa: E402
from gpuwatt.collector.sim.scenario import load_scenario  # noqa: E402
from gpuwatt.collector.sim.source import SimulatedClusterSource  # noqa: E402
from gpuwatt.collector.spool import Spool, SpoolBatch  # noqa: E402
from gpuwatt.model import GpuSample, make_gpu_sample  # noqa: E402
from gpuwatt.store.influx import InfluxStore  # noqa: E402
from gpuwatt.store.sqlite import SqliteStore  # noqa: E402

T0_NS = 1_700_000_000 * 1_000_000_000
SQLITE_TARGET = 100_000
INFLUX_TARGET = 50_000


def demo_ticks(n_samples: int) -> list[list[GpuSample]]:
    """The demo scenario's snapshots, one list per 1-s tick, ``n_samples`` samples or more."""
    source = SimulatedClusterSource(load_scenario("demo"), start_ns=T0_NS)
    source.open()
    ticks: list[list[GpuSample]] = []
    n = 0
    try:
        for samples in source.backfill(
            T0_NS + 10**15, interval_s=1.0, slow_interval_s=30.0
        ):  # stops below
            ticks.append(samples)
            n += len(samples)
            if n >= n_samples:
                break
    finally:
        source.close()
    return ticks


def spooled(directory: Path, ticks: list[list[GpuSample]], *, binary: bool) -> Spool:
    """A spool holding ``ticks`` as the collector appends them (one append per tick)."""
    filling = Spool(directory, binary=binary, fsync=False, max_bytes=1 << 34)
    for samples in ticks:
        filling.append_samples(samples)
    filling.close()
    return Spool(directory, binary=binary, max_bytes=1 << 34)  # fsync'd cursor, as it runs


def replay(spool: Spool, store: object) -> tuple[int, float, float]:
    """Drain ``spool`` into ``store``: (samples, wall s, CPU s)."""
    flusher = Flusher(spool, store)  # type: ignore[arg-type]
    wall, cpu = time.perf_counter(), time.process_time()
    sent = flusher.flush()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert spool.pending_lines() == 0 and flusher.rejected_lines == 0, "replay incomplete"
    return sent, wall, cpu


def spool_alone(spool: Spool, *, rows: bool) -> tuple[int, float, float]:
    """Drain ``spool`` delivering nowhere, in the flusher's batches: its read, decode (``rows``:
    frames left encoded, as ``write_rows`` takes them) and cursor commits alone."""
    n = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while len(batch := _read(spool, rows)):
        n += len(batch)
        spool.commit(batch)
    return n, time.perf_counter() - wall, time.process_time() - cpu


def _read(spool: Spool, rows: bool) -> SpoolBatch:
    """A batch as the flusher reads it for a store that takes rows, or samples."""
    if rows:
        return spool.read_batch(16384, 8 * 1024 * 1024, as_rows=True)
    return spool.read_batch(max_lines=4096)


def rows_alone(store: SqliteStore, spool: Spool) -> tuple[int, float, float]:
    """``write_rows`` of the flusher's batches of ``spool`` (read beforehand, not timed)."""
    batches = []
    while len(batch := _read(spool, True)):
        assert batch.rows is not None
        batches.append(batch.rows)
        spool.commit(batch)
    n = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for rows in batches:
        store.write_rows(rows)
        n += len(rows)
    return n, time.perf_counter() - wall, time.process_time() - cpu


class SamplesOnly:
    """A store seen through ``write_samples`` and ``write_lines`` only: the flusher then hands
    it ``GpuSample`` objects, as it did before ``write_rows``."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def write_samples(self, samples: Sequence[GpuSample]) -> None:
        self.store.write_samples(samples)

    def write_lines(self, lines: Sequence[str]) -> None:
        self.store.write_lines(lines)


def store_alone(store: SqliteStore, ticks: list[list[GpuSample]]) -> tuple[int, float, float]:
    """``write_samples`` of the same samples in batches of 128 ticks (the flusher's 4,096)."""
    n = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(ticks), 128):
        batch = [s for tick in ticks[i : i + 128] for s in tick]
        store.write_samples(batch)
        n += len(batch)
    return n, time.perf_counter() - wall, time.process_time() - cpu


def construction_us(ticks: list[list[GpuSample]]) -> tuple[float, float]:
    """Building one decoded sample: by ``make_gpu_sample`` (what the spool uses) and by the
    dataclass's own constructor: the need for ``gpuwatt.model._slot_twin`` on this path."""
    rows = [[getattr(s, a) for a in spool_frames.ATTRS] for tick in ticks[:200] for s in tick]
    out = []
    for build in (make_gpu_sample, GpuSample):
        best = float("inf")
        for _ in range(5):
            cpu = time.process_time()
            for row in rows:
                build(*row)
            best = min(best, time.process_time() - cpu)
        out.append(best / len(rows) * 1e6)
    return out[0], out[1]


def report(label: str, unit: str, result: tuple[int, float, float], target: int | None) -> None:
    sent, wall, cpu = result
    rate = sent / wall
    verdict = "" if target is None else f"  (target >= {target:,}: {_met(rate >= target)})"
    print(
        f"{label:<46} {rate:>9,.0f} {unit}/s wall, {sent / cpu:>9,.0f} per CPU-s "
        f"({sent:,} in {wall:.2f} s){verdict}"
    )


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def check_count(expected: int, count: Callable[[], int], what: str) -> None:
    got = count()
    assert got == expected, f"{what}: {got} stored, {expected} replayed"


def best_of(runs: int, once: Callable[[int], tuple[int, float, float]]) -> tuple[int, float, float]:
    """The run with the shortest wall time of ``runs`` (``once(k)`` for k = 0, 1, ...): the one
    least slowed by other load on a shared machine, as ``timeit`` advises."""
    results = [once(k) for k in range(runs)]
    return min(results, key=lambda r: r[1])


def process_cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=120_000)
    ap.add_argument("--runs", type=int, default=3, help="replays of each kind; the best is shown")
    args = ap.parse_args()
    t = time.perf_counter()
    ticks = demo_ticks(args.samples)
    n = sum(map(len, ticks))
    print(
        f"{n:,} samples of the demo scenario ({len(ticks[0])} GPUs x {len(ticks)} ticks), "
        f"made in {time.perf_counter() - t:.1f} s (not timed); best of {args.runs} runs each"
    )
    end_ns = T0_NS + (len(ticks) + 1) * 1_000_000_000
    with tempfile.TemporaryDirectory(prefix="gpuwatt-replay-") as tmp:
        root = Path(tmp)

        def into_sqlite(binary: bool, k: int, *, rows: bool = True) -> tuple[int, float, float]:
            name = f"{'binary' if binary else 'text'}-{'rows' if rows else 'samples'}-{k}"
            store = SqliteStore(root / f"{name}.db")
            try:
                into = store if rows else SamplesOnly(store)
                result = replay(spooled(root / f"spool-{name}", ticks, binary=binary), into)
                check_count(n, lambda: store.count_samples(T0_NS, end_ns), name)
            finally:
                store.close()
            return result

        def store_only(k: int, *, rows: bool) -> tuple[int, float, float]:
            store = SqliteStore(root / f"alone-{'rows' if rows else 'samples'}-{k}.db")
            try:
                if rows:
                    return rows_alone(store, spooled(root / f"spool-rows-{k}", ticks, binary=True))
                return store_alone(store, ticks)
            finally:
                store.close()

        def spool_only(k: int, *, rows: bool) -> tuple[int, float, float]:
            spool = spooled(
                root / f"spool-alone-{'rows' if rows else 'samples'}-{k}", ticks, binary=True
            )
            return spool_alone(spool, rows=rows)

        as_rows = best_of(args.runs, lambda k: into_sqlite(True, k))
        as_samples = best_of(args.runs, lambda k: into_sqlite(True, k, rows=False))
        report("binary spool -> SQLite (rows: write_rows)", "samples", as_rows, SQLITE_TARGET)
        parts: list[tuple[str, Callable[..., tuple[int, float, float]], bool]] = [
            ("SQLite write_rows alone (decoding)", store_only, True),
            ("the spool alone (read frames)", spool_only, True),
            ("SQLite write_samples alone", store_only, False),
            ("the spool alone (read, decode)", spool_only, False),
        ]
        for i, (label, part, rows) in enumerate(parts):
            if i == 2:
                report(
                    "binary spool -> SQLite (samples: write_samples)", "samples", as_samples, None
                )
            report(
                f"  of which: {label}",
                "samples",
                best_of(args.runs, lambda k, part=part, rows=rows: part(k, rows=rows)),
                None,
            )
        ours, dataclass = construction_us(ticks)
        print(
            f"  a decoded sample built by make_gpu_sample: {ours:.2f} us; by the "
            f"dataclass's constructor: {dataclass:.2f} us"
        )
        print(
            f"rows against samples: {as_samples[1] / as_rows[1]:.2f}x the wall rate, "
            f"{(as_samples[2] / as_samples[0]) / (as_rows[2] / as_rows[0]):.2f}x per CPU-s"
        )
        report(
            "text spool -> SQLite (an old spool: parsed)",
            "samples",
            best_of(args.runs, lambda k: into_sqlite(False, k)),
            None,
        )

        standin = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "write_standin.py")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert standin.stdout is not None
            standin_url = f"http://127.0.0.1:{int(standin.stdout.readline())}"
            standin_cpu: list[float] = []

            def standin_count() -> tuple[int, float]:
                status, body = http("GET", f"{standin_url}/count")
                assert status == 200, body
                answer = json.loads(body)
                return int(answer["lines"]), float(answer["cpu_s"])

            def into_standin(k: int) -> tuple[int, float, float]:
                http("DELETE", f"{standin_url}/count")
                spool = spooled(root / f"spool-standin-{k}", ticks, binary=False)
                before = standin_count()[1]
                with InfluxStore(standin_url, "", "bench", timeout_s=60) as store:
                    result = replay(spool, store)
                standin_cpu.append(standin_count()[1] - before)
                check_count(n, lambda: standin_count()[0], "stand-in")
                return result

            report(
                "text spool -> /write stand-in (gpuwatt's side)",
                "lines",
                best_of(args.runs, into_standin),
                INFLUX_TARGET,
            )
            print(
                f"  the stand-in's own CPU (decode, check, count): {min(standin_cpu):.2f}-"
                f"{max(standin_cpu):.2f} s for the same lines"
            )
        finally:
            standin.terminate()
            standin.wait(timeout=10)

        server = InfluxDB1Server()
        server.start()
        assert server._proc is not None
        server_pid = server._proc.pid
        server_cpu: list[float] = []
        try:

            def into_influx(k: int) -> tuple[int, float, float]:
                server.query("DROP DATABASE bench", method="POST")
                server.create_database("bench")
                spool = spooled(root / f"spool-influx-{k}", ticks, binary=False)
                before = process_cpu_s(server_pid)
                with InfluxStore(server.url, "", "bench", timeout_s=60) as store:
                    result = replay(spool, store)
                server_cpu.append(process_cpu_s(server_pid) - before)

                def influx_count() -> int:
                    q = 'SELECT count("gpu_lost") FROM "nvidia_smi"'
                    res = server.query(q, db="bench")
                    return int(res["results"][0]["series"][0]["values"][0][1])

                check_count(n, influx_count, "influxdb")
                return result

            result = best_of(args.runs, into_influx)
            report("text spool -> InfluxDB 1.6.7 (the whole path)", "lines", result, INFLUX_TARGET)
            print(
                f"  influxd's own CPU for the same lines: {min(server_cpu):.1f}-"
                f"{max(server_cpu):.1f} s ({n / max(server_cpu):,.0f}-{n / min(server_cpu):,.0f} "
                "lines per influxd CPU-s): the server's ingest, not the collector's sending, "
                "sets the wall time on a machine of few cores"
            )
        finally:
            server.stop()
            server.cleanup()


if __name__ == "__main__":
    main()
