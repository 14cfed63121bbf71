"""XID events on a Prometheus-compatible engine (``PromStore.xid_events``; ``base.xid_events``).

Each source keeps them its own way:

- gpuwatt's line protocol in VictoriaMetrics (``influx``): a sample that carried XIDs has
  ``nvidia_smi_xid_last`` (its last code) and ``nvidia_smi_xid_count``, as in InfluxDB: an event
  per such sample.
- dcgm-exporter (``dcgm``): ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the last XID the GPU
  raised, scrape after scrape: an event where it changes to a code (the point before the range
  is read too, so that a code standing since before it is not an event again). The same code
  raised twice in a row cannot be told apart from one.
- gpuwatt's ``/metrics`` (``gpuwatt``): ``gpuwatt_xid_errors`` counts a collector's XIDs, without
  their codes: an event where it rises (code unknown: NaN), a restarted collector's drop none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuwatt.prometheus_names import XID
from gpuwatt.schema import FIELD_XID_COUNT, FIELD_XID_LAST, MEASUREMENT
from gpuwatt.store.base import XID_COLUMNS
from gpuwatt.store.promql_dialects import DCGM, GPUWATT, INFLUX, NS_PER_MS
from gpuwatt.store.promql_frames import Ident, ident_reader

if TYPE_CHECKING:
    import pandas as pd

    from gpuwatt.store.promql import PromStore

#: How far before a range the gauge or counter is read, for its value just before the range:
#: longer than any scrape interval.
LOOKBEHIND_NS = 600 * 1_000_000_000
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"

Row = tuple[int, Ident, float, float]  # time (ns), GPU, last code, count


def xid_events(
    store: PromStore, start_ns: int, end_ns: int, hosts: Sequence[str] | None
) -> pd.DataFrame:
    """``base.xid_events`` of ``[start_ns, end_ns)``: ``XID_COLUMNS``, in time order."""
    if end_ns <= start_ns:
        rows: list[Row] = []
    elif store.dialect is INFLUX:
        rows = _per_sample(store, start_ns, end_ns, hosts)
    elif store.dialect is DCGM:
        rows = _changes(store, DCGM_XID, start_ns, end_ns, hosts, counter=False)
    elif store.dialect is GPUWATT:
        rows = _changes(store, XID, start_ns, end_ns, hosts, counter=True)
    else:  # a source with no XIDs
        rows = []
    return _frame(rows)


def _points(
    store: PromStore, metric: str, start_ns: int, end_ns: int, hosts: Sequence[str] | None
) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    """Each series of ``metric`` (a regular expression of names) and its raw points in
    ``[start_ns, end_ns)``, times in ns."""
    out = []
    for series in store._raw(metric, start_ns, end_ns, hosts):
        pts = [(round(float(t) * 1000) * NS_PER_MS, float(v)) for t, v in series["values"]]
        out.append((series["metric"], [(t, v) for t, v in pts if start_ns <= t < end_ns]))
    return out


def _per_sample(
    store: PromStore, start_ns: int, end_ns: int, hosts: Sequence[str] | None
) -> list[Row]:
    last_name, count_name = f"{MEASUREMENT}_{FIELD_XID_LAST}", f"{MEASUREMENT}_{FIELD_XID_COUNT}"
    gpu_of = ident_reader(store.dialect)
    by_sample: dict[tuple[int, Ident], dict[str, float]] = {}
    for labels, pts in _points(store, f"{last_name}|{count_name}", start_ns, end_ns, hosts):
        column = "last" if labels.get("__name__") == last_name else "count"
        gpu = gpu_of(labels)
        for t, v in pts:
            by_sample.setdefault((t, gpu), {})[column] = v
    return [
        (t, gpu, v.get("last", float("nan")), v["count"])
        for (t, gpu), v in by_sample.items()
        if v.get("count", 0.0) > 0
    ]


def _changes(
    store: PromStore,
    metric: str,
    start_ns: int,
    end_ns: int,
    hosts: Sequence[str] | None,
    *,
    counter: bool,
) -> list[Row]:
    """Events where a GPU's last-XID gauge changes to a code, or its XID counter rises. The
    nodes whose series changed at all are asked first (``changes``, one value per GPU): every
    GPU has the series, scrape after scrape, and few ever change it or hold a code."""
    lo = start_ns - LOOKBEHIND_NS
    window_ms = (end_ns - lo) // NS_PER_MS + 1
    sel = f"{store._selector(metric, hosts)}[{window_ms}ms]"
    # (or a code held: a series that began with one, no point before it, is an event too)
    changed = store.query(f"changes({sel}) > 0 or last_over_time({sel}) > 0", end_ns)
    host_label = store.dialect.host
    hosts = sorted({r["metric"].get(host_label, "") for r in changed})
    if not hosts:
        return []
    gpu_of = ident_reader(store.dialect)
    by_gpu: dict[Ident, list[tuple[int, float]]] = {}
    for labels, pts in _points(store, metric, lo, end_ns, hosts):
        by_gpu.setdefault(gpu_of(labels), []).extend(pts)
    rows: list[Row] = []
    for gpu, pts in by_gpu.items():
        pts.sort()
        before: float | None = None
        for t, v in pts:
            if t >= start_ns and before is not None and v != before:
                if counter and v > before:
                    rows.append((t, gpu, float("nan"), v - before))
                elif not counter and v > 0:
                    rows.append((t, gpu, v, 1.0))
            elif t >= start_ns and before is None and not counter and v > 0:
                rows.append((t, gpu, v, 1.0))  # no point before: the code is new to us
            before = v
    return rows


def _frame(rows: list[Row]) -> Any:
    import pandas as pd

    records = [(t, g[0], g[1], g[2], g[3], last, count) for t, g, last, count in rows]
    frame = pd.DataFrame.from_records(records, columns=list(XID_COLUMNS))
    frame = frame.astype({"time_ns": "int64", "gpu_index": "int64"})
    frame = frame.astype({"xid_last": "float64", "xid_count": "float64"})
    return frame.sort_values(["time_ns", "host", "gpu_index"], kind="stable").reset_index(drop=True)
