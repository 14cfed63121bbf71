"""The collector's loop: sample -> spool on one cadence, spool -> store as soon as spooled.

Sampling never waits for the store: a tick only appends to the local spool (fsync'd: line
protocol for a store across the network, binary frames of samples for one on this machine, which
then gets ``write_samples`` with no text round trip: ``spool_for``), and a separate flusher
thread, woken by each tick, drains the spool to the store with exponential backoff while it is
down. Ticks run under APScheduler 3.x with coalescing, one instance, and a misfire grace of one
interval, so a slow tick delays the next one instead of piling up. SIGTERM/SIGINT (wired by the
CLI) set the stop event; shutdown waits for the running tick, then gives the flusher a bounded
time to deliver what is spooled. Anything not delivered stays on disk for the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from gpuwatt.collector.delivery import (
    SetAside,
    StoreRefusesUs,
    deliver_lines,
    deliver_rows,
    deliver_samples,
)
from gpuwatt.collector.spool import Spool, SpoolBatch
from gpuwatt.errors import GpuwattError, StoreUnavailable
from gpuwatt.model import GpuSample
from gpuwatt.store.base import Store

log = logging.getLogger(__name__)

REJECTED_DIR = "rejected"  # lines the store refused, within a quarter of the spool's bound
REFUSAL_LOG_EVERY_S = 300.0


class SampleSource(Protocol):
    """Anything that yields one snapshot per GPU per tick (real NVML, the simulated cluster)."""

    def open(self) -> None: ...

    def sample(self, *, include_slow: bool) -> list[GpuSample]: ...

    def close(self) -> None: ...


@dataclass
class TickStats:
    ticks: int = 0
    samples: int = 0
    lost_samples: int = 0
    last_tick_s: float = 0.0  # wall time the last tick took
    failed_sources: int = 0
    skipped_ticks: int = 0  # too close behind a late one


def spool_for(store: object, directory: str | Path, **kwargs: Any) -> Spool:
    """The spool for ``store``: binary frames of samples for the embedded store (it takes the
    samples as they are), line protocol for a store across the network (sent as spooled)."""
    from gpuwatt.store.sqlite import SqliteStore

    return Spool(directory, binary=isinstance(store, SqliteStore), **kwargs)


class Sampler:
    """One tick: a snapshot of every GPU of every source, appended to the spool."""

    def __init__(
        self,
        sources: Sequence[SampleSource],
        spool: Spool,
        *,
        slow_interval_s: float,
        monotonic_s: Callable[[], float] = time.monotonic,
        on_samples: Callable[[list[GpuSample]], None] | None = None,
        min_spacing_s: float = 0.0,
    ) -> None:
        """``min_spacing_s``: a tick that starts sooner than this after the previous one is
        skipped. A late tick followed at once by the on-time next one would otherwise take two
        snapshots a few microseconds apart (the run loop sets it to half the interval)."""
        self.sources = list(sources)
        self.min_spacing_s = min_spacing_s
        self._last_tick_s: float | None = None
        self.spool = spool
        self.slow_interval_s = slow_interval_s
        self._monotonic_s = monotonic_s
        self._last_slow_s: float | None = None
        self._on_samples = on_samples
        self.spooled = threading.Event()  # set after each tick's append: wakes the flusher
        self.stats = TickStats()
        self._lock = threading.Lock()

    def tick(self) -> int:
        with self._lock:
            started = self._monotonic_s()
            if self._last_tick_s is not None and started - self._last_tick_s < self.min_spacing_s:
                self.stats.skipped_ticks += 1
                return 0
            self._last_tick_s = started
            include_slow = (
                self._last_slow_s is None or started - self._last_slow_s >= self.slow_interval_s
            )
            if include_slow:
                self._last_slow_s = started
            samples: list[GpuSample] = []
            for source in self.sources:
                try:
                    samples.extend(source.sample(include_slow=include_slow))
                except GpuwattError as exc:
                    # one broken source (node) must not stop the others
                    self.stats.failed_sources += 1
                    log.error("sampling failed: %s", exc)
            self.spool.append_samples(samples)
            self.spooled.set()
            self.stats.ticks += 1
            self.stats.samples += len(samples)
            self.stats.lost_samples += sum(1 for s in samples if s.lost)
            self.stats.last_tick_s = self._monotonic_s() - started
            if self._on_samples is not None:
                self._on_samples(samples)
            return len(samples)


class Flusher:
    """Drains the spool into the store, oldest first; backs off while the store is down."""

    def __init__(
        self,
        spool: Spool,
        store: Store,
        *,
        batch_lines: int = 4096,
        rows_batch_samples: int = 16384,
        max_backoff_s: float = 30.0,
        monotonic_s: Callable[[], float] = time.monotonic,
        dead_letter_dir: Path | None = None,
        on_delivered: Callable[[list[str]], None] | None = None,
    ) -> None:
        """``on_delivered``: called with each batch the store took, before the spool's cursor
        moves past it (``rollup_writer.RollupWriter.delivered``). ``rows_batch_samples``: the
        most samples written at once into a store that takes rows (``write_rows``); the spool's
        cursor moves past them only once the store has committed them."""
        self.on_delivered = on_delivered
        self.spool = spool
        self.store = store
        self.batch_lines = batch_lines
        self.rows_batch_samples = rows_batch_samples
        self.rows_batch_bytes = 8 * 1024 * 1024
        self._takes_rows = callable(getattr(store, "write_rows", None))
        self.max_backoff_s = max_backoff_s
        self._monotonic_s = monotonic_s
        self.set_aside = SetAside(
            dead_letter_dir or spool.directory / REJECTED_DIR, max(1, spool.max_bytes // 4)
        )
        self._last_refusal_log_s: float | None = None
        self._backoff_s = 0.0
        self._next_attempt_s = 0.0
        self.store_down_since_s: float | None = None
        self.delivered_lines = 0
        self.rejected_lines = 0
        self._lock = threading.Lock()

    def flush(self, stop: threading.Event | None = None, deadline_s: float | None = None) -> int:
        """Send spooled lines until the spool is empty, the store fails, or time is up."""
        with self._lock:
            if self._monotonic_s() < self._next_attempt_s:
                return 0
            sent = 0
            while stop is None or not stop.is_set():
                if deadline_s is not None and self._monotonic_s() >= deadline_s:
                    break
                batch = self._read_batch()
                if not len(batch):
                    break
                if not self._send(batch):
                    break
                sent += len(batch)
            return sent

    def _read_batch(self) -> SpoolBatch:
        """The next batch to send: into a store that takes rows (``write_rows``: the embedded
        store), samples as rows, up to ``rows_batch_samples`` in one write (a replay after an
        outage: one transaction each); else ``batch_lines`` lines or samples."""
        if self._takes_rows:
            return self.spool.read_batch(
                max_lines=self.rows_batch_samples, max_bytes=self.rows_batch_bytes, as_rows=True
            )
        return self.spool.read_batch(max_lines=self.batch_lines)

    def drain(self, timeout_s: float, *, retry_every_s: float = 0.5) -> int:
        """At shutdown: deliver what is spooled whatever the backoff says, retrying a store
        that is still unreachable every ``retry_every_s`` until ``timeout_s`` has passed."""
        deadline_s = self._monotonic_s() + timeout_s
        sent = 0
        while True:
            with self._lock:
                self._next_attempt_s = 0.0
            sent += self.flush(deadline_s=deadline_s)
            if not len(self.spool.read_batch(max_lines=1)) or self.store_down_since_s is None:
                return sent
            if self._monotonic_s() + retry_every_s >= deadline_s:
                return sent
            time.sleep(retry_every_s)

    def _send(self, batch: SpoolBatch) -> bool:
        try:
            if batch.rows is not None:
                outcome = deliver_rows(self.store, batch.rows)
            elif batch.samples:
                outcome = deliver_samples(self.store, batch.samples)
            else:
                outcome = deliver_lines(self.store, batch.lines)
        except StoreRefusesUs as exc:
            self._mark_down(exc, refused=True)
            return False
        except StoreUnavailable as exc:
            self._mark_down(exc)
            return False
        self.delivered_lines += outcome.delivered
        if self.on_delivered is not None:
            self.on_delivered(batch.lines)
        if outcome.refused:
            # The store refused these lines' data (not an outage): keep them aside with the
            # reason, never block the spool behind them, never lose them silently.
            path = self.set_aside.add(outcome.refused, f"{batch.segment:016d}-{batch.end_offset}")
            self.rejected_lines += len(outcome.refused)
            log.error(
                "store refused %d of %d samples (first: %s); kept in %s (gpuwatt spool replay)",
                len(outcome.refused),
                len(batch),
                outcome.refused[0][1],
                path,
            )
        self.spool.commit(batch)
        if self.store_down_since_s is not None:
            down_s = self._monotonic_s() - self.store_down_since_s
            log.warning("store reachable again after %.0f s; replaying the spool", down_s)
            self.store_down_since_s = None
            self._last_refusal_log_s = None
        self._backoff_s = 0.0
        return True

    def _mark_down(self, exc: Exception, *, refused: bool = False) -> None:
        now = self._monotonic_s()
        if refused:
            # An operator has to act (a token to renew, a bucket to create): say so loudly, and
            # again every few minutes while it lasts; keep every sample meanwhile.
            last = self._last_refusal_log_s
            if last is None or now - last >= REFUSAL_LOG_EVERY_S:
                self._last_refusal_log_s = now
                log.error(
                    "store refused us (%s); samples are kept in the spool and sent once it "
                    "accepts them (retrying with back-off up to %.0f s)",
                    exc,
                    self.max_backoff_s,
                )
        if self.store_down_since_s is None:
            self.store_down_since_s = now
            if not refused:
                log.warning("store unreachable (%s); samples are kept in the spool", exc)
        self._backoff_s = min(self.max_backoff_s, max(0.5, self._backoff_s * 2))
        self._next_attempt_s = now + self._backoff_s


def run(
    sampler: Sampler,
    flusher: Flusher,
    *,
    interval_s: float,
    stop: threading.Event,
    duration_s: float | None = None,
    flush_interval_s: float = 1.0,
    shutdown_flush_s: float = 10.0,
) -> None:
    """Run until ``stop`` is set or ``duration_s`` has passed; then shut down cleanly."""
    sampler.min_spacing_s = max(sampler.min_spacing_s, interval_s / 2)
    scheduler = BackgroundScheduler(timezone="UTC")
    common = {"coalesce": True, "max_instances": 1}
    scheduler.add_job(
        sampler.tick,
        "interval",
        seconds=interval_s,
        misfire_grace_time=max(1, round(interval_s)),
        next_run_time=_utcnow(),
        id="sample",
        **common,
    )
    scheduler.start()
    flushing = threading.Thread(
        target=_flush_loop,
        args=(sampler, flusher, stop, flush_interval_s),
        name="gpuwatt-flusher",
        daemon=True,
    )
    flushing.start()
    try:
        stop.wait(timeout=duration_s)
    finally:
        stop.set()
        sampler.spooled.set()  # wakes the flusher, which sees the stop
        scheduler.shutdown(wait=True)
        flushing.join()
        flusher.drain(shutdown_flush_s)
        pending = sampler.spool.pending_lines()
        if pending:
            log.warning("%d samples remain in the spool for the next start", pending)


def _flush_loop(sampler: Sampler, flusher: Flusher, stop: threading.Event, every_s: float) -> None:
    """The flusher's thread: delivers what a tick spooled as soon as it is spooled (woken by the
    tick), and at least every ``every_s`` (the retries of a store that is down, after back-off).
    One thread waiting on an event, rather than a second scheduled job: the scheduler's
    wake-ups and job dispatch were a measurable part of the collector's own CPU
    (``bench/collector_process.py``)."""
    while not stop.is_set():
        sampler.spooled.wait(every_s)
        sampler.spooled.clear()
        if stop.is_set():
            return
        try:
            flusher.flush(stop)
        except Exception:  # as the scheduler did for a job: log it, carry on
            log.exception("delivering the spool failed")


def _utcnow() -> datetime:
    return datetime.now(UTC)
