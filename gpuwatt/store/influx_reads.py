"""InfluxDB reads (``InfluxStore``'s read side): series, latest values and Telegraf's points.

Everything here is InfluxQL over ``InfluxStore.query``; the connection, the writes and the
query transport stay in ``influx``. Bucketed reads come from the engine's rollups
(``engine_rollups``, ``influx_rollups``) where they answer; GPUs on hosts that no gpuwatt
collector rolls (Telegraf writes them alone) are read raw beside them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gpuwatt.line_protocol import decode_name, sample_from_fields
from gpuwatt.model import GpuSample
from gpuwatt.schema import (
    FIELD_BY_ATTR,
    FIELD_ENERGY_METHOD,
    FIELD_JOB_ID,
    FIELD_LOST,
    FIELD_PARENT_UUID,
    FIELD_XID_COUNT,
    FIELD_XID_LAST,
    MEASUREMENT,
    TAG_HOST,
    TAG_INDEX,
    TAG_NAME,
    TAG_UUID,
)
from gpuwatt.store import LAST_VALUE_ATTRS, StoreRejected, checked_fields
from gpuwatt.store.base import KEY_COLUMNS, XID_ATTR, XID_COLUMNS, SeriesRead
from gpuwatt.store.engine_rollups import RollupsUnsupported
from gpuwatt.telegraf import (
    MEASUREMENT_MIG,
    MEASUREMENT_PROCESS,
    TelegrafMigDevice,
    TelegrafProcess,
    extra_columns,
    fill_from_telegraf,
    is_gpuwatt_point,
    merge_writers,
    mig_from_point,
    one_identity_per_uuid,
    process_from_point,
    report_shared,
    yes_no,
)

if TYPE_CHECKING:
    import pandas as pd

    from gpuwatt.store.engine_rollups import RollupSource
    from gpuwatt.store.influx import InfluxStore

GROUP_TAGS = ", ".join(f'"{t}"' for t in (TAG_HOST, TAG_INDEX, TAG_UUID, TAG_NAME))
_COUNT_ALIAS = "_n"


def ident(name: str) -> str:
    """A double-quoted InfluxQL identifier."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gpu_of_tags(tags: dict[str, str]) -> tuple[str, int, str, str]:
    """A GPU's host, index, uuid and model name from its point's tags."""
    return (
        decode_name(tags.get(TAG_HOST, "")),
        int(tags.get(TAG_INDEX) or -1),
        decode_name(tags.get(TAG_UUID, "")),
        decode_name(tags.get(TAG_NAME, "")),
    )


def has_telegraf_field(store: InfluxStore, name: str) -> bool:
    """Whether the measurement has Telegraf's field ``name`` (``SHOW FIELD KEYS``, asked at
    most every 5 minutes): a database Telegraf does not write is read without its columns,
    which would only add nulls to every row. True when the server cannot say."""
    now = time.monotonic()
    if store._telegraf_fields is None or now - store._telegraf_fields[0] > 300:
        try:
            series = store.query(f'SHOW FIELD KEYS FROM "{MEASUREMENT}"')
            keys: frozenset[str] | None = frozenset(
                str(row[0]) for s in series for row in s.get("values", [])
            )
        except StoreRejected:  # an engine without SHOW FIELD KEYS: select them anyway
            keys = None
        store._telegraf_fields = (now, keys)
    keys = store._telegraf_fields[1]
    return keys is None or name in keys


#: How long the time of the oldest raw sample is kept before it is asked again (``oldest_raw_ns``).
OLDEST_RAW_TTL_S = 300.0


