"""Load bench/backfill.py's simulated cluster into a real engine (for bench/dashboard.py --store).

Starts Debian's ``influxd`` (1.6.7) or ``victoria-metrics`` on 127.0.0.1 with its own temporary
data directory (the test fixtures' server classes) and writes every round as gpuwatt's own line
protocol, byte for byte what ``LineEncoder`` writes for the same samples (checked on the first and
the last round) but built without ``GpuSample`` objects (``FastLines``), in gzip'd batches POSTed
straight to the engine's line-protocol endpoint, a few requests in flight (``Poster``). The
engine rollups of every minute and hour are computed from the generated values with the same
``rollup_rule.combine`` and ``rollup_lines`` a collector uses; a collector reads each bucket back
from the engine first (``engine_rollups.roll``), which a bulk load can skip (the engine holds
exactly these samples).

    .venv/bin/python bench/engine_load.py influxdb|victoriametrics [--gpus 1024] [--hours 24]
                                          [--interval-s 10] [--serve]

prints the load time; ``--serve`` keeps the engine running afterwards (its URL printed) for
profiling reads from another process.
"""

from __future__ import annotations

import gzip
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import urllib3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from backfill import MAX_CLOCK_MHZ, NAME, Cluster
from servers import InfluxDB1Server, VictoriaMetricsServer

from gpuwatt.line_protocol import (
    FIELD_INFO,
    LineEncoder,
    _numeric_fields,
    _pattern,
    escape_tag,
    with_info_line,
)
from gpuwatt.schema import FIELD_ENERGY_METHOD, FIELD_JOB_ID, FIELD_TFLOPS_METHOD, FIELDS
from gpuwatt.store import LAST_VALUE_ATTRS, open_store
from gpuwatt.store.engine_rollups import (
    COARSE_LEVELS,
    MINUTE_NS,
    GpuIds,
    concat,
)
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.rollup_rule import as_level, combine

T = TypeVar("T")

#: The attributes the simulated cluster sets (the others are not measured: NaN, not rolled).
ATTRS = (
    "utilization_gpu_pct",
    "temperature_gpu_c",
    "power_w",
    "energy_j",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "clock_event_reasons",
    "tensor_active_pct",
    "tensor_hmma_active_pct",
    "tflops_estimate",
    "memory_used_bytes",
)


@dataclass(frozen=True)
class EngineAt:
    """Where a started engine answers: all another process needs to write to it and read it."""

    kind: str
    url: str  # the store's URL (``open_store``)
    server_url: str  # http://127.0.0.1:PORT
    end_ns: int  # the newest sample the bench loads

    def store(self, *, use_rollups: bool = True) -> Any:
        store = open_store(self.url, environ={})
        store.use_rollups = use_rollups  # type: ignore[attr-defined]
        # VictoriaMetrics' latest() and gpus_seen() look back their hour from the store's
        # clock, and both engines look for the newest rollup point in the day before it; the
        # bench's data ends months ago: look back from the data's end, as on a live cluster (a
        # lookback stretched to months made every latest() scan all 24 h of raw samples, ~1-2
        # s; a newest rollup point not in the last day is looked for again over all time)
        store.clock_ns = lambda: self.end_ns + 1  # type: ignore[attr-defined]
        return store

    def flush(self) -> None:
        """Make what was written searchable now (VictoriaMetrics: within a second or so)."""
        if self.kind == "victoriametrics":
            resp = urllib3.request("GET", f"{self.server_url}/internal/force_flush")
            if resp.status != 200:
                raise RuntimeError(f"force_flush {resp.status}: {resp.data[:200]!r}")


class Engine:
    """A started engine, the store that reads it, and the CPU time its server process used."""

    def __init__(self, kind: str, end_ns: int) -> None:
        self.kind = kind
        self.server: Any = InfluxDB1Server() if kind == "influxdb" else VictoriaMetricsServer()
        self.server.start()
        if kind == "influxdb":
            self.server.create_database("bench")
            url = self.server.url.replace("http://", "influxdb://") + "/bench?timeout=120s"
        else:
            url = self.server.url.replace("http://", "victoriametrics://")
            url += "?timeout=120s&rollups=on"
        self.at = EngineAt(kind, url, self.server.url, end_ns)
        self.url = url

    def store(self, *, use_rollups: bool = True) -> Any:
        return self.at.store(use_rollups=use_rollups)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the engine's process so far."""
        return process_cpu_s(self.server._proc.pid)

    def close(self) -> None:
        self.server.cleanup()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_elsewhere(engine: Engine, cluster: Cluster) -> int:
    """``load`` in a process of its own, as collectors write from theirs: the process that
    then times the dashboard holds none of the load's data. Loaded in the timing process, the
    1 h view's cold callbacks on VictoriaMetrics used more CPU in the dashboard's process
    (bench/dashboard.py, see the CHANGELOG)."""
    spec = (cluster.gpus, cluster.hours, cluster.interval_s, engine.at.end_ns)
    return in_own_process(_load_cluster, engine.at, spec)


