"""The one rollup rule: raw samples and any chain of finer levels give the same buckets."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatt.store import rollup_rule

MINUTE_NS = 60 * 10**9
ATTRS = ("util", "energy")
LAST = frozenset({"energy"})


@st.composite
def samples(draw: st.DrawFn) -> dict[str, np.ndarray]:
    n = draw(st.integers(1, 200))
    t = np.sort(np.array(draw(st.lists(st.integers(0, 30 * MINUTE_NS), min_size=n, max_size=n))))
    gid = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    lost = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    util = np.array(
        draw(st.lists(st.one_of(st.just(np.nan), st.floats(0, 100)), min_size=n, max_size=n))
    )
    # A counter rising with time, not measured in some samples (a slow counter).
    measured = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    energy = np.where(measured, t.astype(np.float64) / 1e9, np.nan)
    return rollup_rule.as_level(t, gid, lost, {"util": util, "energy": energy})


def _expected(cols: dict[str, np.ndarray], step_ns: int) -> dict[tuple[int, int], tuple]:
    """Per (bucket, GPU): samples, non-lost samples, the gauge's mean of minute means weighted
    by each minute's non-lost samples, the counter's newest value."""
    out: dict[tuple[int, int], tuple] = {}
    buckets = cols["time_ns"] // step_ns * step_ns
    for key in sorted(set(zip(buckets.tolist(), cols["gpu_id"].tolist(), strict=True))):
        sel = (buckets == key[0]) & (cols["gpu_id"] == key[1])
        ok = sel & (cols["n_ok"] == 1)
        minute = cols["time_ns"] // MINUTE_NS
        num = den = 0.0
        for m in sorted(set(minute[ok].tolist())):
            in_minute = ok & (minute == m)
            u = cols["util"][in_minute]
            u = u[~np.isnan(u)]
            if len(u):
                num += float(u.mean()) * int(in_minute.sum())
                den += int(in_minute.sum())
        mean = num / den if den else np.nan
        e = cols["energy"][ok]
        e = e[~np.isnan(e)]
        newest = float(e[-1]) if len(e) else np.nan
        out[key] = (int(sel.sum()), int(ok.sum()), mean, newest)
    return out


def _as_dict(cols: dict[str, np.ndarray]) -> dict[tuple[int, int], tuple]:
    return {
        (int(t), int(g)): (int(n), int(k), float(u), float(e))
        for t, g, n, k, u, e in zip(
            cols["time_ns"],
            cols["gpu_id"],
            cols["n"],
            cols["n_ok"],
            cols["util"],
            cols["energy"],
            strict=True,
        )
    }


def _close(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        for x, y in zip(a[k], b[k], strict=True):
            if np.isnan(x) != np.isnan(y) or (
                not np.isnan(x) and abs(x - y) > 1e-9 * max(1, abs(y))
            ):
                return False
    return True


@settings(max_examples=200, deadline=None)
@given(samples(), st.sampled_from([MINUTE_NS, 5 * MINUTE_NS, 60 * MINUTE_NS]))
def test_buckets_from_samples_follow_the_rule(raw: dict[str, np.ndarray], step_ns: int) -> None:
    got = _as_dict(rollup_rule.combine(raw, step_ns, ATTRS, LAST, level_ns=0))
    assert _close(got, _expected(raw, step_ns))


@settings(max_examples=200, deadline=None)
@given(samples(), st.sampled_from([5 * MINUTE_NS, 60 * MINUTE_NS]))
def test_buckets_of_buckets_equal_buckets_of_samples(
    raw: dict[str, np.ndarray], step_ns: int
) -> None:
    minutes = rollup_rule.combine(raw, MINUTE_NS, ATTRS, LAST, level_ns=0)
    via_minutes = _as_dict(rollup_rule.combine(minutes, step_ns, ATTRS, LAST))
    direct = _as_dict(rollup_rule.combine(raw, step_ns, ATTRS, LAST, level_ns=0))
    assert _close(via_minutes, direct)


S = 10**9


def _slots_s(times_s: list[float], lost: list[bool] | None = None) -> list[float]:
    t = np.array([round(x * S) for x in times_s], dtype=np.int64)
    flags = np.array(lost if lost is not None else [False] * len(t))
    return (rollup_rule.sample_seen_ns(t, np.zeros(len(t), np.int64), flags) / S).tolist()


def test_a_sample_stands_for_the_time_to_the_next_unless_that_is_a_gap() -> None:
    # regular 30 s, then a collector gap of an hour: the sample before it counts one interval
    assert _slots_s([0, 30, 60, 90, 3690, 3720, 3750]) == [30, 30, 30, 30, 30, 30, 30]
    # a late round (11 s), then a missed one: the late one is sampling, the missed one a gap
    late_then_missed = [0, 30, 71, 90, 120, 150, 180, 240, 270]
    assert _slots_s(late_then_missed) == [30, 41, 19, 30, 30, 30, 30, 30, 30]
    # faster, then slower sampling: no time lost at either change
    assert _slots_s([0, 30, 40, 50, 60, 90, 120]) == [30, 10, 10, 10, 30, 30, 30]
    # a lost-GPU marker ends the slot before it and stands for nothing
    assert _slots_s([0, 30, 60, 90], [False, False, True, True]) == [30, 30, 0, 0]
    # a lone sample: at most a minute; sparse sampling: a minute per sample
    assert _slots_s([5]) == [60]
    assert _slots_s([0, 300, 600]) == [60, 60, 60]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 90), min_size=2, max_size=150),
    st.integers(0, 10 * MINUTE_NS),
    st.integers(1, 10 * MINUTE_NS),
)
def test_a_roller_reading_around_its_bucket_gives_the_slots_of_a_whole_read(
    spacings_s: list[int], lo_ns: int, length_ns: int
) -> None:
    """``samples_as_level`` over ``[lo, hi)`` from the samples read with the lookbehind and
    lookahead gives each sample the seen time a read of every sample gives it."""
    t = np.cumsum(np.array(spacings_s, dtype=np.int64) * S)
    gid = np.arange(len(t)) % 2
    lost = (np.arange(len(t)) % 7) == 3
    whole = rollup_rule.sample_seen_ns(t, gid, lost)
    hi_ns = lo_ns + length_ns
    near = (t >= lo_ns - rollup_rule.SLOT_LOOKBEHIND_NS) & (
        t < hi_ns + rollup_rule.SLOT_LOOKAHEAD_NS
    )
    cols = rollup_rule.samples_as_level(
        t[near], gid[near], lost[near], {}, start_ns=lo_ns, end_ns=hi_ns
    )
    inside = (t >= lo_ns) & (t < hi_ns)
    assert cols["seen_ns"].tolist() == whole[inside].tolist()
    # the narrowest read that holds every GPU's neighbours gives the same
    spans: list[tuple[int, int]] = []

    def read_one(a: int, b: int) -> np.ndarray:
        spans.append((a, b))
        return np.flatnonzero((t >= a) & (t < b))

    narrow = rollup_rule.read_around(
        read_one,
        lambda i: (t[i], gid[i]),
        np.concatenate,
        lo_ns,
        hi_ns,
    )
    cols = rollup_rule.samples_as_level(
        t[narrow], gid[narrow], lost[narrow], {}, start_ns=lo_ns, end_ns=hi_ns
    )
    assert cols["seen_ns"].tolist() == whole[inside].tolist()
    # the rest of the look-around read by its own reader, its reads sent at once: the same
    outside: list[tuple[int, int]] = []

    def read_outside(a: int, b: int) -> np.ndarray:
        outside.append((a, b))
        return np.flatnonzero((t >= a) & (t < b))

    def at_once(
        fn: Callable[[tuple[int, int]], np.ndarray], spans: list[tuple[int, int]]
    ) -> list[np.ndarray]:
        return [fn(span) for span in reversed(spans)][::-1]  # asked in another order

    def read_split(hint: rollup_rule.LookAroundHint | None) -> np.ndarray:
        outside.clear()
        return rollup_rule.read_around(
            lambda a, b: np.flatnonzero((t >= a) & (t < b)),
            lambda i: (t[i], gid[i]),
            np.concatenate,
            lo_ns,
            hi_ns,
            read_outside=read_outside,
            map_reads=at_once,
            hint=hint,
        )

    # the rest of the look-around read by its own reader, its reads sent at once; and with the
    # sides the last read needed read early, whichever they were (a hint): the same, the hint
    # then names the sides this read needed, and each side is read once
    near_lo, near_hi = lo_ns - rollup_rule.NEAR_MARGIN_NS, hi_ns + rollup_rule.NEAR_MARGIN_NS
    needed = (any(b <= near_lo for _, b in spans[1:]), any(a >= near_hi for a, _ in spans[1:]))
    for guess in [None, *itertools.product((False, True), repeat=2)]:
        hint = None if guess is None else rollup_rule.LookAroundHint(*guess)
        split = read_split(hint)
        assert sorted(split.tolist()) == sorted(narrow.tolist())
        assert all(b <= near_lo or a >= near_hi for a, b in outside)
        if guess is None:
            # exactly the spans the single reader read beyond the near window went to the other
            assert sorted(outside) == sorted(spans[1:])
        else:
            assert hint is not None and (hint.before, hint.after) == needed
            # early where guessed, after the range where needed and not guessed
            sides = max(guess[0], needed[0]) + max(guess[1], needed[1])
            assert len(outside) == len(set(outside)) == sides
    # the side before read first only as far as a hint says (any reach): the same slots, the
    # rest of the look-behind read where that was not enough, no sample read twice
    for reach_s in (0, 9, 31, 95, 240):
        hint = rollup_rule.LookAroundHint(True, False, reach_s * S)
        split = read_split(hint)
        assert len(split) == len(set(split.tolist()))
        cols = rollup_rule.samples_as_level(
            t[split], gid[split], lost[split], {}, start_ns=lo_ns, end_ns=hi_ns
        )
        assert cols["seen_ns"].tolist() == whole[inside].tolist()
        assert set(split.tolist()) <= set(narrow.tolist())
        assert all(b <= near_lo or a >= near_hi for a, b in outside)


def test_a_look_around_learns_how_far_before_its_range_to_read() -> None:
    """At 10-second sampling the side before is read out to the full look-behind once; the next
    read of the same source reads ~45 s first, and that is enough."""
    t = np.repeat(np.arange(0, 20 * MINUTE_NS, 10 * S, dtype=np.int64), 2)
    gid = np.tile(np.array([0, 1], dtype=np.int64), len(t) // 2)
    spans: list[tuple[int, int]] = []

    def read_outside(a: int, b: int) -> np.ndarray:
        spans.append((a, b))
        return np.flatnonzero((t >= a) & (t < b))

    hint = rollup_rule.LookAroundHint(before=True)
    for minute in (10, 11):
        spans.clear()
        lo_ns = minute * MINUTE_NS
        got = rollup_rule.read_around(
            lambda a, b: np.flatnonzero((t >= a) & (t < b)),
            lambda i: (t[i], gid[i]),
            np.concatenate,
            lo_ns,
            lo_ns + MINUTE_NS,
            read_outside=read_outside,
            hint=hint,
        )
        before = [(a, b) for a, b in spans if b <= lo_ns]
        assert len(before) == 1  # read once, early, and enough
        first = before[0][0]
        reach = {10: rollup_rule.SLOT_LOOKBEHIND_NS, 11: 45 * S}[minute]
        assert first == lo_ns - reach
        assert (t[got] < lo_ns).sum() == 2 * len(range(first, lo_ns - 8 * S, 10 * S))
        assert hint.before_ns == 45 * S  # the 3rd sample before, 30 s, and half of it to spare
    # a hint that reached too little (the sampling slowed, a gap): the rest of the look-behind
    # is read and the slots are those a read of every sample gives (random sampling, seeded)
    rng = np.random.default_rng(7)
    rest_read = 0
    for _ in range(300):
        t = np.cumsum(rng.integers(1, 91, size=int(rng.integers(2, 150))) * S)
        gid = np.arange(len(t)) % 2
        lost = (np.arange(len(t)) % 7) == 3
        lo_ns = int(rng.integers(0, 10 * MINUTE_NS))
        hi_ns = lo_ns + int(rng.integers(1, 10 * MINUTE_NS))
        reach_ns = int(rng.integers(0, rollup_rule.SLOT_LOOKBEHIND_NS))
        hint = rollup_rule.LookAroundHint(before=True, before_ns=reach_ns)
        spans.clear()
        got = rollup_rule.read_around(
            lambda a, b, t=t: np.flatnonzero((t >= a) & (t < b)),
            lambda i, t=t, gid=gid: (t[i], gid[i]),
            np.concatenate,
            lo_ns,
            hi_ns,
            read_outside=read_outside,
            hint=hint,
        )
        far = lo_ns - rollup_rule.SLOT_LOOKBEHIND_NS
        first = min(lo_ns - rollup_rule.NEAR_MARGIN_NS, max(far, lo_ns - reach_ns))
        rest_read += first > far and (far, first) in spans
        cols = rollup_rule.samples_as_level(
            t[got], gid[got], lost[got], {}, start_ns=lo_ns, end_ns=hi_ns
        )
        inside = (t >= lo_ns) & (t < hi_ns)
        assert cols["seen_ns"].tolist() == rollup_rule.sample_seen_ns(t, gid, lost)[inside].tolist()
    assert rest_read > 30  # the case was met


def test_seen_time_adds_up_and_a_bucket_without_it_stays_unknown() -> None:
    t = np.arange(0, 3 * MINUTE_NS, 20 * S, dtype=np.int64)
    gid = np.zeros(len(t), np.int64)
    lost = np.zeros(len(t), bool)
    raw = rollup_rule.as_level(t, gid, lost, {}, seen_ns=rollup_rule.sample_seen_ns(t, gid, lost))
    minutes = rollup_rule.combine(raw, MINUTE_NS, (), (), level_ns=0)
    assert minutes["seen_ns"].tolist() == [60 * S] * 3
    assert rollup_rule.combine(minutes, 3 * MINUTE_NS, (), ())["seen_ns"].tolist() == [180 * S]
    old = {k: v for k, v in minutes.items() if k != "seen_ns"}  # rolled before the column
    assert rollup_rule.combine(old, 3 * MINUTE_NS, (), ())["seen_ns"].tolist() == [-1]
    mixed = minutes | {"seen_ns": np.array([60 * S, -1, 60 * S])}
    assert rollup_rule.combine(mixed, 3 * MINUTE_NS, (), ())["seen_ns"].tolist() == [-1]