def oldest_raw_ns(store: InfluxStore) -> int | None:
    """The time of the oldest raw sample of the measurement (gpuwatt's or Telegraf's), asked at
    most every ``OLDEST_RAW_TTL_S``; None when there is none. A read of raw samples that ends
    before it has nothing to find: InfluxDB still opens every series and field to say so (on
    1,024 GPUs ~0.1 s of its CPU per read, over a second when several run at once), and a 24 h
    view on a store younger than its context window asks for several such reads.
    Samples written later with older times are seen when the time is asked again."""
    cached = store._oldest_raw
    if cached is not None and time.monotonic() - cached[0] < OLDEST_RAW_TTL_S:
        return cached[1]
    # The parallel reads of a cold view all need it: one asks (two all-time queries, ~40 ms
    # each on 1,024 GPUs), the others wait for its answer instead of asking too.
    with store._oldest_raw_lock:
        now = time.monotonic()
        cached = store._oldest_raw
        if cached is not None and now - cached[0] < OLDEST_RAW_TTL_S:
            return cached[1]
        times = [
            row[0]
            for field in (FIELD_LOST, "utilization_gpu")  # every gpuwatt / Telegraf point has one
            for s in store.query(f"SELECT first({ident(field)}) FROM {ident(MEASUREMENT)}")
            for row in s.get("values") or []
        ]
        if not all(type(t) is int for t in times):
            # VictoriaMetrics takes InfluxDB's writes but answers every InfluxQL query with its
            # database list ("_internal"): an influxdb:// URL given for it
            raise RollupsUnsupported(
                f"the engine answered InfluxQL with {times[:1]!r}, not a time: it is not "
                "InfluxDB (VictoriaMetrics? give its URL as victoriametrics://)"
            )
        oldest = min(times) if times else None
        if oldest is not None:  # an empty store is asked again at once: samples may arrive
            store._oldest_raw = (now, oldest)
        return oldest


def count_samples(store: InfluxStore, start_ns: int, end_ns: int) -> int:
    series = store.query(
        f'SELECT count("{FIELD_LOST}") FROM "{MEASUREMENT}" WHERE '
        + store.where(start_ns, end_ns, None)
    )
    return int(sum(row[1] or 0 for s in series for row in s.get("values", [])))


#: ``latest`` is asked in this many parts, each for some of the hosts, sent at once: InfluxDB
#: runs a query on one core, and finding the newest point of every field of every GPU's series
#: is ~0.15-0.2 s of it at 1,024 GPUs whatever the time range asked (ask the newest 2 minutes
#: or all of a day: the same), so two halves answer in about half the time on a server with
#: two cores or more (``bench/dashboard.py --store influxdb``).
LATEST_PARTS = 2
#: How long the hosts of the measurement are trusted from memory (``raw_hosts``): a new host's
#: GPUs are missing from ``latest`` at most this long.
HOSTS_TTL_S = 30.0


def raw_hosts(store: InfluxStore) -> list[str]:
    """The host tag values of the measurement, as stored (``SHOW TAG VALUES``: from the index,
    without reading points), asked at most every ``HOSTS_TTL_S``."""
    cached = store._raw_hosts
    if cached is not None and time.monotonic() - cached[0] < HOSTS_TTL_S:
        return cached[1]
    series = store.query(f'SHOW TAG VALUES FROM "{MEASUREMENT}" WITH KEY = "{TAG_HOST}"')
    hosts = sorted({str(row[-1]) for s in series for row in s.get("values") or []})
    store._raw_hosts = (time.monotonic(), hosts)
    return hosts


def _host_parts(store: InfluxStore, parts: int) -> list[str]:
    """Conditions that split the measurement's series into ``parts`` sets of hosts (one
    condition, empty, where it cannot be split); the first also takes series without a host
    tag (InfluxQL's ``= ''``), so that together they hold every series (``latest`` checks it
    against the number of series)."""
    from gpuwatt.store.influx import influxql_string

    try:
        hosts = raw_hosts(store)
    except StoreRejected:  # an engine without SHOW TAG VALUES: one query
        return [""]
    if parts < 2 or len(hosts) < 2:
        return [""]
    groups = [hosts[i::parts] for i in range(min(parts, len(hosts)))]
    groups[0] = ["", *groups[0]]
    return [
        "(" + " OR ".join(f'"{TAG_HOST}" = {influxql_string(h)}' for h in group) + ")"
        for group in groups
    ]


def _series_count(store: InfluxStore) -> int | None:
    """How many series the measurement has (from the index); None where the engine cannot
    say."""
    try:
        counted = store.query(f'SHOW SERIES EXACT CARDINALITY FROM "{MEASUREMENT}"')
    except StoreRejected:
        return None
    return sum(int(row[-1]) for s in counted for row in s.get("values") or [])


#: The fields of a GPU's newest point that say which GPU, when, which job, how its energy is
#: obtained and which writer (``gpus_seen``): gpuwatt writes ``gpu_lost`` in every point,
#: Telegraf its utilisation and memory figures, so each writer's newest point has one of them.
SEEN_FIELDS: tuple[str, ...] = (
    FIELD_LOST,
    FIELD_JOB_ID,
    FIELD_PARENT_UUID,
    FIELD_ENERGY_METHOD,
    "utilization_gpu",
    "memory_total",
    "memory_used",
)


