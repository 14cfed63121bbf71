"""The rollup rule: how samples, and buckets of samples, combine into coarser buckets.

One function, ``combine``, used for every level and every engine (the embedded store's minute
and hour levels, the buckets a read asks for, and the rollups kept in InfluxDB or a
Prometheus-compatible engine), so that a figure does not depend on which level served it.

Level columns describe one row per (bucket, GPU): ``time_ns`` (bucket start), ``gpu_id``,
``n`` (samples), ``n_ok`` (samples not lost), ``t_last_ns`` (newest non-lost sample,
``NULL_TIME`` when none) and one float64 column per metric attribute (NaN: not measured).
Raw samples are level columns with ``n = 1`` (``as_level``).

- Gauges: in a minute, the mean over the non-lost samples where the metric is set; in a coarser
  bucket, the means of its minutes weighted by their non-lost samples (``n_ok``), over the
  minutes where the metric is set. Coarser buckets are always built from minutes, so a figure is
  the same whether it is read from raw samples, minutes or hours (a minute's mean stands for all
  its non-lost samples, measured or not).
- Counters and flags (``last_value_attrs``): the newest measured value, i.e. the value in the
  newest row (by its newest non-lost sample) where it is set.
- Seen time (``seen_ns``, additive): the sum of the slots of the bucket's samples
  (``sample_seen_ns``). A level without the column (rollups written before it existed) has
  ``seen_ns = UNKNOWN_SEEN`` and so has every bucket combined from one of them; readers then
  count such a bucket whole, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

_T = TypeVar("_T")

NULL_TIME = -(2**63)
MINUTE_NS = 60 * 10**9
FIVE_MINUTES_NS = 5 * MINUTE_NS
HOUR_NS = 60 * MINUTE_NS
#: The rollup levels every store keeps (the embedded store's ``rollups`` table, the engines'
#: ``gpuwatt_rollup_*``), finest first: minutes from raw samples, the others from minutes.
LEVELS: tuple[int, ...] = (MINUTE_NS, FIVE_MINUTES_NS, HOUR_NS)
#: The level each level is rolled from, and whose rows a read takes where the level is not
#: rolled (0: raw samples). Hours come from minutes, not from 5-minute buckets, for the reason
#: given at ``COMBINED_FURTHER``.
ROLLED_FROM: dict[int, int] = {MINUTE_NS: 0, FIVE_MINUTES_NS: MINUTE_NS, HOUR_NS: MINUTE_NS}
#: The levels rolled from minutes (read back), finest first.
COARSE_LEVELS: tuple[int, ...] = tuple(lv for lv in LEVELS if ROLLED_FROM[lv] == MINUTE_NS)
#: The levels whose buckets a read combines into a coarser step (a multiple of theirs). Not the
#: 5-minute level: a bucket's gauge mean is weighted by its ``n_ok`` whether or not the metric
#: was set in all of it, so a 10-minute step combined from 5-minute buckets would differ from
#: the one combined from minutes wherever a metric was unset for a whole minute; such steps
#: read minutes. (Hours serve multiples of an hour, as they always have.)
COMBINED_FURTHER: tuple[int, ...] = (MINUTE_NS, HOUR_NS)
KEYS = ("time_ns", "gpu_id", "n", "n_ok", "t_last_ns", "seen_ns")
#: ``seen_ns`` of a bucket whose seen time is not known (combined from rows without it).
UNKNOWN_SEEN = -1
#: A sample's slot is never longer than this: a sampling interval longer than a minute counts
#: one minute per sample.
MAX_SLOT_NS = MINUTE_NS
#: A spacing up to this factor times the sampling interval is still sampling (jitter, a late
#: round); a longer one is a gap (a collector down), of which one interval counts.
JITTER_FACTOR = 1.5
#: The sampling interval at a sample: the longest of its GPU's last few spacings (an extra
#: sample, a late round, do not shorten it).
INTERVAL_SPACINGS = 3
#: How far before and beyond the samples of a bucket a roller reads so that each sample's
#: neighbours that decide its slot are known (``samples_as_level``).
SLOT_LOOKBEHIND_NS = INTERVAL_SPACINGS * MAX_SLOT_NS
SLOT_LOOKAHEAD_NS = 3 * MAX_SLOT_NS


#: The margin a roller reads around its bucket first: enough where every GPU has its
#: neighbours within it (``neighbours_within``); a side where one lacks them is then read out
#: to the full look-around.
NEAR_MARGIN_NS = 8 * 10**9


def neighbours_within(
    time_ns: np.ndarray, gpu_id: np.ndarray, start_ns: int, end_ns: int
) -> tuple[bool, bool]:
    """Whether samples read around ``[start_ns, end_ns)`` hold, for every GPU with a sample in
    it, the ``INTERVAL_SPACINGS`` samples before it and the two after it that decide the slots
    of its samples in it (``sample_seen_ns``): per side, a wider read then gives the same."""
    t = np.asarray(time_ns, dtype=np.int64)
    g = np.asarray(gpu_id, dtype=np.int64)
    inside = (t >= start_ns) & (t < end_ns)
    if not inside.any():
        return True, True
    gpus, codes = np.unique(g, return_inverse=True)
    size = len(gpus)
    absent = np.bincount(codes[inside], minlength=size) == 0
    before = np.bincount(codes[t < start_ns], minlength=size) >= INTERVAL_SPACINGS
    after = np.bincount(codes[t >= end_ns], minlength=size) >= 2
    return bool(np.all(absent | before)), bool(np.all(absent | after))


@dataclass
class LookAroundHint:
    """Which sides of its range a source's last look-around had to read out to the full
    look-around (``read_around``): with a sampling interval over ``NEAR_MARGIN_NS`` / 3 the
    side before, at the newest data the side after, every time. The next read of the source
    sends those at once with its range instead of after it (an InfluxDB view: ~100 ms sooner).

    ``before_ns``: how far before its range the last look-around found every GPU's samples
    that decide slots in it (``reach_before_ns``), with ``BEFORE_MARGIN`` to spare: the side
    before is read that far first, the rest of the full look-behind only where it is not
    enough. At 10-second sampling that is ~45 s instead of 3 minutes (InfluxDB 1.6, 1,024
    GPUs: the side's query ~70 instead of ~150 ms)."""

    before: bool = False
    after: bool = False
    before_ns: int = SLOT_LOOKBEHIND_NS


#: The share added to the reach before a range the last look-around needed (sampling jitter,
#: a late round) when it is read first the next time (``LookAroundHint.before_ns``).
BEFORE_MARGIN = 0.5


def reach_before_ns(time_ns: np.ndarray, gpu_id: np.ndarray, start_ns: int, end_ns: int) -> int:
    """How far before ``start_ns`` the samples read reach that decide the slots of the samples
    in ``[start_ns, end_ns)``: the farthest, over the GPUs with a sample in it, of each one's
    ``INTERVAL_SPACINGS``-th sample before it (its oldest sample before it where it has fewer:
    the read held them all); 0 where none has a sample before it."""
    t = np.asarray(time_ns, dtype=np.int64)
    g = np.asarray(gpu_id, dtype=np.int64)
    inside = (t >= start_ns) & (t < end_ns)
    before = t < start_ns
    if not inside.any() or not before.any():
        return 0
    mine = before & np.isin(g, np.unique(g[inside]))
    tb, gb = t[mine], g[mine]
    if not len(tb):
        return 0
    order = np.lexsort((-tb, gb))  # by GPU, newest first
    tb, gb = tb[order], gb[order]
    first = np.flatnonzero(np.r_[True, gb[1:] != gb[:-1]])
    counts = np.diff(np.r_[first, len(gb)])
    nth = first + np.minimum(counts, INTERVAL_SPACINGS) - 1  # each GPU's decisive sample
    return int(start_ns - tb[nth].min())


def read_around(
    read: Callable[[int, int], _T],
    times: Callable[[_T], tuple[np.ndarray, np.ndarray]],
    concat: Callable[[list[_T]], _T],
    start_ns: int,
    end_ns: int,
    *,
    read_outside: Callable[[int, int], _T] | None = None,
    map_reads: Callable[[Callable[[tuple[int, int]], _T], list[tuple[int, int]]], Iterable[_T]]
    | None = None,
    hint: LookAroundHint | None = None,
) -> _T:
    """``read(lo, hi)`` of the samples in ``[start_ns, end_ns)`` and those around it that decide
    their slots: ``NEAR_MARGIN_NS`` each side, and on a side where a GPU lacks its neighbours
    (``neighbours_within``; ``times`` gives a read's sample times and GPU ids) the rest of the
    full look-around (``SLOT_LOOKBEHIND_NS`` before, ``SLOT_LOOKAHEAD_NS`` after), read apart
    and joined by ``concat``. At 1-s sampling a minute's roll reads 16 s more than the minute,
    not six minutes more; at the newest data the read after it finds nothing.

    The rest of the look-around decides slots by its sample times alone: ``read_outside``, where
    given, reads it instead of ``read`` (an engine then sends times, not every metric), and
    ``map_reads`` (``map`` where not given) runs its one or two reads (a thread pool's ``map``
    sends them to an engine at once). ``hint``: the sides the source's last look-around read
    out are read while the range is (a side then not needed is not used), the side before as
    far as it says first, and it is updated. The slots of the samples in the range are the same
    with any hint: the result holds them and, for every GPU, the samples around them that decide
    their slots (``neighbours_within``), if fewer before them where a hint said how far."""
    lo, hi = start_ns - NEAR_MARGIN_NS, end_ns + NEAR_MARGIN_NS
    far = start_ns - SLOT_LOOKBEHIND_NS
    # the side before read first as far as the hint says (all of it where it says so)
    first_lo = far if hint is None else min(lo, max(far, start_ns - hint.before_ns))
    before_span, after_span = (first_lo, lo), (hi, end_ns + SLOT_LOOKAHEAD_NS)
    rest_span = (far, first_lo)  # the rest of the look-behind, where the first was not enough
    outside = read if read_outside is None else read_outside
    sides = ((before_span, hint.before), (after_span, hint.after)) if hint is not None else ()
    guessed = [span for span, last_needed in sides if last_needed and span[0] < span[1]]
    early: dict[tuple[int, int], Future[_T]] = {}
    # (no thread starts until a side is guessed; leaving waits for one read early and not needed)
    with ThreadPoolExecutor(max(1, len(guessed)), "around-early") as pool:
        for span in guessed:
            early[span] = pool.submit(outside, *span)
            early[span].add_done_callback(lambda f: f.exception())  # one not needed may fail
        got = read(lo, hi)
        before_ok, after_ok = neighbours_within(*times(got), start_ns, end_ns)
        spans = [span for span, ok in ((before_span, before_ok), (after_span, after_ok)) if not ok]
        late = [span for span in spans if span not in early and span[0] < span[1]]
        run = map if map_reads is None else map_reads
        extra = dict(zip(late, run(lambda span: outside(*span), late), strict=True))
    if not spans:
        if hint is not None:
            hint.before = hint.after = False
        return got

    def part(span: tuple[int, int]) -> _T:
        return early[span].result() if span in early else extra[span]

    before: list[_T] = []
    if not before_ok:
        before = [part(before_span)] if before_span[0] < before_span[1] else []
        if rest_span[0] < rest_span[1]:
            near = concat([*before, got])
            if not neighbours_within(*times(near), start_ns, end_ns)[0]:
                before = [outside(*rest_span), *before]  # the first was not enough
    after = [] if after_ok else [part(after_span)]
    out = concat([*before, got, *after])
    if hint is not None:
        hint.before, hint.after = not before_ok, not after_ok
        if not before_ok:
            hint.before_ns = _reach_to_read_ns(*times(out), start_ns, end_ns)
    return out


def _reach_to_read_ns(time_ns: np.ndarray, gpu_id: np.ndarray, start_ns: int, end_ns: int) -> int:
    """How far before its range the next look-around reads first (``LookAroundHint``): the
    reach this one needed with ``BEFORE_MARGIN``, or the full look-behind where a GPU lacked
    its samples before the range in all of it (its first samples: the reach says nothing)."""
    if not neighbours_within(time_ns, gpu_id, start_ns, end_ns)[0]:
        return SLOT_LOOKBEHIND_NS
    reach = reach_before_ns(time_ns, gpu_id, start_ns, end_ns) * (1 + BEFORE_MARGIN)
    return min(SLOT_LOOKBEHIND_NS, max(NEAR_MARGIN_NS, round(reach)))


def sample_seen_ns(time_ns: np.ndarray, gpu_id: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """Per sample, how long it stands for its GPU being seen (docs/accounting.md, rule 3).

    A lost-GPU marker stands for nothing. Any other sample stands for its *slot*: from its
    time to its GPU's next sample (of any kind, a marker included), unless that is more than
    ``JITTER_FACTOR`` sampling intervals away (a gap: a collector down, a GPU gone without a
    marker), in which case one interval (no longer than the spacing from the previous sample).
    The sampling interval is the longest of the GPU's last ``INTERVAL_SPACINGS`` spacings up to
    the sample; a spacing no more than ``JITTER_FACTOR``
    times the one after it (the sampling slowed down) is no gap either. No slot is longer than
    ``MAX_SLOT_NS`` (a GPU's first samples, a lone sample: a minute at most). Only the samples
    within ``SLOT_LOOKBEHIND_NS`` before and ``SLOT_LOOKAHEAD_NS`` after a sample decide its
    slot, so a roller reading that much around its bucket gives each sample the slot a read of
    all the samples would; the samples may come in any order."""
    t = np.asarray(time_ns, dtype=np.int64)
    g = np.asarray(gpu_id, dtype=np.int64)
    order = np.lexsort((t, g))
    ts, gs = t[order], g[order]
    n = len(ts)
    big = np.iinfo(np.int64).max // 4
    nxt_gap = np.full(n, big, dtype=np.int64)
    prev_gap = np.full(n, big, dtype=np.int64)
    if n > 1:
        d = np.where(gs[1:] == gs[:-1], ts[1:] - ts[:-1], big)
        nxt_gap[:-1] = d
        prev_gap[1:] = d
    interval = prev_gap.copy()
    for k in range(1, INTERVAL_SPACINGS):  # the k-th spacing before, if of the same GPU
        back = np.full(n, big, dtype=np.int64)
        back[k:] = np.where(gs[k:] == gs[:-k], prev_gap[:-k], big)
        interval = np.maximum(interval, back)
    interval = np.minimum(interval, MAX_SLOT_NS)
    # the spacing after the next sample: a sampling interval that grows is not a gap
    after = np.full(n, big, dtype=np.int64)
    after[:-1] = np.where(nxt_gap[:-1] < big, nxt_gap[1:], big)
    after = np.where(after < big, np.minimum(after, MAX_SLOT_NS), 0)
    sampling = nxt_gap <= JITTER_FACTOR * np.maximum(interval, after)
    slot = np.where(sampling, nxt_gap, np.minimum(interval, prev_gap))
    slot = np.minimum(slot, MAX_SLOT_NS)
    out = np.empty(n, dtype=np.int64)
    out[order] = slot
    return np.where(np.asarray(lost, dtype=bool), 0, out)


def as_level(
    time_ns: np.ndarray,
    gpu_id: np.ndarray,
    lost: np.ndarray,
    values: dict[str, np.ndarray],
    *,
    seen_ns: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Raw samples as level columns: each sample its own bucket of one. ``seen_ns``: each
    sample's slot (``sample_seen_ns``); without it the seen time is ``UNKNOWN_SEEN``."""
    ok = ~np.asarray(lost, dtype=bool)
    t = np.asarray(time_ns, dtype=np.int64)
    seen = (
        np.full(len(t), UNKNOWN_SEEN, dtype=np.int64)
        if seen_ns is None
        else np.asarray(seen_ns, dtype=np.int64)
    )
    return {
        "time_ns": t,
        "gpu_id": np.asarray(gpu_id, dtype=np.int64),
        "n": np.ones(len(t), dtype=np.int64),
        "n_ok": ok.astype(np.int64),
        "t_last_ns": np.where(ok, t, NULL_TIME),
        "seen_ns": seen,
    } | {a: np.where(ok, np.asarray(v, dtype=np.float64), np.nan) for a, v in values.items()}


def samples_as_level(
    time_ns: np.ndarray,
    gpu_id: np.ndarray,
    lost: np.ndarray,
    values: dict[str, np.ndarray],
    *,
    start_ns: int,
    end_ns: int,
) -> dict[str, np.ndarray]:
    """Raw samples read over ``[start_ns - SLOT_LOOKBEHIND_NS, end_ns + SLOT_LOOKAHEAD_NS)``
    as the level columns of those in ``[start_ns, end_ns)``, with their seen time."""
    t = np.asarray(time_ns, dtype=np.int64)
    seen = sample_seen_ns(t, gpu_id, lost)
    keep = (t >= start_ns) & (t < end_ns)
    return as_level(
        t[keep],
        np.asarray(gpu_id)[keep],
        np.asarray(lost)[keep],
        {a: np.asarray(v)[keep] for a, v in values.items()},
        seen_ns=seen[keep],
    )


def level_for(step_ns: int) -> int:
    """The coarsest rollup level that answers ``step_ns`` exactly as the levels below it would
    (0: none, raw samples): its own step, or a multiple of it where it is combined further
    (``COMBINED_FURTHER``)."""
    for level in reversed(LEVELS):
        if step_ns == level or (step_ns % level == 0 and level in COMBINED_FURTHER):
            return level
    return 0


def combine(
    cols: dict[str, np.ndarray],
    step_ns: int,
    attrs: Sequence[str],
    last_value_attrs: Collection[str],
    *,
    level_ns: int = MINUTE_NS,
) -> dict[str, np.ndarray]:
    """Level columns of ``level_ns`` buckets (0: raw samples), in any order, aggregated into
    ``step_ns`` buckets per GPU, ordered by bucket and GPU id. Finer than a minute into coarser
    than a minute goes through minutes. A missing ``n`` column counts as ``n_ok``."""
    if level_ns < MINUTE_NS < step_ns and step_ns % MINUTE_NS == 0:
        cols = _combine(cols, MINUTE_NS, attrs, last_value_attrs)
    return _combine(cols, step_ns, attrs, last_value_attrs)


def _combine(
    cols: dict[str, np.ndarray],
    step_ns: int,
    attrs: Sequence[str],
    last_value_attrs: Collection[str],
) -> dict[str, np.ndarray]:
    t = cols["time_ns"] // step_ns * step_ns
    gid = cols["gpu_id"]
    if len(t) == 0:
        return {k: np.zeros(0, np.int64) for k in KEYS} | {a: np.zeros(0) for a in attrs}
    order = np.lexsort((cols["t_last_ns"], gid, t))  # by bucket, GPU, then newest last
    t_s, g_s = t[order], gid[order]
    new = np.r_[True, (t_s[1:] != t_s[:-1]) | (g_s[1:] != g_s[:-1])]
    starts = np.flatnonzero(new)
    n_ok = cols["n_ok"][order]
    n = cols["n"][order] if "n" in cols else n_ok
    out = {
        "time_ns": t_s[starts],
        "gpu_id": g_s[starts],
        "n": np.add.reduceat(n, starts),
        "n_ok": np.add.reduceat(n_ok, starts),
        "t_last_ns": np.maximum.reduceat(cols["t_last_ns"][order], starts),
        "seen_ns": _sum_seen(cols, order, starts),
    }
    weight = n_ok.astype(np.float64)
    for a in attrs:
        v = cols[a][order]
        if a in last_value_attrs:
            # The newest measured value: slow counters (ECC, remapped rows) are sampled once a
            # minute, so the newest sample of a bucket usually does not hold them.
            newest = np.maximum.reduceat(np.where(np.isfinite(v), np.arange(len(v)), -1), starts)
            out[a] = np.where(newest >= starts, v[np.maximum(newest, 0)], np.nan)
            continue
        ok = np.isfinite(v) & (weight > 0)
        num = np.add.reduceat(np.where(ok, v * weight, 0.0), starts)
        den = np.add.reduceat(np.where(ok, weight, 0.0), starts)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[a] = np.where(den > 0, num / den, np.nan)
    return out


def _sum_seen(cols: dict[str, np.ndarray], order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Seen time per output bucket: the sum of its rows', ``UNKNOWN_SEEN`` where one of them
    (or the whole level: rows written before the column) does not know it."""
    if "seen_ns" not in cols:
        return np.full(len(starts), UNKNOWN_SEEN, dtype=np.int64)
    seen = np.asarray(cols["seen_ns"], dtype=np.int64)[order]
    unknown = np.add.reduceat((seen < 0).astype(np.int64), starts) > 0
    total = np.add.reduceat(np.maximum(seen, 0), starts)
    return np.where(unknown, UNKNOWN_SEEN, total)
