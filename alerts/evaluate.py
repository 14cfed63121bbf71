"""Pure evaluation of one rule over store data at an injected time.

``evaluate_rule(rule, store, now_ns)`` reads ``[now_ns - window, now_ns]`` and returns one
``Observation`` per target (a GPU, a node, or the cluster) the rule can judge. A target with no
observation has no data: the state machine treats it as "condition not met". No clock reads here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.alerts.clock import NS_PER_S
from gpuwatt.alerts.rules import (
    AnalyticsQuery,
    DeadmanQuery,
    EventQuery,
    IncreaseQuery,
    Rule,
    ThresholdQuery,
    compare,
)
from gpuwatt.model import GpuSample
from gpuwatt.precision import settled
from gpuwatt.store.base import Store, xid_events

#: Windows longer than this are read as 1-minute rollups instead of raw samples.
RAW_WINDOW_MAX_S = 900.0
_GPU_KEYS = ["host", "gpu_index", "uuid", "name"]


@dataclass(frozen=True, slots=True)
class Observation:
    """What a rule saw for one target at one evaluation."""

    target: dict[str, str]  # host, gpu, uuid, gpu_name (empty for cluster-wide rules)
    value: float | None
    breach: bool  # the condition holds against the threshold
    holding: bool  # the condition holds against the recovery threshold (keeps a firing alert)
    detail: str = ""


def gpu_target(host: str, gpu_index: int, uuid: str, name: str) -> dict[str, str]:
    return {"host": host, "gpu": str(int(gpu_index)), "uuid": uuid, "gpu_name": name}


def evaluate_rule(rule: Rule, store: Store, now_ns: int) -> list[Observation]:
    q = rule.query
    if isinstance(q, ThresholdQuery):
        return _threshold(q, store, now_ns)
    if isinstance(q, IncreaseQuery):
        return _increase(q, store, now_ns)
    if isinstance(q, DeadmanQuery):
        return _deadman(q, store.latest(), now_ns)
    if isinstance(q, EventQuery):
        return _event(q, store, now_ns)
    return _analytics(q, store, now_ns)


def _read(store: Store, now_ns: int, window_s: float, fields: Sequence[str]) -> pd.DataFrame:
    start_ns = now_ns - round(window_s * NS_PER_S)
    step_s = 60 if window_s > RAW_WINDOW_MAX_S else None
    return store.series(start_ns, now_ns + 1, list(dict.fromkeys(fields)), step_s=step_s)


def _holding(value: float, op: str, threshold: float, recovery: float | None) -> tuple[bool, bool]:
    """Whether ``value`` breaches the threshold, and holds against the recovery threshold:
    compared settled (``gpuwatt.precision``), so a value at the threshold breaches it, or not,
    alike on every store."""
    value = settled(value)
    breach = compare(value, op, threshold)
    holding = breach if recovery is None else compare(value, op, recovery)
    return breach, holding


def _threshold(q: ThresholdQuery, store: Store, now_ns: int) -> list[Observation]:
    fields = [q.metric] + ([q.relative_to] if q.relative_to else [])
    df = _read(store, now_ns, q.window_s, fields)
    if df.empty:
        return []
    v = df[q.metric]
    if q.relative_to:
        denom = df[q.relative_to]
        v = v / denom.where(denom > 0)
    if q.mask is not None:
        known = v.notna()
        bits = np.bitwise_and(v.fillna(0).astype("int64"), q.mask) != 0
        v = pd.Series(np.where(known, bits.astype(float), np.nan), index=df.index)
    df = df.assign(_v=v).dropna(subset=["_v"])
    agg = {"avg": "mean", "min": "min", "max": "max", "last": "last", "fraction": "mean"}
    values = df.groupby(_GPU_KEYS, sort=True)["_v"].agg(agg[q.aggregation])
    out = []
    for (host, idx, uuid, name), value in values.items():
        breach, holding = _holding(float(value), q.op, q.threshold, q.recovery_threshold)
        out.append(Observation(gpu_target(host, idx, uuid, name), float(value), breach, holding))
    return out


def _increase(q: IncreaseQuery, store: Store, now_ns: int) -> list[Observation]:
    df = _read(store, now_ns, q.window_s, [q.metric]).dropna(subset=[q.metric])
    if df.empty:
        return []
    out = []
    for (host, idx, uuid, name), g in df.groupby(_GPU_KEYS, sort=True):
        # sum of positive steps: a counter that resets (driver reload) does not count negative
        increase = float(g[q.metric].diff().clip(lower=0).sum())
        breach = settled(increase) > q.threshold
        out.append(Observation(gpu_target(host, idx, uuid, name), increase, breach, breach))
    return out


def _deadman(q: DeadmanQuery, latest: list[GpuSample], now_ns: int) -> list[Observation]:
    limit_ns = round(q.silent_for_s * NS_PER_S)
    host_last: dict[str, int] = {}
    for s in latest:
        host_last[s.host] = max(host_last.get(s.host, s.time_ns), s.time_ns)
    down = {h for h, t in host_last.items() if now_ns - t > limit_ns}
    out: list[Observation] = []
    if q.scope == "host":
        for host, t in sorted(host_last.items()):
            silent_s = max(0.0, (now_ns - t) / NS_PER_S)
            breach = host in down
            detail = f"no sample from {host} for {silent_s:.0f} s" if breach else ""
            out.append(Observation({"host": host}, silent_s, breach, breach, detail))
        return out
    for s in latest:
        if s.host in down:
            continue  # the node-down alert speaks for its GPUs
        silent_s = max(0.0, (now_ns - s.time_ns) / NS_PER_S)
        silent = now_ns - s.time_ns > limit_ns
        breach = s.lost or silent
        detail = (
            "NVML reports the GPU lost"
            if s.lost
            else (f"GPU silent for {silent_s:.0f} s while its node reports" if silent else "")
        )
        target = gpu_target(s.host, s.gpu_index, s.uuid, s.name)
        out.append(Observation(target, silent_s, breach, breach, detail))
    return out


def _event(q: EventQuery, store: Store, now_ns: int) -> list[Observation]:
    """An observation per GPU that raised a matching XID within the window: every sample's
    XIDs (``xid_events``), not only the newest sample's (a collector samples every second, the
    evaluator runs every 15 s). A store that keeps no XID events: the newest samples' XIDs.
    Codes a source does not keep (gpuwatt's ``/metrics`` counts XIDs) match ``codes: any``."""
    GpuKey = tuple[str, int, str, str]
    raised: dict[GpuKey, list[float]] = {}
    events = xid_events(store, now_ns - round(q.window_s * NS_PER_S), now_ns + 1)
    if events is None:
        for s in store.latest(since_ns=now_ns - 60 * NS_PER_S):
            if s.xid_errors:
                raised[(s.host, s.gpu_index, s.uuid, s.name)] = [float(x) for x in s.xid_errors]
    else:
        rows = events[[*_GPU_KEYS, "xid_last"]].itertuples(index=False)
        for host, idx, uuid, name, code in rows:
            raised.setdefault((host, int(idx), uuid, name), []).append(float(code))
    out = []
    for (host, idx, uuid, name), codes in raised.items():
        known = [int(c) for c in codes if c == c]  # NaN: a code the source does not keep
        hits = list(dict.fromkeys(c for c in known if not q.codes or c in q.codes))
        if q.codes and not hits:
            continue
        detail = f"XID {', '.join(map(str, hits))}" if hits else "XID (code not kept)"
        value = float(hits[-1]) if hits else None
        out.append(Observation(gpu_target(host, idx, uuid, name), value, True, True, detail))
    return out


def _analytics(q: AnalyticsQuery, store: Store, now_ns: int) -> list[Observation]:
    from gpuwatt.analytics import analyze
    from gpuwatt.analytics.findings import IDLE_SEVERITY
    from gpuwatt.analytics.inputs import read_analysis_input

    start_ns = now_ns - round(q.window_s * NS_PER_S)
    # the same input as the CLI and the dashboard: rows, read level and job attribution
    data = read_analysis_input(store, start_ns, now_ns + 1)
    frame = data.frame
    if frame.empty:
        return []
    summary = analyze(
        frame, now_ns=now_ns + 1, window_s=60.0, start_ns=start_ns, jobs=data.jobs,
        step_s=data.step_s,
    )  # fmt: skip
    seen = {
        (h, int(i), u, n)
        for h, i, u, n in frame[_GPU_KEYS].drop_duplicates().itertuples(index=False)
    }
    # the finding's cause and severity label the alert (gpuwatt.analytics.findings): an alert
    # says what the dashboard and the CLI say
    if q.analysis == "straggler":
        hits = {
            (s.host, s.gpu_index, s.uuid, s.name): (
                s.score,
                s.explanation,
                {"cause": s.cause, "severity": s.severity},
            )
            for s in summary.active_stragglers
        }
        return _per_gpu(seen, hits)
    if q.analysis == "idle_allocated":
        hits = {
            (i.host, i.gpu_index, i.uuid, i.name): (
                i.utilization_gpu_pct,
                i.explanation,
                {"cause": i.idle_class, "severity": IDLE_SEVERITY[i.idle_class]},
            )
            for i in summary.idle_allocated
        }
        return _per_gpu(seen, hits)
    if q.analysis == "imbalance":
        series = summary.imbalance()
        if series.empty or not np.isfinite(series.iloc[-1]):
            return []
        value = float(series.iloc[-1])
    else:
        fig = summary.cluster.get("tflops_per_w")
        if fig is None or fig.value is None:
            return []
        value = float(fig.value)
    assert q.threshold is not None
    breach, holding = _holding(value, q.op, q.threshold, q.recovery_threshold)
    return [Observation({}, value, breach, holding)]


def _per_gpu(
    seen: set[tuple[str, int, str, str]],
    hits: dict[tuple[str, int, str, str], tuple[float, str, dict[str, str]]],
) -> list[Observation]:
    out = []
    for key in sorted(seen):
        value, detail, labels = hits.get(key, (None, "", {}))
        breach = key in hits
        out.append(Observation(gpu_target(*key) | labels, value, breach, breach, detail))
    return out
