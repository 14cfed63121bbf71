"""Engine rollups on InfluxDB (``engine_rollups.RollupSource`` over InfluxQL).

Plain ``SELECT``s of fields, no InfluxQL functions beyond ``first``/``last``: the same statements
run on InfluxDB 1.x, on 2.x through its v1-compatibility ``/query`` and on 3.x Core.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuwatt.schema import (
    FIELD_BY_ATTR,
    FIELD_LOST,
    MEASUREMENT,
    TAG_HOST,
    TAG_INDEX,
    TAG_NAME,
    TAG_UUID,
    decode_name,
)
from gpuwatt.store.engine_rollups import (
    FIELD_N,
    FIELD_N_OK,
    FIELD_T_LAST,
    MEASUREMENTS,
    NS_PER_MS,
    GpuIds,
    Ident,
    empty_level,
)
from gpuwatt.store.rollup_rule import NULL_TIME, as_level

if TYPE_CHECKING:
    from gpuwatt.store.influx import InfluxStore

_GROUP_TAGS = ", ".join(f'"{t}"' for t in (TAG_HOST, TAG_INDEX, TAG_UUID, TAG_NAME))
#: How long the oldest rollup point of a level is trusted from memory (it moves only with
#: retention); the newest is asked for on every read.
OLDEST_TTL_S = 600.0


def _ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class InfluxRollups:
    """The rollups of one ``InfluxStore``'s bucket."""

    def __init__(self, store: InfluxStore) -> None:
        self.store = store
        self._oldest: dict[int, tuple[float, int]] = {}

    def write_lines(self, lines: Sequence[str]) -> None:
        self.store.write_lines(lines)

    def rollup_span(self, level_ns: int) -> tuple[int, int] | None:
        measurement = _ident(MEASUREMENTS[level_ns])
        cached = self._oldest.get(level_ns)
        if cached is None or time.monotonic() - cached[0] > OLDEST_TTL_S:
            oldest = self._time_of(f'SELECT first("{FIELD_N}") FROM {measurement}')
            if oldest is None:
                return None
            self._oldest[level_ns] = (time.monotonic(), oldest)
        else:
            oldest = cached[1]
        # The newest point: looked for in the last day first, which is cheap (InfluxDB reads
        # only the shards the time range names), then anywhere.
        day_ago = time.time_ns() - 86_400 * 10**9
        newest = self._time_of(
            f'SELECT last("{FIELD_N}") FROM {measurement} WHERE time >= {day_ago}'
        ) or self._time_of(f'SELECT last("{FIELD_N}") FROM {measurement}')
        if newest is None:
            return None
        return min(oldest, newest), newest

    def _time_of(self, influxql: str) -> int | None:
        for s in self.store.query(influxql):
            for row in s.get("values", []):
                # an engine that only looks like InfluxDB (VictoriaMetrics' /query) answers
                # with something else: no rollups there
                return row[0] if isinstance(row[0], int) else None
        return None

    def raw_level(
        self,
        start_ns: int,
        end_ns: int,
        attrs: Sequence[str],
        hosts: Sequence[str] | None,
        ids: GpuIds,
    ) -> dict[str, np.ndarray]:
        selects = [_ident(FIELD_LOST)] + [_ident(FIELD_BY_ATTR[a].field) for a in attrs]
        series = self.store.query(
            f'SELECT {", ".join(selects)} FROM "{MEASUREMENT}" WHERE '
            f"{self.store.where(start_ns, end_ns, hosts)} GROUP BY {_GROUP_TAGS}"
        )
        t, gid, data = _columns(series, 1 + len(attrs), ids)
        if not len(t):
            return as_level(t, gid, np.zeros(0, bool), {a: np.zeros(0) for a in attrs})
        values = {}
        for i, a in enumerate(attrs):
            scale = FIELD_BY_ATTR[a].scale
            values[a] = data[:, 1 + i] * scale if scale != 1.0 else data[:, 1 + i]
        return as_level(t, gid, data[:, 0] == 1.0, values)

    def rollup_points(
        self,
        level_ns: int,
        start_ns: int,
        end_ns: int,
        attrs: Sequence[str],
        hosts: Sequence[str] | None,
        ids: GpuIds,
    ) -> dict[str, np.ndarray]:
        names = [FIELD_N, FIELD_N_OK, FIELD_T_LAST, *attrs]
        series = self.store.query(
            f"SELECT {', '.join(map(_ident, names))} FROM {_ident(MEASUREMENTS[level_ns])} "
            f"WHERE {self.store.where(start_ns, end_ns, hosts)} GROUP BY {_GROUP_TAGS}"
        )
        t, gid, data = _columns(series, len(names), ids)
        if not len(t):
            return empty_level(attrs)
        t_last = data[:, 2]
        out = {
            "time_ns": t,
            "gpu_id": gid,
            "n": np.nan_to_num(data[:, 0]).astype(np.int64),
            "n_ok": np.nan_to_num(data[:, 1]).astype(np.int64),
            "t_last_ns": np.where(
                np.isnan(t_last), NULL_TIME, np.nan_to_num(t_last).astype(np.int64) * NS_PER_MS
            ),
        }
        return out | {a: data[:, 3 + i] for i, a in enumerate(attrs)}


def _columns(
    series: list[dict[str, Any]], width: int, ids: GpuIds
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Times, GPU ids and a float64 matrix (NaN: null; booleans 0/1) of InfluxQL series whose
    columns are time then ``width`` values."""
    times: list[int] = []
    gids: list[np.ndarray] = []
    rows: list[Any] = []
    for s in series:
        values = s.get("values") or []
        if not values:
            continue
        tags = s.get("tags", {})
        ident: Ident = (
            decode_name(tags.get(TAG_HOST, "")),
            int(tags.get(TAG_INDEX) or -1),
            decode_name(tags.get(TAG_UUID, "")),
            decode_name(tags.get(TAG_NAME, "")),
        )
        gids.append(np.full(len(values), ids.of(ident), dtype=np.int64))
        times.extend(row[0] for row in values)
        rows.extend(values)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, width))
    matrix = np.array(rows, dtype=object)[:, 1:]
    matrix[matrix == None] = np.nan  # noqa: E711 (element-wise)
    return (
        np.array(times, dtype=np.int64),
        np.concatenate(gids),
        matrix.astype(np.float64).reshape(len(rows), width),
    )
