"""Prometheus-compatible engines as a gpuwatt store: reads in PromQL over the HTTP API.

``prometheus://host:9090`` and ``victoriametrics://host:8428`` name an engine; ``source=`` says
whose series it holds (a *dialect*):

- ``gpuwatt``: scraped from collectors' ``/metrics`` (``gpuwatt.prometheus_names``); the default
  for ``prometheus://``.
- ``dcgm``: NVIDIA's dcgm-exporter (``DCGM_FI_DEV_*``, ``DCGM_FI_PROF_*`` with its ``Hostname``,
  ``gpu``, ``UUID``, ``modelName`` and ``hpc_job``/``pod`` labels): gpuwatt runs on data a cluster
  already collects, with no gpuwatt collector installed.
- ``influx``: gpuwatt's own line protocol written into VictoriaMetrics (``nvidia_smi_<field>``);
  the default for ``victoriametrics://``, which also takes the collector's writes.

Reads keep the store contract (``gpuwatt.store.base``): rows ``[start_ns, end_ns)``; with
``step_s`` one row per GPU and bucket aligned to the epoch, the mean of gauges and the last value
of ``LAST_VALUE_ATTRS``, computed in the engine (``avg_over_time``/``last_over_time`` evaluated at
each bucket's last millisecond). Range windows are left-open in VictoriaMetrics and Prometheus 3
and closed in Prometheus 2; the window is sized for each so that a bucket holds exactly the
samples with ``start <= t < end`` (timestamps are milliseconds in both engines). One query per
metric, run in parallel.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import urllib3

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import decode_name
from gpuwatt.model import METRIC_FIELDS, GpuSample
from gpuwatt.prometheus_names import ENERGY, GAUGES, REASONS_MASK, SAMPLE_TIME, UP
from gpuwatt.schema import FIELD_LOST, FIELDS, MEASUREMENT, MIB, Kind
from gpuwatt.store import LAST_VALUE_ATTRS, StoreRejected
from gpuwatt.store.base import KEY_COLUMNS, SeriesRead

if TYPE_CHECKING:
    import pandas as pd

NS_PER_MS = 1_000_000
PRESENCE = "__presence__"  # the pseudo-attribute under which the presence metric is read


@dataclass(frozen=True)
class SeriesName:
    """Where one ``GpuSample`` attribute lives in the engine: model value = engine value x scale.

    ``metric`` may be a regular expression of alternative names (dcgm-exporter renamed the
    throttle-reason field); ``kind`` rounds integers and turns booleans back into bools.
    """

    attr: str
    metric: str
    scale: float = 1.0


@dataclass(frozen=True)
class Dialect:
    """Whose series an engine holds: metric names, scales and identity labels."""

    name: str
    series: tuple[SeriesName, ...]
    host: str
    index: str
    uuid: str
    model: str
    jobs: tuple[str, ...]  # labels naming the job, the first non-empty wins
    presence: str  # a metric every sample of every GPU has (counts, times)
    sample_time: str | None = None  # a metric whose value is the sample's Unix time
    lost_metric: str | None = None  # the presence metric, where its ``lost_value`` marks lost
    lost_value: float = 1.0
    encoded_names: bool = False  # names written by gpuwatt's line protocol (``encode_name``)

    def by_attr(self) -> dict[str, SeriesName]:
        return {s.attr: s for s in self.series}


GPUWATT = Dialect(
    name="gpuwatt",
    series=(
        *(SeriesName(g.attr, g.name, 1.0 / g.scale) for g in GAUGES),
        SeriesName("energy_j", ENERGY + "_total"),
        SeriesName("clock_event_reasons", REASONS_MASK),
    ),
    host="host",
    index="gpu",
    uuid="uuid",
    model="name",
    jobs=("job_id",),
    presence=UP,
    sample_time=SAMPLE_TIME,
    lost_metric=UP,
    lost_value=0.0,
)

#: dcgm-exporter's field names (its etc/default-counters.csv and dcp-metrics-included.csv) and
#: units: utilisation in %, memory in MiB, energy in mJ since boot, clocks in MHz, DCP (PROF)
#: activities as 0-1 ratios, PROF PCIe/NVLink bytes as bytes per second.
DCGM = Dialect(
    name="dcgm",
    series=(
        SeriesName("utilization_gpu_pct", "DCGM_FI_DEV_GPU_UTIL"),
        SeriesName("utilization_memory_pct", "DCGM_FI_DEV_MEM_COPY_UTIL"),
        SeriesName("memory_used_bytes", "DCGM_FI_DEV_FB_USED", MIB),
        SeriesName("memory_free_bytes", "DCGM_FI_DEV_FB_FREE", MIB),
        SeriesName("temperature_gpu_c", "DCGM_FI_DEV_GPU_TEMP"),
        SeriesName("temperature_memory_c", "DCGM_FI_DEV_MEMORY_TEMP"),
        SeriesName("power_w", "DCGM_FI_DEV_POWER_USAGE"),
        SeriesName("energy_j", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),
        SeriesName("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK"),
        SeriesName("memory_clock_mhz", "DCGM_FI_DEV_MEM_CLOCK"),
        SeriesName(
            "clock_event_reasons",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS|DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        ),
        SeriesName("pcie_tx_bytes_per_s", "DCGM_FI_PROF_PCIE_TX_BYTES"),
        SeriesName("pcie_rx_bytes_per_s", "DCGM_FI_PROF_PCIE_RX_BYTES"),
        SeriesName("nvlink_tx_bytes_per_s", "DCGM_FI_PROF_NVLINK_TX_BYTES"),
        SeriesName("nvlink_rx_bytes_per_s", "DCGM_FI_PROF_NVLINK_RX_BYTES"),
        SeriesName("sm_active_pct", "DCGM_FI_PROF_SM_ACTIVE", 100.0),
        SeriesName("sm_occupancy_pct", "DCGM_FI_PROF_SM_OCCUPANCY", 100.0),
        SeriesName("tensor_active_pct", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100.0),
        SeriesName("fp64_active_pct", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", 100.0),
        SeriesName("fp32_active_pct", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", 100.0),
        SeriesName("fp16_active_pct", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", 100.0),
        SeriesName("dram_active_pct", "DCGM_FI_PROF_DRAM_ACTIVE", 100.0),
        SeriesName("ecc_sbe_volatile_count", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
        SeriesName("ecc_dbe_volatile_count", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
        SeriesName("remapped_rows_correctable", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
        SeriesName("remapped_rows_uncorrectable", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    ),
    host="Hostname",
    index="gpu",
    uuid="UUID",
    model="modelName",
    jobs=("hpc_job", "pod"),
    presence="DCGM_FI_DEV_GPU_UTIL",
)

#: gpuwatt's line protocol as VictoriaMetrics stores it: ``<measurement>_<field>``, tags as
#: labels, booleans as 0/1. String fields (job id, processes) are not kept by the engine.
INFLUX = Dialect(
    name="influx",
    series=tuple(
        SeriesName(f.attr, f"{MEASUREMENT}_{f.field}", f.scale)
        for f in FIELDS
        if f.kind is not Kind.STR
    ),
    host="host",
    index="index",
    uuid="uuid",
    model="name",
    jobs=(),
    presence=f"{MEASUREMENT}_{FIELD_LOST}",
    lost_metric=f"{MEASUREMENT}_{FIELD_LOST}",
    encoded_names=True,
)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (GPUWATT, DCGM, INFLUX)}
_KIND = {f.attr: f.kind for f in FIELDS}


def promql_string(value: str) -> str:
    """A PromQL string literal (Go escaping; JSON's escapes are a subset Go accepts)."""
    return json.dumps(value)


def _regex_alternatives(values: Sequence[str]) -> str:
    """An RE2 pattern matching exactly one of ``values`` (PromQL anchors label regexes)."""
    specials = set("\\.+*?()|[]{}^$")
    return "|".join("".join("\\" + c if c in specials else c for c in v) for v in values)


class PromStore:
    """A Prometheus-compatible engine read with PromQL (and, for VictoriaMetrics, written to)."""

    def __init__(
        self,
        url: str,
        dialect: Dialect,
        *,
        engine: str = "prometheus",
        left_open_windows: bool | None = None,
        timeout_s: float = 30.0,
        parallel: int = 8,
        writer: Any = None,
        latest_lookback_s: float = 3600.0,
        use_rollups: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.dialect = dialect
        self.engine = engine
        self.timeout_s = timeout_s
        self._http = urllib3.PoolManager(
            maxsize=parallel, timeout=urllib3.Timeout(total=timeout_s), retries=False
        )
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="promql")
        self._writer = writer
        self._left_open = left_open_windows
        #: How far back ``latest()`` looks for a GPU when not told (an engine has no cheap
        #: "newest sample ever"): GPUs silent for longer are not listed.
        self.latest_lookback_s = latest_lookback_s
        #: Serve bucketed reads from the rollups gpuwatt keeps in the engine
        #: (``engine_rollups``; ``source=influx`` only) when it holds any.
        self.use_rollups = use_rollups
        self._rollups: Any = None

    def __repr__(self) -> str:
        return f"PromStore({self.url!r}, source={self.dialect.name!r})"

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.clear()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> PromStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writes ---------------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self._writer is None

    def _require_writer(self) -> Any:
        if self._writer is None:
            raise StoreRejected(
                f"{self.url} is read-only for gpuwatt (Prometheus takes no pushed samples): "
                "serve the collector's samples with `gpuwatt collect --metrics-port PORT` and "
                "let Prometheus scrape them, or write to VictoriaMetrics (victoriametrics://)"
            )
        return self._writer

    def write_samples(self, samples: Sequence[GpuSample]) -> None:
        self._require_writer().write_samples(samples)

    def write_lines(self, lines: Sequence[str]) -> None:
        self._require_writer().write_lines(lines)

    @property
    def rollups(self) -> Any:
        """The rollups gpuwatt keeps in the engine (``promql_rollups.PromRollups``), or None
        where it keeps none (Prometheus; series of other writers) or ``use_rollups`` is off."""
        if not self.use_rollups or self._writer is None or self.dialect is not INFLUX:
            return None
        if self._rollups is None:
            from gpuwatt.store.promql_rollups import PromRollups

            self._rollups = PromRollups(self)
        return self._rollups

    # --- HTTP -----------------------------------------------------------------------------------

    def _api(self, path: str, fields: dict[str, str], *, method: str = "POST") -> Any:
        if method == "POST":  # queries: a form body (no URL length limit)
            fields = {**fields, "timeout": f"{self.timeout_s:g}s", "nocache": "1"}
        try:
            resp = (
                self._http.request(
                    method, f"{self.url}{path}", fields=fields, encode_multipart=False
                )
                if method == "POST"
                else self._http.request(method, f"{self.url}{path}")
            )
        except urllib3.exceptions.HTTPError as exc:
            raise StoreUnavailable(f"{self.url} unreachable: {type(exc).__name__}") from exc
        try:
            payload = _loads_without_gc(resp.data)
        except ValueError:
            payload = {}
        if resp.status >= 500 and resp.status != 503:
            raise StoreUnavailable(f"{self.url} answered HTTP {resp.status}")
        if resp.status != 200 or payload.get("status") != "success":
            error = str(payload.get("error") or resp.data[:300].decode("utf-8", "replace"))
            if resp.status in (503, 504) or payload.get("errorType") == "timeout":
                raise StoreUnavailable(f"{self.url} did not answer in time: {error}")
            raise StoreRejected(f"{self.url} rejected the query: {error}", resp.status)
        return payload["data"]

    def query(self, promql: str, at_ns: int) -> list[dict[str, Any]]:
        """An instant query at ``at_ns``; its result list (vector or matrix)."""
        data = self._api("/api/v1/query", {"query": promql, "time": _seconds(at_ns)})
        return list(data.get("result", []))

    def query_range(self, promql: str, first_ns: int, last_ns: int, step_s: int) -> list[Any]:
        data = self._api(
            "/api/v1/query_range",
            {
                "query": promql,
                "start": _seconds(first_ns),
                "end": _seconds(last_ns),
                "step": f"{int(step_s)}s",
            },
        )
        return list(data.get("result", []))

    def left_open_windows(self) -> bool:
        """Whether a range window ``[d]`` at t holds (t-d, t] (VictoriaMetrics, Prometheus 3+)."""
        if self._left_open is None:
            try:
                version = str(
                    self._api("/api/v1/status/buildinfo", {}, method="GET").get("version", "")
                )
                major = int(version.split(".")[0]) if version[:1].isdigit() else 3
            except (StoreRejected, ValueError):
                major = 3
            self._left_open = major >= 3
        return self._left_open

    def _window_ms(self, span_ns: int) -> int:
        """The window that holds ``[t - span, t)`` once evaluated at ``t - 1 ms``."""
        span_ms = span_ns // NS_PER_MS
        return max(1, span_ms if self.left_open_windows() else span_ms - 1)

    # --- selectors ------------------------------------------------------------------------------

    def _selector(self, metric: str, hosts: Sequence[str] | None) -> str:
        op = "=~" if "|" in metric else "="
        matchers = [f"__name__{op}{promql_string(metric)}"]
        if hosts is not None:
            pattern = _regex_alternatives(hosts) if hosts else "$^"
            matchers.append(f"{self.dialect.host}=~{promql_string(pattern)}")
        return "{" + ", ".join(matchers) + "}"

    def _attrs(self, fields: Sequence[str] | None) -> tuple[str, ...]:
        if fields is None:
            return METRIC_FIELDS
        unknown = [f for f in fields if f not in _KIND]
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; use GpuSample attribute names")
        return tuple(fields)

    # --- reads ----------------------------------------------------------------------------------

    def series(
        self,
        start_ns: int,
        end_ns: int,
        fields: Sequence[str] | None = None,
        *,
        step_s: int | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        attrs = self._attrs(fields)
        names = self.dialect.by_attr()
        # The presence metric is read too, so that a GPU sample (or bucket) whose requested
        # metrics are all absent, such as a lost GPU's marker, still has its row (NaN metrics).
        reads = [(a, names[a].metric) for a in attrs if a in names]
        reads.append((PRESENCE, self.dialect.presence))
        if end_ns <= start_ns:
            return _frame(self.dialect, attrs, [])
        if step_s is not None and int(step_s) > 0 and self.rollups is not None:
            from gpuwatt.store import engine_rollups

            served = engine_rollups.read_levels(
                self.rollups, start_ns, end_ns, int(step_s) * 10**9, attrs, hosts
            )
            if served is not None:
                return engine_rollups.frame(*served, attrs)
        if step_s is None:
            results = self._pool.map(
                lambda r: (r[0], _points(self._raw(r[1], start_ns, end_ns, hosts))), reads
            )
        else:
            if int(step_s) <= 0:
                raise ValueError("step_s must be positive")
            results = self._pool.map(
                lambda r: (
                    r[0],
                    _points(self._bucketed(r[0], r[1], start_ns, end_ns, step_s, hosts)),
                ),
                reads,
            )
        if step_s is None:  # raw samples: exactly [start, end)
            return _frame(self.dialect, attrs, list(results), start_ns, end_ns)
        frame = _frame(self.dialect, attrs, list(results))
        if len(frame):  # a bucket cut by the range's start is keyed at the start (``Store``)
            frame["time_ns"] = frame["time_ns"].clip(lower=start_ns)
        return frame

    def _raw(
        self, metric: str, start_ns: int, end_ns: int, hosts: Sequence[str] | None
    ) -> list[Any]:
        # Read a millisecond wider on both sides; _frame keeps exactly [start, end).
        window_ms = (end_ns - start_ns) // NS_PER_MS + 2
        return self.query(f"{self._selector(metric, hosts)}[{window_ms}ms]", end_ns + NS_PER_MS)

    def _bucketed(
        self,
        attr: str,
        metric: str,
        start_ns: int,
        end_ns: int,
        step_s: int,
        hosts: Sequence[str] | None,
    ) -> list[Any]:
        if attr == PRESENCE:
            fn = "count_over_time"
        elif attr in LAST_VALUE_ATTRS:
            fn = "last_over_time"
        else:
            fn = "avg_over_time"
        sel = self._selector(metric, hosts)
        step_ns = int(step_s) * 1_000_000_000

        def partial(lo: int, hi: int, bucket: int) -> list[dict[str, Any]]:
            """The bucket starting at ``bucket`` restricted to ``[lo, hi)``."""
            window = self._window_ms(hi - lo)
            return _tag(self.query(f"{fn}({sel}[{window}ms])", hi - NS_PER_MS), bucket)

        head = start_ns // step_ns * step_ns
        whole_start = head if head == start_ns else head + step_ns
        whole_end = end_ns // step_ns * step_ns  # whole buckets: [whole_start, whole_end)
        out: list[Any] = []
        if head < start_ns:  # the first bucket starts before the range
            out += partial(start_ns, min(head + step_ns, end_ns), head)
        if whole_end > whole_start:
            window = self._window_ms(step_ns)
            matrix = self.query_range(
                f"{fn}({sel}[{window}ms])",
                whole_start + step_ns - NS_PER_MS,
                whole_end - NS_PER_MS,
                step_s,
            )
            out += _shift(matrix, step_ns - NS_PER_MS)
        if start_ns <= whole_end < end_ns:  # the last bucket ends after the range
            out += partial(whole_end, end_ns, whole_end)
        return out

    def series_many(self, reads: Sequence[SeriesRead]) -> list[pd.DataFrame]:
        """``series`` for each read, in parallel: the engine answers them at once."""
        if len(reads) <= 1:
            return [self.series(r.start_ns, r.end_ns, r.fields, step_s=r.step_s, hosts=r.hosts)
                    for r in reads]  # fmt: skip
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix="reads") as pool:
            return list(
                pool.map(
                    lambda r: self.series(
                        r.start_ns, r.end_ns, r.fields, step_s=r.step_s, hosts=r.hosts
                    ),
                    reads,
                )
            )

    def count_samples(self, start_ns: int, end_ns: int) -> int:
        if end_ns <= start_ns:
            return 0
        result = self.query(
            f"sum(count_over_time({self._selector(self.dialect.presence, None)}"
            f"[{self._window_ms(end_ns - start_ns)}ms]))",
            end_ns - NS_PER_MS,
        )
        return int(float(result[0]["value"][1])) if result else 0

    def latest(self, *, since_ns: int | None = None, now_ns: int | None = None) -> list[GpuSample]:
        """The newest value of each metric of every GPU seen since ``since_ns`` (default: the
        last ``latest_lookback_s``)."""
        import time

        now = time.time_ns() if now_ns is None else now_ns
        lookback_ns = round(self.latest_lookback_s * 1e9)
        since = now - lookback_ns if since_ns is None else since_ns
        window = f"[{max(1, (now - since) // NS_PER_MS)}ms]"
        names = self.dialect.by_attr()
        presence = self._selector(self.dialect.presence, None)
        times = self.query(self._sample_times(window, now - since), now)
        queries = [(a, f"last_over_time({self._selector(s.metric, None)}{window})")
                   for a, s in names.items()]  # fmt: skip
        if self.dialect.lost_metric and self.dialect.lost_metric != self.dialect.presence:
            queries.append(
                (
                    "lost",
                    f"last_over_time({self._selector(self.dialect.lost_metric, None)}{window})",
                )
            )
        results = dict(self._pool.map(lambda q: (q[0], self.query(q[1], now)), queries))
        if self.dialect.lost_metric is not None:  # the presence metric itself marks lost GPUs
            results["lost"] = self.query(f"last_over_time({presence}{window})", now)
        return _latest_samples(self.dialect, times, results)

    def _sample_times(self, window: str, lookback_ns: int) -> str:
        """PromQL for each GPU's newest sample time (Unix seconds) within ``window``."""
        if self.dialect.sample_time is not None:
            sel = self._selector(self.dialect.sample_time, None)
            return f"last_over_time({sel}{window})"
        presence = self._selector(self.dialect.presence, None)
        if self.engine == "victoriametrics":
            return f"tlast_over_time({presence}{window})"
        # Prometheus: the newest timestamp() seen by a subquery. Its resolution stays within the
        # 5-minute lookback for up to ~1.7 days; beyond that a GPU silent for that long may be
        # missed, which only drops GPUs that are long gone.
        resolution_s = max(15, -(-lookback_ns // (10_000 * 1_000_000_000)))
        return f"last_over_time(timestamp({presence})[{window[1:-1]}:{resolution_s}s])"


def _loads_without_gc(data: bytes) -> Any:
    """``json.loads`` with the cyclic garbage collector paused.

    A 1,000-GPU answer is ~100,000 small lists and strings, all alive until the parse ends: they
    trigger full collections that walk every object of the process (seen: 40 ms parses taking
    600 ms, one in three). JSON builds no reference cycles, so pausing collection is safe.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(data)
    finally:
        if enabled:
            gc.enable()


def _seconds(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{(ns % 1_000_000_000) // NS_PER_MS:03d}"


def _tag(result: list[dict[str, Any]], bucket_ns: int) -> list[dict[str, Any]]:
    """Instant-query results as one-point matrices at ``bucket_ns``."""
    return [{"metric": r["metric"], "values": [[bucket_ns / 1e9, r["value"][1]]]} for r in result]


def _shift(result: list[dict[str, Any]], by_ns: int) -> list[dict[str, Any]]:
    """Range results with each point moved from its evaluation time to its bucket's start."""
    for r in result:
        r["values"] = [
            [(round(float(t) * 1000) * NS_PER_MS - by_ns) / 1e9, v] for t, v in r["values"]
        ]
    return result


def _ident(dialect: Dialect, labels: dict[str, str]) -> tuple[str, int, str, str]:
    try:
        index = int(labels.get(dialect.index, "-1"))
    except ValueError:
        index = -1
    names = (
        labels.get(dialect.host, ""),
        labels.get(dialect.uuid, ""),
        labels.get(dialect.model, ""),
    )
    if dialect.encoded_names:  # gpuwatt's line protocol (``line_protocol.encode_name``)
        names = tuple(map(decode_name, names))  # type: ignore[assignment]
    return (names[0], index, names[1], names[2])


@dataclass(frozen=True)
class Points:
    """One metric's answer as arrays: each series' labels and length, its points' times (s) and
    values, in series order. Made in the worker thread that fetched it, so that the engine's
    JSON (lists of small lists) is dropped at once."""

    labels: list[dict[str, str]]
    lengths: list[int]
    t_s: Any  # numpy float64
    values: Any  # numpy float64


def _points(matrix: list[dict[str, Any]]) -> Points:
    import numpy as np

    lengths = [len(series.get("values") or ()) for series in matrix]
    flat = [pt for series in matrix for pt in series.get("values") or ()]
    return Points(
        [series["metric"] for series in matrix],
        lengths,
        np.array([pt[0] for pt in flat], dtype=np.float64),
        np.array([pt[1] for pt in flat], dtype=np.float64),
    )


def _frame(
    dialect: Dialect,
    attrs: Sequence[str],
    results: list[tuple[str, Points]],
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> pd.DataFrame:
    """Long-form rows (``KEY_COLUMNS`` + ``attrs``, sorted by time then GPU) from per-attribute
    answers; ``start_ns``/``end_ns`` keep only raw samples inside the range.

    Built column-wise: a row is one (time, GPU) code, so that 1,000 GPUs x 60 buckets x a dozen
    metrics take one sort, not a Python loop per point (``bench/promql_read.py``).
    """
    import numpy as np
    import pandas as pd

    idents: dict[tuple[str, int, str, str], int] = {}
    gid_parts: list[Any] = []
    t_parts: list[Any] = []
    v_parts: list[Any] = []
    col_parts: list[Any] = []
    col_of = {a: i for i, a in enumerate(attrs)}
    names = dialect.by_attr()
    for attr, points in results:
        if not len(points.t_s):
            continue
        scale = 1.0 if attr == PRESENCE else names[attr].scale
        series_gids = [idents.setdefault(_ident(dialect, m), len(idents)) for m in points.labels]
        gid_parts.append(np.repeat(np.array(series_gids, dtype=np.int64), points.lengths))
        t_parts.append(points.t_s)
        v_parts.append(points.values * scale)
        # -1: the presence metric, keys only
        col_parts.append(np.full(len(points.t_s), col_of.get(attr, -1), dtype=np.int64))
    columns = [*KEY_COLUMNS, *attrs]
    if not gid_parts:
        dtypes = {"time_ns": "int64", "gpu_index": "int64", **dict.fromkeys(attrs, "float64")}
        return pd.DataFrame(columns=columns).astype(dtypes)
    gids = np.concatenate(gid_parts)
    t_ns = np.rint(np.concatenate(t_parts) * 1000).astype(np.int64) * NS_PER_MS
    vals = np.concatenate(v_parts)
    cols = np.concatenate(col_parts)
    if start_ns is not None and end_ns is not None:
        inside = (t_ns >= start_ns) & (t_ns < end_ns)
        gids, t_ns, vals, cols = gids[inside], t_ns[inside], vals[inside], cols[inside]
    # Rank GPUs by (host, index, uuid): a row's code then sorts by time, then GPU.
    ident_list = list(idents)
    order = sorted(range(len(ident_list)), key=lambda g: ident_list[g][:3])
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    times, t_index = np.unique(t_ns, return_inverse=True)
    codes, row = np.unique(t_index * len(order) + rank[gids], return_inverse=True)
    data = np.full((len(codes), len(attrs)), np.nan)
    valued = cols >= 0
    data[row[valued], cols[valued]] = vals[valued]
    by_rank = [ident_list[g] for g in order]
    gpu_of_row = codes % len(order)
    df = pd.DataFrame(
        {
            "time_ns": times[codes // len(order)],
            "host": np.array([i[0] for i in by_rank], dtype=object)[gpu_of_row],
            "gpu_index": np.array([i[1] for i in by_rank], dtype=np.int64)[gpu_of_row],
            "uuid": np.array([i[2] for i in by_rank], dtype=object)[gpu_of_row],
            "name": np.array([i[3] for i in by_rank], dtype=object)[gpu_of_row],
        }
    )
    for i, a in enumerate(attrs):
        df[a] = data[:, i]
    return df


def _latest_samples(
    dialect: Dialect, times: list[dict[str, Any]], results: dict[str, list[dict[str, Any]]]
) -> list[GpuSample]:
    by_gpu: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    jobs: dict[tuple[str, int, str, str], str] = {}
    names = dialect.by_attr()
    for r in times:
        key = _ident(dialect, r["metric"])
        by_gpu.setdefault(key, {})["time_ns"] = round(float(r["value"][1]) * 1000) * NS_PER_MS
        for label in dialect.jobs:
            if r["metric"].get(label):
                jobs.setdefault(key, r["metric"][label])
                break
    for r in results.pop("lost", []):
        key = _ident(dialect, r["metric"])
        if key in by_gpu:
            by_gpu[key]["lost"] = float(r["value"][1]) == dialect.lost_value
    for attr, result in results.items():
        for r in result:
            key = _ident(dialect, r["metric"])
            if key not in by_gpu or by_gpu[key].get("lost"):
                continue  # a lost GPU's newest sample is its marker: no metrics
            value = float(r["value"][1])
            if math.isnan(value):
                continue
            value *= names[attr].scale
            kind = _KIND.get(attr)
            by_gpu[key][attr] = (
                round(value) if kind is Kind.INT else bool(value) if kind is Kind.BOOL else value
            )
    out = [
        GpuSample(host=k[0], gpu_index=k[1], uuid=k[2], name=k[3], job_id=jobs.get(k), **v)
        for k, v in by_gpu.items()
    ]
    out.sort(key=lambda s: (s.host, s.gpu_index, s.uuid))
    return out
