"""Stores: where samples go and where the dashboard reads them back.

``open_store(url)`` is the one way the CLI and the services get a store. Backends are imported
lazily, so a process that only writes SQLite never imports influxdb_client, and nothing here
imports pandas.
"""

from __future__ import annotations

import os
from collections.abc import Container, Mapping, Sequence
from typing import TYPE_CHECKING

from gpuwatt.errors import ConfigError, GpuwattError
from gpuwatt.schema import COUNTER_ATTRS, FIELDS, Kind
from gpuwatt.store.base import KEY_COLUMNS, Store

if TYPE_CHECKING:
    from gpuwatt.store.influx import InfluxStore
    from gpuwatt.store.promql import PromStore

__all__ = [
    "KEY_COLUMNS",
    "LAST_VALUE_ATTRS",
    "Store",
    "StoreRejected",
    "StoreUrlError",
    "default_store_url",
    "open_store",
]


class StoreRejected(GpuwattError):
    """The store answered and refused the request (HTTP 4xx: bad data, bad query, no access).

    Retrying the same request will not help, unlike ``StoreUnavailable``.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class StoreUrlError(ConfigError):
    """A store URL or the InfluxDB settings in the environment are malformed.

    ``path`` is where the setting came from (the URL with any credentials removed, or the name of
    an environment variable); the message never contains a token.
    """

    def __init__(self, where: str, message: str) -> None:
        super().__init__(where, None, message)


#: Attributes whose rolled-up value (``series(step_s=...)``) is the last value in the bucket, not
#: the mean: counters (``schema.COUNTER_ATTRS``), booleans (InfluxQL cannot average a boolean and
#: a state is better summarised by its last value) and the clock-event reason bitmask (the mean of
#: a bitmask means nothing).
LAST_VALUE_ATTRS: frozenset[str] = frozenset(
    COUNTER_ATTRS | {f.attr for f in FIELDS if f.kind is Kind.BOOL} | {"clock_event_reasons"}
)


def checked_fields(fields: Sequence[str] | None, known: Container[str]) -> tuple[str, ...]:
    """The ``fields`` of a ``Store.series`` call (None: every metric); a name not in ``known``
    raises ValueError."""
    from gpuwatt.model import METRIC_FIELDS

    if fields is None:
        return METRIC_FIELDS
    unknown = [f for f in fields if f not in known]
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; use GpuSample attribute names")
    return tuple(fields)


def open_store(
    url: str | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    timeout_s: float | None = None,
) -> Store:
    """Open the store a URL names (see ``gpuwatt.store.url``); None or "" opens the default.

    ``timeout_s`` is the config file's read timeout for an engine, used where the URL sets no
    ``timeout=``.

    Raises ``StoreUrlError`` (a ``ConfigError``) for a malformed URL, an unknown scheme or a URL
    that carries a token or password.
    """
    from gpuwatt.store.url import InfluxTarget, PromTarget, SqliteTarget, parse_store_url

    env = os.environ if environ is None else environ
    target = parse_store_url(url or default_store_url(env), env, timeout_s=timeout_s)
    if isinstance(target, SqliteTarget):
        from gpuwatt.private_files import private_file
        from gpuwatt.store.sqlite import SqliteStore

        private_file(target.path)  # samples name hosts, jobs and processes: the owner's alone
        return SqliteStore(target.path)
    store: InfluxStore | PromStore
    if isinstance(target, PromTarget):
        store = _open_prom(target)
    else:
        from gpuwatt.store.influx import InfluxStore

        assert isinstance(target, InfluxTarget)
        s = target.settings
        store = InfluxStore(
            s.url,
            s.org,
            s.bucket,
            s.token,
            timeout_s=target.timeout_s,
            api=target.api,
            token_file=s.token_file,
            use_rollups=target.rollups,
        )
    if target.cache_bytes is not None:  # an engine's reader: the rollup points it keeps
        store.rollup_cache_bytes = target.cache_bytes
    return store


def _open_prom(target: object) -> PromStore:
    from gpuwatt.store.promql import DIALECTS, PromStore
    from gpuwatt.store.url import PromTarget

    assert isinstance(target, PromTarget)
    writer = None
    if target.engine == "victoriametrics":
        # VictoriaMetrics takes InfluxDB line protocol at /api/v2/write (org and bucket are
        # only labels to it), so the collector's writes go there unchanged.
        from gpuwatt.store.influx import InfluxStore

        writer = InfluxStore(target.url, "gpuwatt", "gpuwatt", None)
    return PromStore(
        target.url,
        DIALECTS[target.source],
        engine=target.engine,
        left_open_windows=True if target.engine == "victoriametrics" else None,
        timeout_s=target.timeout_s,
        writer=writer,
        use_rollups=target.rollups,
    )


def default_store_url(environ: Mapping[str, str] | None = None) -> str:
    """``sqlite:///$GPUWATT_HOME/gpuwatt.db``, else ``sqlite:///~/.local/share/gpuwatt/gpuwatt.db``."""
    from gpuwatt.store.url import default_sqlite_path

    return "sqlite://" + str(default_sqlite_path(os.environ if environ is None else environ))