def latest_fields(attrs: Sequence[str]) -> tuple[str, ...]:
    """The fields ``latest`` selects for the metrics ``attrs`` of each GPU's newest point, as
    gpuwatt and Telegraf write them, and the GPU's state (``SEEN_FIELDS``); ``xid_errors``
    among them: its newest XID, as ``latest`` gives it (``base.XID_ATTR``)."""
    metrics = [a for a in attrs if a != XID_ATTR]
    own = [FIELD_BY_ATTR[a].field for a in checked_fields(metrics, FIELD_BY_ATTR)]
    xid = [FIELD_XID_LAST, FIELD_XID_COUNT] if XID_ATTR in attrs else []
    telegraf = [f for f, _, _ in extra_columns(metrics)]
    return tuple(dict.fromkeys([*SEEN_FIELDS, *own, *xid, *telegraf]))


def latest(
    store: InfluxStore,
    since_ns: int | None,
    fields: Sequence[str] | None = None,
    hosts: Sequence[str] | None = None,
) -> tuple[list[GpuSample], dict[str, tuple[str, ...]]]:
    """The newest sample of each GPU (of ``hosts`` alone; None: all) with the fields ``fields``
    alone (None: all), and the writers of each GPU more than one writes."""
    since = "" if since_ns is None else f"time >= {int(since_ns)}"
    selected = "*" if fields is None else ", ".join(f'"{f}"' for f in fields)

    def one(hosts: str) -> list[dict[str, Any]]:
        where = " AND ".join(c for c in (since, hosts) if c)
        return store.query(
            f'SELECT {selected} FROM "{MEASUREMENT}"{" WHERE " + where if where else ""} '
            "GROUP BY * ORDER BY time DESC LIMIT 1"
        )

    if hosts is not None:  # a few nodes: one query
        conditions = [store.hosts_or_fqdn_condition(hosts)]
    else:
        conditions = _host_parts(store, LATEST_PARTS) if since_ns is None else [""]
    if len(conditions) == 1:
        series = one(conditions[0])
    else:
        with ThreadPoolExecutor(len(conditions) + 1, thread_name_prefix="latest") as pool:
            count = pool.submit(_series_count, store)
            series = [s for part in pool.map(one, conditions) for s in part]
            if count.result() != len(series):
                # a series no part holds (an engine whose "= ''" misses a series without a
                # host tag), or no count to tell: the whole measurement in one query
                series = one("")
    out, shared = _one_per_gpu(series)
    out.sort(key=lambda x: (x.host, x.gpu_index, x.uuid))
    return out, shared


def xid_events(
    store: InfluxStore, start_ns: int, end_ns: int, hosts: Sequence[str] | None
) -> pd.DataFrame:
    """``base.xid_events``: the points in the range whose ``xid_count`` is above zero."""
    import pandas as pd

    series = store.query(
        f'SELECT "{FIELD_XID_LAST}", "{FIELD_XID_COUNT}" FROM "{MEASUREMENT}" WHERE '
        f'{store.where(start_ns, end_ns, hosts)} AND "{FIELD_XID_COUNT}" > 0 GROUP BY {GROUP_TAGS}'
    )
    rows = []
    for s in series:
        gpu = gpu_of_tags(s.get("tags", {}))
        cols = s["columns"]
        for row in s.get("values", []):
            v = dict(zip(cols, row, strict=True))
            last, count = (v.get(f) for f in (FIELD_XID_LAST, FIELD_XID_COUNT))
            rows.append((int(row[0]), *gpu, math.nan if last is None else float(last), count))
    frame = pd.DataFrame.from_records(rows, columns=list(XID_COLUMNS))
    frame = frame.astype({"time_ns": "int64", "gpu_index": "int64"})
    frame = frame.astype({"xid_last": "float64", "xid_count": "float64"})
    return frame.sort_values(["time_ns", "host", "gpu_index"], kind="stable").reset_index(drop=True)