def in_own_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh interpreter (spawned, not a copy of this one), its result."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        return pool.submit(fn, *args).result()


def _load_cluster(at: EngineAt, spec: tuple[int, float, float, int]) -> int:
    return load(at, Cluster(*spec), progress=lambda line: print(line, flush=True))


def load(
    engine: EngineAt,
    cluster: Cluster,
    *,
    batch_lines: int = 50_000,
    workers: int = 2,
    progress: Callable[[str], None] = print,
) -> int:
    """Write every round of ``cluster`` and its minute, 5-minute and hour rollups; the samples
    written."""
    store = engine.store()
    # VictoriaMetrics is given the string fields as an info line, as ``PromStore.write_lines``
    fast = FastLines(cluster, labelled=engine.kind == "victoriametrics")
    ids = GpuIds()
    gids = np.array(
        [
            ids.of((h, i, u, NAME))
            for h, i, u in zip(cluster.hosts, cluster.index, cluster.uuids, strict=True)
        ]
    )
    lost = np.zeros(cluster.gpus, bool)
    pending: list[str] = []
    minute_rows: list[dict[str, np.ndarray]] = []  # the current minute's samples (level cols)
    # the minutes of each coarse level's current bucket
    coarse_minutes: dict[int, list[dict[str, np.ndarray]]] = {lv: [] for lv in COARSE_LEVELS}
    written, t0, next_report = 0, time.perf_counter(), 0.0
    poster = Poster(engine, workers)

    def close_minute() -> None:
        if minute_rows:
            cols = combine(
                concat(minute_rows, ATTRS), MINUTE_NS, ATTRS, LAST_VALUE_ATTRS, level_ns=0
            )
            pending.extend(store.rollups.rollup_lines(MINUTE_NS, cols, ids.idents))
            for minutes in coarse_minutes.values():
                minutes.append(cols)
            minute_rows.clear()

    def close_coarse(level_ns: int) -> None:
        if minutes := coarse_minutes[level_ns]:
            cols = combine(concat(minutes, ATTRS), level_ns, ATTRS, LAST_VALUE_ATTRS)
            pending.extend(store.rollups.rollup_lines(level_ns, cols, ids.idents))
            minutes.clear()

    step_ns = round(cluster.interval_s * 1e9)
    for k in range(cluster.steps):
        t = cluster.time_ns(k)
        if minute_rows and t % MINUTE_NS < step_ns:
            close_minute()
            for level in COARSE_LEVELS:
                if t % level < step_ns:
                    close_coarse(level)
        values = fast.values(k)
        lines = fast.lines(t, values)
        if k in (0, cluster.steps - 1):  # the first round, and one with the straggler
            _check_same_as_encoder(cluster, t, values, lines, fast.labelled)
        pending.extend(lines)
        minute_rows.append(  # each sample's slot: the sampling interval (no gaps, as a
            as_level(  # collector's ``raw_with_seen`` finds for them)
                np.full(cluster.gpus, t),
                gids,
                lost,
                {a: values[a] for a in ATTRS},
                seen_ns=np.full(cluster.gpus, step_ns),
            )
        )
        written += cluster.gpus
        if len(pending) >= batch_lines:
            poster.post(pending)
            pending = []
        if (k + 1) / cluster.steps >= next_report:
            rate = written / (time.perf_counter() - t0)
            progress(f"  load {(k + 1) / cluster.steps:5.0%}  {written:,} samples  {rate:,.0f}/s")
            next_report += 0.1
    close_minute()
    for level in COARSE_LEVELS:
        close_coarse(level)
    poster.post(pending)
    poster.close()
    engine.flush()
    store.close()
    return written


