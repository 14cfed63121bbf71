"""Data access for the pages: one store read and one ``analyze`` per time window, cached.

Every page of one time range shares the same ``WindowData`` (``window_data``): the store's
rollups for the range (never raw samples: the buckets come from ``TimeRange.step_s``, at most a
few hundred per GPU) and the analytics engine's summary of them. Entries are keyed by the range
in a stale-while-revalidate cache (``read_cache``); several callbacks of one page, and several
users looking at the same range, cost one read, and auto-refresh never waits on the store: at
1,024 GPUs a cold read plus analysis of one hour takes seconds on a small machine, a cached one
tens of milliseconds.

Store failures become ``DataError`` with a message meant for the page ("store not reachable:
..."); they are logged as one line, never as a traceback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pandas as pd

from gpuwatt.analytics import (
    ANALYSIS_FIELDS,
    AnalysisSummary,
    StragglerFindings,
    Tariff,
    analyze,
    find_stragglers_in,
)
from gpuwatt.analytics.inputs import (
    context_reads,
    integrated_of,
    jobs_of,
    joined,
    with_energy_methods,
)
from gpuwatt.dashboard.partial_reads import Partial, joined_partial, parts_of, read_in_parts
from gpuwatt.dashboard.read_cache import DataError, ReadCache, describe
from gpuwatt.dashboard.read_progress import Count, ReadProgress, view_key
from gpuwatt.dashboard.render_cache import RenderCache
from gpuwatt.dashboard.slow_fields import (
    SLOW_FIELDS,
    SLOW_LOOKBACK_S,
    newest_measured,
    with_slow_fields,
)
from gpuwatt.dashboard.timerange import NS_PER_S, TimeRange, choose_step_s
from gpuwatt.dashboard.window_data import (
    ACCOUNTING_MAX_GPU_MINUTES,
    SILENT_AFTER_S,
    GpuCounts,
    WindowData,
    with_accounting,
)
from gpuwatt.errors import StoreUnavailable
from gpuwatt.model import GpuSample, GpuSeen
from gpuwatt.store.base import (
    SeriesRead,
    Store,
    gpus_seen,
    latest_of,
    series_many,
    shared_session,
    xid_events,
)

__all__ = ["SILENT_AFTER_S", "DashboardData", "DataError", "GpuCounts", "WindowData"]

log = logging.getLogger("gpuwatt.dashboard")

T = TypeVar("T")
DAY_NS = 86_400 * NS_PER_S
RECENT_SPAN_S = 3600
RECENT_STEP_S = 60
#: Reads started beside a view's own (``DashboardData.soon``): the newest samples, and what a
#: page reads after the window (``prefetch``).
SIDE_READS = 4


def _started(fn: Callable[..., T], *args: Any) -> Future[T]:
    """``fn(*args)`` running in a thread of its own (not the side pool, whose reads may wait
    on each other); ``result()`` raises what it raised."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="gpuwatt-early", daemon=True).start()
    return future


def _analysis(compute: Callable[[], T]) -> T:
    """Run an analysis; a failure becomes a ``DataError`` for the page and one log line."""
    try:
        return compute()
    except Exception as exc:
        log.error("analysis failed: %s: %s", type(exc).__name__, describe(exc))
        log.debug("analysis failed", exc_info=True)
        raise DataError(f"the analysis of this range failed: {describe(exc)}") from None


@dataclass(frozen=True)
class _RecentRead:
    """A coarse view's newest hour in minutes (``DashboardData._recent_read``)."""

    frame: pd.DataFrame
    partial: Partial | None
    stragglers: StragglerFindings


def _minute_end_ns(now_ns: int) -> int:
    """The end of the minute ``now_ns`` is in (a range that ends there includes it)."""
    return now_ns - now_ns % (60 * NS_PER_S) + 60 * NS_PER_S


