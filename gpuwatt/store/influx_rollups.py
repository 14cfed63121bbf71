"""Engine rollups on InfluxDB (``engine_rollups.RollupSource`` over InfluxQL).

Plain ``SELECT``s of fields, no InfluxQL functions beyond ``first``/``last``: the same statements
run on InfluxDB 1.x, on 2.x through its v1-compatibility ``/query`` and on 3.x Core.

Packed points: one point per bucket and *host* (tag ``host``), its GPUs in a string field
``gpus`` (JSON ``[[index, uuid, name], ...]``) and each column (``n``, ``n_ok``, ``t_last_ns``,
``seen_ns``, one per metric) a string field holding the host's values as little-endian
int64/float64, base64, padded to a multiple of 3 values so that a column of many points decodes
in one call (``seen_ns`` is absent from points written before it). Measured on InfluxDB 1.6.7
with 1,024 GPUs (``bench/dashboard.py --store influxdb``): one numeric series per GPU and field
made an hour of minutes 12,000 cursors and 10 MB of JSON numbers (~2 s to
answer and parse); packed, it is 128 series per field and strings that parse at once. A metric
no GPU of the host measured is left out (NaN).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuwatt.line_protocol import decode_name, escape_tag
from gpuwatt.schema import (
    FIELD_BY_ATTR,
    FIELD_LOST,
    MEASUREMENT,
    TAG_HOST,
)
from gpuwatt.store import StoreRejected
from gpuwatt.store.engine_rollups import (
    FIELD_N,
    FIELD_N_OK,
    FIELD_SEEN,
    MEASUREMENTS,
    NS_PER_MS,
    GpuIds,
    Ident,
    RollupsUnsupported,
    Scope,
    empty_level,
)
from gpuwatt.store.influx_reads import GROUP_TAGS, gpu_of_tags, ident, oldest_raw_ns
from gpuwatt.store.rollup_rule import KEYS, NULL_TIME, UNKNOWN_SEEN, LookAroundHint, as_level
from gpuwatt.store.rollup_spans import NEWEST_LOOKBACKS_S, SpanCache

if TYPE_CHECKING:
    from gpuwatt.store.influx import InfluxStore

FIELD_GPUS = "gpus"
FIELD_T_LAST_NS = "t_last_ns"
#: The packed int64 columns and the level column each holds (``seen_ns`` is absent from points
#: written before it, and reads as ``UNKNOWN_SEEN``).
_INT_COLUMNS = {
    FIELD_N: "n",
    FIELD_N_OK: "n_ok",
    FIELD_T_LAST_NS: "t_last_ns",
    FIELD_SEEN: "seen_ns",
}
#: The packed columns a lean read takes (rows that go to a frame uncombined).
_LEAN_INT_COLUMNS = {FIELD_N: "n", FIELD_SEEN: "seen_ns"}
#: How long the hosts that no rollups name are trusted from memory (a new Telegraf-only host
#: is read raw at most this late; until then its GPUs are missing from bucketed reads).
UNROLLED_TTL_S = 30.0


class InfluxRollups:
    """The rollups of one ``InfluxStore``'s bucket."""

    def __init__(self, store: InfluxStore) -> None:
        self.store = store
        #: the sides of a range its last raw read had to read out (``rollup_rule.read_around``)
        self.look_around = LookAroundHint()
        self._spans = SpanCache(self._oldest_ns, self._newest_ns)
        self._unrolled: tuple[float, frozenset[str]] | None = None

    def write_lines(self, lines: Sequence[str]) -> None:
        self.store.write_lines(lines)

    def rollup_span(self, level_ns: int) -> tuple[int, int] | None:
        return self._spans.get(level_ns)

    def point_counts(
        self, level_ns: int, first_ns: int, last_ns: int, chunk_ns: int
    ) -> dict[int, int]:
        """``rollup_cache.CountedSource``: the points (one per host and bucket roll) of each
        chunk, counted by InfluxDB's ``GROUP BY time``, whose intervals start at multiples of
        the interval, as chunks do."""
        series = self.store.query(
            f'SELECT count("{FIELD_N}") FROM {ident(MEASUREMENTS[level_ns])} '
            f"WHERE {self.store.where(first_ns, last_ns, None)} "
            f"GROUP BY time({chunk_ns // 1000}u)"
        )
        counts: dict[int, int] = {}
        for s in series:
            for row in s.get("values") or []:
                if isinstance(row[0], int) and row[1]:
                    counts[row[0]] = int(row[1])
        return counts

    def unrolled_hosts(self, hosts: Sequence[str] | None) -> list[str]:
        """Hosts of the raw measurement (of ``hosts``, None: all) that no rollup point names.

        Collectors roll their own hosts from their own points (a GPU Telegraf writes too is
        rolled from gpuwatt's samples of it); a host where only Telegraf (or anything but a
        gpuwatt collector) writes has no rollups, and its GPUs must be read raw. ``host.domain``
        of a rolled ``host`` is rolled: a Telegraf configured with the FQDN writes the GPUs that
        host's collector rolls, which read raw beside their rollups would be there twice.
        ``SHOW TAG VALUES`` answers from the index, without reading points.
        """
        cached = self._unrolled
        if cached is None or time.monotonic() - cached[0] > UNROLLED_TTL_S:
            try:
                raw = self._hosts_of(MEASUREMENT)
                rolled: set[str] = set()
                for measurement in MEASUREMENTS.values():
                    rolled |= self._hosts_of(measurement)
            except StoreRejected:  # an engine without SHOW TAG VALUES: the rollups alone
                raw = rolled = set()
            alone = frozenset(h for h in raw - rolled if h.partition(".")[0] not in rolled)
            cached = self._unrolled = (time.monotonic(), alone)
        return sorted(cached[1] if hosts is None else cached[1] & set(hosts))

    def _hosts_of(self, measurement: str) -> set[str]:
        series = self.store.query(
            f'SHOW TAG VALUES FROM {ident(measurement)} WITH KEY = "{TAG_HOST}"'
        )
        return {decode_name(str(row[-1])) for s in series for row in s.get("values") or []}

    def _oldest_ns(self, level_ns: int) -> int | None:
        return self._time_of(f'SELECT first("{FIELD_N}") FROM {ident(MEASUREMENTS[level_ns])}')

    def _newest_ns(self, level_ns: int) -> int | None:
        # looked for in the last minutes first, which is cheap (InfluxDB reads only the
        # blocks the time range names), then the last day, then anywhere
        measurement = ident(MEASUREMENTS[level_ns])
        now = self.store.clock_ns()
        for lookback_s in NEWEST_LOOKBACKS_S:
            since = now - lookback_s * 10**9
            query = f'SELECT last("{FIELD_N}") FROM {measurement} WHERE time >= {since}'
            if found := self._time_of(query):
                return found
        return self._time_of(f'SELECT last("{FIELD_N}") FROM {measurement}')

    def _time_of(self, influxql: str) -> int | None:
        for s in self.store.query(influxql):
            for row in s.get("values", []):
                # an engine that only looks like InfluxDB (VictoriaMetrics' /query) answers
                # with something else: no rollups there
                return row[0] if isinstance(row[0], int) else None
        return None

    def raw_in(self, start_ns: int, end_ns: int) -> bool:
        return self.raw_before(end_ns)

    def raw_before(self, end_ns: int) -> bool:
        oldest = oldest_raw_ns(self.store)  # kept for a few minutes (``influx_reads``)
        return oldest is not None and oldest < end_ns

    def raw_level(self, start_ns: int, end_ns: int, scope: Scope) -> dict[str, np.ndarray]:
        attrs, hosts, ids = scope.attrs, scope.hosts, scope.ids
        selects = [ident(FIELD_LOST)] + [ident(FIELD_BY_ATTR[a].field) for a in attrs]
        series = (
            []
            if not self.raw_before(end_ns)
            else self.store.query(
                f'SELECT {", ".join(selects)} FROM "{MEASUREMENT}" WHERE '
                f"{self.store.where(start_ns, end_ns, hosts)} GROUP BY {GROUP_TAGS}"
            )
        )
        t, gid, data = _columns(series, 1 + len(attrs), ids)
        ours = ~np.isnan(data[:, 0])  # gpuwatt's points carry gpu_lost, Telegraf's do not
        if not ours.all():  # Telegraf's hosts are read raw (``unrolled_hosts``), not rolled
            t, gid, data = t[ours], gid[ours], data[ours]
        if not len(t):
            return as_level(t, gid, np.zeros(0, bool), {a: np.zeros(0) for a in attrs})
        values = {}
        for i, a in enumerate(attrs):
            scale = FIELD_BY_ATTR[a].scale
            values[a] = data[:, 1 + i] * scale if scale != 1.0 else data[:, 1 + i]
        return as_level(t, gid, data[:, 0] == 1.0, values)

    def rollup_lines(
        self, level_ns: int, cols: dict[str, np.ndarray], idents: Sequence[Ident]
    ) -> list[str]:
        """Level rows as packed points, one per bucket and host (see the module doc)."""
        t, gid = cols["time_ns"], cols["gpu_id"]
        if not len(t):
            return []
        hosts = sorted({idents[g][0] for g in set(gid.tolist())})
        code = {h: i for i, h in enumerate(hosts)}
        host = np.array([code[idents[g][0]] for g in gid.tolist()], dtype=np.int64)
        order = np.lexsort((gid, host, t))
        t_s, h_s = t[order], host[order]
        starts = np.flatnonzero(np.r_[True, (t_s[1:] != t_s[:-1]) | (h_s[1:] != h_s[:-1])])
        ends = np.r_[starts[1:], len(order)]
        attrs = [a for a in cols if a not in KEYS]
        measurement = _ident_measurement(MEASUREMENTS[level_ns])
        level_ms = level_ns // NS_PER_MS
        out = []
        for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
            rows = order[lo:hi]
            gpus = json.dumps([list(idents[g][1:]) for g in gid[rows].tolist()])
            fields = [f"{FIELD_GPUS}={_string_field(gpus)}"]
            for name, key in _INT_COLUMNS.items():
                if key in cols:
                    fields.append(f'{name}="{_pack(cols[key][rows].astype("<i8"))}"')
            for a in attrs:
                v = cols[a][rows]
                if not np.isnan(v).all():
                    fields.append(f'{a}="{_pack(v.astype("<f8"))}"')
            n = int(cols["n"][rows].sum())
            point_ns = int(t_s[lo]) + min(n, level_ms - 1) * NS_PER_MS
            tag = escape_tag(hosts[int(h_s[lo])])
            out.append(f"{measurement},{TAG_HOST}={tag} {','.join(fields)} {point_ns}")
        return out

    def rollup_points(
        self, level_ns: int, start_ns: int, end_ns: int, scope: Scope, *, lean: bool = False
    ) -> dict[str, np.ndarray]:
        attrs, hosts, ids = scope.attrs, scope.hosts, scope.ids
        # uncombined rows (``RollupSource.rollup_points``): n_ok and t_last_ns are not read
        int_columns = _LEAN_INT_COLUMNS if lean else _INT_COLUMNS
        names = [FIELD_GPUS, *int_columns, *attrs]
        series = self.store.query(
            f"SELECT {', '.join(map(ident, names))} FROM {ident(MEASUREMENTS[level_ns])} "
            f'WHERE {self.store.where(start_ns, end_ns, hosts)} GROUP BY "{TAG_HOST}"'
        )
        # the rows turned into columns by ``zip`` (in C), not value by value: an hour of a
        # 1,024-GPU cluster's minutes is 7,680 points of 18 fields, read in ~106 instead of
        # ~120 ms of CPU (``bench/engine_load.py influxdb``; a cold 6 h view, ~40 ms less)
        gpu_lists: list[list[int]] = []
        rows: list[list[Any]] = []
        cache: dict[tuple[str, str], list[int]] = {}
        for s in series:
            values = s.get("values") or []
            if not values:
                continue
            host = decode_name(s.get("tags", {}).get(TAG_HOST, ""))
            for gpus in dict.fromkeys(row[1] for row in values):
                if (host, gpus) not in cache:
                    if not isinstance(gpus, str):
                        raise RollupsUnsupported("a rollup point that is not InfluxQL's")
                    cache[host, gpus] = [
                        ids.of((host, int(i), decode_name(u), decode_name(m)))
                        for i, u, m in json.loads(gpus)
                    ]
            gpu_lists.extend(cache[host, row[1]] for row in values)
            rows.extend(values)
        if not rows:
            return empty_level(attrs)
        try:
            columns = list(zip(*rows, strict=True))  # ValueError: rows of different lengths
        except ValueError:
            columns = []
        times = list(columns[0]) if len(columns) == 1 + len(names) else []
        if not times or not all(type(t) is int for t in times):
            raise RollupsUnsupported("a rollup point that is not InfluxQL's")
        columns = columns[2:]
        counts = np.array([len(g) for g in gpu_lists], dtype=np.int64)
        padded = -(-counts // 3) * 3
        offsets = np.r_[0, np.cumsum(padded)[:-1]]
        # each point's values without its padding: its offset, then 0 .. count - 1
        starts = np.cumsum(counts) - counts
        keep = np.repeat(offsets - starts, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        unpacked = [
            _unpack(col, padded, "<i8" if i < len(int_columns) else "<f8")[keep]
            for i, col in enumerate(columns)
        ]
        ints = len(int_columns)
        out = (
            {
                "time_ns": np.repeat(np.array(times, dtype=np.int64), counts),
                "gpu_id": np.fromiter(chain.from_iterable(gpu_lists), np.int64, len(keep)),
            }
            | dict(zip(int_columns.values(), unpacked[:ints], strict=True))
            | {a: unpacked[ints + i] for i, a in enumerate(attrs)}
        )
        if lean:
            out["n_ok"] = out["n"]
            out["t_last_ns"] = np.full(len(out["n"]), NULL_TIME, dtype=np.int64)
        return out


def _ident_measurement(name: str) -> str:
    return name.replace(",", "\\,").replace(" ", "\\ ")


def _string_field(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pack(values: np.ndarray) -> str:
    """Values base64-encoded, padded with zeros to a multiple of 3 (no ``=`` padding)."""
    pad = -len(values) % 3
    if pad:
        values = np.r_[values, np.zeros(pad, dtype=values.dtype)]
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unpack(column: Sequence[str | None], padded: np.ndarray, dtype: str) -> np.ndarray:
    """A column of packed values, one string per point of ``padded`` values (None: all NaN,
    or for int64 all ``UNKNOWN_SEEN``: a column the point was written without)."""
    if None in column:
        fill = np.full(3, np.nan) if dtype == "<f8" else np.full(3, UNKNOWN_SEEN, dtype="<i8")
        missing = base64.b64encode(fill.tobytes()).decode("ascii")
        column = [v if v is not None else missing * (int(p) // 3)
                  for v, p in zip(column, padded, strict=True)]  # fmt: skip
    try:
        data = binascii.a2b_base64("".join(column))  # type: ignore[arg-type]  # no None left
    except binascii.Error as exc:
        raise ValueError("unreadable packed rollup point") from exc
    return np.frombuffer(data, dtype=dtype)


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
        gpu: Ident = gpu_of_tags(tags)
        gids.append(np.full(len(values), ids.of(gpu), dtype=np.int64))
        if not isinstance(values[0][0], int) or len(values[0]) != width + 1:
            raise RollupsUnsupported(f"{len(values[0])} columns of {values[0][0]!r}: not InfluxQL")
        times.extend(row[0] for row in values)
        rows.extend(values)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, width))
    # numpy reads null as NaN and booleans as 0/1 (the time column, as a float, is not used):
    # ~2x faster than an object array whose nulls are replaced (1,024 GPUs' newest raw minute)
    matrix = np.array(rows, dtype=np.float64)[:, 1:]
    return np.array(times, dtype=np.int64), np.concatenate(gids), matrix
