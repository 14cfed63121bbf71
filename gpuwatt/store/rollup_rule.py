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
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

NULL_TIME = -(2**63)
MINUTE_NS = 60 * 10**9
KEYS = ("time_ns", "gpu_id", "n", "n_ok", "t_last_ns")


def as_level(
    time_ns: np.ndarray, gpu_id: np.ndarray, lost: np.ndarray, values: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Raw samples as level columns: each sample its own bucket of one."""
    ok = ~np.asarray(lost, dtype=bool)
    t = np.asarray(time_ns, dtype=np.int64)
    return {
        "time_ns": t,
        "gpu_id": np.asarray(gpu_id, dtype=np.int64),
        "n": np.ones(len(t), dtype=np.int64),
        "n_ok": ok.astype(np.int64),
        "t_last_ns": np.where(ok, t, NULL_TIME),
    } | {a: np.where(ok, np.asarray(v, dtype=np.float64), np.nan) for a, v in values.items()}


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
