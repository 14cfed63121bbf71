"""Rollups kept in the engine (``gpuwatt.store.engine_rollups``), on Debian's InfluxDB 1.6.7 and
VictoriaMetrics started by the fixtures: what they serve equals what the embedded store serves
from the same samples, at every step and range edge; they stay complete and idempotent under
late data, spool replays and a collector restarted mid-minute (``collector.rollup_writer``)."""

from __future__ import annotations

import itertools
import json
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from servers import http

from gpuwatt.analytics.inputs import context_reads
from gpuwatt.collector.rollup_writer import STATE_FILE, RollupWriter, open_rollup_writer
from gpuwatt.collector.runtime import Flusher
from gpuwatt.collector.spool import Spool
from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample
from gpuwatt.store import engine_rollups, open_store
from gpuwatt.store.base import SEEN_COLUMN, SeriesRead, series_many, shared_session
from gpuwatt.store.engine_rollups import FIVE_MINUTES_NS, HOUR_NS, MINUTE_NS, GpuIds, Scope
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.promql_rollups import PromRollups
from gpuwatt.store.sqlite import SqliteStore

pytestmark = pytest.mark.servers

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour
ATTRS = ("power_w", "utilization_gpu_pct", "energy_j", "temperature_gpu_c", "clock_event_reasons")
GPUS = (("node1", 0), ("node1", 1), ("node-2 b", 0))  # a host name with a space


class _Flushing:
    """The engine's rollup source, with VictoriaMetrics' buffers flushed before each read (the
    test server makes new samples searchable on a flush; a real one within about a second,
    which ``RollupWriter.settle_s`` waits for)."""

    def __init__(self, source: Any, flush: Callable[[], None]) -> None:
        self.source = source
        self.flush = flush

    def raw_level(self, *args: Any) -> Any:
        self.flush()
        return self.source.raw_level(*args)

    def raw_in(self, start_ns: int, end_ns: int) -> bool:
        self.flush()
        return bool(self.source.raw_in(start_ns, end_ns))

    def rollup_points(self, *args: Any, **kwargs: Any) -> Any:
        self.flush()
        return self.source.rollup_points(*args, **kwargs)

    def rollup_span(self, level_ns: int) -> Any:
        self.flush()
        return self.source.rollup_span(level_ns)

    def rollup_lines(self, *args: Any) -> Any:
        return self.source.rollup_lines(*args)

    def write_lines(self, lines: Sequence[str]) -> None:
        self.source.write_lines(lines)


@dataclass
class Engine:
    store: Any
    source: Any
    flush: Callable[[], None]
    drop_raw_before: Callable[[int], None]

    def count_points(self, level_ns: int) -> int:
        """Rollup points of a level kept in the engine, stale ones too, one per GPU."""
        points = self.source.rollup_points(level_ns, 0, 2**62, Scope((), None))
        return len(points["time_ns"])


