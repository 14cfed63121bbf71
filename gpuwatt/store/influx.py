"""InfluxDB store: writes through influxdb_client to /api/v2/write, reads InfluxQL over /query.

InfluxDB 1.8, 2.x and 3.x take ``/api/v2/write``; 1.6 and 1.7 only the 1.x ``/write`` endpoint.
``api="auto"`` (the default) asks ``/ping`` once which version answers and picks the endpoint;
``api="v1"``/``"v2"`` (``?api=`` in the store URL) choose without asking. On 1.x a token of the
form ``user:password`` is sent as Basic authentication, as 1.x servers with auth expect.

Writes: ``write_api(write_options=SYNCHRONOUS)`` with records that are our own line-protocol
strings (``line_protocol.LineEncoder``), precision ns. No client-side batching or buffering: the
caller's
spool is the buffer (see design §4 for why). Connection failures, timeouts, 429 and 5xx raise
``StoreUnavailable`` (retry later); any other 4xx raises ``StoreRejected`` (retrying the same data
will not help).

Reads: InfluxQL over ``GET /query`` (``db=<bucket>``, ``epoch=ns``), which InfluxDB 1.x, 2.x
(v1-compatibility API, buckets auto-mapped to databases) and 3.x Core all answer. The token goes
in an ``Authorization: Token`` header, never in a URL, a log line, a repr or an error message.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import urllib3

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import LineEncoder, decode_name, encode_name, sample_from_fields
from gpuwatt.model import METRIC_FIELDS, GpuSample
from gpuwatt.schema import (
    FIELD_BY_ATTR,
    FIELD_LOST,
    MEASUREMENT,
    TAG_HOST,
    TAG_INDEX,
    TAG_NAME,
    TAG_UUID,
)
from gpuwatt.store import LAST_VALUE_ATTRS, StoreRejected
from gpuwatt.store.base import KEY_COLUMNS, SeriesRead
from gpuwatt.store.url import InfluxSettings, influx_settings_from_env
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
    from influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import WriteApi

    from gpuwatt.store.influx_rollups import InfluxRollups

__all__ = ["InfluxSettings", "InfluxStore", "influx_settings_from_env", "influxql_string"]

_GROUP_TAGS = ", ".join(f'"{t}"' for t in (TAG_HOST, TAG_INDEX, TAG_UUID, TAG_NAME))
_COUNT_ALIAS = "_n"


def influxql_string(value: str) -> str:
    """A single-quoted InfluxQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Secret:
    """Holds a token; its repr is ``'***'`` so dumps of an object's state (``vars()``, a
    traceback with locals) do not show it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"


def _retryable(status: int | None) -> bool:
    return status is None or status == 0 or status == 429 or status >= 500


class InfluxStore:
    """An InfluxDB 1.x/2.x/3.x reached over HTTP. One instance may be shared by threads."""

    def __init__(
        self,
        url: str,
        org: str,
        bucket: str,
        token: str | None = None,
        *,
        timeout_s: float = 10.0,
        api: str = "auto",
        token_file: str | None = None,
        use_rollups: bool = True,
    ) -> None:
        if api not in ("auto", "v1", "v2"):
            raise ValueError(f"api={api!r}: use auto, v1 or v2")
        self.api = api
        self.url = url.rstrip("/")
        self.org = org
        self.bucket = bucket
        self.timeout_s = float(timeout_s)
        self._token = _Secret(token) if token else None
        self._token_file = token_file
        self._encoder = LineEncoder()
        #: per GPU uuid that more than one collector writes, the writers (``latest()`` sets it)
        self.shared_writers: dict[str, tuple[str, ...]] = {}
        self._telegraf_fields: tuple[float, frozenset[str] | None] | None = None
        #: Serve bucketed reads from the rollups kept in the bucket (``engine_rollups``) when
        #: it holds any; False: aggregate raw samples with ``GROUP BY time()`` as before.
        self.use_rollups = use_rollups
        self._rollups: InfluxRollups | None = None
        self._client: InfluxDBClient | None = None
        self._write_api: WriteApi | None = None
        self._http = urllib3.PoolManager(
            num_pools=2,
            maxsize=4,
            retries=False,
            timeout=urllib3.Timeout(connect=self.timeout_s, read=self.timeout_s),
        )

    @classmethod
    def from_settings(cls, settings: InfluxSettings, *, timeout_s: float = 10.0) -> InfluxStore:
        return cls(settings.url, settings.org, settings.bucket, settings.token, timeout_s=timeout_s)

    def __repr__(self) -> str:
        auth = "token" if self._token else "no token"
        return f"InfluxStore(url={self.url!r}, org={self.org!r}, bucket={self.bucket!r}, {auth})"

    def close(self) -> None:
        if self._write_api is not None:
            self._write_api.close()
            self._write_api = None
        if self._client is not None:
            self._client.close()
            self._client = None
        self._http.clear()

    def __enter__(self) -> InfluxStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writes -------------------------------------------------------------------------------

    def write_samples(self, samples: Sequence[GpuSample]) -> None:
        if samples:
            self.write_lines(self._encoder.encode_many(samples))

    def write_lines(self, lines: Sequence[str]) -> None:
        """POST the lines to /api/v2/write (precision ns) in one request (1.x: /write)."""
        records = [line for line in lines if line.strip()]
        if not records:
            return
        if self._write_api_version() == "v1":
            self._write_v1(records)
            return
        import urllib3.exceptions
        from influxdb_client import WritePrecision
        from influxdb_client.rest import ApiException

        # A keep-alive connection that a restarted server dropped fails once, and a fresh one
        # then answers: retry once at once, except after a timeout (that would double the wait).
        # Writes are idempotent (same series and timestamp overwrite), so a resend is harmless.
        for attempt in (1, 2):
            try:
                self._writer().write(
                    bucket=self.bucket,
                    org=self.org,
                    record=records,
                    write_precision=WritePrecision.NS,  # type: ignore[arg-type]
                )
                return
            except ApiException as exc:
                if exc.status in (401, 403) and attempt == 1 and self._reload_token():
                    continue  # a renewed token in the token file: try it at once
                self._raise_http("write", exc.status, exc.body, exc)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                timed_out = isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError)
                if attempt == 2 or timed_out:
                    raise StoreUnavailable(
                        f"InfluxDB at {self.url} unreachable on write: {type(exc).__name__}"
                    ) from exc

    def _reload_token(self) -> bool:
        """Read the token file again after the server refused the token; True when it holds a
        different token now (the next request uses it)."""
        if self._token_file is None:
            return False
        from gpuwatt.store.url import read_token_file

        token = read_token_file(self._token_file)
        if token is None or (self._token is not None and token == self._token.reveal()):
            return False
        self._token = _Secret(token)
        if self._write_api is not None:  # the client holds the old token
            self._write_api.close()
            self._write_api = None
        if self._client is not None:
            self._client.close()
            self._client = None
        return True

    def _write_api_version(self) -> str:
        """ "v1" for InfluxDB 1.0-1.7 (no /api/v2/write), else "v2"; asks /ping once."""
        if self.api == "auto":
            try:
                resp = self._http.request("GET", f"{self.url}/ping")
            except urllib3.exceptions.HTTPError as exc:
                raise StoreUnavailable(
                    f"InfluxDB at {self.url} unreachable on ping: {type(exc).__name__}"
                ) from exc
            version = resp.headers.get("X-Influxdb-Version", "")
            major, _, rest = version.lstrip("v").partition(".")
            minor = rest.partition(".")[0]
            old = major == "1" and minor.isdigit() and int(minor) < 8
            self.api = "v1" if old else "v2"
        return self.api

    def _write_v1(self, records: list[str]) -> None:
        """POST to InfluxDB 1.x's /write (database = the bucket, precision ns)."""
        import base64
        from urllib.parse import urlencode

        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if self._token:
            secret = self._token.reveal()
            if ":" in secret:  # user:password, as 1.x authentication expects
                headers["Authorization"] = "Basic " + base64.b64encode(secret.encode()).decode()
            else:
                headers["Authorization"] = f"Token {secret}"
        query = urlencode({"db": self.bucket, "precision": "ns"})
        try:
            resp = self._http.request(
                "POST",
                f"{self.url}/write?{query}",
                body="\n".join(records).encode("utf-8"),
                headers=headers,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise StoreUnavailable(
                f"InfluxDB at {self.url} unreachable on write: {type(exc).__name__}"
            ) from exc
        if resp.status in (401, 403) and self._reload_token():
            self._write_v1(records)  # a renewed token in the token file: try it once
            return
        if resp.status != 204:
            self._raise_http("write", resp.status, resp.data, RuntimeError(f"HTTP {resp.status}"))

    def _writer(self) -> WriteApi:
        if self._write_api is None:
            from influxdb_client import InfluxDBClient
            from influxdb_client.client.write_api import SYNCHRONOUS

            self._client = InfluxDBClient(
                url=self.url,
                token=self._token.reveal() if self._token else "",
                org=self.org,
                timeout=int(self.timeout_s * 1000),
                debug=False,
                retries=False,
            )
            self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
        return self._write_api

    def _raise_http(self, what: str, status: int | None, body: Any, exc: Exception) -> NoReturn:
        detail = _error_text(body)
        message = f"InfluxDB at {self.url} answered {what} with HTTP {status}: {detail}"
        if self._token:
            message = message.replace(self._token.reveal(), "***")
        if _retryable(status):
            raise StoreUnavailable(message) from exc
        raise StoreRejected(message, status) from exc

    # --- reads --------------------------------------------------------------------------------

    @property
    def rollups(self) -> InfluxRollups:
        """The bucket's 1-minute and 1-hour rollups (``engine_rollups``)."""
        if self._rollups is None:
            from gpuwatt.store.influx_rollups import InfluxRollups

            self._rollups = InfluxRollups(self)
        return self._rollups

    def query(self, influxql: str) -> list[dict[str, Any]]:
        """Run one InfluxQL statement; the ``series`` of its result (empty when none)."""
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Token {self._token.reveal()}"
        try:
            resp = self._http.request(
                "GET",
                f"{self.url}/query",
                fields={"db": self.bucket, "epoch": "ns", "q": influxql},
                headers=headers,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise StoreUnavailable(
                f"InfluxDB at {self.url} unreachable on query: {type(exc).__name__}"
            ) from exc
        if not 200 <= resp.status < 300:
            self._raise_http("query", resp.status, resp.data, RuntimeError(f"HTTP {resp.status}"))
        try:
            payload = json.loads(resp.data)
            result = payload["results"][0]
        except (ValueError, KeyError, IndexError) as exc:
            raise StoreRejected(f"InfluxDB at {self.url} sent an unreadable /query answer") from exc
        if "error" in result:
            message = f"InfluxDB at {self.url} rejected the query: {result['error']}"
            raise StoreRejected(message, resp.status)
        return list(result.get("series", []))

    def where(self, start_ns: int, end_ns: int, hosts: Sequence[str] | None) -> str:
        """An InfluxQL ``WHERE`` condition: ``[start_ns, end_ns)`` and, given, these hosts."""
        where = f"time >= {int(start_ns)} AND time < {int(end_ns)}"
        if hosts is not None:
            if not hosts:
                return where + " AND false"
            ors = " OR ".join(f'"{TAG_HOST}" = {influxql_string(encode_name(h))}' for h in hosts)
            where += f" AND ({ors})"
        return where

    def _has_telegraf_field(self, name: str) -> bool:
        """Whether the measurement has Telegraf's field ``name`` (``SHOW FIELD KEYS``, asked at
        most every 5 minutes): a database Telegraf does not write is read without its columns,
        which would only add nulls to every row. True when the server cannot say."""
        now = time.monotonic()
        if self._telegraf_fields is None or now - self._telegraf_fields[0] > 300:
            try:
                series = self.query(f'SHOW FIELD KEYS FROM "{MEASUREMENT}"')
                keys: frozenset[str] | None = frozenset(
                    str(row[0]) for s in series for row in s.get("values", [])
                )
            except StoreRejected:  # an engine without SHOW FIELD KEYS: select them anyway
                keys = None
            self._telegraf_fields = (now, keys)
        keys = self._telegraf_fields[1]
        return keys is None or name in keys

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
        series = self.query(
            f'SELECT count("{FIELD_LOST}") FROM "{MEASUREMENT}" WHERE '
            + self.where(start_ns, end_ns, None)
        )
        return int(sum(row[1] or 0 for s in series for row in s.get("values", [])))

    def latest(self, *, since_ns: int | None = None) -> list[GpuSample]:
        where = "" if since_ns is None else f" WHERE time >= {int(since_ns)}"
        series = self.query(
            f'SELECT * FROM "{MEASUREMENT}"{where} GROUP BY * ORDER BY time DESC LIMIT 1'
        )
        out, self.shared_writers = _one_per_gpu(series)
        out.sort(key=lambda x: (x.host, x.gpu_index, x.uuid))
        return out

    def series(
        self,
        start_ns: int,
        end_ns: int,
        fields: Sequence[str] | None = None,
        *,
        step_s: int | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        attrs = _check_fields(fields)
        if step_s is not None and self.use_rollups and int(step_s) > 0:
            from gpuwatt.store import engine_rollups

            served = engine_rollups.read_levels(
                self.rollups, start_ns, end_ns, int(step_s) * 10**9, attrs, hosts
            )
            if served is not None:
                return engine_rollups.frame(*served, attrs)
        where = self.where(start_ns, end_ns, hosts)
        tg = [c for c in extra_columns(attrs) if self._has_telegraf_field(c[0])]
        if step_s is None:
            # gpu_lost keeps lost-GPU markers as rows (InfluxQL drops rows whose selected
            # fields are all null), as SqliteStore returns them.
            selects = [_ident(FIELD_LOST)]
            selects += [f"{_ident(FIELD_BY_ATTR[a].field)} AS {_ident(a)}" for a in attrs]
            selects += [f"{_ident(f)} AS {_ident(c)}" for f, c, _ in tg]
            group = _GROUP_TAGS
        else:
            if int(step_s) <= 0:
                raise ValueError("step_s must be positive")
            selects = [f"count({_ident(FIELD_LOST)}) AS {_COUNT_ALIAS}"]
            for a in attrs:
                fn = "last" if a in LAST_VALUE_ATTRS else "mean"
                selects.append(f"{fn}({_ident(FIELD_BY_ATTR[a].field)}) AS {_ident(a)}")
            for f, c, last in tg:  # Telegraf's names for some of ``attrs``
                selects.append(f"{'last' if last else 'mean'}({_ident(f)}) AS {_ident(c)}")
            group = f"time({int(step_s)}s), {_GROUP_TAGS} fill(none)"
        series = self.query(
            f'SELECT {", ".join(selects)} FROM "{MEASUREMENT}" WHERE {where} GROUP BY {group}'
        )
        # gpuwatt's rows carry gpu_lost (Telegraf's do not): its identity wins for a shared GPU
        marker = FIELD_LOST if step_s is None else _COUNT_ALIAS
        frame = _frame(series, attrs, [*(c for _, c, _ in tg), marker])
        ours = frame.pop(marker).to_numpy()
        ours = (ours == ours) if step_s is None else (ours > 0)  # not NaN; a count above zero
        # one GPU, whatever host/name tags or other tags its writers add (gpuwatt.telegraf)
        frame = one_identity_per_uuid(fill_from_telegraf(frame), ours)
        if step_s is not None and len(frame):
            # a bucket cut by the range's start is keyed at the start (``Store.series``)
            frame["time_ns"] = frame["time_ns"].clip(lower=start_ns)
        return frame


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


def _check_fields(fields: Sequence[str] | None) -> tuple[str, ...]:
    if fields is None:
        return METRIC_FIELDS
    unknown = [f for f in fields if f not in FIELD_BY_ATTR]
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; use GpuSample attribute names")
    return tuple(fields)


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
        ident = (
            decode_name(tags.get(TAG_HOST, "")),
            int(tags.get(TAG_INDEX) or -1),
            decode_name(tags.get(TAG_UUID, "")),
            decode_name(tags.get(TAG_NAME, "")),
        )
        pos = [s["columns"].index(a) for a in (*attrs, *extra)]
        for row in s.get("values", []):
            keys.append((row[0], *ident))
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


def _error_text(body: Any) -> str:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    text = str(body or "").strip()
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            text = str(parsed.get("message") or parsed.get("error") or text)
    except ValueError:
        pass
    return text[:300] or "(no body)"
