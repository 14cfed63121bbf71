"""The collector loop: ticks go to the spool; the flusher delivers in order through outages."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from gpuwatt.collector.runtime import Flusher, Sampler, run, spool_for
from gpuwatt.collector.spool import Spool
from gpuwatt.errors import GpuwattError, StoreUnavailable
from gpuwatt.line_protocol import decode_line
from gpuwatt.model import GpuSample
from gpuwatt.store.sqlite import SqliteStore


class CountingSource:
    """A sample source of our own protocol: ``n_gpus`` GPUs, a fresh timestamp per tick."""

    def __init__(self, host: str, n_gpus: int, *, fail: bool = False) -> None:
        self.host, self.n_gpus, self.fail = host, n_gpus, fail
        self.t_ns = 0
        self.slow_ticks = 0

    def open(self) -> None: ...

    def close(self) -> None: ...

    def sample(self, *, include_slow: bool) -> list[GpuSample]:
        if self.fail:
            raise GpuwattError(f"{self.host}: driver went away")
        self.t_ns += 1_000_000_000
        self.slow_ticks += include_slow
        return [
            GpuSample(self.t_ns, self.host, i, f"GPU-{self.host}-{i}", "sim", power_w=100.0 + i)
            for i in range(self.n_gpus)
        ]


class RecordingStore:
    """The store protocol over a list; ``down`` makes every write fail like an outage."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.down = False
        self.reject = False

    def write_lines(self, lines: Sequence[str]) -> None:
        if self.down:
            raise StoreUnavailable("connection refused")
        if self.reject:
            raise GpuwattError("400 bad request: unable to parse")
        self.lines.extend(lines)

    def close(self) -> None: ...


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_one_failing_source_does_not_stop_the_others(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    good, bad = CountingSource("a", 2), CountingSource("b", 2, fail=True)
    sampler = Sampler([bad, good], spool, slow_interval_s=60)
    assert sampler.tick() == 2
    assert sampler.stats.failed_sources == 1
    assert spool.pending_lines() == 2
    spool.close()


def test_slow_fields_every_slow_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    source = CountingSource("a", 1)
    spool = Spool(tmp_path)
    sampler = Sampler([source], spool, slow_interval_s=10, monotonic_s=clock)
    for _ in range(25):
        sampler.tick()
        clock.t += 1
    assert source.slow_ticks == 3  # t = 0, 10, 20
    spool.close()


def test_outage_keeps_everything_and_replays_in_order(tmp_path: Path) -> None:
    clock = FakeClock()
    spool = Spool(tmp_path)
    store = RecordingStore()
    source = CountingSource("a", 4)
    sampler = Sampler([source], spool, slow_interval_s=60)
    flusher = Flusher(spool, store, batch_lines=3, monotonic_s=clock)
    sampler.tick()
    flusher.flush()
    store.down = True
    for _ in range(10):
        sampler.tick()
        clock.t += 1
        flusher.flush()
    assert flusher.store_down_since_s is not None
    assert len(store.lines) == 4
    store.down = False
    clock.t += 60  # past any backoff
    flusher.flush()
    times = [decode_line(line).time_ns for line in store.lines]
    assert len(store.lines) == 44
    assert times == sorted(times)
    assert flusher.store_down_since_s is None
    assert spool.pending_lines() == 0
    spool.close()


def test_backoff_grows_while_the_store_is_down(tmp_path: Path) -> None:
    clock = FakeClock()
    spool = Spool(tmp_path)
    store = RecordingStore()
    store.down = True
    spool.append(["m f=1i 1"])
    flusher = Flusher(spool, store, monotonic_s=clock, max_backoff_s=8)
    attempts = 0
    for _ in range(200):
        before = flusher._next_attempt_s
        flusher.flush()
        attempts += flusher._next_attempt_s != before
        clock.t += 0.25
    # 50 s of outage with backoff 0.5, 1, 2, 4, 8, 8, ... tries about a dozen times, not 200
    assert 5 <= attempts <= 15
    spool.close()


def test_rejected_batch_is_kept_aside_and_does_not_block(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    store = RecordingStore()
    store.reject = True
    spool.append(["m f=1i 1", "m f=2i 2"])
    flusher = Flusher(spool, store)
    flusher.flush()
    assert flusher.rejected_lines == 2
    kept = list((tmp_path / "spool" / "rejected").glob("*.lp"))
    reason = "# GpuwattError: 400 bad request: unable to parse\n"
    assert len(kept) == 1 and kept[0].read_text() == f"{reason}m f=1i 1\n{reason}m f=2i 2\n"
    store.reject = False
    spool.append(["m f=3i 3"])
    flusher.flush()
    assert store.lines == ["m f=3i 3"]
    spool.close()


def test_run_stops_on_the_event_and_flushes(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    store = RecordingStore()
    source = CountingSource("a", 3)
    sampler = Sampler([source], spool, slow_interval_s=60)
    flusher = Flusher(spool, store)
    stop = threading.Event()
    original_tick = sampler.tick

    def tick_then_stop() -> int:
        n = original_tick()
        if sampler.stats.ticks >= 3:
            stop.set()
        return n

    sampler.tick = tick_then_stop  # type: ignore[method-assign]
    run(sampler, flusher, interval_s=0.05, stop=stop, duration_s=30, flush_interval_s=10)
    assert sampler.stats.ticks >= 3
    # every tick delivered (the flusher is woken by each tick, and the final drain sees the rest)
    assert len(store.lines) == 3 * sampler.stats.ticks
    assert spool.pending_lines() == 0
    spool.close()


def test_shutdown_with_store_down_leaves_samples_spooled(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    store = RecordingStore()
    store.down = True
    sampler = Sampler([CountingSource("a", 2)], spool, slow_interval_s=60)
    flusher = Flusher(spool, store)
    stop = threading.Event()
    sampler.tick()
    stop.set()
    run(sampler, flusher, interval_s=1, stop=stop, duration_s=5, shutdown_flush_s=0.5)
    assert store.lines == []
    assert spool.pending_lines() >= 2
    spool.close()


def test_a_tick_right_behind_a_late_one_is_skipped(tmp_path: Path) -> None:
    clock = FakeClock()
    spool = Spool(tmp_path)
    source = CountingSource("a", 2)
    sampler = Sampler([source], spool, slow_interval_s=60, monotonic_s=clock, min_spacing_s=0.5)
    assert sampler.tick() == 2
    clock.t += 0.999  # the first tick ran late; the next, on time, follows 1 ms later
    assert sampler.tick() == 2
    clock.t += 0.001
    assert sampler.tick() == 0
    assert sampler.stats.skipped_ticks == 1
    clock.t += 1.0
    assert sampler.tick() == 2
    assert spool.pending_lines() == 6
    spool.close()


def test_shutdown_drain_retries_a_store_that_is_coming_back(tmp_path: Path) -> None:
    class ComingBack(RecordingStore):
        attempts = 0

        def write_lines(self, lines: Sequence[str]) -> None:
            self.attempts += 1
            self.down = self.attempts <= 3  # refused three times, then up
            super().write_lines(lines)

    spool = Spool(tmp_path)
    store = ComingBack()
    spool.append(["m f=1i 1", "m f=2i 2"])
    flusher = Flusher(spool, store)
    assert flusher.drain(timeout_s=30, retry_every_s=0.001) == 2
    assert store.lines == ["m f=1i 1", "m f=2i 2"]
    assert store.attempts == 4
    spool.close()


def test_embedded_store_gets_samples_through_a_binary_spool_and_an_outage(tmp_path: Path) -> None:
    """The embedded store is fed samples, not text, and a locked database (another writer holds
    it) is an outage like any other: everything waits in the spool and arrives once, in order."""
    clock = FakeClock()
    store = SqliteStore(tmp_path / "gpuwatt.db", busy_timeout_s=0.05)
    spool = spool_for(store, tmp_path / "spool")
    assert spool.binary
    source = CountingSource("a", 4)
    sampler = Sampler([source], spool, slow_interval_s=60)
    flusher = Flusher(spool, store, batch_lines=6, monotonic_s=clock)
    sampler.tick()
    flusher.flush()
    assert store.count_samples(0, 2**62) == 4
    holder = sqlite3.connect(tmp_path / "gpuwatt.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the database
    for _ in range(10):
        sampler.tick()
        clock.t += 1
        flusher.flush()
    assert flusher.store_down_since_s is not None
    assert spool.pending_lines() == 40
    holder.execute("ROLLBACK")
    holder.close()
    clock.t += 60  # past any backoff
    flusher.flush()
    assert flusher.store_down_since_s is None
    assert spool.pending_lines() == 0
    assert flusher.delivered_lines == 44
    assert store.count_samples(0, 2**62) == 44
    assert [s.power_w for s in sorted(store.latest(), key=lambda s: s.gpu_index)] == [
        100.0,
        101.0,
        102.0,
        103.0,
    ]
    assert {s.time_ns for s in store.latest()} == {11 * 1_000_000_000}
    spool.close()
    store.close()


def test_network_stores_get_a_text_spool(tmp_path: Path) -> None:
    store = RecordingStore()
    spool = spool_for(store, tmp_path)
    assert not spool.binary
    Sampler([CountingSource("a", 2)], spool, slow_interval_s=60).tick()
    assert [decode_line(line).gpu_index for line in spool.read_batch().lines] == [0, 1]
    spool.close()
