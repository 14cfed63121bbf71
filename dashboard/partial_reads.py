"""Partial results when an engine is too slow for a whole range: what arrived, and a label.

A long range of a large cluster can take an engine longer than the store's read timeout. Rather
than a blank page, the dashboard then reads each range in parts (newest first, cut on bucket
boundaries so that every bucket is read whole and the parts add up to the range), keeps the
parts the engine answered and says which are missing ("partial: the engine answered 4 of 6
parts"). Only a read where no part at all arrives is an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import pairwise

import pandas as pd

from gpuwatt.errors import StoreUnavailable
from gpuwatt.model import METRIC_FIELDS
from gpuwatt.store.base import KEY_COLUMNS, SeriesRead, Store

NS_PER_S = 1_000_000_000
#: How many parts a long read is cut into (at most: never finer than one bucket).
PARTS = 6
#: Reads shorter than this are never cut (the context before a range, the newest minutes).
MIN_PART_S = 600


@dataclass(frozen=True)
class Partial:
    """Which parts of a view's reads the engine answered."""

    answered: int
    total: int
    #: ``[start_ns, end_ns)`` of each part that did not arrive, oldest first
    missing: tuple[tuple[int, int], ...]

    @property
    def label(self) -> str:
        """What the page says above the figures."""
        spans = ", ".join(
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(lo / NS_PER_S))}"
            f"-{time.strftime('%H:%M', time.gmtime(hi / NS_PER_S))} UTC"
            for lo, hi in self.missing
        )
        return (
            f"partial: the engine answered {self.answered} of {self.total} parts in time; "
            f"missing {spans}"
        )


def split_read(read: SeriesRead, parts: int = PARTS) -> list[SeriesRead]:
    """``read`` cut into at most ``parts`` consecutive reads on bucket boundaries, newest first.

    Buckets are aligned to the epoch, so a part boundary on a multiple of ``step_s`` leaves every
    bucket whole in one part; a raw read (no step) is cut on whole seconds.
    """
    span_ns = read.end_ns - read.start_ns
    if span_ns < MIN_PART_S * NS_PER_S or parts < 2:
        return [read]
    grain_ns = (read.step_s or 1) * NS_PER_S
    size_ns = -(-span_ns // parts // grain_ns) * grain_ns
    cuts = [read.start_ns]
    edge = -(-(read.start_ns + size_ns) // grain_ns) * grain_ns
    while edge < read.end_ns:
        cuts.append(edge)
        edge += size_ns
    cuts.append(read.end_ns)
    out = [replace(read, start_ns=lo, end_ns=hi) for lo, hi in pairwise(cuts)]
    return out[::-1]


def parts_of(reads: Sequence[SeriesRead], parts: int = PARTS) -> int:
    """How many reads ``read_in_parts`` sends for ``reads``."""
    return sum(len(split_read(r, parts)) for r in reads)


def read_in_parts(
    store: Store,
    reads: Sequence[SeriesRead],
    parts: int = PARTS,
    *,
    on_done: Callable[[], None] | None = None,
) -> tuple[list[pd.DataFrame], Partial]:
    """Each read's rows from the parts the engine answered, and which parts did not arrive.

    The parts of every read go to the engine at once, newest first; a part that fails with
    ``StoreUnavailable`` (a timeout, the engine gone) is left out. Raises the first failure when
    no part arrived at all. ``on_done`` is called as each part is answered or fails.
    """
    plan = [split_read(r, parts) for r in reads]
    flat = [(i, p) for i, ps in enumerate(plan) for p in ps]

    def one(part: SeriesRead) -> pd.DataFrame | StoreUnavailable:
        try:
            return store.series(
                part.start_ns, part.end_ns, part.fields, step_s=part.step_s, hosts=part.hosts
            )
        except StoreUnavailable as exc:
            return exc
        finally:
            if on_done is not None:
                on_done()

    with ThreadPoolExecutor(max_workers=min(8, len(flat)), thread_name_prefix="parts") as pool:
        results = list(pool.map(one, [p for _, p in flat]))
    failures = [r for r in results if isinstance(r, StoreUnavailable)]
    if len(failures) == len(results):
        raise failures[0]
    got: list[list[pd.DataFrame]] = [[] for _ in reads]
    missing: list[tuple[int, int]] = []
    for (i, part), result in zip(flat, results, strict=True):
        if isinstance(result, StoreUnavailable):
            missing.append((part.start_ns, part.end_ns))
        else:
            got[i].append(result)
    frames = [_joined(fs, r) for fs, r in zip(got, reads, strict=True)]
    partial = Partial(len(results) - len(failures), len(results), tuple(sorted(set(missing))))
    return frames, partial


def joined_partial(*phases: tuple[Sequence[SeriesRead], Partial | None]) -> Partial | None:
    """One ``Partial`` for a view whose reads went to the store in several calls (``phases``:
    each call's reads and its ``Partial``, None where they arrived whole): None where every
    call's did."""
    if all(p is None for _, p in phases):
        return None
    answered = total = 0
    missing: set[tuple[int, int]] = set()
    for reads, partial in phases:
        if partial is None:  # arrived whole: as many parts as a read in parts would have sent
            answered, total = answered + parts_of(reads), total + parts_of(reads)
        else:
            answered, total = answered + partial.answered, total + partial.total
            missing.update(partial.missing)
    return Partial(answered, total, tuple(sorted(missing)))


def _joined(frames: list[pd.DataFrame], read: SeriesRead) -> pd.DataFrame:
    """The parts of one read as one frame in the store's order (time, then GPU)."""
    kept = [f for f in frames if len(f)]
    if not kept:
        if frames:
            return frames[0]
        # no part of this read arrived: no rows, the columns the store would have sent
        attrs = tuple(read.fields) if read.fields is not None else METRIC_FIELDS
        dtypes = {"time_ns": "int64", "gpu_index": "int64", **dict.fromkeys(attrs, "float64")}
        return pd.DataFrame(columns=[*KEY_COLUMNS, *attrs]).astype(dtypes)
    if len(kept) == 1:
        return kept[0].reset_index(drop=True)
    both = pd.concat(kept, ignore_index=True)
    order = ["time_ns", "host", "gpu_index", "uuid"]
    return both.sort_values(order, kind="stable").reset_index(drop=True)