class DashboardData:
    """Cached, server-side aggregated reads for the dashboard (thread-safe)."""

    def __init__(
        self,
        store: Store,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        tariff: Tariff | None = None,
        ttl_s: float = 10.0,
        max_stale_s: float = 300.0,
        max_entries: int = 16,
        shared_recent_max_age_s: float = 30.0,
    ) -> None:
        self.store = store
        self.clock_ns = clock_ns
        self.tariff = tariff or Tariff()
        self.cache = ReadCache(ttl_s=ttl_s, max_stale_s=max_stale_s, max_entries=max_entries)
        #: pages' content drawn from the windows the cache serves (``render_cache``)
        self.rendered = RenderCache()
        #: called with each live range computed again in the background (by the warmer, or a
        #: stale cache entry's refresh) and its new window, not where that failed
        #: (``app.redraw_viewed``)
        self.on_recomputed: Callable[[TimeRange, WindowData], None] | None = None
        self.cache.on_refreshed = self._recomputed
        #: A live coarse range takes its newest-hour analysis from the cached live 1-hour view
        #: (the default view, kept warm) when that is at most this old; see ``_window``.
        self.shared_recent_max_age_s = shared_recent_max_age_s
        self._warmer: tuple[threading.Event, threading.Thread] | None = None
        self._logged: set[str] = set()  # notices already logged (``_log_conflicts``)
        self.accounting_max_gpu_minutes = ACCOUNTING_MAX_GPU_MINUTES
        #: how many of the reads of each view being computed are done (``read_progress``)
        self.progress = ReadProgress()
        self._side: ThreadPoolExecutor | None = None  # ``soon``
        self._side_lock = threading.Lock()
        #: every GPU's newest samples pages started reading before their views (``read_newest``):
        #: by the metrics read (None: all), when each read started, and the read
        self._newest_reads: dict[tuple[str, ...] | None, tuple[float, Future[list[GpuSample]]]]
        self._newest_reads = {}

    def _cached(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        return self.cache.get(key, compute)

    def clear_cache(self) -> None:
        self.cache.clear()
        self.rendered.clear()
        with self._side_lock:
            self._newest_reads.clear()

    def soon(self, compute: Callable[[], T]) -> Future[T]:
        """``compute()`` started in a background thread (a read that does not depend on the
        one the caller makes next: both wait on the store at once); ``result()`` raises what
        it raised."""
        with self._side_lock:
            if self._side is None:
                self._side = ThreadPoolExecutor(SIDE_READS, thread_name_prefix="gpuwatt-side")
            return self._side.submit(compute)

    def prefetch(self, compute: Callable[[], object]) -> None:
        """Start a cached read a page will ask for after the window (``soon``); its failure is
        left for the page's own call to meet and say."""
        self.soon(compute).add_done_callback(lambda f: f.exception())

    def read_newest(self, attrs: tuple[str, ...] | None = None) -> None:
        """Start reading every GPU's newest samples (with the metrics ``attrs``; None: whole),
        for a page that shows them, before its view starts: the view then takes the GPUs seen
        from this read instead of sending one of its own (``gpus_seen``). In a thread of its
        own, not the side pool: reads there wait on it. Its failure is left for the page's own
        call to meet and say."""
        read: Callable[[], list[GpuSample]] = self.latest
        if attrs is not None:
            read = lambda: self.latest_of(None, attrs)  # noqa: E731
        future = _started(read)
        future.add_done_callback(lambda f: f.exception())
        with self._side_lock:
            self._newest_reads[attrs] = (time.monotonic(), future)

    def _newest_being_read(self) -> list[GpuSample] | None:
        """Every GPU's newest samples, from a read a page started at most ``ttl_s`` ago
        (``read_newest``), once it is done; None when there is none, or it failed."""
        with self._side_lock:
            reads = sorted(self._newest_reads.values(), key=lambda r: r[0], reverse=True)
        for started_s, future in reads:
            if time.monotonic() - started_s > self.cache.ttl_s:
                continue
            try:
                return future.result()
            except Exception:  # the page's own call meets it and says it
                continue
        return None

    def close(self) -> None:
        warmer, self._warmer = self._warmer, None
        if warmer is not None:
            warmer[0].set()
            warmer[1].join(timeout=30.0)
        side, self._side = self._side, None
        if side is not None:
            side.shutdown(wait=True, cancel_futures=True)
        self.cache.close()

    def _read(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            log.warning("store not reachable while reading %s: %s", what, describe(exc))
            raise DataError(f"store not reachable: {describe(exc)}", unreachable=True) from None
        except Exception as exc:
            log.error("reading %s failed: %s: %s", what, type(exc).__name__, describe(exc))
            log.debug("reading %s failed", what, exc_info=True)
            raise DataError(f"could not read {what}: {describe(exc)}") from None

    # --- reads ------------------------------------------------------------------------------

    def now_ns(self) -> int:
        return self.clock_ns()

    def latest(self) -> list[GpuSample]:
        return self._cached(("latest",), lambda: self._read("latest samples", self.store.latest))

    def gpus_seen(self) -> list[GpuSeen]:
        """The GPUs of ``latest`` without their newest values (``base.gpus_seen``): what a view
        needs to count and attribute its GPUs. Taken from the newest samples when they are
        cached; on an engine, otherwise, read on its own: most pages never show every GPU's
        newest values, which cost VictoriaMetrics ~10x the CPU."""
        cached: list[GpuSample] | None = self.cache.peek(("latest",), self.cache.ttl_s)
        if (
            cached is None
            and not self.cache.computing(("latest",))
            and hasattr(self.store, "gpus_seen")  # else a store that reads them from those
        ):
            # a page that shows every GPU's newest values, or some of them, is reading them
            cached = self._newest_being_read()
            if cached is None:
                return self._cached(
                    ("gpus-seen",),
                    lambda: self._read("the GPUs seen", lambda: gpus_seen(self.store)),
                )
        return [GpuSeen.of(s) for s in (self.latest() if cached is None else cached)]

    def latest_of(
        self, host: str | None = None, attrs: tuple[str, ...] | None = None
    ) -> list[GpuSample]:
        """The newest samples of one node's GPUs (None: every GPU), with at least the metrics
        ``attrs`` (None: all) and whether each GPU is lost: from every GPU's whole samples when
        they are cached, else read for those alone (``base.latest_of``): the node page shows
        one node's, the overview one metric of all."""
        cached: list[GpuSample] | None = self.cache.peek(("latest",), self.cache.ttl_s)
        if cached is not None or not hasattr(self.store, "latest_of"):
            # a store that filters its newest samples: those, shared with the pages
            whole = self.latest() if cached is None else cached
            return [s for s in whole if host is None or s.host == host]
        what = "the newest samples" + (f" of {host}" if host else "")
        hosts = None if host is None else [host]
        return self._cached(
            ("latest-of", host, attrs),
            lambda: self._read(what, lambda: latest_of(self.store, hosts, attrs)),
        )

    def latest_with_slow_fields(self, attrs: tuple[str, ...] | None = None) -> list[GpuSample]:
        """The newest sample of every GPU (with the metrics ``attrs``, as ``latest_of``; None:
        whole) with its ECC and remapped-row figures filled in from the last few slow intervals
        (``slow_fields``): what the health table shows."""

        def compute() -> list[GpuSample]:
            samples = self.latest() if attrs is None else self.latest_of(None, attrs)
            if not samples:
                return samples
            end_ns = max(s.time_ns for s in samples) + 1
            start_ns = end_ns - SLOW_LOOKBACK_S * NS_PER_S
            frame = self._read(
                "ECC and remapped rows",
                lambda: self.store.series(start_ns, end_ns, SLOW_FIELDS),
            )
            return with_slow_fields(samples, newest_measured(frame))

        return self._cached(("latest-slow", attrs), compute)

    def window(self, tr: TimeRange) -> WindowData:
        """Rollups and the analytics summary for one range.

        A live range ("the last hour") is keyed by its span, not its end: its end moves with
        every request, and keyed by it no request would ever find the cache. The entry is then
        at most ``ttl_s`` behind now, and a refresh recomputes it up to the clock at that time.
        """
        if not tr.live:
            return self._cached(
                ("window", tr.start_ns, tr.end_ns, tr.step_s), lambda: self._window(tr)
            )
        span_ns = tr.end_ns - tr.start_ns
        return self._cached(
            ("window-live", span_ns, tr.step_s), lambda: self._window(self._moved(tr))
        )

    def _moved(self, tr: TimeRange) -> TimeRange:
        """A live range moved to end at the clock's now."""
        now = self.now_ns()
        return replace(tr, start_ns=now - (tr.end_ns - tr.start_ns), end_ns=now)

    def start_warming(
        self, ranges: Sequence[tuple[TimeRange, float]] | Sequence[TimeRange], every_s: float = 30.0
    ) -> threading.Event:
        """Keep the windows of these live ranges computed, one background thread recomputing
        each every ``every_s`` (or its own period, given as ``(range, period_s)``), in the
        order given: the first visitor after a quiet spell, and every visitor of the default
        view and the preset ranges, finds the data ready instead of waiting for a cold read and
        analysis of the whole cluster (0.2-0.7 s of CPU at 1,000 GPUs). Returns an event set
        once the first range has been computed (or has failed)."""
        plan = [(r, every_s) if isinstance(r, TimeRange) else r for r in ranges]
        first_done = threading.Event()
        if self._warmer is not None:
            first_done.set()
            return first_done
        stop = threading.Event()

        def run() -> None:
            due = [0.0] * len(plan)
            while not stop.is_set():
                for i, (tr, period_s) in enumerate(plan):
                    if time.monotonic() < due[i]:
                        continue
                    due[i] = time.monotonic() + period_s
                    self._warm(tr)
                    if i == 0:
                        # the overview's "Energy today", with the default view: the page a
                        # visitor lands on
                        self._warm_today()
                        first_done.set()
                    if stop.is_set():
                        return
                stop.wait(max(0.0, min(due) - time.monotonic()))

        self._warmer = (stop, threading.Thread(target=run, name="gpuwatt-warm", daemon=True))
        self._warmer[1].start()
        return first_done

    def _warm(self, tr: TimeRange) -> None:
        key = ("window-live", tr.end_ns - tr.start_ns, tr.step_s)
        win = self._warm_entry(lambda: (key, self._window(self._moved(tr))))
        if win is not None:
            self._recomputed(key, win)

    def _recomputed(self, key: tuple[Any, ...], value: Any) -> None:
        """An entry computed again in the background (the warmer, or a stale entry's refresh):
        a live range's new window is passed to ``on_recomputed``; a failure there is logged."""
        if key[0] != "window-live" or self.on_recomputed is None:
            return
        try:
            self.on_recomputed(value.range, value)
        except Exception as exc:  # never let the warmer or the cache's refresh die
            log.error("drawing pages after a view was computed again failed: %s", describe(exc))

    def _warm_today(self) -> None:
        def entry() -> tuple[tuple[Any, ...], AnalysisSummary]:
            key, compute = self._today(self.now_ns())
            return key, compute()

        self._warm_entry(entry)

    def _warm_entry(self, entry: Callable[[], tuple[tuple[Any, ...], Any]]) -> Any | None:
        """Compute a cache entry (key, value) and put it; the value, or None where it failed
        (a failure never stops the warmer)."""
        try:
            key, value = entry()
        except DataError:
            return None  # logged as one line; the page will say it
        except Exception as exc:  # never let the warmer die silently
            log.error("warming the cache failed: %s", describe(exc))
            return None
        self.cache.put(key, value)
        return value

    def _window(self, tr: TimeRange) -> WindowData:
        coarse = tr.step_s > RECENT_STEP_S
        # The GPUs seen are read while the range is (a network engine answers both at once); a
        # coarse range needs their count first, to choose its other reads.
        newest = self.soon(self.gpus_seen)
        # the context before the range, then the range (as ``analytics.inputs`` reads them)
        reads = context_reads(tr.start_ns, tr.end_ns, tr.step_s, float(tr.step_s))
        recent_start = max(tr.start_ns, tr.end_ns - RECENT_SPAN_S * NS_PER_S)
        recent_read = SeriesRead(recent_start, tr.end_ns, ANALYSIS_FIELDS, RECENT_STEP_S)
        shared = self._shared_recent() if coarse and tr.live else None
        # the view's reads, in one batch or two, send the requests they share once (a coarse
        # view's newest hour in minutes holds its range's newest bucket, combined from them)
        session = shared_session(self.store, lean_minutes=not coarse)
        with self.progress.tracking(view_key(tr)) as count:
            early: Future[tuple[list[pd.DataFrame], Partial | None]] | None = None
            early_recent: Future[_RecentRead] | None = None
            if coarse and not getattr(self.store, "reads_share_work", False):
                # A network engine: the context and the range, read whatever the GPU count,
                # go to it while the newest samples are read, and so does the newest hour in
                # minutes unless the GPUs last counted say the range is accounted in minutes
                # (a cold 6 h view of 1,024 GPUs on VictoriaMetrics sent it ~0.5 s later,
                # after the count). The newest hour's stragglers are found as soon as its
                # minutes arrive, while the range is still being read. (The embedded store
                # reads a view's reads in one transaction, their newest raw samples aggregated
                # once.)
                counted = self._gpus_counted()
                if shared is None and not self._accounted_in_minutes(tr.span_s, counted):
                    if session is not None:  # whichever of the two reads asks first
                        session.expect(recent_read)
                    early_recent = _started(
                        self._recent_read, recent_read, count, session, newest, tr.start_ns
                    )
                early = _started(self._read_counted, reads, count, session)
            seen = newest.result() if coarse else []
            accounting = coarse and self._accounted_in_minutes(tr.span_s, len(seen))
            shared = shared if not accounting else None
            more: list[SeriesRead] = []
            if accounting:
                # the range in 1-minute windows, read with the rest: its figures, and its
                # stragglers (they include the newest hour's)
                more = context_reads(tr.start_ns, tr.end_ns, RECENT_STEP_S)
            elif coarse and shared is None and early_recent is None:
                # read with the rest: one snapshot, the newest raw samples aggregated once
                more = [recent_read]
            if early is None:
                frames, partial = self._read_counted(reads + more, count, session)
            else:
                later = self._read_counted(more, count, session) if more else ([], None)
                first = early.result()
                frames = first[0] + later[0]
                partial = joined_partial((reads, first[1]), (more, later[1]))
            seen = newest.result()
            jobs = jobs_of(seen, tr.start_ns)  # as the CLI and the alert evaluator attribute them
            integrated = integrated_of(seen)  # and label their energy
            frame = frames[1]
            # the range analysed while the newest hour's stragglers may still be found
            summary = self._analyze(
                with_energy_methods(joined(frames[:2]), integrated),
                tr.end_ns,
                tr.start_ns,
                tr.step_s,
                jobs,
            )
            found_early: StragglerFindings | None = None
            if early_recent is not None and not accounting:
                # (not used where the range is accounted in minutes after all: the GPUs
                # counted had changed)
                got = early_recent.result()
                frames.append(got.frame)
                partial = joined_partial((reads, partial), ([recent_read], got.partial))
                found_early = got.stragglers
        self._log_conflicts(summary)
        recent: AnalysisSummary | StragglerFindings | None = None
        if accounting:
            minutes = self._analyze(
                with_energy_methods(joined(frames[2:]), integrated),
                tr.end_ns,
                tr.start_ns,
                RECENT_STEP_S,
                jobs,
            )
            summary = with_accounting(summary, minutes)
            if not frame.empty and minutes.windows:
                sw = minutes.straggler_windows  # the newest hour: the peer comparison's points
                newest_sw = sw.loc[sw["window_start_ns"] >= recent_start] if len(sw) else sw
                recent = replace(minutes, straggler_windows=newest_sw.reset_index(drop=True))
        elif coarse and not frame.empty:
            if shared is not None:
                recent = shared.summary
            elif found_early is not None:
                recent = found_early
            else:
                recent = self._recent_stragglers(
                    with_energy_methods(frames[2], integrated), tr.end_ns, recent_start, jobs
                )
        return WindowData(tr, frame, summary, seen, jobs, recent, accounting, partial)

    def _recent_read(
        self,
        read: SeriesRead,
        count: Count,
        session: Any,
        seen: Future[list[GpuSeen]],
        start_ns: int,
    ) -> _RecentRead:
        """A coarse view's newest hour in minutes, and its stragglers (``_recent_stragglers``:
        the GPUs ``seen`` attributed to jobs as from ``start_ns``, the range's start)."""
        frames, partial = self._read_counted([read], count, session)
        jobs = jobs_of(seen.result(), start_ns)
        marked = with_energy_methods(frames[0], integrated_of(seen.result()))
        found = self._recent_stragglers(marked, read.end_ns, read.start_ns, jobs)
        return _RecentRead(frames[0], partial, found)

    def _read_counted(
        self, reads: list[SeriesRead], count: Count, session: Any = None
    ) -> tuple[list[pd.DataFrame], Partial | None]:
        """The reads at once; when the engine does not answer them in time, the same reads in
        parts (``partial_reads``): what arrives is shown, labelled partial, not a blank page.
        How many are done is counted for the page (``count``: ``progress``) while they run."""
        count.expect(len(reads))

        def whole() -> list[pd.DataFrame] | None:
            try:
                return series_many(self.store, reads, on_done=count.one_done, shared=session)
            except StoreUnavailable as exc:
                log.warning("store too slow or gone for the whole range: %s", describe(exc))
                return None

        first = self._read("samples", whole)
        if first is not None:
            return first, None
        count.restart(parts_of(reads))
        frames, partial = self._read(
            "samples", lambda: read_in_parts(self.store, reads, on_done=count.one_done)
        )
        if partial.missing:
            log.warning("%s", partial.label)
        return frames, (partial if partial.missing else None)

    def _log_conflicts(self, summary: AnalysisSummary) -> None:
        """Energy counters of one GPU that go back and forth (two writers) are a notice on the
        page (the summary's notes) and, once per distinct notice, a log warning."""
        for note in summary.notes:
            if "two collectors" in note and note not in self._logged:
                self._logged.add(note)
                log.warning("%s", note)

    def _accounted_in_minutes(self, span_s: float, gpus: int | None) -> bool:
        """Whether a coarse range of ``span_s`` seconds and ``gpus`` GPUs is analysed in
        1-minute windows as well (False where the count is not known)."""
        return gpus is not None and gpus * span_s / 60 <= self.accounting_max_gpu_minutes

    def _gpus_counted(self) -> int | None:
        """The number of GPUs last seen (None: none cached)."""
        for key in (("gpus-seen",), ("latest",)):
            seen: list[Any] | None = self.cache.peek(key, float("inf"))
            if seen is not None:
                return len(seen)
        return None

    def _shared_recent(self) -> WindowData | None:
        """The cached live view of the last hour in 1-minute windows, if at most
        ``shared_recent_max_age_s`` old: the newest hour of a live coarse range is that very
        analysis (the default view, which the server keeps warm), not a second one."""
        key = ("window-live", RECENT_SPAN_S * NS_PER_S, RECENT_STEP_S)
        hit: WindowData | None = self.cache.peek(key, self.shared_recent_max_age_s)
        return hit

    def _analyze(
        self, frame: pd.DataFrame, end_ns: int, start_ns: int, step_s: int, jobs: dict[str, str]
    ) -> AnalysisSummary:
        t = self.tariff
        return _analysis(
            lambda: analyze(
                frame,
                now_ns=end_ns,
                start_ns=start_ns,
                window_s=float(step_s),
                step_s=step_s,
                jobs=jobs,
                price_per_kwh=t.price_per_kwh,
                carbon_g_per_kwh=t.carbon_g_per_kwh,
                currency=t.currency,
            )
        )

    @staticmethod
    def _recent_stragglers(
        frame: pd.DataFrame, end_ns: int, start_ns: int, jobs: dict[str, str]
    ) -> StragglerFindings:
        """The newest hour's stragglers only: the rest of its analysis is not shown."""
        return _analysis(
            lambda: find_stragglers_in(
                frame, now_ns=end_ns, start_ns=start_ns, window_s=float(RECENT_STEP_S), jobs=jobs
            )
        )

    def energy_today(self, now_ns: int) -> AnalysisSummary:
        """The analytics summary of energy since midnight UTC, in the windows a view of that
        range has: 1-minute ones where the view is accounted in minutes
        (``ACCOUNTING_MAX_GPU_MINUTES``), else its own buckets (``choose_step_s``: 5 minutes
        up to 6 h, then hours), so the figure is that view's. Late in the day on a large
        cluster that is hours: at 1,024 GPUs and 23:00, analysing every 5 minutes since
        midnight made a cold overview on VictoriaMetrics take ~1.2 s, ~0.65 s in hours.

        Keyed by the day and the step, not by the minute it ends in, as a live view is: a
        visitor in a new minute is served the figure of the minute before while it is read
        again (``read_cache``), instead of waiting for a whole day's read."""
        return self._cached(*self._today(now_ns))

    def energy_today_is_cached(self, now_ns: int) -> bool:
        """Whether ``energy_today`` answers from the cache (a stale figure is refreshed in the
        background): without a read while the caller waits."""
        key, _ = self._today(now_ns)
        return self.cache.peek(key, self.cache.max_stale_s) is not None

    def _today(self, now_ns: int) -> tuple[tuple[Any, ...], Callable[[], AnalysisSummary]]:
        """``energy_today``'s cache key and computation."""
        day_ns = (now_ns // DAY_NS) * DAY_NS
        step = self._today_step_s(day_ns, _minute_end_ns(now_ns))

        def compute() -> AnalysisSummary:
            # the day up to the clock's now when it is computed (a refresh in the background
            # runs minutes later), the current minute included, in the step of the key
            end = min(_minute_end_ns(max(self.now_ns(), now_ns)), day_ns + DAY_NS)
            fields = ("energy_j", "power_w", "utilization_gpu_pct")
            reads = [
                SeriesRead(r.start_ns, r.end_ns, fields, step)
                for r in context_reads(day_ns, end, step)
            ]
            frames = self._read("today's energy", lambda: series_many(self.store, reads))
            frame = with_energy_methods(joined(frames), integrated_of(self.gpus_seen()))
            return self._analyze(frame, end, day_ns, step, {})

        return ("today", day_ns, step), compute

    def _today_step_s(self, day_ns: int, end_ns: int) -> int:
        """The step of a view of ``[day_ns, end_ns)``, or minutes where it is accounted in
        minutes."""
        span_s = (end_ns - day_ns) / NS_PER_S
        if self._accounted_in_minutes(span_s, len(self.gpus_seen())):
            return RECENT_STEP_S
        return choose_step_s(span_s)

    def host_series(self, tr: TimeRange, host: str, fields: Sequence[str]) -> pd.DataFrame:
        """Rollups of one node's GPUs (drill-down); a live range keyed as in ``window``."""

        def compute() -> pd.DataFrame:
            r = self._moved(tr) if tr.live else tr
            return self._read(
                f"the samples of {host}",
                lambda: self.store.series(
                    r.start_ns, r.end_ns, fields, step_s=r.step_s, hosts=[host]
                ),
            )

        when = ("live", tr.end_ns - tr.start_ns) if tr.live else (tr.start_ns, tr.end_ns)
        return self._cached(("host", host, tuple(fields), *when, tr.step_s), compute)

    def host_xids(self, tr: TimeRange, host: str | None) -> pd.DataFrame | None:
        """The XID events of one node's GPUs (None: every node's) in the range
        (``store.base.xid_events``: from the samples, whatever the range's step); None where
        the store keeps no XIDs."""

        def compute() -> pd.DataFrame | None:
            r = self._moved(tr) if tr.live else tr
            return self._read(
                f"the XID events of {host or 'every node'}",
                lambda: xid_events(
                    self.store, r.start_ns, r.end_ns, None if host is None else [host]
                ),
            )

        when = ("live", tr.end_ns - tr.start_ns) if tr.live else (tr.start_ns, tr.end_ns)
        return self._cached(("xids", host, *when), compute)
