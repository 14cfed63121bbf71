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
(v1-compatibility API, buckets auto-mapped to databases) and 3.x Core all answer; ``query`` sends
one statement, ``influx_reads`` writes them. The token goes in an ``Authorization: Token``
header, never in a URL, a log line, a repr or an error message.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import urllib3

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import LineEncoder, encode_name
from gpuwatt.model import GpuSample, GpuSeen
from gpuwatt.schema import TAG_HOST
from gpuwatt.store import StoreRejected, influx_reads
from gpuwatt.store.base import SeriesRead
from gpuwatt.store.influx_reads import telegraf_mig_devices, telegraf_processes
from gpuwatt.store.rollup_cache import DEFAULT_BUDGET_BYTES, RollupCache
from gpuwatt.store.url import InfluxSettings, influx_settings_from_env

if TYPE_CHECKING:
    import pandas as pd
    from influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import WriteApi

    from gpuwatt.store.influx_rollups import InfluxRollups
    from gpuwatt.store.shared_reads import SharedReads

__all__ = [
    "InfluxSettings",
    "InfluxStore",
    "influx_settings_from_env",
    "influxql_string",
    "telegraf_mig_devices",
    "telegraf_processes",
]


def influxql_string(value: str) -> str:
    """A single-quoted InfluxQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
        self._oldest_raw: tuple[float, int] | None = None  # (monotonic s, ns): oldest_raw_ns
        self._oldest_raw_lock = threading.Lock()  # the reads of a view ask it once, not each
        self._raw_hosts: tuple[float, list[str]] | None = None  # (monotonic s, hosts): raw_hosts
        #: Serve bucketed reads from the rollups kept in the bucket (``engine_rollups``) when
        #: it holds any; False: aggregate raw samples with ``GROUP BY time()`` as before.
        self.use_rollups = use_rollups
        self._rollups: InfluxRollups | None = None
        #: memory for the rollup points reads keep (``rollup_cache``; 0: none kept)
        self.rollup_cache_bytes = DEFAULT_BUDGET_BYTES
        self._rollup_cache: RollupCache | None = None
        self._cache_lock = threading.Lock()
        #: "now" for finding the newest rollup point in the last day (``InfluxRollups``; a
        #: bench replaying data that ended in the past sets the data's end)
        self.clock_ns: Callable[[], int] = time.time_ns
        self._msgpack = True  # ask for MessagePack answers (until the server refuses them)
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
        """Run one InfluxQL statement; the ``series`` of its result (empty when none).

        Answers are asked for in MessagePack where the server offers it (InfluxDB 1.x): the same
        structure as JSON, sent and decoded in half the time (``bench/dashboard.py --store
        influxdb``: 13 MB for an hour of a 1,024-GPU cluster's minute rollups, 97 ms to decode
        as JSON, 54 ms as MessagePack). A server that sends JSON instead is read as JSON."""
        accept = _ACCEPT_MSGPACK if self._msgpack else "application/json"
        resp = self._query_request(influxql, accept)
        if self._msgpack and resp.status in (406, 415):  # a server that refuses MessagePack
            self._msgpack = False
            resp = self._query_request(influxql, "application/json")
        if not 200 <= resp.status < 300:
            self._raise_http("query", resp.status, resp.data, RuntimeError(f"HTTP {resp.status}"))
        try:
            payload = _decode_answer(resp.headers.get("Content-Type", ""), resp.data)
            result = payload["results"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise StoreRejected(f"InfluxDB at {self.url} sent an unreadable /query answer") from exc
        if "error" in result:
            message = f"InfluxDB at {self.url} rejected the query: {result['error']}"
            raise StoreRejected(message, resp.status)
        return list(result.get("series") or [])

    def _query_request(self, influxql: str, accept: str) -> Any:
        headers = {"Accept": accept}
        if self._token:
            headers["Authorization"] = f"Token {self._token.reveal()}"
        try:
            return self._http.request(
                "GET",
                f"{self.url}/query",
                fields={"db": self.bucket, "epoch": "ns", "q": influxql},
                headers=headers,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise StoreUnavailable(
                f"InfluxDB at {self.url} unreachable on query: {type(exc).__name__}"
            ) from exc

    def where(self, start_ns: int, end_ns: int, hosts: Sequence[str] | None) -> str:
        """An InfluxQL ``WHERE`` condition: ``[start_ns, end_ns)`` and, given, these hosts."""
        where = f"time >= {int(start_ns)} AND time < {int(end_ns)}"
        if hosts is not None:
            if not hosts:
                return where + " AND false"
            ors = " OR ".join(f'"{TAG_HOST}" = {influxql_string(encode_name(h))}' for h in hosts)
            where += f" AND ({ors})"
        return where

    @staticmethod
    def hosts_or_fqdn_condition(hosts: Sequence[str]) -> str:
        """An InfluxQL condition: the series of these hosts, also under a fully qualified name
        (``host.domain``): Telegraf configured with the FQDN writes the GPUs a gpuwatt collector
        writes under the short name, and ``latest`` merges the two writers' points by uuid."""
        if not hosts:
            return "false"
        alts = "|".join(_regex_literal(encode_name(h)) for h in hosts)
        return f'"{TAG_HOST}" =~ /^(?:{alts})(?:\\.|$)/'

    def _has_telegraf_field(self, name: str) -> bool:
        return influx_reads.has_telegraf_field(self, name)

    def series_many(
        self,
        reads: Sequence[SeriesRead],
        *,
        on_done: Callable[[], None] | None = None,
        shared: SharedReads | None = None,
    ) -> list[pd.DataFrame]:
        """``series`` for each read, in parallel: the engine answers them at once, the
        requests they share once (``shared``: with the other reads of a view, else with
        each other; ``shared_reads``)."""
        from gpuwatt.store import shared_reads

        return shared_reads.series_many(
            self, reads, lambda r, s: influx_reads.series(self, r, s), on_done, shared
        )

    @property
    def read_rollups(self) -> RollupCache:
        """``rollups`` as reads take them: kept by chunk in memory (``rollup_cache``)."""
        with self._cache_lock:
            if self._rollup_cache is None:
                self._rollup_cache = RollupCache(self.rollups, self.rollup_cache_bytes)
        return self._rollup_cache

    def shared_reads(self) -> SharedReads | None:
        """A ``shared_reads.SharedReads`` of this store's rollups (None: read without them)."""
        if not self.use_rollups:
            return None
        from gpuwatt.store.shared_reads import SharedReads

        return SharedReads(self.read_rollups)

    def count_samples(self, start_ns: int, end_ns: int) -> int:
        return influx_reads.count_samples(self, start_ns, end_ns)

    def latest(self, *, since_ns: int | None = None) -> list[GpuSample]:
        out, self.shared_writers = influx_reads.latest(self, since_ns)
        return out

    def latest_of(
        self, hosts: Sequence[str] | None = None, *, attrs: Sequence[str] | None = None
    ) -> list[GpuSample]:
        """``latest`` of the GPUs of ``hosts`` alone (None: all; one query with their tags),
        with the metrics ``attrs`` (None: all) and the GPU's state from a few fields of each
        newest point instead of every field (``base.latest_of``)."""
        fields = None if attrs is None else influx_reads.latest_fields(attrs)
        out, _ = influx_reads.latest(self, None, fields, hosts)
        wanted = None if hosts is None else set(hosts)
        return [s for s in out if wanted is None or s.host in wanted]

    def gpus_seen(self, *, since_ns: int | None = None) -> list[GpuSeen]:
        """The GPUs ``latest`` gives, from a few fields of their newest points instead of every
        field (``base.gpus_seen``)."""
        out, _ = influx_reads.latest(self, since_ns, influx_reads.SEEN_FIELDS)
        return [GpuSeen.of(s) for s in out]

    def xid_events(
        self, start_ns: int, end_ns: int, *, hosts: Sequence[str] | None = None
    ) -> pd.DataFrame:
        return influx_reads.xid_events(self, start_ns, end_ns, hosts)

    def series(
        self,
        start_ns: int,
        end_ns: int,
        fields: Sequence[str] | None = None,
        *,
        step_s: int | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        return influx_reads.series(self, SeriesRead(start_ns, end_ns, fields, step_s, hosts))


def _regex_literal(text: str) -> str:
    """``text`` matched literally in an InfluxQL regular expression (RE2 inside ``/.../``)."""
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$/")

# InfluxDB 1.x compares the whole header: one type, not a list with weights. Servers that do
# not know it answer JSON, their default (or 406/415, and then JSON is asked for).
_ACCEPT_MSGPACK = "application/x-msgpack"


def _decode_answer(content_type: str, data: bytes) -> Any:
    """A /query answer as Python objects, MessagePack or JSON by its content type (the same
    structure: times are integers with ``epoch=ns``). Large answers are decoded with the
    garbage collector paused: a few hundred thousand new containers would trigger it often."""
    import gc

    enabled = gc.isenabled() and len(data) > 1_000_000
    if enabled:
        gc.disable()
    try:
        if content_type.startswith("application/x-msgpack"):
            import msgpack

            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)
            unpacker.feed(data)
            return next(unpacker)  # one answer (InfluxDB sends no more without ``chunked``)
        return json.loads(data)
    except StopIteration as exc:
        raise ValueError("an empty MessagePack answer") from exc
    except Exception as exc:
        if isinstance(exc, ValueError):
            raise
        raise ValueError(f"an unreadable answer: {type(exc).__name__}") from exc
    finally:
        if enabled:
            gc.enable()


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
