"""The one rollup rule: raw samples and any chain of finer levels give the same buckets."""

from __future__ import annotations

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
