"""The dashboard's data cache with a moving clock: a live range ("the last hour") is found in the
cache although its end moves with every request, refreshes catch up with the clock, and the
default view is kept computed in the background."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_dashboard_support import DEMO_END_NS, build_demo_store

from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.timerange import parse_range
from gpuwatt.model import GpuSeen
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000


class CountingStore:
    """A real store that counts its ``series`` reads (one per read of a ``series_many``)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.series_calls: list[tuple[int, int]] = []
        self.threads: list[str] = []  # the thread of each read
        self.lock = threading.Lock()

    def series(self, start_ns: int, end_ns: int, *args: Any, **kw: Any) -> Any:
        with self.lock:
            self.series_calls.append((start_ns, end_ns))
            self.threads.append(threading.current_thread().name)
        return self._store.series(start_ns, end_ns, *args, **kw)

    def series_many(self, reads: Sequence[Any]) -> Any:
        with self.lock:
            self.series_calls += [(r.start_ns, r.end_ns) for r in reads]
            self.threads += [threading.current_thread().name] * len(reads)
        return self._store.series_many(reads)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class Clock:
    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqliteStore]:
    store = build_demo_store(tmp_path_factory.mktemp("cache") / "demo.db", minutes=10)
    yield store
    store.close()


def ends(calls: Sequence[tuple[int, int]]) -> list[int]:
    return [end for _start, end in calls]


