"""Engine rollups on VictoriaMetrics (``engine_rollups.RollupSource`` over PromQL).

The rollup points are written as line protocol, like the samples, so VictoriaMetrics names them
``gpuwatt_rollup_1m_<field>``. They are read back as raw points (``metric[window]``), which
VictoriaMetrics answers as a matrix; the oldest and newest point of a level come from its
``tfirst_over_time``/``tlast_over_time``. Only the ``influx`` dialect (gpuwatt's own writes)
has rollups: Prometheus takes no writes, and dcgm-exporter's series are aggregated in the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpuwatt.schema import FIELD_LOST, MEASUREMENT
from gpuwatt.store.engine_rollups import (
    FIELD_N,
    FIELD_N_OK,
    FIELD_SEEN,
    FIELD_T_LAST,
    MEASUREMENTS,
    NS_PER_MS,
    Ident,
    Scope,
    empty_level,
    rollup_lines,
)
from gpuwatt.store.promql_dialects import promql_string, regex_alternatives
from gpuwatt.store.promql_frames import Exported, pivot_exported
from gpuwatt.store.rollup_rule import NULL_TIME, UNKNOWN_SEEN, LookAroundHint, as_level
from gpuwatt.store.rollup_spans import NEWEST_LOOKBACKS_S, SpanCache

if TYPE_CHECKING:
    from gpuwatt.store.promql import PromStore

#: The metrics of one read of raw samples or rollup points go to VictoriaMetrics in this many
#: exports at once (``PromRollups._export``): it answers each on about one core.
EXPORT_PARTS = 2

_DAY_NS = 86_400 * NS_PER_MS * 1000
_FAR_S = 50 * 365 * 86_400  # "any time" since 1976 (a window reaching before 1970 finds nothing)


class PromRollups:
    """The rollups a VictoriaMetrics holds beside gpuwatt's samples (``source=influx``)."""

    def __init__(self, store: PromStore) -> None:
        self.store = store
        #: the sides of a range its last raw read had to read out (``rollup_rule.read_around``)
        self.look_around = LookAroundHint()
        self._spans = SpanCache(self._oldest_ns, self._newest_ns)
        #: UTC days (Unix days) the index has listed samples on (``raw_in``): a day with samples
        #: keeps them, so a live view's newest minute is not asked about again
        self._days_with_samples: set[int] = set()

    def write_lines(self, lines: Sequence[str]) -> None:
        self.store.write_lines(lines)

    def rollup_lines(
        self, level_ns: int, cols: dict[str, np.ndarray], idents: Sequence[Ident]
    ) -> list[str]:
        """One point per bucket and GPU, a field per column: VictoriaMetrics keeps numbers."""
        return rollup_lines(level_ns, cols, idents)

    def _n_selector(self, level_ns: int) -> str:
        return "{" + f"__name__={promql_string(MEASUREMENTS[level_ns] + '_' + FIELD_N)}" + "}"

    def rollup_span(self, level_ns: int) -> tuple[int, int] | None:
        return self._spans.get(level_ns)

    def _oldest_ns(self, level_ns: int) -> int | None:
        sel = self._n_selector(level_ns)
        return self._time_of(f"min(tfirst_over_time({sel}[{_FAR_S}s]))", self.store.clock_ns())

    def _newest_ns(self, level_ns: int) -> int | None:
        # the store's now: a bench replaying data that ended in the past finds its newest
        # point in the last minutes, as a live cluster does (not in an all-time query)
        sel, now = self._n_selector(level_ns), self.store.clock_ns()
        for lookback_s in (*NEWEST_LOOKBACKS_S, _FAR_S):
            if found := self._time_of(f"max(tlast_over_time({sel}[{lookback_s}s]))", now):
                return found
        return None

    def _time_of(self, promql: str, at_ns: int) -> int | None:
        for r in self.store.query(promql, at_ns):
            return round(float(r["value"][1]) * 1000) * NS_PER_MS
        return None

    def point_counts(
        self, level_ns: int, first_ns: int, last_ns: int, chunk_ns: int
    ) -> dict[int, int]:
        """``rollup_cache.CountedSource``: each chunk's points counted at its end (a window
        ``(end - chunk, end]`` or ``[end - chunk, end]`` holds the same points: none lies on a
        chunk's start, each being its bucket's start plus ``n`` >= 1 ms)."""
        chunk_ms = chunk_ns // NS_PER_MS
        promql = f"sum(count_over_time({self._n_selector(level_ns)}[{chunk_ms}ms]))"
        answer = self.store.query_range(
            promql, first_ns + chunk_ns, last_ns, chunk_ns // (1000 * NS_PER_MS), fresh=True
        )
        counts: dict[int, int] = {}
        for series in answer:
            for at_s, value in series.get("values", []):
                end_ns = round(float(at_s) * 1000) * NS_PER_MS
                counts[end_ns - chunk_ns] = int(float(value))
        return counts

    def raw_in(self, start_ns: int, end_ns: int) -> bool:
        """Whether VictoriaMetrics' index has a gpuwatt GPU series with samples on the days of
        ``[start_ns, end_ns)`` (``/api/v1/series``, limit 1: an index lookup, a few ms). A
        range before the data (a young database's context: on 1,024 GPUs ~0.3 s of the
        engine for an export that finds nothing) is then not read; a range of more than ~40
        days is looked up in the global index, which answers yes. A day found with samples is
        remembered (a day found without is asked again: samples may arrive)."""
        first, last = start_ns // _DAY_NS, (end_ns - 1) // _DAY_NS
        if any(day in self._days_with_samples for day in range(first, last + 1)):
            return True
        names = self.store.dialect.by_attr()
        metrics = [f"{MEASUREMENT}_{FIELD_LOST}", names["utilization_gpu_pct"].metric]
        found = self.store.has_series(
            "{__name__=~" + promql_string(regex_alternatives(metrics)) + "}", start_ns, end_ns
        )
        if found and first == last:
            self._days_with_samples.add(first)
        return found

    def raw_level(self, start_ns: int, end_ns: int, scope: Scope) -> dict[str, np.ndarray]:
        attrs, hosts, ids = scope.attrs, scope.hosts, scope.ids
        names = self.store.dialect.by_attr()
        columns = [f"{MEASUREMENT}_{FIELD_LOST}", *(names[a].metric for a in attrs)]
        exported = self._export(columns, hosts, start_ns, end_ns)
        t, gid, data = pivot_exported(exported, self.store.dialect, columns, ids)
        inside = (t >= start_ns) & (t < end_ns)
        t, gid, data = t[inside], gid[inside], data[inside]
        values = {a: data[:, 1 + i] * names[a].scale for i, a in enumerate(attrs)}
        return as_level(t, gid, data[:, 0] == 1.0, values)

    def rollup_points(
        self, level_ns: int, start_ns: int, end_ns: int, scope: Scope, *, lean: bool = False
    ) -> dict[str, np.ndarray]:
        attrs, hosts, ids = scope.attrs, scope.hosts, scope.ids
        prefix = MEASUREMENTS[level_ns] + "_"
        keys = [FIELD_N, FIELD_SEEN] if lean else [FIELD_N, FIELD_SEEN, FIELD_N_OK, FIELD_T_LAST]
        fields = [*keys, *attrs]
        window_ms = (end_ns - start_ns) // NS_PER_MS
        if window_ms <= 0:
            return empty_level(attrs)

        names = [prefix + f for f in fields]
        exported = self._export(names, hosts, start_ns, end_ns)
        t, gid, data = pivot_exported(exported, self.store.dialect, names, ids)
        inside = (t >= start_ns) & (t < end_ns)
        t, gid, data = t[inside], gid[inside], data[inside]
        if not len(t):
            return empty_level(attrs)
        n = np.nan_to_num(data[:, 0]).astype(np.int64)
        out = {
            "time_ns": t,
            "gpu_id": gid,
            "n": n,
            "seen_ns": np.where(
                np.isnan(data[:, 1]), UNKNOWN_SEEN, np.nan_to_num(data[:, 1]).astype(np.int64)
            ),
        }
        if lean:  # uncombined rows (``RollupSource.rollup_points``)
            out |= {"n_ok": n, "t_last_ns": np.full(len(t), NULL_TIME, dtype=np.int64)}
        else:
            t_last = data[:, 3]
            out["n_ok"] = np.nan_to_num(data[:, 2]).astype(np.int64)
            out["t_last_ns"] = np.where(
                np.isnan(t_last), NULL_TIME, np.nan_to_num(t_last).astype(np.int64) * NS_PER_MS
            )
        return out | {a: data[:, len(keys) + i] for i, a in enumerate(attrs)}

    def _export(
        self, names: Sequence[str], hosts: Sequence[str] | None, start_ns: int, end_ns: int
    ) -> Exported:
        """The series of the metrics ``names`` (of ``hosts``; None: all) in ``[start_ns,
        end_ns)``: the metrics split into ``EXPORT_PARTS`` exports sent at once
        (``PromStore.export_at_once``), each for several metrics (one request per metric cost
        more: ``PromStore.export``)."""
        k = max(1, min(EXPORT_PARTS, len(names)))
        host_matcher = self._hosts(hosts)
        matches = [
            "{__name__=~" + promql_string(regex_alternatives(names[i::k])) + host_matcher + "}"
            for i in range(k)
        ]
        return self.store.export_at_once(matches, start_ns, end_ns)

    def _hosts(self, hosts: Sequence[str] | None) -> str:
        """The matcher that keeps ``hosts`` (None: every host), after a comma."""
        if hosts is None:
            return ""
        pattern = regex_alternatives(hosts) if hosts else "$^"
        return f", {self.store.dialect.host}=~{promql_string(pattern)}"
