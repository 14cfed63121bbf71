"""Store URLs and InfluxDB settings.

Store URLs:

- ``sqlite:///abs/path.db`` (absolute) and ``sqlite:relative.db`` (relative to the working
  directory).
- ``influxdb://host:8086/<bucket>?org=<org>`` (http) and ``influxdbs://host/<bucket>?org=<org>``
  (https); ``timeout=30s`` sets the per-request timeout (default 10 s; the config file's
  ``store: timeout:`` where the URL has none), ``api=v1`` writes to
  InfluxDB 1.0-1.7's ``/write`` (by default ``/ping`` tells which the server takes). A missing
  bucket or org falls back to ``INFLUXDB_V2_BUCKET`` / ``INFLUXDB_V2_ORG``; ``influxdb://`` with
  no host takes everything from the environment (``INFLUXDB_V2_URL``).

- ``prometheus://host:9090[/prefix]?source=gpuwatt|dcgm&timeout=30s`` and
  ``victoriametrics://host:8428[/prefix]?source=influx|gpuwatt|dcgm&timeout=30s`` (``...s://`` for
  https): a Prometheus-compatible engine read with PromQL (``gpuwatt.store.promql``). ``source``
  says whose series it holds: collectors scraped at ``/metrics`` (``gpuwatt``, Prometheus'
  default), NVIDIA's dcgm-exporter (``dcgm``) or gpuwatt's line protocol written into
  VictoriaMetrics (``influx``, its default; VictoriaMetrics also takes the collector's writes).

``rollups=on|off``: keep 1-minute and 1-hour rollups in the engine (the collector writes them)
and serve bucketed reads from them (``engine_rollups``). On by default for InfluxDB; off by
default for Prometheus-compatible engines, whose own ``avg_over_time`` answered as fast (see
``PromTarget.rollups``); ``victoriametrics://...?rollups=on`` turns them on there.
``cache_mb=384``: the memory a reader keeps the engine's rollup points in (``rollup_cache``;
``0``: none kept, every read asks the engine).

A token never comes from a URL: a URL with userinfo (``user:token@host``) is rejected, because a
command line is visible to every user of the machine (``ps``) and lands in shell history. Tokens
come from ``INFLUXDB_V2_TOKEN`` or from the file ``INFLUXDB_V2_TOKEN_FILE`` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import SplitResult, parse_qs, urlsplit

from gpuwatt.store import StoreUrlError

DEFAULT_BUCKET = "gpuwatt"
ENV_URL = "INFLUXDB_V2_URL"
ENV_ORG = "INFLUXDB_V2_ORG"
ENV_TOKEN = "INFLUXDB_V2_TOKEN"
ENV_TOKEN_FILE = "INFLUXDB_V2_TOKEN_FILE"
ENV_BUCKET = "INFLUXDB_V2_BUCKET"
ENV_HOME = "GPUWATT_HOME"

_TOKEN_HINT = (
    f"tokens are read from {ENV_TOKEN} or from the file {ENV_TOKEN_FILE} names, "
    "never from a URL or the command line"
)


@dataclass(frozen=True, slots=True)
class InfluxSettings:
    """Where an InfluxDB is and how to reach it. ``repr`` never shows the token."""

    url: str
    org: str
    bucket: str = DEFAULT_BUCKET
    token: str | None = field(default=None, repr=False)
    #: Where the token came from, if a file: read again when the server refuses it, so that a
    #: renewed token is picked up without a restart.
    token_file: str | None = None


@dataclass(frozen=True, slots=True)
class SqliteTarget:
    path: Path


@dataclass(frozen=True, slots=True)
class InfluxTarget:
    settings: InfluxSettings
    timeout_s: float = 10.0  # per request (``?timeout=30s``): long ranges need more
    api: str = "auto"  # the write endpoint (``?api=v1`` for InfluxDB 1.0-1.7, ``v2``, or probe)
    rollups: bool = True  # serve bucketed reads from the engine's rollups (``?rollups=off``)
    cache_bytes: int | None = None  # rollup points kept in memory (``?cache_mb=``; None: default)


PROM_SCHEMES: dict[str, tuple[str, str]] = {
    "prometheus": ("prometheus", "http"),
    "prometheuss": ("prometheus", "https"),
    "victoriametrics": ("victoriametrics", "http"),
    "victoriametricss": ("victoriametrics", "https"),
}
PROM_DEFAULT_SOURCE: dict[str, str] = {"prometheus": "gpuwatt", "victoriametrics": "influx"}
PROM_SOURCES: tuple[str, ...] = ("gpuwatt", "dcgm", "influx")


@dataclass(frozen=True, slots=True)
class PromTarget:
    """A Prometheus-compatible engine: its base URL, which engine, whose series, a read timeout."""

    url: str
    engine: str
    source: str
    timeout_s: float = 30.0
    #: Serve bucketed reads from gpuwatt's rollups in the engine (``?rollups=on``). Off by
    #: default: VictoriaMetrics' own ``avg_over_time`` answered as fast or faster in
    #: ``bench/dashboard.py --store victoriametrics`` (1,024 GPUs x 6 h of 10-s samples).
    rollups: bool = False
    cache_bytes: int | None = None  # rollup points kept in memory (``?cache_mb=``; None: default)


def default_sqlite_path(environ: Mapping[str, str]) -> Path:
    """``$GPUWATT_HOME/gpuwatt.db``, else ``~/.local/share/gpuwatt/gpuwatt.db``."""
    home = environ.get(ENV_HOME)
    base = Path(home) if home else Path("~/.local/share/gpuwatt")
    return (base.expanduser() / "gpuwatt.db").absolute()


def _read_token(environ: Mapping[str, str]) -> str | None:
    token = environ.get(ENV_TOKEN)
    if token:
        return token.strip()
    path = environ.get(ENV_TOKEN_FILE)
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        message = f"cannot read token file {path}: {exc.strerror}"
        raise StoreUrlError(ENV_TOKEN_FILE, message) from None
    token = text.strip()
    if not token:
        raise StoreUrlError(ENV_TOKEN_FILE, f"token file {path} is empty")
    return token


def _token_file(environ: Mapping[str, str]) -> str | None:
    """The token file, when the token comes from one (``INFLUXDB_V2_TOKEN`` wins over it)."""
    if environ.get(ENV_TOKEN):
        return None
    return environ.get(ENV_TOKEN_FILE) or None


def read_token_file(path: str) -> str | None:
    """The token in ``path`` now; None when it cannot be read or is empty."""
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def influx_settings_from_env(environ: Mapping[str, str]) -> InfluxSettings:
    """Settings from ``INFLUXDB_V2_URL``, ``_ORG``, ``_TOKEN`` or ``_TOKEN_FILE``, ``_BUCKET``."""
    url = environ.get(ENV_URL, "").strip()
    if not url:
        raise StoreUrlError(ENV_URL, f"{ENV_URL} is not set (e.g. http://influxdb:8086)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreUrlError(ENV_URL, f"{ENV_URL} must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise StoreUrlError(ENV_URL, f"{ENV_URL} must not carry credentials; {_TOKEN_HINT}")
    return InfluxSettings(
        url=url.rstrip("/"),
        org=environ.get(ENV_ORG, "").strip(),
        bucket=environ.get(ENV_BUCKET, "").strip() or DEFAULT_BUCKET,
        token=_read_token(environ),
        token_file=_token_file(environ),
    )


def redact_url(url: str) -> str:
    """The URL with any userinfo replaced by ``***`` (safe to show in a message)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{tail}"


