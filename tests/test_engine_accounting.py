"""The accounting rules (docs/accounting.md) on engines serving reads from their rollups: on
Debian's InfluxDB 1.6.7 and VictoriaMetrics, a range whose edges fall inside rolled buckets
equals the samples in it (rule 4), and energy over a range is the same from raw samples, minutes
and hours, as ``test_accounting_edges`` checks on the embedded store."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from test_accounting_edges import STEADY_RANGES, assert_steady_energy, steady_gpu_samples
from test_sqlite_rounds import ATTRS, T0, S, cluster, reference

from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample
from gpuwatt.store import engine_rollups, open_store
from gpuwatt.store.influx import InfluxStore

pytestmark = pytest.mark.servers

EDGES = [(29, 29 + 40 * 60), (0, 61 * 60 + 17), (61, 3 * 3600 + 59), (3599, 3600 + 1)]


@pytest.fixture(params=["influxdb1", "victoriametrics"])
def load(request: pytest.FixtureRequest) -> Iterator[Callable[[Sequence[GpuSample]], Any]]:
    """Writes samples into a fresh engine and rolls every bucket they touch; the store."""
    if request.param == "influxdb1":
        server, db = request.getfixturevalue("influx_db")
        store: Any = InfluxStore(server.url, "", db, timeout_s=30)
        flush: Callable[[], None] = lambda: None  # noqa: E731
    else:
        vm = request.getfixturevalue("victoria_metrics")
        store = open_store(vm.url.replace("http://", "victoriametrics://") + "?rollups=on")
        flush = vm.force_flush

    def write(samples: Sequence[GpuSample]) -> Any:
        lines = LineEncoder().encode_many(samples)
        for i in range(0, len(lines), 10_000):
            store.write_lines(lines[i : i + 10_000])
        flush()
        times = [s.time_ns for s in samples]
        assert engine_rollups.roll_range(store.rollups, min(times), max(times) + 1) > 0
        flush()
        return store

    try:
        yield write
    finally:
        store.close()


def test_ranges_with_edges_inside_rolled_buckets_equal_the_samples_in_them(
    load: Callable[[Sequence[GpuSample]], Any], make_sample: Callable[..., GpuSample]
) -> None:
    batches = cluster(make_sample, 4 * 3600 + 120, shuffle=False)
    store = load([s for b in batches for s in b])
    assert store.rollups.rollup_span(engine_rollups.HOUR_NS) is not None
    for lo_s, hi_s in EDGES:
        for step_s in (60, 120, 3600):
            lo, hi = T0 + lo_s * S, T0 + hi_s * S
            got = store.series(lo, hi, ATTRS, step_s=step_s)
            want = reference(batches, lo, hi, step_s, None)
            assert len(got) == len(want) > 0, (lo_s, hi_s, step_s)
            for row in got.itertuples(index=False):
                assert lo <= row.time_ns < hi
                bucket = row.time_ns // (step_s * S) * step_s * S
                expected = want[(bucket, row.host, row.gpu_index)]
                actual = [getattr(row, a) for a in ATTRS]
                assert actual == pytest.approx(expected, rel=1e-9, nan_ok=True), (row, expected)


def test_energy_of_a_range_is_the_same_from_raw_samples_minutes_and_hours(
    load: Callable[[Sequence[GpuSample]], Any],
) -> None:
    store = load(steady_gpu_samples())
    for lo_s, len_s in STEADY_RANGES:
        assert_steady_energy(store, lo_s, len_s)