class FastLines:
    """The cluster's rounds as gpuwatt's line protocol without ``GpuSample`` objects: each
    GPU's tag prefix and constant fields are built once, the numeric fields of a round written
    by the encoder's own ``_numeric_fields`` with its pattern for this cluster's field set.
    ``load`` checks the result against ``LineEncoder`` on the first and the last round (and
    ``labelled``, against ``with_info_line`` of it: the string fields as an info line's tags)."""

    def __init__(self, cluster: Cluster, *, labelled: bool = False) -> None:
        self.cluster = cluster
        self.labelled = labelled
        encoder = LineEncoder()
        first = cluster.samples_of(cluster.start_ns, cluster.round(0))
        getter = attrgetter(*(spec.attr for spec in FIELDS))
        absent = tuple(v is None for v in getter(first[0]))
        self.pattern = _pattern(absent)
        self.attrs = [None if a else spec.attr for spec, a in zip(FIELDS, absent, strict=True)]
        self.prefixes = [encoder.prefix(s) for s in first]
        cluster.reset()  # the rounds again from the first: the same values as the embedded store
        self.infos: list[str] | None = None
        if labelled:
            self.infos = [
                f"{p[:-1]},{FIELD_ENERGY_METHOD}=counter,{FIELD_TFLOPS_METHOD}=gpm,"
                f"{FIELD_JOB_ID}={escape_tag(job)} {FIELD_INFO}=1 "
                for p, job in zip(self.prefixes, cluster.jobs, strict=True)
            ]
            self.suffixes = [" "] * len(cluster.jobs)
        else:
            self.suffixes = [
                f',{FIELD_ENERGY_METHOD}="counter",{FIELD_TFLOPS_METHOD}="gpm",'
                f'{FIELD_JOB_ID}="{job}" '
                for job in cluster.jobs
            ]
        g = cluster.gpus
        self.constants = {
            "sm_clock_max_mhz": np.full(g, MAX_CLOCK_MHZ),
            "memory_used_bytes": np.full(g, float(60 * 2**30)),
        }

    def values(self, k: int) -> dict[str, np.ndarray]:
        return self.cluster.round(k) | self.constants

    def lines(self, t_ns: int, values: dict[str, np.ndarray]) -> list[str]:
        none = [None] * self.cluster.gpus
        cols = [none if a is None else values[a].tolist() for a in self.attrs]
        pattern, end = self.pattern, f"{t_ns}"
        lines = [
            f"{p}{_numeric_fields(pattern, row)}{s}{end}"
            for p, row, s in zip(self.prefixes, zip(*cols, strict=True), self.suffixes, strict=True)
        ]
        if self.infos is None:
            return lines
        infos = [f"{i}{end}" for i in self.infos]
        return [x for pair in zip(lines, infos, strict=True) for x in pair]


def _check_same_as_encoder(
    cluster: Cluster, t_ns: int, values: dict[str, np.ndarray], lines: list[str], labelled: bool
) -> None:
    expected = LineEncoder().encode_many(cluster.samples_of(t_ns, values))
    if labelled:
        expected = [x for line in expected for x in with_info_line(line)]
    if expected != lines:
        bad = next(i for i, (a, b) in enumerate(zip(expected, lines, strict=True)) if a != b)
        raise AssertionError(f"FastLines differs from LineEncoder:\n{expected[bad]}\n{lines[bad]}")


class Poster:
    """Gzip'd batches POSTed in parallel straight to the engine's line-protocol endpoint (v1
    ``/write`` on InfluxDB 1.x, ``/write`` on VictoriaMetrics), a few requests in flight."""

    def __init__(self, engine: EngineAt, workers: int) -> None:
        if engine.kind == "influxdb":
            self.url = f"{engine.server_url}/write?db=bench&precision=ns"
        else:
            self.url = f"{engine.server_url}/write?precision=ns"
        self.http = urllib3.PoolManager(maxsize=workers, timeout=urllib3.Timeout(total=300.0))
        self.pool = ThreadPoolExecutor(workers)
        self.in_flight: list[Future[None]] = []
        self.workers = workers

    def post(self, lines: list[str]) -> None:
        if not lines:
            return
        while len(self.in_flight) >= 2 * self.workers:
            self.in_flight.pop(0).result()
        self.in_flight.append(self.pool.submit(self._send, "\n".join(lines)))

    def _send(self, text: str) -> None:
        body = gzip.compress(text.encode(), compresslevel=1)
        for attempt in range(10):
            resp = self.http.request(
                "POST", self.url, body=body, headers={"Content-Encoding": "gzip"}
            )
            if resp.status in (200, 204):
                return
            # A busy shared machine: influxd answers a batch it did not store within its
            # write timeout (10 s) with 500 "timeout". Writes are idempotent: send it again.
            if attempt == 9 or resp.status < 500:
                raise RuntimeError(f"write {resp.status}: {resp.data[:300]!r}")
            time.sleep(2.0 * (attempt + 1))

    def close(self) -> None:
        for f in self.in_flight:
            f.result()
        self.pool.shutdown()


def main() -> None:
    import argparse

    from backfill import Cluster as _Cluster

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("influxdb", "victoriametrics"))
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--interval-s", type=float, default=10.0)
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()
    end_ns = (1_767_225_600 + 20 * 3600) * 1_000_000_000  # bench/dashboard.py's END_NS
    cluster = _Cluster(args.gpus, args.hours, args.interval_s, end_ns)
    engine = Engine(args.kind, end_ns)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # ``kill PID`` stops the engine
    try:
        t = time.perf_counter()
        n = load_elsewhere(engine, cluster)
        dt = time.perf_counter() - t
        print(f"{n:,} samples in {dt:.0f} s ({n / dt:,.0f}/s); engine CPU {engine.cpu_s():.0f} s")
        if args.serve:
            print(f"serving {engine.url} (Ctrl-C ends)", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        engine.close()


__all__ = [
    "Engine",
    "EngineAt",
    "InfluxStore",
    "in_own_process",
    "load",
    "load_elsewhere",
    "process_cpu_s",
]

if __name__ == "__main__":
    main()