def test_a_live_range_is_served_from_the_cache_while_the_clock_moves(
    demo_store: SqliteStore,
) -> None:
    store = CountingStore(demo_store)
    clock = Clock(DEMO_END_NS - 30 * S)
    data = DashboardData(store, clock_ns=clock, ttl_s=3600.0)  # type: ignore[arg-type]
    try:
        first = data.window(parse_range({"range": "15m"}, clock())[0])
        tr = first.range  # the context before the range, then the range
        assert ends(store.series_calls) == [tr.start_ns, DEMO_END_NS - 30 * S]
        clock.now_ns += 7 * S  # the next auto-refresh, 7 s later: a new end, the same view
        again = data.window(parse_range({"range": "15m"}, clock())[0])
        assert again is first and len(store.series_calls) == 2
        # A range with a fixed end is keyed by its end.
        fixed = {"range": "15m", "end": str(DEMO_END_NS // S - 60)}
        data.window(parse_range(fixed, clock())[0])
        assert ends(store.series_calls)[-1] == DEMO_END_NS - 60 * S
    finally:
        data.close()


def test_a_stale_live_range_is_recomputed_up_to_the_clock(demo_store: SqliteStore) -> None:
    store = CountingStore(demo_store)
    clock = Clock(DEMO_END_NS - 60 * S)
    data = DashboardData(store, clock_ns=clock, ttl_s=0.0, max_stale_s=3600.0)  # type: ignore[arg-type]
    try:
        tr = parse_range({"range": "15m"}, clock())[0]
        first = data.window(tr)
        clock.now_ns = DEMO_END_NS
        stale = data.window(parse_range({"range": "15m"}, clock())[0])
        assert stale is first  # served at once while the background refresh runs
        deadline = time.monotonic() + 60
        while DEMO_END_NS not in ends(store.series_calls) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert DEMO_END_NS in ends(store.series_calls)  # the refresh read up to the new now
    finally:
        data.close()


def test_the_default_view_is_kept_computed_in_the_background(
    demo_store: SqliteStore, tmp_path: Path
) -> None:
    store = CountingStore(demo_store)
    clock = Clock(DEMO_END_NS - 120 * S)
    data = DashboardData(store, clock_ns=clock, ttl_s=3600.0)  # type: ignore[arg-type]
    default = parse_range({}, clock())[0]
    first = data.start_warming([default], every_s=0.01)
    try:
        assert first.wait(60), "the default view was never computed"
        deadline = time.monotonic() + 60
        assert store.series_calls, "the warmer never read the store"
        clock.now_ns = DEMO_END_NS
        while DEMO_END_NS not in ends(store.series_calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert DEMO_END_NS in ends(store.series_calls)  # it follows the clock
        win = data.window(parse_range({}, clock())[0])  # a visitor
        assert not win.empty
        # the overview's "Energy today" as well, computed with the default view
        assert data.energy_today(clock()).cluster["energy_kwh"].value
        assert set(store.threads) == {"gpuwatt-warm"}  # the visitor never waited for a read
    finally:
        data.close()
    settled = len(store.series_calls)
    time.sleep(0.1)
    assert len(store.series_calls) == settled  # close() stopped the warmer


def test_a_coarse_live_range_takes_its_newest_hour_from_the_fresh_default_view(
    demo_store: SqliteStore,
) -> None:
    """24 h and 6 h analyse their newest hour in 1-minute windows: that is the live 1 h view's
    analysis, taken from the cache while it is fresh instead of read and computed again."""
    store = CountingStore(demo_store)
    clock = Clock(DEMO_END_NS)
    data = DashboardData(store, clock_ns=clock, ttl_s=3600.0)  # type: ignore[arg-type]
    data.accounting_max_gpu_minutes = 0  # as for a large cluster: no 1-minute pass
    try:
        hour = data.window(parse_range({"range": "1h"}, clock())[0])
        assert hour.summary.stragglers  # the demo's straggler: something to compare
        before = len(store.series_calls)
        day = data.window(parse_range({"range": "24h"}, clock())[0])
        assert day.recent is hour.summary
        assert len(store.series_calls) == before + 2  # the range's own read (and context)
        data.shared_recent_max_age_s = 0.0  # the cached hour is now too old to share
        six = data.window(parse_range({"range": "6h"}, clock())[0])
        assert six.recent is not None and six.recent is not hour.summary
        assert len(store.series_calls) == before + 5  # the range and its newest hour
        assert [s.uuid for s in six.recent.stragglers] == [s.uuid for s in hour.summary.stragglers]
        assert [s.uuid for s in six.stragglers] == [s.uuid for s in day.stragglers]
    finally:
        data.close()


def test_preset_ranges_are_kept_computed_each_at_its_own_period(demo_store: SqliteStore) -> None:
    store = CountingStore(demo_store)
    clock = Clock(DEMO_END_NS)
    data = DashboardData(store, clock_ns=clock, ttl_s=3600.0)  # type: ignore[arg-type]
    hour = parse_range({}, clock())[0]
    six = parse_range({"range": "6h"}, clock())[0]
    six_span = (six.end_ns - six.start_ns, DEMO_END_NS)  # its own read (the 1-minute one too)
    first = data.start_warming([(hour, 0.01), (six, 3600.0)])
    try:
        assert first.wait(60), "the first range was never computed"
        deadline = time.monotonic() + 60
        hour_span = (hour.end_ns - hour.start_ns, DEMO_END_NS)

        def read_spans() -> list[tuple[int, int]]:
            with store.lock:
                return [(end - start, end) for start, end in store.series_calls]

        while read_spans().count(hour_span) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        spans = read_spans()
        assert spans.count(six_span) == 2  # once, at start: its period is an hour
        assert spans.count(hour_span) >= 5
        with store.lock:
            seen = len(store.threads)
        win = data.window(parse_range({"range": "6h"}, clock())[0])  # a visitor of the preset
        assert win.range.end_ns - win.range.start_ns == six_span[0] and not win.empty
        with store.lock:
            assert "MainThread" not in store.threads[seen:]  # served, not read for the visitor
    finally:
        data.close()


def test_the_server_answers_once_the_default_view_is_computed(demo_store: SqliteStore) -> None:
    from gpuwatt.dashboard.server import start

    store = CountingStore(demo_store)
    running = start(store, "127.0.0.1", 0, environ={}, now_ns=DEMO_END_NS)  # type: ignore[arg-type]
    try:
        assert store.series_calls, "start() returned before the default view was read"
        assert set(store.threads) == {"gpuwatt-warm"}
        with store.lock:
            seen = len(store.threads)
        data = running.data
        assert data is not None
        assert not data.window(parse_range({}, data.now_ns())[0]).empty
        with store.lock:
            assert "MainThread" not in store.threads[seen:]
    finally:
        running.stop()


def test_a_started_server_keeps_its_start_up_heap_out_of_full_collections(
    demo_store: SqliteStore,
) -> None:
    """What the server holds once started (the app, the default view) is frozen out of the
    cyclic collector's walk, so a full collection in a served callback is short; stopping
    gives it back to the collector (a process that goes on after a server: tests)."""
    import gc

    from gpuwatt.dashboard.server import start

    running = start(demo_store, "127.0.0.1", 0, environ={}, now_ns=DEMO_END_NS)
    try:
        assert running.data is not None
        assert gc.get_freeze_count() > 1000  # the modules, the app and the default view
    finally:
        running.stop()
    assert gc.get_freeze_count() == 0


class EngineLike(CountingStore):
    """The demo store as a network engine is read: no shared transaction for a view's reads,
    and a ``latest`` that answers only once a read of the range has reached the store (at most
    10 s: a view that waits for it first takes that long and fails below)."""

    reads_share_work = False

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.reading = threading.Event()
        self.waited_for_latest: list[bool] = []
        self.batches: list[list[int | None]] = []  # the step of each read, per call

    def series_many(self, reads: Sequence[Any]) -> Any:
        self.reading.set()
        with self.lock:
            self.batches.append([r.step_s for r in reads])
        return super().series_many(reads)

    def latest(self, **kw: Any) -> Any:
        self.waited_for_latest.append(not self.reading.wait(10.0))
        return self._store.latest(**kw)


def test_a_coarse_range_reads_its_range_while_the_newest_samples_are_read(
    demo_store: SqliteStore,
) -> None:
    """The context and the range of a coarse view do not depend on the GPU count (which the
    newest samples give): a network engine gets them at once, and the newest hour in minutes
    beside them (its stragglers found as soon as it arrives) unless the GPUs last counted say
    the range is read in minutes; the view is the same."""
    clock = Clock(DEMO_END_NS)
    store = EngineLike(demo_store)
    data = DashboardData(store, clock_ns=clock)  # type: ignore[arg-type]
    ref = DashboardData(demo_store, clock_ns=clock)
    minutes, hours = 60, 3600  # the steps of the reads
    try:
        # the newest hour apart; the range in minutes (the count learnt after the first reads,
        # then known from the cache)
        for accounting_max, cold, batches in (
            (0, True, [[hours, hours], [minutes]]),
            (10**9, True, [[hours, hours], [minutes], [minutes, minutes]]),
            (10**9, False, [[hours, hours], [minutes, minutes]]),
        ):
            data.accounting_max_gpu_minutes = ref.accounting_max_gpu_minutes = accounting_max
            data.clear_cache()
            if not cold:  # the newest samples read, no view
                data.latest()
            store.reading.clear()
            store.batches.clear()
            tr = parse_range({"range": "24h"}, clock())[0]
            day = data.window(tr)
            want = ref.window(tr)
            assert sorted(store.batches, key=str) == sorted(batches, key=str)  # at once
            assert store.waited_for_latest[-1] is False
            assert day.recent_is_range is want.recent_is_range is (accounting_max > 0)
            assert day.partial is None
            assert day.frame.equals(want.frame)
            assert day.summary.cluster == want.summary.cluster
            assert [s.uuid for s in day.stragglers] == [s.uuid for s in want.stragglers]
            ref.clear_cache()
    finally:
        data.close()
        ref.close()


class SeenApart(CountingStore):
    """A store that reads the GPUs seen apart from their newest values (as an engine does:
    ``PromStore.gpus_seen``), counting both reads."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.asked: list[str] = []

    def latest(self, **kw: Any) -> Any:
        with self.lock:
            self.asked.append("latest")
        return self._store.latest(**kw)

    def gpus_seen(self, **kw: Any) -> Any:
        with self.lock:
            self.asked.append("gpus_seen")
        return [GpuSeen.of(s) for s in self._store.latest(**kw)]

    def latest_of(self, hosts: Sequence[str] | None, attrs: Any = None) -> Any:
        with self.lock:
            self.asked.append("latest_of")
        return [s for s in self._store.latest() if hosts is None or s.host in hosts]


def shown(components: Any) -> str:
    """A page's components as text, its graphs' numbered names without their numbers."""
    return re.sub(r"('name': '[\w-]+?)-\d+'", r"\1'", str(components))


def test_only_the_pages_that_show_newest_values_read_them(demo_store: SqliteStore) -> None:
    """A cold view reads the GPUs seen (count, jobs) and not every GPU's newest values, which
    only the health page shows (those it shows: it starts reading them before the window, which
    takes the GPUs seen from them); the node page reads its node's alone and the GPUs seen, the
    overview the power of all, which gives the GPUs seen too. Each page shows what it shows
    where all come from ``latest``."""
    from gpuwatt.dashboard.app import PAGES, render_page

    store = SeenApart(demo_store)
    data = DashboardData(store, clock_ns=Clock(DEMO_END_NS))  # type: ignore[arg-type]
    ref = DashboardData(demo_store, clock_ns=Clock(DEMO_END_NS))
    try:
        for page in PAGES:
            data.clear_cache()
            store.asked.clear()
            args = {"host": "node-2", "gpu": "5"} if page.PAGE == "node" else {}
            got = shown(render_page(page, args, data))
            assert got == shown(render_page(page, args, ref)), page.PAGE
            if page.PAGE in ("health", "overview"):  # the GPUs seen from the values shown
                assert store.asked == ["latest_of"], page.PAGE
            elif page.PAGE == "node":
                assert sorted(store.asked) == ["gpus_seen", "latest_of"], page.PAGE
            elif getattr(page, "NEEDS_DATA", True):
                assert store.asked == ["gpus_seen"], page.PAGE
        tr = parse_range({}, DEMO_END_NS)[0]
        seen = data.window(tr).gpus
        assert seen == [GpuSeen.of(s) for s in demo_store.latest()] and len(seen) > 0
        assert data.window(tr).jobs == ref.window(tr).jobs
    finally:
        data.close()
        ref.close()
