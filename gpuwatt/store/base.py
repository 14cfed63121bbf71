"""The store interface every backend implements.

Reads return pandas DataFrames in *long* form, one row per GPU and time:
``time_ns`` (int64, bucket start for rolled-up reads), ``host``, ``gpu_index``, ``uuid``, ``name``,
then one column per requested metric under its ``GpuSample`` attribute name (``power_w``, ...),
NaN where not measured. pandas is imported by the read paths only: a collector that only writes
never imports it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuwatt.model import GpuSample, GpuSeen

if TYPE_CHECKING:
    import pandas as pd

#: Columns that identify a row in every frame a store returns.
KEY_COLUMNS: tuple[str, ...] = ("time_ns", "host", "gpu_index", "uuid", "name")
#: The column that gives each row's seen time in seconds, where the store knows it
#: (``Store.series``; docs/accounting.md, rule 3).
SEEN_COLUMN = "seen_s"


@dataclass(frozen=True)
class SeriesRead:
    """The arguments of one ``Store.series`` call, for reading several at once."""

    start_ns: int
    end_ns: int
    fields: Sequence[str] | None = None
    step_s: int | None = None
    hosts: Sequence[str] | None = None


def series_many(
    store: Store,
    reads: Sequence[SeriesRead],
    *,
    on_done: Callable[[], None] | None = None,
    shared: Any = None,
) -> list[pd.DataFrame]:
    """``store.series`` for each read; in one snapshot, sharing work, where the store can.
    ``on_done`` is called once per read as it is done (the dashboard's progress count);
    ``shared``: the ``shared_session`` of the view these reads are part of (requests that
    another batch of its reads sent are not sent again)."""
    batch = getattr(store, "series_many", None)
    if batch is not None and shared is not None:
        return list(batch(reads, on_done=on_done, shared=shared))
    if batch is not None:
        if on_done is None:
            return list(batch(reads))
        if "on_done" in inspect.signature(batch).parameters:
            return list(batch(reads, on_done=on_done))
        frames = list(batch(reads))  # a store that cannot say: all done at once
        for _ in reads:
            on_done()
        return frames
    out = []
    for r in reads:
        out.append(store.series(r.start_ns, r.end_ns, r.fields, step_s=r.step_s, hosts=r.hosts))
        if on_done is not None:
            on_done()
    return out


#: The columns of ``xid_events``: a row per sample that carries XID events, its last XID code
#: and how many XIDs the GPU raised since its previous sample.
XID_COLUMNS: tuple[str, ...] = (*KEY_COLUMNS, "xid_last", "xid_count")


def xid_events(
    store: Store, start_ns: int, end_ns: int, hosts: Sequence[str] | None = None
) -> pd.DataFrame | None:
    """The XID events of ``[start_ns, end_ns)`` (``XID_COLUMNS``, in time order) from the raw
    samples, whatever step a page draws at: a bucketed read keeps only a bucket's last value,
    so an XID inside a bucket would vanish. None where the store does not keep XIDs (each
    store that does says how it keeps them: ``promql_xids`` for Prometheus-compatible engines)."""
    read = getattr(store, "xid_events", None)
    if read is None:
        return None
    frame: pd.DataFrame = read(start_ns, end_ns, hosts=hosts)
    return frame


def xid_codes(events: pd.DataFrame | None) -> dict[tuple[str, int], list[int]] | None:
    """Each GPU's (host, index) XID codes in time order, from ``xid_events``; an XID whose code
    the source does not keep (a scraped collector's count) as 0. None: no events kept."""
    if events is None:
        return None
    out: dict[tuple[str, int], list[int]] = {}
    for host, idx, code in events[["host", "gpu_index", "xid_last"]].itertuples(index=False):
        out.setdefault((host, int(idx)), []).append(int(code) if code == code else 0)
    return out


def gpus_seen(store: Store, *, since_ns: int | None = None) -> list[GpuSeen]:
    """The GPUs of ``store.latest(since_ns=...)``, without their metrics, in its order: from the
    store's own ``gpus_seen`` where it has one (an engine: a GPU's newest sample time is one
    series, its newest values a dozen), else from ``latest``."""
    read = getattr(store, "gpus_seen", None)
    if read is not None:
        seen: list[GpuSeen] = read(since_ns=since_ns)
        return seen
    return [GpuSeen.of(s) for s in store.latest(since_ns=since_ns)]


#: Among ``latest_of``'s ``attrs``: each GPU's newest XID (``GpuSample.xid_errors``) as
#: ``latest`` gives it, beside the metrics.
XID_ATTR = "xid_errors"


def latest_of(
    store: Store, hosts: Sequence[str] | None = None, attrs: Sequence[str] | None = None
) -> list[GpuSample]:
    """``store.latest()`` of the GPUs of ``hosts`` alone (None: all), with at least the metrics
    ``attrs`` (None: all; ``XID_ATTR``: the newest XID too) and whether each GPU is lost: the
    store's own ``latest_of`` where it has one (an engine answers a node's GPUs, or a few
    metrics, for a fraction of the cost), else ``latest`` filtered (its samples whole)."""
    read = getattr(store, "latest_of", None)
    if read is not None:
        samples: list[GpuSample] = read(hosts, attrs=attrs)
        return samples
    wanted = None if hosts is None else set(hosts)
    return [s for s in store.latest() if wanted is None or s.host in wanted]


@runtime_checkable
class Store(Protocol):
    """Write samples; read windowed series and latest values."""

    def write_samples(self, samples: Sequence[GpuSample]) -> None:
        """Persist samples. Idempotent: writing the same sample twice stores it once.

        Raises ``StoreUnavailable`` when the store cannot be reached (the caller retries).
        """

    def write_lines(self, lines: Sequence[str]) -> None:
        """Persist ``nvidia_smi`` points in line protocol (the spool's format). Idempotent."""

    def latest(self, *, since_ns: int | None = None) -> list[GpuSample]:
        """The newest sample of every GPU (optionally only GPUs seen since ``since_ns``)."""

    def series(
        self,
        start_ns: int,
        end_ns: int,
        fields: Sequence[str] | None = None,
        *,
        step_s: int | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        """Samples with ``start_ns <= time_ns < end_ns``.

        ``fields`` are ``GpuSample`` attribute names (None: every numeric metric). With
        ``step_s`` the rows are per-GPU buckets of that many seconds: the mean of gauges and the
        last value of counters (``schema.COUNTER_ATTRS``), served from rollups where they exist.
        A bucket is keyed at its start, or at ``start_ns`` when the range starts inside it (it
        then holds only the samples from ``start_ns`` on: docs/accounting.md, rule 4).

        A store that knows the seen time adds the column ``seen_s`` (``SEEN_COLUMN``): a raw
        sample's slot (``rollup_rule.sample_seen_ns``: up to its GPU's next sample, at most one
        sampling interval, 0 for a lost-GPU marker), a bucket's the sum of its samples' slots,
        the same whichever level served it; NaN for a bucket rolled before the column existed.
        The embedded store gives it; a store without the column has its rows counted by their
        slot (docs/accounting.md, rule 3).
        """

    def count_samples(self, start_ns: int, end_ns: int) -> int:
        """How many GPU samples lie in ``[start_ns, end_ns)`` (lost-GPU markers included)."""

    def close(self) -> None: ...


def shared_session(store: Store, *, lean_minutes: bool = True) -> Any:
    """What the reads of one view pass as ``series_many(..., shared=)`` so that their batches
    send the engine requests they share once (``shared_reads``); None where the store has no
    such requests (the embedded store shares work within a batch, in one transaction).
    ``lean_minutes=False``: the view reads the same minutes in 1-minute buckets and to combine
    them (``SharedReads.lean_minutes``)."""
    make = getattr(store, "shared_reads", None)
    session = None if make is None else make()
    if session is not None:
        session.lean_minutes = lean_minutes
    return session


def series_in_parallel(
    store: Store,
    reads: Sequence[SeriesRead],
    *,
    on_done: Callable[[], None] | None = None,
    read: Callable[[SeriesRead], pd.DataFrame] | None = None,
) -> list[pd.DataFrame]:
    """``store.series`` (or ``read``) for each read, in parallel threads: a network engine
    answers them at once (the dashboard's range and its newest hour, say). ``on_done`` is
    called as each read is done."""

    def one(r: SeriesRead) -> pd.DataFrame:
        if read is not None:
            frame = read(r)
        else:
            frame = store.series(r.start_ns, r.end_ns, r.fields, step_s=r.step_s, hosts=r.hosts)
        if on_done is not None:
            on_done()
        return frame

    if len(reads) <= 1:
        return [one(r) for r in reads]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix="reads") as pool:
        return list(pool.map(one, reads))
