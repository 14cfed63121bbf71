"""The rollup points reads keep in memory (``gpuwatt.store.rollup_cache``), on Debian's InfluxDB
1.6.7 and VictoriaMetrics started by the fixtures: a read served from kept chunks gives what the
engine holds, the same frame as the embedded store's from the same samples, after late data
re-rolled a bucket, with a budget that keeps almost nothing, and for a node's hosts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from test_engine_rollups import (
    ATTRS,
    MINUTE_NS,
    T0,
    Engine,
    S,
    assert_same,
    embedded,
    engine_of,
    samples,
    write,
)

from gpuwatt.model import GpuSample
from gpuwatt.store import engine_rollups
from gpuwatt.store.engine_rollups import FIVE_MINUTES_NS, HOUR_NS, Scope
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.rollup_cache import CHUNK_NS, RollupCache
from gpuwatt.store.sqlite import SqliteStore

pytestmark = pytest.mark.servers

SPAN_S = 127 * 60


@pytest.fixture(params=["influxdb1", "victoriametrics"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    yield from engine_of(request)


def rolled(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> tuple[list[GpuSample], SqliteStore]:
    batch = samples(make_sample, T0, T0 + 127 * MINUTE_NS)
    write(engine, batch)
    assert engine_rollups.roll_range(engine.source, T0, T0 + 127 * MINUTE_NS) > 0
    engine.flush()
    return batch, embedded(tmp_path, batch)


def cache_of(engine: Engine) -> RollupCache:
    cache = engine.store.read_rollups
    assert isinstance(cache, RollupCache)
    return cache


def test_ranges_read_again_are_served_from_memory_as_the_engine_serves_them(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    """Random ranges and steps, each read twice: the second from kept chunks (counted), both
    the embedded store's frame."""
    _, ref = rolled(engine, make_sample, tmp_path)
    cache = cache_of(engine)

    @settings(
        max_examples=15,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each example reads an engine
    )
    @example(lo_s=0, length_s=SPAN_S, step_s=300)
    @example(lo_s=61 * 60 + 7, length_s=SPAN_S, step_s=3600)
    @given(
        lo_s=st.integers(0, SPAN_S - 10),
        length_s=st.integers(10, SPAN_S),
        step_s=st.sampled_from([60, 120, 300, 600, 1800, 3600, 7200]),
    )
    def same(lo_s: int, length_s: int, step_s: int) -> None:
        read = [(lo_s * S, min(SPAN_S, lo_s + length_s) * S, step_s)]
        assert_same(engine, ref, read)
        hits = cache.hits
        assert_same(engine, ref, read)
        if length_s >= 2 * step_s:  # at least a whole rolled bucket: from rollup points
            assert cache.hits > hits

    same()
    assert 0 < cache.kept_bytes <= cache.budget_bytes
    ref.close()


def test_a_bucket_rolled_again_after_late_data_is_read_again(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    batch, ref = rolled(engine, make_sample, tmp_path)
    reads = [(0, 127 * MINUTE_NS, 60), (0, 127 * MINUTE_NS, 300), (0, 127 * MINUTE_NS, 3600)]
    assert_same(engine, ref, reads)  # every level's chunks kept
    ref.close()
    late = samples(make_sample, T0 + 5 * MINUTE_NS + 5 * S, T0 + 6 * MINUTE_NS, power_offset=99)
    write(engine, late)
    engine_rollups.roll(engine.source, MINUTE_NS, T0 + 5 * MINUTE_NS)
    engine_rollups.roll(engine.source, FIVE_MINUTES_NS, T0 + 5 * MINUTE_NS)
    engine_rollups.roll(engine.source, HOUR_NS, T0)
    misses = cache_of(engine).misses
    (tmp_path / "late").mkdir()
    late_ref = embedded(tmp_path / "late", batch + late)
    assert_same(engine, late_ref, reads)
    # one chunk of each level changed (minutes 0-10, the first hour of 5-minute buckets, the
    # first day of hours): read again, the rest served
    assert cache_of(engine).misses == misses + 3
    late_ref.close()


def test_a_budget_that_keeps_almost_nothing_still_reads_right(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    _, ref = rolled(engine, make_sample, tmp_path)
    cache = cache_of(engine)
    cache.budget_bytes = 2_000  # less than a chunk of minutes of three GPUs
    reads = [(0, 127 * MINUTE_NS, 60), (7 * S, 100 * MINUTE_NS, 300), (0, 127 * MINUTE_NS, 60)]
    assert_same(engine, ref, reads)
    assert cache.kept_bytes <= 2_000
    ref.close()


def test_a_nodes_read_takes_its_gpus_from_the_clusters_chunks(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path
) -> None:
    _, ref = rolled(engine, make_sample, tmp_path)
    cache = cache_of(engine)
    for hosts in (["node1"], ["node-2 b"], ["node1"]):
        for lo, hi, step in [(0, 127 * MINUTE_NS, 60), (0, 127 * MINUTE_NS, 300)]:
            got = engine.store.series(T0 + lo, T0 + hi, ATTRS, step_s=step, hosts=hosts)
            want = ref.series(T0 + lo, T0 + hi, ATTRS, step_s=step, hosts=hosts)
            assert set(got["host"]) == set(hosts)
            pd.testing.assert_frame_equal(
                got.reset_index(drop=True), want.reset_index(drop=True), rtol=1e-9
            )
        if hosts == ["node-2 b"]:  # the cluster's chunks: kept once the cluster was read
            engine.store.series(T0, T0 + 127 * MINUTE_NS, ATTRS, step_s=60)
    assert cache.hits > 0
    ref.close()


@pytest.mark.parametrize("level_ns", [MINUTE_NS, FIVE_MINUTES_NS, HOUR_NS])
def test_point_counts_are_the_points_of_each_chunk(
    engine: Engine, make_sample: Callable[..., GpuSample], tmp_path: Path, level_ns: int
) -> None:
    rolled(engine, make_sample, tmp_path)
    chunk = CHUNK_NS[level_ns]
    first = T0 // chunk * chunk
    last = -(-(T0 + 127 * MINUTE_NS) // chunk) * chunk
    counts = engine.store.rollups.point_counts(level_ns, first, last, chunk)
    for c in range(first, last, chunk):
        scope = Scope((), None)
        points = engine.source.rollup_points(level_ns, c, c + chunk, scope)
        want = len(points["time_ns"])  # VictoriaMetrics: a point per GPU
        if isinstance(engine.store, InfluxStore):  # a point per host, its GPUs packed
            hosts = [scope.ids.idents[g][0] for g in points["gpu_id"].tolist()]
            want = len(set(zip(points["time_ns"].tolist(), hosts, strict=True)))
        assert counts.get(c, 0) == want, c
