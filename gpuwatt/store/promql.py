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
metric, run in parallel. The dialects are in ``promql_dialects``; answers become frames in
``promql_frames``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import urllib3

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import LineEncoder, with_info_line
from gpuwatt.model import GpuSample, GpuSeen
from gpuwatt.schema import COUNTER_ATTRS
from gpuwatt.store import LAST_VALUE_ATTRS, StoreRejected, checked_fields
from gpuwatt.store import promql_frames as frames
from gpuwatt.store.base import SeriesRead
from gpuwatt.store.promql_dialects import (
    DCGM,
    DIALECTS,
    GPUWATT,
    INFLUX,
    KIND,
    NS_PER_MS,
    PRESENCE,
    Dialect,
    promql_string,
    regex_alternatives,
)
from gpuwatt.store.rollup_cache import DEFAULT_BUDGET_BYTES, RollupCache

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DCGM", "DIALECTS", "GPUWATT", "INFLUX", "Dialect", "PromStore", "promql_string"]


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
        self._http = urllib3.PoolManager(  # room for each read's exports sent at once
            maxsize=2 * parallel, timeout=urllib3.Timeout(total=timeout_s), retries=False
        )
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="promql")
        self._writer = writer
        self._left_open = left_open_windows
        #: How far back ``latest()`` looks for a GPU when not told (an engine has no cheap
        #: "newest sample ever"): GPUs silent for longer are not listed.
        self.latest_lookback_s = latest_lookback_s
        #: "now" for ``latest`` and ``gpus_seen`` when not told (a bench replaying data that
        #: ended in the past sets the data's end)
        self.clock_ns: Callable[[], int] = time.time_ns
        #: Serve bucketed reads from the rollups gpuwatt keeps in the engine
        #: (``engine_rollups``; ``source=influx`` only) when it holds any.
        self.use_rollups = use_rollups
        self._rollups: Any = None
        #: memory for the rollup points reads keep (``rollup_cache``; 0: none kept)
        self.rollup_cache_bytes = DEFAULT_BUDGET_BYTES
        self._rollup_cache: RollupCache | None = None
        self._cache_lock = threading.Lock()

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
        self.write_lines(LineEncoder().encode_many(samples))

    def write_lines(self, lines: Sequence[str]) -> None:
        """The lines as the engine keeps them: their string fields as the labels of an info
        series (``line_protocol.with_info_line``: VictoriaMetrics drops string fields)."""
        self._require_writer().write_lines([x for line in lines for x in with_info_line(line)])

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

    @property
    def read_rollups(self) -> Any:
        """``rollups`` as reads take them: kept by chunk in memory (``rollup_cache``)."""
        rollups = self.rollups
        if rollups is None:
            return None
        with self._cache_lock:
            if self._rollup_cache is None:
                self._rollup_cache = RollupCache(rollups, self.rollup_cache_bytes)
        return self._rollup_cache

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
            payload = frames.loads_without_gc(resp.data)
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
        data = self._api("/api/v1/query", {"query": promql, "time": frames.seconds(at_ns)})
        return list(data.get("result", []))

    def export(self, match: str, start_ns: int, end_ns: int) -> frames.Exported:
        """VictoriaMetrics' raw points of the series ``match`` selects in ``[start_ns, end_ns)``
        (``/api/v1/export``: a JSON line per series, its values as numbers): one request for
        many metrics, and ~4x faster to fetch and read than a PromQL range selector per metric,
        whose answer is a list of ``[time, "value"]`` pairs (an hour of a 1,024-GPU cluster's
        minute rollups: 0.75 s against 3.0 s, ``bench/dashboard.py --store victoriametrics``)."""
        fields = {
            "match[]": match,
            "start": frames.seconds(start_ns),
            "end": frames.seconds(end_ns - NS_PER_MS),  # inclusive, in milliseconds
        }
        try:
            resp = self._http.request(
                "POST", f"{self.url}/api/v1/export", fields=fields, encode_multipart=False
            )
        except urllib3.exceptions.HTTPError as exc:
            raise StoreUnavailable(f"{self.url} unreachable: {type(exc).__name__}") from exc
        if resp.status != 200:
            error = resp.data[:300].decode("utf-8", "replace")
            if resp.status >= 500:
                raise StoreUnavailable(f"{self.url} answered HTTP {resp.status}: {error}")
            raise StoreRejected(f"{self.url} rejected the export: {error}", resp.status)
        try:
            with frames.gc_paused():  # many small containers, no cycles
                fast = frames.exported_text(resp.data)
                if fast is not None:
                    return fast
                # one JSON document of all the lines (a line per series, no newline inside one)
                joined = b"[" + b",".join(x for x in resp.data.split(b"\n") if x) + b"]"
                return frames.exported(json.loads(joined))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreRejected(f"{self.url} sent an unreadable export") from exc

    def export_at_once(self, matches: Sequence[str], start_ns: int, end_ns: int) -> frames.Exported:
        """``export`` of each of ``matches``, the requests sent at once, as one ``Exported``.
        VictoriaMetrics answers one export on about one core: 1,024 GPUs' newest raw minute
        (15 metrics, 3.1 MB) took ~300 ms in one request and ~200-220 ms in two, the engine's
        CPU alike, on a 2-core machine (``curl``-like requests from Python, 4 runs each)."""
        if len(matches) == 1:
            return self.export(matches[0], start_ns, end_ns)
        with ThreadPoolExecutor(max_workers=len(matches), thread_name_prefix="export") as pool:
            parts = list(pool.map(lambda m: self.export(m, start_ns, end_ns), matches))
        return frames.joined_exports(parts)

    def has_series(self, match: str, start_ns: int, end_ns: int) -> bool:
        """Whether the engine lists a series of ``match`` with samples in ``[start_ns, end_ns)``
        (``/api/v1/series``: from its index; VictoriaMetrics' per-day index may list one whose
        samples on those days lie outside the range, never the other way round)."""
        data = self._api(
            "/api/v1/series",
            {
                "match[]": match,
                "start": frames.seconds(start_ns),
                "end": frames.seconds(end_ns - NS_PER_MS),
                "limit": "1",
            },
        )
        return bool(data)

    def query_range(
        self, promql: str, first_ns: int, last_ns: int, step_s: int, *, fresh: bool = False
    ) -> list[Any]:
        """``fresh``: not from VictoriaMetrics' cache of range results (which keeps answers
        for times older than a few minutes, and so misses points written there since)."""
        fields = {
            "query": promql,
            "start": frames.seconds(first_ns),
            "end": frames.seconds(last_ns),
            "step": f"{int(step_s)}s",
        }
        if fresh:
            fields["nocache"] = "1"
        data = self._api("/api/v1/query_range", fields)
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
            pattern = regex_alternatives(hosts) if hosts else "$^"
            matchers.append(f"{self.dialect.host}=~{promql_string(pattern)}")
        return "{" + ", ".join(matchers) + "}"

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
        return self._series(SeriesRead(start_ns, end_ns, fields, step_s, hosts))

    def _series(self, read: SeriesRead, source: Any = None) -> pd.DataFrame:
        """``series``; ``source``: the rollups as the reads of one view share them
        (``shared_reads``)."""
        start_ns, end_ns, fields, step_s, hosts = (
            read.start_ns, read.end_ns, read.fields, read.step_s, read.hosts
        )  # fmt: skip
        attrs = checked_fields(fields, KIND)
        names = self.dialect.by_attr()
        # The presence metric is read too, so that a GPU sample (or bucket) whose requested
        # metrics are all absent, such as a lost GPU's marker, still has its row (NaN metrics).
        reads = [(a, names[a].metric) for a in attrs if a in names]
        reads.append((PRESENCE, self.dialect.presence))
        if end_ns <= start_ns:
            return frames.frame(self.dialect, attrs, [])
        if step_s is not None and int(step_s) > 0 and self.rollups is not None:
            from gpuwatt.store import engine_rollups

            served = engine_rollups.read_levels(
                source or self.read_rollups, start_ns, end_ns, int(step_s) * 10**9, attrs, hosts
            )
            if served is not None:
                return engine_rollups.frame(*served, attrs)
        if step_s is None:
            results = self._pool.map(
                lambda r: (r[0], frames.points(self._raw(r[1], start_ns, end_ns, hosts))), reads
            )
        else:
            if int(step_s) <= 0:
                raise ValueError("step_s must be positive")
            results = self._pool.map(
                lambda r: (
                    r[0],
                    frames.points(self._bucketed(r[0], r[1], start_ns, end_ns, step_s, hosts)),
                ),
                reads,
            )
        if step_s is None:  # raw samples: exactly [start, end)
            return frames.frame(self.dialect, attrs, list(results), start_ns, end_ns)
        frame = frames.frame(self.dialect, attrs, list(results))
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
        sel = self._selector(metric, hosts)
        step_ns = int(step_s) * 1_000_000_000
        bucket_of = self._bucket_expr(attr, sel)

        def partial(lo: int, hi: int, bucket: int) -> list[dict[str, Any]]:
            """The bucket starting at ``bucket`` restricted to ``[lo, hi)``."""
            window = self._window_ms(hi - lo)
            return frames.instant_as_matrix(
                self.query(bucket_of(f"{window}ms"), hi - NS_PER_MS), bucket
            )

        head = start_ns // step_ns * step_ns
        whole_start = head if head == start_ns else head + step_ns
        whole_end = end_ns // step_ns * step_ns  # whole buckets: [whole_start, whole_end)
        out: list[Any] = []
        if head < start_ns:  # the first bucket starts before the range
            out += partial(start_ns, min(head + step_ns, end_ns), head)
        if whole_end > whole_start:
            window = self._window_ms(step_ns)
            matrix = self.query_range(
                bucket_of(f"{window}ms"),
                whole_start + step_ns - NS_PER_MS,
                whole_end - NS_PER_MS,
                step_s,
            )
            out += frames.shift(matrix, step_ns - NS_PER_MS)
        if start_ns <= whole_end < end_ns:  # the last bucket ends after the range
            out += partial(whole_end, end_ns, whole_end)
        return out

    def _bucket_expr(self, attr: str, sel: str) -> Callable[[str], str]:
        """The PromQL of a bucket of ``attr``'s series ``sel``, for a window: the mean of a
        gauge, the count of the presence metric, the last value of a counter or flag. Where the
        dialect's series name their job (dcgm-exporter's ``hpc_job``: a GPU has a series per
        job), a bucket takes all of the GPU's series: sums and counts added up by GPU, a
        counter's newest (largest) value; a flag's last value is its series' own."""
        d = self.dialect
        by = f"by ({', '.join(dict.fromkeys((d.host, d.index, d.uuid, d.model)))})"
        split = bool(d.jobs) and d.info is None
        if attr == PRESENCE:
            if split:
                return lambda w: f"sum {by} (count_over_time({sel}[{w}]))"
            return lambda w: f"count_over_time({sel}[{w}])"
        if attr in LAST_VALUE_ATTRS:
            if split and attr in COUNTER_ATTRS:
                return lambda w: f"max {by} (last_over_time({sel}[{w}]))"
            return lambda w: f"last_over_time({sel}[{w}])"
        if split:
            return lambda w: (
                f"sum {by} (sum_over_time({sel}[{w}])) / sum {by} (count_over_time({sel}[{w}]))"
            )
        return lambda w: f"avg_over_time({sel}[{w}])"

    def series_many(
        self,
        reads: Sequence[SeriesRead],
        *,
        on_done: Callable[[], None] | None = None,
        shared: Any = None,
    ) -> list[pd.DataFrame]:
        """``series`` for each read, in parallel: the engine answers them at once, the
        requests they share once (``shared``: with the other reads of a view, else with
        each other; ``shared_reads``)."""
        from gpuwatt.store import shared_reads

        return shared_reads.series_many(self, reads, self._series, on_done, shared)

    def shared_reads(self) -> Any:
        """A ``shared_reads.SharedReads`` of this store's rollups (None: it keeps none)."""
        rollups = self.read_rollups
        if rollups is None:
            return None
        from gpuwatt.store.shared_reads import SharedReads

        return SharedReads(rollups)

    def count_samples(self, start_ns: int, end_ns: int) -> int:
        if end_ns <= start_ns:
            return 0
        result = self.query(
            f"sum(count_over_time({self._selector(self.dialect.presence, None)}"
            f"[{self._window_ms(end_ns - start_ns)}ms]))",
            end_ns - NS_PER_MS,
        )
        return int(float(result[0]["value"][1])) if result else 0

    def xid_events(
        self, start_ns: int, end_ns: int, *, hosts: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """``base.xid_events``, as each source keeps XIDs (``promql_xids``)."""
        from gpuwatt.store import promql_xids

        return promql_xids.xid_events(self, start_ns, end_ns, hosts)

    def gpus_seen(self, *, since_ns: int | None = None, now_ns: int | None = None) -> list[GpuSeen]:
        """The GPUs ``latest`` gives, without their newest values (``base.gpus_seen``)."""
        from gpuwatt.store import promql_latest

        return promql_latest.gpus_seen(self, since_ns=since_ns, now_ns=now_ns)

    def latest_of(
        self,
        hosts: Sequence[str] | None = None,
        *,
        attrs: Sequence[str] | None = None,
        now_ns: int | None = None,
    ) -> list[GpuSample]:
        """``latest`` of the GPUs of ``hosts`` alone (None: all), with the metrics ``attrs``
        alone (None: all) (``base.latest_of``)."""
        from gpuwatt.store import promql_latest

        return promql_latest.latest(self, now_ns=now_ns, hosts=hosts, attrs=attrs)

    def latest(self, *, since_ns: int | None = None, now_ns: int | None = None) -> list[GpuSample]:
        """The newest value of each metric of every GPU seen since ``since_ns`` (default: the
        last ``latest_lookback_s``; ``promql_latest``)."""
        from gpuwatt.store import promql_latest

        return promql_latest.latest(self, since_ns=since_ns, now_ns=now_ns)