@pytest.fixture(params=["influxdb1", "victoriametrics"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    yield from engine_of(request)


def engine_of(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The ``engine`` fixture's engine, for the fixture of another test module."""
    if request.param == "influxdb1":
        server, db = request.getfixturevalue("influx_db")
        store = InfluxStore(server.url, "", db, timeout_s=30)

        def drop_influx(t_ns: int) -> None:
            server.query(f'DELETE FROM "nvidia_smi" WHERE time < {t_ns}', db=db, method="POST")

        try:
            yield Engine(store, store.rollups, lambda: None, drop_influx)
        finally:
            store.close()
        return
    vm = request.getfixturevalue("victoria_metrics")
    prom = open_store(vm.url.replace("http://", "victoriametrics://") + "?rollups=on")

    def drop_vm(t_ns: int) -> None:
        """Keep the rollups and the raw samples from ``t_ns`` on (VictoriaMetrics deletes
        whole series only: export, start empty, import what is kept)."""
        kept = []
        for s in vm.export():
            if not s["metric"]["__name__"].startswith("gpuwatt_rollup"):
                pairs = [(t, v) for t, v in zip(s["timestamps"], s["values"], strict=True)
                         if t * 1_000_000 >= t_ns]  # fmt: skip
                if not pairs:
                    continue
                s = {**s, "timestamps": [t for t, _ in pairs], "values": [v for _, v in pairs]}
            kept.append(json.dumps(s))
        vm.wipe()
        status, body = http("POST", f"{vm.url}/api/v1/import", data="\n".join(kept).encode())
        assert status == 204, body
        vm.force_flush()

    try:
        yield Engine(prom, _Flushing(prom.rollups, vm.force_flush), vm.force_flush, drop_vm)
    finally:
        prom.close()


def samples(
    make_sample: Callable[..., GpuSample], start_ns: int, end_ns: int, *, period_s: int = 10,
    power_offset: float = 0.0,
) -> list[GpuSample]:  # fmt: skip
    """Three GPUs every ``period_s``; GPU 1 of node1 lost for minute 30 and for one sample at
    each 7th minute; the reason bitmask changes each minute, the energy counter climbs."""
    out = []
    for t in range(start_ns, end_ns, period_s * S):
        k = (t - T0) // S
        for n, (host, index) in enumerate(GPUS):
            minute = (t - T0) // MINUTE_NS
            if (host, index) == ("node1", 1) and (
                minute == 30 or (minute % 7 == 0 and k % 60 == 20)
            ):
                out.append(
                    GpuSample(
                        time_ns=t,
                        host=host,
                        gpu_index=index,
                        uuid=f"GPU-{host}-{index}",
                        name="NVIDIA H100 80GB HBM3",
                        lost=True,
                    )
                )
                continue
            out.append(
                make_sample(
                    t,
                    host=host,
                    gpu_index=index,
                    power_w=300.0 + 7.25 * n + (k % 97) * 1.5 + power_offset,
                    utilization_gpu_pct=float((k // 10 + 13 * n) % 101),
                    energy_j=1.0e6 + 400.0 * k + n,
                    temperature_gpu_c=float(50 + (k // 60 + n) % 30),
                    clock_event_reasons=[0, 4, 0x40, 4][(minute + n) % 4],
                )
            )
    return out


def write(engine: Engine, batch: Sequence[GpuSample]) -> None:
    lines = LineEncoder().encode_many(batch)
    for i in range(0, len(lines), 5000):
        engine.store.write_lines(lines[i : i + 5000])
    engine.flush()


def embedded(tmp_path: Path, batch: Sequence[GpuSample]) -> SqliteStore:
    store = SqliteStore(tmp_path / "ref.db")
    store.write_samples(sorted(batch, key=lambda s: s.time_ns))
    store.flush_rollups()
    return store


READS = [
    (0, 127 * MINUTE_NS, 60),
    (29 * S, 119 * MINUTE_NS + 31 * S, 60),
    (17 * S, 127 * MINUTE_NS, 300),
    (0, 127 * MINUTE_NS, 3600),
    (90 * S, 126 * MINUTE_NS + 5 * S, 3600),
    (0, 120 * MINUTE_NS, 7200),
    (0, 127 * MINUTE_NS, 1800),
]


def assert_same(engine: Engine, ref: SqliteStore, reads: Sequence[tuple[int, int, int]]) -> None:
    engine.flush()
    for lo, hi, step in reads:
        got = engine.store.series(T0 + lo, T0 + hi, ATTRS, step_s=step)
        want = ref.series(T0 + lo, T0 + hi, ATTRS, step_s=step)
        assert len(want), (lo, hi, step)
        if engine.source.rollup_span(MINUTE_NS) is None:  # raw GROUP BY: no seen time
            assert SEEN_COLUMN not in got.columns
            want = want.drop(columns=SEEN_COLUMN)
        pd.testing.assert_frame_equal(
            got.reset_index(drop=True),
            want.reset_index(drop=True),
            rtol=1e-9,
            obj=f"{lo, hi, step}",
        )


def test_rollups_serve_what_the_embedded_store_serves(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    batch = samples(make_sample, T0, T0 + 127 * MINUTE_NS)
    write(engine, batch)
    ref = embedded(tmp_path, batch)
    assert engine.source.rollup_span(MINUTE_NS) is None  # none yet: raw GROUP BY, as before
    assert_same(engine, ref, READS)
    written = engine_rollups.roll_range(engine.source, T0, T0 + 127 * MINUTE_NS)
    assert written == 3 * 127 + 3 * 26 + 3 * 3
    assert engine.count_points(MINUTE_NS) == 3 * 127
    assert engine.count_points(FIVE_MINUTES_NS) == 3 * 26
    assert engine.count_points(HOUR_NS) == 3 * 3
    assert_same(engine, ref, READS)
    # Served from the rollups: with the raw samples of all but the newest minutes gone, reads
    # of whole minutes still give the same rows.
    engine.drop_raw_before(T0 + 124 * MINUTE_NS)
    whole = [r for r in READS if r[0] % MINUTE_NS == 0]
    assert_same(engine, ref, whole)
    ref.close()


def test_any_range_at_any_step_is_what_the_embedded_store_serves(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    """The same, over random ranges (any second, the newest rollup bucket included) and the
    dashboard's and the CLI's steps, once every bucket is rolled: one truth on every store."""
    batch = samples(make_sample, T0, T0 + 127 * MINUTE_NS)
    write(engine, batch)
    ref = embedded(tmp_path, batch)
    assert engine_rollups.roll_range(engine.source, T0, T0 + 127 * MINUTE_NS) > 0
    engine.flush()
    span_s = 127 * 60

    @settings(
        max_examples=25,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each example reads an engine
    )
    @example(lo_s=0, length_s=span_s, step_s=300)
    @example(lo_s=3595, length_s=10, step_s=60)  # a sample each side of an hour's start
    @example(lo_s=61 * 60 + 7, length_s=span_s - 61 * 60 - 7, step_s=3600)  # to the newest
    @given(
        lo_s=st.integers(0, span_s - 10),
        length_s=st.integers(10, span_s),  # at least a sample (one each 10 s)
        step_s=st.sampled_from([60, 120, 300, 600, 1800, 3600, 7200]),
    )
    def same(lo_s: int, length_s: int, step_s: int) -> None:
        hi_s = min(span_s, lo_s + length_s)
        assert_same(engine, ref, [(lo_s * S, hi_s * S, step_s)])

    same()
    ref.close()


def test_rollups_take_late_data_and_replays(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    batch = samples(make_sample, T0, T0 + 70 * MINUTE_NS)
    write(engine, batch)
    engine_rollups.roll_range(engine.source, T0, T0 + 70 * MINUTE_NS)
    # Late samples in minute 5 (between the others), then the whole range replayed twice.
    late = samples(make_sample, T0 + 5 * MINUTE_NS + 5 * S, T0 + 6 * MINUTE_NS, power_offset=99)
    write(engine, late)
    engine_rollups.roll(engine.source, MINUTE_NS, T0 + 5 * MINUTE_NS)
    engine_rollups.roll(engine.source, FIVE_MINUTES_NS, T0 + 5 * MINUTE_NS)
    engine_rollups.roll(engine.source, HOUR_NS, T0)
    for _ in range(2):
        write(engine, batch)
        engine_rollups.roll_range(engine.source, T0, T0 + 70 * MINUTE_NS)
    ref = embedded(tmp_path, batch + late)
    assert_same(engine, ref, [(0, 70 * MINUTE_NS, 60), (0, 70 * MINUTE_NS, 3600),
                              (0, 60 * MINUTE_NS, 300)])  # fmt: skip
    # The replays wrote nothing new; the late minute has its first, stale point besides.
    assert engine.count_points(MINUTE_NS) == 3 * 70 + 3
    assert engine.count_points(FIVE_MINUTES_NS) == 3 * 14 + 3
    assert engine.count_points(HOUR_NS) == 3 * 2 + 3
    ref.close()


@pytest.mark.parametrize("stop", ["clean", "killed"])
def test_a_collector_restarted_mid_minute_leaves_complete_rollups(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path, stop: str
) -> None:
    batch = samples(make_sample, T0, T0 + 65 * MINUTE_NS)
    lines = LineEncoder().encode_many(batch)
    cut = next(i for i, s in enumerate(batch) if s.time_ns >= T0 + 62 * MINUTE_NS + 30 * S)

    def run_collector(part: Sequence[str], *, close: bool) -> RollupWriter:
        spool = Spool(tmp_path / "spool", fsync=False)
        writer = RollupWriter(engine.source, spool.directory, settle_s=0.0)
        flusher = Flusher(spool, engine.store, batch_lines=500, on_delivered=writer.delivered)
        spool.append(part)
        flusher.flush()
        if close:
            writer.close()
        spool.close()
        return writer

    first = run_collector(lines[:cut], close=stop == "clean")
    assert first.rolled >= 3 * 62  # the minutes before the cut, with the first hour
    state = tmp_path / "spool" / STATE_FILE
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    run_collector(lines[cut:], close=True)
    # every 5-minute bucket rolled (the newest point of each: the restart's is rolled twice)
    fives = engine.source.rollup_points(FIVE_MINUTES_NS, 0, 2**62, Scope((), None))
    assert len(engine_rollups.newest_per_bucket(fives, FIVE_MINUTES_NS)["n"]) == 3 * 13
    ref = embedded(tmp_path, batch)
    assert_same(engine, ref, [(0, 65 * MINUTE_NS, 60), (0, 65 * MINUTE_NS, 3600)])
    # and served from the rollups, the minute of the restart included
    engine.drop_raw_before(T0 + 64 * MINUTE_NS)
    assert_same(
        engine,
        ref,
        [(0, 63 * MINUTE_NS, 60), (0, 60 * MINUTE_NS, 300), (0, 120 * MINUTE_NS, 3600)],
    )
    ref.close()


def test_a_collector_upgraded_after_others_fills_in_its_five_minute_buckets(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    """Collectors of a version without the 5-minute level rolled minutes and hours; node1's was
    upgraded at minute 30 and rolls 5-minute buckets since. Reads take them from the oldest on,
    so node-2's GPU is missing from them until its collector, upgraded later, fills its own in
    at its first delivery; then a 5-minute view equals the embedded store's."""
    batch = samples(make_sample, T0, T0 + 66 * MINUTE_NS)
    write(engine, batch)
    for minute in range(T0, T0 + 65 * MINUTE_NS, MINUTE_NS):
        engine_rollups.roll(engine.source, MINUTE_NS, minute)
    engine_rollups.roll(engine.source, HOUR_NS, T0)
    for bucket in range(T0 + 30 * MINUTE_NS, T0 + 65 * MINUTE_NS, FIVE_MINUTES_NS):
        engine_rollups.roll(engine.source, FIVE_MINUTES_NS, bucket, hosts=["node1"])
    ref = embedded(tmp_path, batch)
    view = (30 * MINUTE_NS, 65 * MINUTE_NS, 300)
    engine.flush()
    before = engine.store.series(T0 + view[0], T0 + view[1], ATTRS, step_s=300)
    assert len(before) == 2 * 6 + 3  # node-2 is missing from the six rolled buckets
    state = {"minutes": [], "hours": [], "hosts": ["node-2 b"], "newest_ns": T0 + 65 * MINUTE_NS}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    writer = RollupWriter(engine.source, tmp_path, settle_s=0.0)
    node2 = [s for s in batch if s.host == "node-2 b" and s.time_ns >= T0 + 65 * MINUTE_NS]
    writer.delivered(LineEncoder().encode_many(node2))
    assert writer.rolled >= 7  # its seven 5-minute buckets since minute 30
    assert "five_minutes" in json.loads((tmp_path / STATE_FILE).read_text())  # filled once
    assert_same(engine, ref, [view, (0, 65 * MINUTE_NS, 600)])
    ref.close()


def test_the_embedded_store_gets_no_rollup_writer(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    assert open_rollup_writer(store, tmp_path) is None
    store.close()


def test_newest_point_of_a_bucket_wins() -> None:
    ids = GpuIds()
    g = ids.of(("h", 0, "u", "m"))
    cols = {
        "time_ns": np.array([T0 + 30 * 10**6, T0 + 60 * 10**6, T0 + MINUTE_NS + 60 * 10**6]),
        "gpu_id": np.array([g, g, g]),
        "n": np.array([30, 60, 60]),
        "n_ok": np.array([30, 60, 60]),
        "t_last_ns": np.array([T0, T0 + 59 * S, T0 + MINUTE_NS + 59 * S]),
        "power_w": np.array([1.0, 2.0, 3.0]),
    }
    out = engine_rollups.newest_per_bucket(cols, MINUTE_NS)
    assert out["time_ns"].tolist() == [T0, T0 + MINUTE_NS]
    assert out["power_w"].tolist() == [2.0, 3.0]


def test_rollups_turn_off_on_a_server_that_is_not_the_engine_named(
    victoria_metrics: Any, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    """An ``influxdb://`` URL pointing at VictoriaMetrics takes the samples (its /api/v2/write)
    but its /query is not InfluxQL: the collector's rollups turn off, quietly, once."""
    store = InfluxStore(victoria_metrics.url, "gpuwatt", "gpuwatt")
    assert open_rollup_writer(store, tmp_path) is not None
    writer = RollupWriter(store.rollups, tmp_path, settle_s=0.0)
    lines = LineEncoder().encode_many(samples(make_sample, T0, T0 + 3 * MINUTE_NS))
    store.write_lines(lines)
    victoria_metrics.force_flush()
    writer.delivered(lines)
    assert not writer.enabled and writer.rolled == 0
    store.close()


def test_the_reads_of_one_view_send_the_requests_they_share_once(
    engine: Engine, make_sample: Callable[..., GpuSample]
) -> None:
    """A coarse view (its context and range in hours, then its newest hour in minutes, in two
    batches) reads the newest hour's minute rollups and the newest minute raw once, and each
    read's frame is what it reads alone (``shared_reads``)."""
    batch = samples(make_sample, T0, T0 + 127 * MINUTE_NS)
    write(engine, batch)
    engine_rollups.roll_range(engine.source, T0, T0 + 126 * MINUTE_NS)
    engine.flush()
    end = T0 + 127 * MINUTE_NS
    first = [
        SeriesRead(T0 - 5 * HOUR_NS, T0, ATTRS, 3600),  # the context, before the data
        SeriesRead(T0, end, ATTRS, 3600),
        SeriesRead(T0, end, ATTRS, 3600, hosts=["node1"]),
    ]
    then = [SeriesRead(end - HOUR_NS, end, ATTRS[:2], 60)]  # fewer fields, lean minutes
    engine.store.rollup_cache_bytes = 0  # requests counted: none served from memory
    rollups = engine.store.rollups
    sent: list[tuple[Any, ...]] = []
    for name in ("raw_level", "rollup_points"):
        real = getattr(rollups, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            *span, scope = args
            hosts = None if scope.hosts is None else tuple(scope.hosts)
            sent.append((_name, *span, hosts, kwargs.get("lean")))
            return _real(*args, **kwargs)

        setattr(rollups, name, spy)
    session = shared_session(engine.store)
    together = series_many(engine.store, first, shared=session)
    together += series_many(engine.store, then, shared=session)
    assert len({s[:-1] for s in sent}) == len(sent)  # nothing asked twice
    assert session.shared > 0
    view = len(sent)
    sent.clear()
    for read, frame in zip(first + then, together, strict=True):
        alone = engine.store.series(
            read.start_ns, read.end_ns, read.fields, step_s=read.step_s, hosts=read.hosts
        )
        assert len(alone) or read.start_ns < T0
        pd.testing.assert_frame_equal(frame, alone, obj=str(read))
    assert view < len(sent)  # read alone, the newest hour's requests went twice


def rolled_and_spied(
    engine: Engine, make_sample: Callable[..., GpuSample]
) -> list[tuple[int, int, int]]:
    """127 minutes of samples written and rolled; the (level, start, end) of each rollup-points
    request the engine is asked from then on, in the list returned."""
    write(engine, samples(make_sample, T0, T0 + 127 * MINUTE_NS))
    engine_rollups.roll_range(engine.source, T0, T0 + 126 * MINUTE_NS)
    engine.flush()
    engine.store.rollup_cache_bytes = 0  # requests counted: none served from memory
    rollups = engine.store.rollups
    asked: list[tuple[int, int, int]] = []
    real = rollups.rollup_points

    def spy(level_ns: int, start_ns: int, end_ns: int, *args: Any, **kwargs: Any) -> Any:
        asked.append((level_ns, start_ns, end_ns))
        return real(level_ns, start_ns, end_ns, *args, **kwargs)

    rollups.rollup_points = spy
    return asked


def test_an_analysis_context_and_range_are_read_in_one_request_per_level(
    engine: Engine, make_sample: Callable[..., GpuSample]
) -> None:
    """An analysis's context and range (``context_reads``) abut: where they meet at a bucket
    boundary the engine is asked for the minute rollups of both at once, and each read's frame
    is what it reads alone; where they meet inside a bucket, each is read apart."""
    asked = rolled_and_spied(engine, make_sample)
    end = T0 + 127 * MINUTE_NS
    for start, together in ((end - HOUR_NS, True), (end - HOUR_NS + 30 * S, False)):
        reads = context_reads(start, end, 60)
        asked.clear()
        frames = series_many(engine.store, reads)
        minutes = [a for a in asked if a[0] == MINUTE_NS]
        assert len(minutes) == (1 if together else 2), minutes
        for read, frame in zip(reads, frames, strict=True):
            alone = engine.store.series(read.start_ns, read.end_ns, read.fields, step_s=60)
            assert len(alone) > 0
            pd.testing.assert_frame_equal(frame, alone, obj=str(read))


def test_a_read_within_another_reads_minutes_takes_them_from_its_answer(
    engine: Engine, make_sample: Callable[..., GpuSample]
) -> None:
    """A view in 2-minute buckets (no level above minutes tiles them) reads its range's minute
    rollups; its newest hour in 1-minute buckets lies within them and is not asked of the
    engine again; each frame is what its read gives alone."""
    asked = rolled_and_spied(engine, make_sample)
    end = T0 + 127 * MINUTE_NS
    view = [SeriesRead(end - 2 * HOUR_NS, end, ATTRS, 120)]
    newest = [SeriesRead(end - HOUR_NS, end, ATTRS[:3], 60)]
    session = shared_session(engine.store)
    frames = series_many(engine.store, view, shared=session)
    frames += series_many(engine.store, newest, shared=session)
    assert [a[0] for a in asked] == [MINUTE_NS], asked  # the newest hour's: from the view's
    for read, frame in zip(view + newest, frames, strict=True):
        alone = engine.store.series(read.start_ns, read.end_ns, read.fields, step_s=read.step_s)
        assert len(alone) > 0
        pd.testing.assert_frame_equal(frame, alone, obj=str(read))


def test_steps_of_five_minutes_are_read_from_the_five_minute_level(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    """A view in 5-minute buckets asks for 5-minute rollup points (5x fewer than its minutes)
    and minutes only for the part of its range not rolled in 5 minutes; 10-minute buckets are
    combined from minutes (``rollup_rule.level_for``); each frame is what the embedded store
    serves."""
    asked = rolled_and_spied(engine, make_sample)
    ref = embedded(tmp_path, samples(make_sample, T0, T0 + 127 * MINUTE_NS))
    m = MINUTE_NS
    expected = {
        # minutes rolled up to minute 125: the 5-minute bucket at 125 is the newest, from below
        (0, 127 * m, 300): [(FIVE_MINUTES_NS, 0, 125 * m)],
        # the parts of the range inside a 5-minute bucket, from minutes
        (2 * m, 123 * m, 300): [
            (FIVE_MINUTES_NS, 5 * m, 120 * m),
            (m, 2 * m, 5 * m),
            (m, 120 * m, 123 * m),
        ],
        (0, 127 * m, 600): [(m, 0, 125 * m)],
    }
    for (lo, hi, step), want in expected.items():
        asked.clear()
        assert_same(engine, ref, [(lo, hi, step)])
        assert sorted(asked) == sorted((lv, T0 + a, T0 + b) for lv, a, b in want), asked
    ref.close()


def test_a_coarse_views_newest_hour_and_range_share_their_minutes_in_either_order(
    engine: Engine, make_sample: Callable[..., GpuSample]
) -> None:
    """A coarse view reads its newest hour in 1-minute buckets and its range in hours, whose
    newest hour comes from minutes to be combined. Lean, the newest hour's minutes serve no
    combining read: read first, they are read twice. A session that is not lean (the
    dashboard's for coarse views) reads them once whichever goes first; frames as alone."""
    asked = rolled_and_spied(engine, make_sample)
    end = T0 + 127 * MINUTE_NS
    newest = SeriesRead(end - HOUR_NS, end, ATTRS, 60)
    view = SeriesRead(T0, end, ATTRS, 3600)
    for lean, minute_requests in ((True, 2), (False, 1)):
        asked.clear()
        session = shared_session(engine.store, lean_minutes=lean)
        frames = series_many(engine.store, [newest], shared=session)
        frames += series_many(engine.store, [view], shared=session)
        assert [a[0] for a in asked].count(MINUTE_NS) == minute_requests, asked
        for read, frame in zip((newest, view), frames, strict=True):
            alone = engine.store.series(read.start_ns, read.end_ns, read.fields, step_s=read.step_s)
            pd.testing.assert_frame_equal(frame, alone, obj=str(read))


def test_a_coarse_views_range_read_first_asks_for_its_newest_hours_minutes_at_once(
    engine: Engine, make_sample: Callable[..., GpuSample]
) -> None:
    """In one batch, the newest bucket of a coarse view's range (read from minutes) is asked
    for before its newest hour in minutes (held back here): the minutes of the whole hour are
    asked for then, once, and each frame is what its read gives alone. (Without the batch's
    reads in minutes announced first, the engine was asked for both apart.)"""
    asked = rolled_and_spied(engine, make_sample)
    end = T0 + 127 * MINUTE_NS
    newest = SeriesRead(end - HOUR_NS, end, ATTRS, 60)
    view = SeriesRead(T0, end, ATTRS, 3600)
    minutes_sent = threading.Event()
    rollups, session = engine.store.rollups, shared_session(engine.store, lean_minutes=False)
    to_engine, through = rollups.rollup_points, session.rollup_points

    def sent(level_ns: int, *args: Any, **kwargs: Any) -> Any:
        if level_ns == MINUTE_NS:
            minutes_sent.set()
        return to_engine(level_ns, *args, **kwargs)

    def newest_last(level_ns: int, start_ns: int, *args: Any, **kwargs: Any) -> Any:
        if level_ns == MINUTE_NS and start_ns < end - HOUR_NS + MINUTE_NS:
            assert minutes_sent.wait(30.0)  # the newest hour's own: once the view's is sent
        return through(level_ns, start_ns, *args, **kwargs)

    rollups.rollup_points = sent
    session.rollup_points = newest_last  # type: ignore[method-assign]
    frames = series_many(engine.store, [view, newest], shared=session)
    assert [a[0] for a in asked].count(MINUTE_NS) == 1, asked
    for read, frame in zip((view, newest), frames, strict=True):
        alone = engine.store.series(read.start_ns, read.end_ns, read.fields, step_s=read.step_s)
        assert len(alone) > 0
        pd.testing.assert_frame_equal(frame, alone, obj=str(read))


def test_a_range_on_days_before_the_data_sends_no_raw_read(
    engine: Engine, make_sample: Callable[..., GpuSample]
) -> None:
    """The context before a young database's data: the engine says it holds no sample there
    (InfluxDB: its oldest sample; VictoriaMetrics: its per-day series index), so no raw read is
    sent; a range with samples is read."""
    write(engine, samples(make_sample, T0, T0 + 10 * MINUTE_NS))
    day = 86_400 * S
    assert engine.source.raw_in(T0, T0 + MINUTE_NS)
    assert engine.source.raw_in(T0 - 2 * day, T0 + MINUTE_NS)
    assert not engine.source.raw_in(T0 - 3 * day, T0 - 2 * day)
    rollups = engine.store.rollups
    sent: list[tuple[int, int]] = []
    real = rollups.raw_level

    def spy(start_ns: int, end_ns: int, scope: Scope) -> Any:
        sent.append((start_ns, end_ns))
        return real(start_ns, end_ns, scope)

    rollups.raw_level = spy
    before = engine_rollups.raw_with_seen(rollups, T0 - 3 * day, T0 - 2 * day, Scope(ATTRS, None))
    assert len(before["time_ns"]) == 0 and sent == []
    inside = engine_rollups.raw_with_seen(rollups, T0, T0 + MINUTE_NS, Scope(ATTRS, None))
    assert len(inside["time_ns"]) == 3 * 6 and sent
    # a day found with samples is not asked about again; one without is
    if isinstance(rollups, PromRollups):
        asked: list[int] = []
        has_series = engine.store.has_series

        def counted(*args: Any) -> bool:
            asked.append(args[1])
            return bool(has_series(*args))

        engine.store.has_series = counted
        assert rollups.raw_in(T0 + MINUTE_NS, T0 + 2 * MINUTE_NS)
        assert not rollups.raw_in(T0 - 3 * day, T0 - 2 * day)
        assert not rollups.raw_in(T0 - 3 * day, T0 - 2 * day)
        assert asked == [T0 - 3 * day] * 2


def test_raw_samples_before_the_oldest_rolled_minute_are_read_and_none_only_by_their_times(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    """Raw samples older than the oldest rolled minute (written before the engine kept
    rollups) are read and served as the embedded store serves them. Where there are none (the
    context of a young database's view, which ends where its data starts) only their times are
    asked for, not every metric of each GPU's first samples just after."""
    batch = samples(make_sample, T0, T0 + 20 * MINUTE_NS)
    older = [s for s in samples(make_sample, T0 - 20 * MINUTE_NS, T0) if s.host == "node1"]
    write(engine, older + batch)
    ref = embedded(tmp_path, older + batch)
    assert engine_rollups.roll_range(engine.source, T0, T0 + 20 * MINUTE_NS)  # not before T0
    engine.flush()
    rollups = engine.store.rollups
    sent: list[tuple[int, int, tuple[str, ...]]] = []
    real = rollups.raw_level

    def spy(start_ns: int, end_ns: int, scope: Scope) -> Any:
        sent.append((start_ns, end_ns, scope.attrs))
        return real(start_ns, end_ns, scope)

    rollups.raw_level = spy
    lo, hi = T0 - 30 * MINUTE_NS, T0 + 20 * MINUTE_NS
    try:
        for hosts, step in itertools.product((None, ["node-2 b"]), (60, 300, 3600)):
            sent.clear()
            got = engine.store.series(lo, hi, ATTRS, step_s=step, hosts=hosts)
            want = ref.series(lo, hi, ATTRS, step_s=step, hosts=hosts)
            assert (want["time_ns"] < T0).any() == (hosts is None)
            pd.testing.assert_frame_equal(got, want, rtol=1e-9, obj=f"{hosts} {step}")
            with_metrics = [(a, b) for a, b, attrs in sent if attrs]
            assert with_metrics  # the newest minute
            # node-2 b has no sample before T0: its context is asked for by its times alone
            assert any(a < T0 for a, _ in with_metrics) == (hosts is None), sent
    finally:
        del rollups.raw_level
    ref.close()


@pytest.mark.parametrize("engine", ["victoriametrics"], indirect=True)
def test_victoriametrics_reads_send_their_metrics_in_several_exports_at_once(
    engine: Engine,
    make_sample: Callable[..., GpuSample],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read of raw samples or rollup points asks VictoriaMetrics for its metrics in
    ``EXPORT_PARTS`` exports sent together (it answers each on about one core), each metric in
    exactly one of them, and the rows are those one export gives, and the embedded store's."""
    batch = samples(make_sample, T0, T0 + 127 * MINUTE_NS)
    write(engine, batch)
    ref = embedded(tmp_path, batch)
    engine_rollups.roll_range(engine.source, T0, T0 + 126 * MINUTE_NS)
    engine.flush()
    engine.store.rollup_cache_bytes = 0  # every read goes to the engine
    real_export = engine.store.export
    sent: list[tuple[str, int, int, list[str]]] = []

    def spy(match: str, start_ns: int, end_ns: int) -> Any:
        metrics = match.split('"')[1].split("|")
        sent.append((threading.current_thread().name, start_ns, end_ns, metrics))
        return real_export(match, start_ns, end_ns)

    monkeypatch.setattr(engine.store, "export", spy)
    lo, hi = T0 + 3 * MINUTE_NS + 7 * S, T0 + 127 * MINUTE_NS
    frames: dict[tuple[int, int], pd.DataFrame] = {}
    for parts, step in itertools.product((1, 3), (60, 300, 3600)):
        monkeypatch.setattr("gpuwatt.store.promql_rollups.EXPORT_PARTS", parts)
        sent.clear()
        frames[parts, step] = engine.store.series(lo, hi, ATTRS, step_s=step)
        reads: dict[tuple[int, int, str], list[tuple[str, list[str]]]] = {}
        for thread, start_ns, end_ns, metrics in sent:  # a read: raw samples or a level's
            first = metrics[0]  # rollup points over a span
            family = first[:17] if first.startswith("gpuwatt_rollup_") else "raw"
            reads.setdefault((start_ns, end_ns, family), []).append((thread, metrics))
        assert len(reads) >= 2
        for exports in reads.values():
            metrics = [m for _, e in exports for m in e]
            assert len(metrics) == len(set(metrics))  # each metric in one export of a read,
            assert len(exports) == min(parts, len(metrics))  # split into as many as asked,
            if len(exports) > 1:  # sent together
                assert all(thread.startswith("export") for thread, _ in exports)
        assert any(len(exports) == min(parts, 3) for exports in reads.values())
    for step in (60, 300, 3600):
        got = frames[3, step]
        pd.testing.assert_frame_equal(got, frames[1, step], obj=f"step {step}")
        want = ref.series(lo, hi, ATTRS, step_s=step)
        pd.testing.assert_frame_equal(got, want, rtol=1e-9, obj=f"step {step}")
    ref.close()