def series(
    store: InfluxStore, read: SeriesRead, source: RollupSource | None = None
) -> pd.DataFrame:
    """``Store.series``: from the engine's rollups where they answer, else raw ``GROUP BY``.
    ``source``: the rollups as the reads of one view share them (``shared_reads``)."""
    start_ns, end_ns, step_s, hosts = read.start_ns, read.end_ns, read.step_s, read.hosts
    attrs = checked_fields(read.fields, FIELD_BY_ATTR)
    if step_s is not None and store.use_rollups and int(step_s) > 0:
        from gpuwatt.store import engine_rollups

        served = engine_rollups.read_levels(
            source or store.read_rollups, start_ns, end_ns, int(step_s) * 10**9, attrs, hosts
        )
        if served is not None:
            frame = engine_rollups.frame(*served, attrs)
            unrolled = store.rollups.unrolled_hosts(hosts)
            if not unrolled:
                return frame
            # Hosts no collector rolls (Telegraf alone writes their GPUs): read raw.
            raw = raw_series(store, start_ns, end_ns, attrs, int(step_s), unrolled)
            return _beside(frame[~frame["host"].isin(unrolled)], raw)
    return raw_series(store, start_ns, end_ns, attrs, step_s, hosts)


def raw_series(
    store: InfluxStore,
    start_ns: int,
    end_ns: int,
    attrs: Sequence[str],
    step_s: int | None,
    hosts: Sequence[str] | None,
) -> pd.DataFrame:
    """Raw samples (``step_s`` None) or their ``GROUP BY time()`` buckets, Telegraf's included.
    ``hosts``: their GPUs' rows as a read of every host gives them, a Telegraf that names the
    same GPUs ``host.domain`` included (``hosts_or_fqdn_condition``)."""
    where = store.where(start_ns, end_ns, None)
    if hosts is not None:
        where += f" AND {store.hosts_or_fqdn_condition(hosts)}"
    tg = [c for c in extra_columns(attrs) if has_telegraf_field(store, c[0])]
    if step_s is None:
        # gpu_lost keeps lost-GPU markers as rows (InfluxQL drops rows whose selected
        # fields are all null), as SqliteStore returns them.
        selects = [ident(FIELD_LOST)]
        selects += [f"{ident(FIELD_BY_ATTR[a].field)} AS {ident(a)}" for a in attrs]
        selects += [f"{ident(f)} AS {ident(c)}" for f, c, _ in tg]
        group = GROUP_TAGS
    else:
        if int(step_s) <= 0:
            raise ValueError("step_s must be positive")
        selects = [f"count({ident(FIELD_LOST)}) AS {_COUNT_ALIAS}"]
        for a in attrs:
            fn = "last" if a in LAST_VALUE_ATTRS else "mean"
            selects.append(f"{fn}({ident(FIELD_BY_ATTR[a].field)}) AS {ident(a)}")
        for f, c, last in tg:  # Telegraf's names for some of ``attrs``
            selects.append(f"{'last' if last else 'mean'}({ident(f)}) AS {ident(c)}")
        group = f"time({int(step_s)}s), {GROUP_TAGS} fill(none)"
    series = store.query(
        f'SELECT {", ".join(selects)} FROM "{MEASUREMENT}" WHERE {where} GROUP BY {group}'
    )
    # gpuwatt's rows carry gpu_lost (Telegraf's do not): its identity wins for a shared GPU
    marker = FIELD_LOST if step_s is None else _COUNT_ALIAS
    frame = _frame(series, attrs, [*(c for _, c, _ in tg), marker])
    ours = frame.pop(marker).to_numpy()
    ours = (ours == ours) if step_s is None else (ours > 0)  # not NaN; a count above zero
    # one GPU, whatever host/name tags or other tags its writers add (gpuwatt.telegraf)
    frame = one_identity_per_uuid(fill_from_telegraf(frame), ours)
    if hosts is not None and len(frame):  # not another machine named ``host.domain``
        frame = frame.loc[frame["host"].isin(hosts)].reset_index(drop=True)
    if step_s is not None and len(frame):
        # a bucket cut by the range's start is keyed at the start (``Store.series``)
        frame["time_ns"] = frame["time_ns"].clip(lower=start_ns)
    return frame


def _beside(rolled: pd.DataFrame, raw: pd.DataFrame) -> pd.DataFrame:
    """Rows read from rollups and rows read raw as one frame, in the store's order."""
    import pandas as pd

    if not len(raw):
        return rolled.reset_index(drop=True)
    raw = raw.reindex(columns=list(rolled.columns))  # a raw bucket's seen time: not known
    if not len(rolled):
        return raw.reset_index(drop=True)
    both = pd.concat([rolled, raw], ignore_index=True)
    return both.sort_values(["time_ns", "host", "gpu_index", "uuid"], kind="stable").reset_index(
        drop=True
    )


