"""The reads of one dashboard view send the engine requests they have in common once.

A coarse view reads its range in hourly buckets and, beside it, its newest hour in 1-minute
buckets. Served from engine rollups (``engine_rollups.read_levels``) both take the newest hour's
minute rollups and the newest, not yet rolled minute from raw samples (with the samples around
it that decide their slots): the same requests twice, the largest of the view (on 1,024 GPUs
~12-19 MB each). A ``SharedReads`` wraps the store's ``RollupSource`` for the reads of one view
(``series_many(..., shared=)``, the view's batches of reads alike): a request whose answer
another read of the view already has, or is waiting for, takes that answer instead of asking the
engine again. An answer serves a request for the same range and hosts when it holds every
attribute asked for, and is not ``lean`` where the request is not (a lean read only ignores
``n_ok`` and ``t_last_ns``). Each read gets its own attributes and GPU ids back: what it
computes is what it computed alone.

Which of two such reads sends its request first is a race: a coarse view's newest bucket, a few
minutes read from minutes, is served by its newest hour in minutes, but not the other way round.
So the reads in minutes of a batch are announced before it starts (``expect``), and a request
within one of them that finds no answer asks for that read's whole range: the read then finds its
answer sent (on 1,024 GPUs VictoriaMetrics spent ~100 ms of CPU on the few minutes asked for
apart, for its ~13,000 series).

Answers are kept only as long as the view's reads run (the object is dropped with the view).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuwatt.model import METRIC_FIELDS
from gpuwatt.store import engine_rollups
from gpuwatt.store.base import SeriesRead, series_in_parallel
from gpuwatt.store.engine_rollups import (
    GpuIds,
    PassedSource,
    RollupSource,
    Scope,
    in_ids_of,
)
from gpuwatt.store.rollup_rule import MINUTE_NS

if TYPE_CHECKING:
    import pandas as pd

Cols = dict[str, np.ndarray]
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class _Answer:
    attrs: frozenset[str]
    lean: bool
    ids: GpuIds
    future: Future[Cols]
    span: tuple[int, int]  # the range asked for


@dataclass(frozen=True)
class _Expected:
    """A read in minutes of the view not sent yet (``SharedReads.expect``): the attributes and
    the whole minutes of its range."""

    attrs: frozenset[str]
    span: tuple[int, int]


def _serves(
    a: _Answer, attrs: frozenset[str], lean: bool, span: tuple[int, int], within: bool
) -> bool:
    """Whether answer ``a`` serves a request: every attribute, not lean where it is not, and
    the same range (``within``: or one that holds it)."""
    if not attrs <= a.attrs or (a.lean and not lean):
        return False
    if within:
        return a.span[0] <= span[0] and span[1] <= a.span[1]
    return a.span == span


class SharedReads(PassedSource):
    """A ``RollupSource`` whose raw and rollup requests are shared by the reads of one view."""

    def __init__(self, source: RollupSource) -> None:
        super().__init__(source)
        #: whether a read in 1-minute buckets asks for lean minute points (``RollupSource``).
        #: Not where the view also reads the same minutes to combine them: a lean answer serves
        #: no such request, and whichever of the two is sent first, one request must serve both
        #: (a coarse view's newest hour in minutes, and its range's newest bucket from minutes).
        self.lean_minutes = True
        self._answers: dict[tuple[Any, ...], list[_Answer]] = {}
        self._expected: dict[tuple[Any, ...], list[_Expected]] = {}
        self._lock = threading.Lock()
        #: requests sent to the engine, and those answered from another read's request
        self.sent = 0
        self.shared = 0

    def expect(self, read: SeriesRead) -> None:
        """Announce a read of the view in 1-minute steps, before the reads start: a request
        for minute rollup points within its range asks for all of them (``_shared``)."""
        if read.step_s is None or round(float(read.step_s) * NS_PER_S) != MINUTE_NS:
            return
        span = (-(-read.start_ns // MINUTE_NS) * MINUTE_NS, read.end_ns // MINUTE_NS * MINUTE_NS)
        if span[0] >= span[1]:
            return
        attrs = frozenset(METRIC_FIELDS if read.fields is None else read.fields)
        expected = _Expected(attrs, span)
        with self._lock:  # once (a view announces a read its batch announces again)
            known = self._expected.setdefault(("points", MINUTE_NS, _hosts(read.hosts)), [])
            if expected not in known:
                known.append(expected)

    # --- shared --------------------------------------------------------------------------------

    def raw_level(self, start_ns: int, end_ns: int, scope: Scope) -> Cols:
        return self._shared(
            ("raw", _hosts(scope.hosts)),
            (start_ns, end_ns),
            scope,
            False,
            lambda own, _: self.source.raw_level(start_ns, end_ns, own),
        )

    def rollup_points(
        self, level_ns: int, start_ns: int, end_ns: int, scope: Scope, *, lean: bool = False
    ) -> Cols:
        # Rollup points are whole buckets, each at its bucket's start plus less than a bucket
        # (``engine_rollups``), and asked for from a bucket boundary to another: those of a
        # range within another's answer are its points in that range. (A coarse view's newest
        # 5-minute bucket, read from minutes, lies within its newest hour in minutes.)
        lean = lean and (self.lean_minutes or level_ns != MINUTE_NS)
        return self._shared(
            ("points", level_ns, _hosts(scope.hosts)),
            (start_ns, end_ns),
            scope,
            lean,
            lambda own, asked: self.source.rollup_points(level_ns, *asked, own, lean=lean),
            within=True,
        )

    def _shared(
        self,
        key: tuple[Any, ...],
        span: tuple[int, int],
        scope: Scope,
        lean: bool,
        ask: Callable[[Scope, tuple[int, int]], Cols],
        *,
        within: bool = False,
    ) -> Cols:
        """An answer of another read that serves this request (its GPU ids translated into
        this read's, its rows in ``span`` where it holds more), else the engine's: for an
        expected read's range and attributes where the request lies within it (``expect``)."""
        attrs = frozenset(scope.attrs)
        mine: _Answer | None = None
        with self._lock:
            found = next(
                (a for a in self._answers.get(key, ()) if _serves(a, attrs, lean, span, within)),
                None,
            )
            if found is None:
                asked, wide = span, attrs
                expected = self._expected.get(key, [])
                for e in expected if within else ():
                    if e.span[0] <= span[0] and span[1] <= e.span[1]:
                        asked, wide = e.span, attrs | e.attrs
                        expected.remove(e)
                        break
                found = mine = _Answer(wide, lean, scope.ids, Future(), asked)
                self._answers.setdefault(key, []).append(mine)
                self.sent += 1
            else:
                self.shared += 1
        if mine is not None:
            own = scope if mine.attrs == attrs else replace(scope, attrs=tuple(sorted(mine.attrs)))
            try:
                mine.future.set_result(ask(own, mine.span))
            except BaseException as exc:
                mine.future.set_exception(exc)
                raise
            if own is scope and mine.span == span:
                return mine.future.result()
        cols = found.future.result()
        if found.span != span:
            cols = engine_rollups.within(cols, *span)
        return in_ids_of(cols, found.ids, scope)


def series_many(
    store: Any,
    reads: Sequence[SeriesRead],
    read: Callable[[SeriesRead, SharedReads], pd.DataFrame],
    on_done: Callable[[], None] | None,
    shared: SharedReads | None,
) -> list[pd.DataFrame]:
    """An engine store's ``series_many``: ``read(r, shared)`` of each read in parallel, with
    the ``shared`` requests of the view they belong to, else (several reads) of their own;
    as ``series`` where the store reads no rollups (``store.shared_reads()`` None)."""
    shared = shared or (store.shared_reads() if len(reads) > 1 else None)
    if shared is None:
        return series_in_parallel(store, reads, on_done=on_done)
    session = shared
    groups = abutting(reads)
    runs = [run for run, _ in groups]
    for run in runs:  # before any starts: which read sends a request first is a race
        session.expect(run)
    joined = {id(run): len(members) - 1 for run, members in groups}

    def one(run: SeriesRead) -> pd.DataFrame:
        frame = read(run, session)
        if on_done is not None:  # the progress counts the reads asked for
            for _ in range(joined[id(run)]):
                on_done()
        return frame

    whole = series_in_parallel(store, runs, on_done=on_done, read=one)
    return [
        frame if len(members) == 1 else _part(frame, reads[i])
        for (_, members), frame in zip(groups, whole, strict=True)
        for i in members
    ]


def abutting(reads: Sequence[SeriesRead]) -> list[tuple[SeriesRead, list[int]]]:
    """The reads as one read per run of consecutive reads that abut (each ending where the
    next starts) at a bucket boundary, with the same fields, step and hosts: an analysis's
    context and range (``analytics.inputs.context_reads``). The engine answers a run in one
    request per level instead of one per read: on 1,024 GPUs each costs VictoriaMetrics
    ~80 ms of CPU for its series alone, however short the read (``bench/dashboard.py --store
    victoriametrics``). Each read's rows are those of the run in its range (``_part``): no
    bucket spans a boundary that is a multiple of the step, as buckets start at multiples of
    it, so they are the rows the read gives alone."""
    out: list[tuple[SeriesRead, list[int]]] = []
    for i, r in enumerate(reads):
        if out and _abuts(out[-1][0], r):
            run, members = out[-1]
            out[-1] = (replace(run, end_ns=r.end_ns), [*members, i])
        else:
            out.append((r, [i]))
    return out


def _abuts(a: SeriesRead, b: SeriesRead) -> bool:
    if a.step_s is None or a.step_s != b.step_s or int(a.step_s) <= 0:
        return False
    if _names(a.fields) != _names(b.fields) or _names(a.hosts) != _names(b.hosts):
        return False
    on_boundary = a.end_ns % (int(a.step_s) * NS_PER_S) == 0
    return a.start_ns < a.end_ns == b.start_ns < b.end_ns and on_boundary


def _names(names: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if names is None else tuple(names)


def _part(frame: pd.DataFrame, read: SeriesRead) -> pd.DataFrame:
    """The rows of a run's frame in ``read``'s range (a bucket is keyed at its start, or at
    the run's start where that cuts it)."""
    t = frame["time_ns"].to_numpy()
    return frame.loc[(t >= read.start_ns) & (t < read.end_ns)].reset_index(drop=True)


def _hosts(hosts: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if hosts is None else tuple(hosts)