def parse_store_url(
    url: str, environ: Mapping[str, str], *, timeout_s: float | None = None
) -> SqliteTarget | InfluxTarget | PromTarget:
    """What a store URL names. Raises ``StoreUrlError`` with a message safe to print.

    ``timeout_s`` (the config file's ``store: timeout:``) applies where the URL has no
    ``timeout=``: the URL, being the more specific setting, wins.
    """
    shown = redact_url(url)
    scheme = url.partition(":")[0].lower()
    if scheme == "sqlite":
        return _parse_sqlite(url, shown)
    if scheme in ("influxdb", "influxdbs"):
        return _parse_influx(url, shown, environ, timeout_s)
    if scheme in PROM_SCHEMES:
        return _parse_prom(url, shown, timeout_s)
    raise StoreUrlError(
        shown,
        f"unknown store scheme {scheme!r}: use sqlite:///abs/path.db, sqlite:relative.db, "
        "influxdb://host:8086/<bucket>?org=<org>, influxdbs://host/<bucket>?org=<org>, "
        "prometheus://host:9090 or victoriametrics://host:8428",
    )


def _split_without_userinfo(
    url: str, shown: str, kind: str, hint: str
) -> tuple[SplitResult, int | None]:
    """``urlsplit`` and the port, refusing a malformed URL or one that carries credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise StoreUrlError(shown, f"malformed {kind}URL: {exc}") from None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise StoreUrlError(shown, hint)
    return parts, port


def _parse_prom(url: str, shown: str, config_timeout_s: float | None) -> PromTarget:
    parts, port = _split_without_userinfo(
        url, shown, "", "a store URL must not carry a user or password"
    )
    if not parts.hostname:
        raise StoreUrlError(shown, "the URL needs a host: prometheus://host:9090")
    engine, http = PROM_SCHEMES[parts.scheme.lower()]
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - {"source", "timeout", "rollups", "cache_mb"}
    if unknown:
        raise StoreUrlError(
            shown,
            f"unknown parameter(s) {', '.join(sorted(unknown))}; use source=, timeout=, "
            "rollups= and cache_mb=",
        )
    source = query.get("source", [PROM_DEFAULT_SOURCE[engine]])[-1]
    if source not in PROM_SOURCES:
        raise StoreUrlError(shown, f"source={source!r}: use one of {', '.join(PROM_SOURCES)}")
    timeout_s = _timeout_s(query, shown, default_s=config_timeout_s or 30.0)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    base = f"{http}://{host}" + (f":{port}" if port else "") + parts.path.rstrip("/")
    return PromTarget(
        base,
        engine,
        source,
        timeout_s,
        _rollups(query, shown, default=False),
        _cache_bytes(query, shown),
    )


def _parse_sqlite(url: str, shown: str) -> SqliteTarget:
    rest = url[len("sqlite:") :]
    if rest.startswith("//"):
        netloc, _, path = rest[2:].partition("/")
        if netloc:
            raise StoreUrlError(
                shown, "a sqlite URL has no host: use sqlite:///abs/path.db or sqlite:rel.db"
            )
        path = "/" + path
    else:
        path = rest
    if "?" in path or "#" in path:
        raise StoreUrlError(shown, "a sqlite URL takes no query or fragment")
    if path in ("", "/"):
        raise StoreUrlError(shown, "a sqlite URL needs a file path")
    return SqliteTarget(Path(path).expanduser().absolute())


def _parse_influx(
    url: str, shown: str, environ: Mapping[str, str], config_timeout_s: float | None
) -> InfluxTarget:
    parts, port = _split_without_userinfo(
        url, shown, "InfluxDB ", f"an InfluxDB URL must not carry a user or token; {_TOKEN_HINT}"
    )
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - {"org", "timeout", "api", "rollups", "cache_mb"}
    if unknown:
        raise StoreUrlError(
            shown,
            f"unknown parameter(s) {', '.join(sorted(unknown))}; use org=, timeout=, api=, "
            "rollups= and cache_mb=",
        )
    rollups = _rollups(query, shown, default=True)
    cache_bytes = _cache_bytes(query, shown)
    timeout_s = _timeout_s(query, shown, default_s=config_timeout_s or 10.0)
    api = query.get("api", ["auto"])[-1]
    if api not in ("auto", "v1", "v2"):
        raise StoreUrlError(shown, f"api={api!r}: use v1 (InfluxDB 1.0-1.7), v2 or auto")
    bucket = parts.path.strip("/")
    if "/" in bucket:
        raise StoreUrlError(shown, "the URL path must be just the bucket: influxdb://host/<bucket>")
    org = query.get("org", [""])[-1]
    if not parts.hostname:
        base = influx_settings_from_env(environ)
        return InfluxTarget(
            InfluxSettings(
                base.url, org or base.org, bucket or base.bucket, base.token, base.token_file
            ),
            timeout_s,
            api,
            rollups,
            cache_bytes,
        )
    http = "https" if parts.scheme.lower() == "influxdbs" else "http"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    server = f"{http}://{host}" + (f":{port}" if port else "")
    return InfluxTarget(
        InfluxSettings(
            url=server,
            org=org or environ.get(ENV_ORG, "").strip(),
            bucket=bucket or environ.get(ENV_BUCKET, "").strip() or DEFAULT_BUCKET,
            token=_read_token(environ),
            token_file=_token_file(environ),
        ),
        timeout_s,
        api,
        rollups,
        cache_bytes,
    )


def _rollups(query: dict[str, list[str]], shown: str, *, default: bool) -> bool:
    """``rollups=on|off``: whether bucketed reads are served from the engine's rollups."""
    if "rollups" not in query:
        return default
    text = query["rollups"][-1].lower()
    if text not in ("on", "off"):
        raise StoreUrlError(shown, f"rollups={text!r}: use on or off")
    return text == "on"


def _cache_bytes(query: dict[str, list[str]], shown: str) -> int | None:
    """``cache_mb=``: MiB of rollup points a reader keeps, a whole number from 0 to 65,536
    (None: not set, the reader's default, ``rollup_cache.DEFAULT_BUDGET_BYTES``)."""
    if "cache_mb" not in query:
        return None
    text = query["cache_mb"][-1]
    if not text.isdigit() or int(text) > 65_536:
        raise StoreUrlError(shown, f"cache_mb={text!r}: use a whole number of MiB, 0 to 65536")
    return int(text) * 2**20


def _timeout_s(query: dict[str, list[str]], shown: str, *, default_s: float) -> float:
    """``timeout=`` of a store URL: a duration from 1 ms to 1 h (e.g. ``30s``, ``2m``)."""
    from gpuwatt.yamlfile import parse_duration_s

    if "timeout" not in query:
        return default_s
    text = query["timeout"][-1]
    value = parse_duration_s(text)
    if value is None or not 0 < value <= 3600:
        raise StoreUrlError(shown, f"timeout={text!r}: a duration up to 1h, e.g. 30s")
    return value