def telegraf_processes(store: InfluxStore, since_ns: int) -> list[TelegrafProcess]:
    """The processes of each host's newest ``nvidia_smi_process`` points since ``since_ns``
    (Telegraf tags them by process name and type only: see ``telegraf.TelegrafProcess``)."""
    series = store.query(
        f'SELECT * FROM "{MEASUREMENT_PROCESS}" WHERE time >= {int(since_ns)} GROUP BY *'
    )
    points = [
        process_from_point(row[0], s.get("tags", {}), dict(zip(s["columns"], row, strict=True)))
        for s in series
        for row in s.get("values", [])
    ]
    newest: dict[str, int] = {}
    for p in points:
        newest[p.host] = max(newest.get(p.host, p.time_ns), p.time_ns)
    out = [p for p in points if p.time_ns == newest[p.host]]
    return sorted(out, key=lambda p: (p.host, p.pid or 0))


def telegraf_mig_devices(store: InfluxStore, since_ns: int) -> list[TelegrafMigDevice]:
    """The newest point of each MIG device in Telegraf's ``nvidia_smi_mig`` since ``since_ns``,
    one per (GPU uuid, MIG index) whatever its P-state tag."""
    series = store.query(
        f'SELECT * FROM "{MEASUREMENT_MIG}" WHERE time >= {int(since_ns)} '
        "GROUP BY * ORDER BY time DESC LIMIT 1"
    )
    newest: dict[tuple[str, int | None], TelegrafMigDevice] = {}
    for s in series:
        for row in s.get("values", []):
            d = mig_from_point(row[0], s.get("tags", {}), dict(zip(s["columns"], row, strict=True)))
            key = (d.gpu_uuid, d.mig_index)
            if key not in newest or newest[key].time_ns < d.time_ns:
                newest[key] = d
    return sorted(newest.values(), key=lambda d: (d.host, d.gpu_uuid, d.mig_index or 0))


def _one_per_gpu(
    series: list[dict[str, Any]],
) -> tuple[list[GpuSample], dict[str, tuple[str, ...]]]:
    """``latest()``'s rows, one sample per GPU uuid: Telegraf's extra tags (``pstate``...) make
    one GPU several series, and a GPU two collectors write is written twice (``telegraf``)."""
    candidates = []
    for s in series:
        columns = s["columns"]
        tags = s.get("tags", {})
        for row in s.get("values", []):
            values = dict(zip(columns, row, strict=True))
            writer = "gpuwatt" if is_gpuwatt_point(values) else "telegraf"
            candidates.append((sample_from_fields(row[0], tags, values), writer))
    out, shared = merge_writers(candidates)
    report_shared(shared)
    return out, shared


def _as_float(v: Any) -> float:
    """A stored value as a float: Telegraf's "Yes"/"No" flags are 1.0/0.0."""
    if isinstance(v, str):
        b = yes_no(v)
        return math.nan if b is None else float(b)
    return float(v)


def _frame(
    series: list[dict[str, Any]], attrs: Sequence[str], extra: Sequence[str] = ()
) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    keys: list[tuple[Any, ...]] = []
    values: list[list[Any]] = []
    for s in series:
        tags = s.get("tags", {})
        gpu = gpu_of_tags(tags)
        pos = [s["columns"].index(a) for a in (*attrs, *extra)]
        for row in s.get("values", []):
            keys.append((row[0], *gpu))
            values.append([row[i] for i in pos])
    columns = [*KEY_COLUMNS, *attrs, *extra]
    if not keys:
        dtypes = {
            "time_ns": "int64",
            "gpu_index": "int64",
            **dict.fromkeys((*attrs, *extra), "float64"),
        }
        return pd.DataFrame(columns=columns).astype(dtypes)
    df = pd.DataFrame.from_records(keys, columns=list(KEY_COLUMNS))
    try:
        cells = [[np.nan if v is None else float(v) for v in row] for row in values]
    except ValueError:  # a string: Telegraf's "Yes"/"No" flags (the rare case, so not first)
        cells = [[np.nan if v is None else _as_float(v) for v in row] for row in values]
    data = np.array(cells, dtype="float64").reshape(len(values), len(attrs) + len(extra))
    for i, a in enumerate(attrs):
        scale = FIELD_BY_ATTR[a].scale
        df[a] = data[:, i] * scale if scale != 1.0 else data[:, i]
    for i, c in enumerate(extra, start=len(attrs)):
        df[c] = data[:, i]
    df = df.astype({"time_ns": "int64", "gpu_index": "int64"})
    return df.sort_values(["time_ns", "host", "gpu_index", "uuid"], kind="stable").reset_index(
        drop=True
    )
