"""Store URLs, the default store, and InfluxDB settings from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatt.errors import ConfigError
from gpuwatt.store import Store, StoreUrlError, default_store_url, open_store
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.sqlite import SqliteStore
from gpuwatt.store.url import (
    InfluxSettings,
    InfluxTarget,
    PromTarget,
    SqliteTarget,
    influx_settings_from_env,
    parse_store_url,
)

TOKEN = "tok-ABC-123"


def test_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_store_url("sqlite:///abs/path.db", {}) == SqliteTarget(Path("/abs/path.db"))
    monkeypatch.chdir(tmp_path)
    assert parse_store_url("sqlite:rel/g.db", {}) == SqliteTarget(tmp_path / "rel" / "g.db")
    for bad in ("sqlite://host/x.db", "sqlite:", "sqlite:///", "sqlite:///x.db?mode=ro"):
        with pytest.raises(StoreUrlError):
            parse_store_url(bad, {})


def test_open_store_sqlite(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/sub/g.db", {})
    try:
        assert isinstance(store, SqliteStore) and isinstance(store, Store)
        assert store.path == tmp_path / "sub" / "g.db" and store.path.exists()
    finally:
        store.close()


def test_default_store(tmp_path: Path) -> None:
    assert default_store_url({"GPUWATT_HOME": str(tmp_path)}) == f"sqlite://{tmp_path}/gpuwatt.db"
    home_default = default_store_url({})
    assert home_default.startswith("sqlite:///")
    assert home_default.endswith("/.local/share/gpuwatt/gpuwatt.db")
    store = open_store(None, {"GPUWATT_HOME": str(tmp_path / "h")})
    try:
        assert isinstance(store, SqliteStore) and store.path == tmp_path / "h" / "gpuwatt.db"
    finally:
        store.close()


def test_influx_urls() -> None:
    env = {"INFLUXDB_V2_TOKEN": f"  {TOKEN}\n", "INFLUXDB_V2_ORG": "envorg"}
    target = parse_store_url("influxdb://db.example:8086/metrics?org=acme", env)
    assert target == InfluxTarget(
        InfluxSettings("http://db.example:8086", "acme", "metrics", TOKEN)
    )
    target = parse_store_url("influxdbs://db.example/", env)
    assert isinstance(target, InfluxTarget)
    assert target.settings == InfluxSettings("https://db.example", "envorg", "gpuwatt", TOKEN)
    assert TOKEN not in repr(target)


def test_influx_url_from_environment_only() -> None:
    env = {
        "INFLUXDB_V2_URL": "https://influx.internal:8086/",
        "INFLUXDB_V2_ORG": "o",
        "INFLUXDB_V2_BUCKET": "b",
    }
    target = parse_store_url("influxdb://", env)
    assert isinstance(target, InfluxTarget)
    assert target.settings == InfluxSettings("https://influx.internal:8086", "o", "b", None)


@pytest.mark.parametrize(
    "url",
    [
        f"influxdb://admin:{TOKEN}@db:8086/b?org=o",
        f"influxdbs://{TOKEN}@db/b",
        f"influxdb://:{TOKEN}@db/b",
    ],
)
def test_credentials_in_a_url_are_rejected_without_echoing_them(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(url, {})
    message = str(info.value)
    assert TOKEN not in message
    assert "INFLUXDB_V2_TOKEN" in message and "INFLUXDB_V2_TOKEN_FILE" in message


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgres://db/x", "unknown store scheme"),
        ("/tmp/x.db", "unknown store scheme"),
        ("influxdb://db/b?token=x", "use org=, timeout=, api=, rollups= and cache_mb="),
        ("influxdb://db/b?cache_mb=-1", "cache_mb='-1': use a whole number of MiB"),
        ("victoriametrics://vm:8428?cache_mb=1.5", "cache_mb='1.5': use a whole number"),
        ("victoriametrics://vm:8428?cache_mb=99999", "0 to 65536"),
        ("influxdb://db/b?rollups=maybe", "rollups='maybe': use on or off"),
        ("victoriametrics://vm:8428?rollups=1", "rollups='1': use on or off"),
        ("influxdb://db/a/b", "just the bucket"),
        ("influxdb://db:notaport/b", "malformed"),
    ],
)
def test_bad_urls_are_explained(url: str, needle: str) -> None:
    with pytest.raises(StoreUrlError, match=needle):
        parse_store_url(url, {})


def test_open_store_influx_does_not_connect() -> None:
    store = open_store("influxdb://127.0.0.1:9/bkt?org=o", {"INFLUXDB_V2_TOKEN": TOKEN})
    try:
        assert isinstance(store, InfluxStore)
        assert (store.url, store.org, store.bucket) == ("http://127.0.0.1:9", "o", "bkt")
        assert TOKEN not in repr(store)
    finally:
        store.close()


def test_settings_from_env(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"\n  {TOKEN}  \n")
    env = {"INFLUXDB_V2_URL": "http://influxdb:8086", "INFLUXDB_V2_TOKEN_FILE": str(token_file)}
    s = influx_settings_from_env(env)
    assert s == InfluxSettings("http://influxdb:8086", "", "gpuwatt", TOKEN, str(token_file))
    assert TOKEN not in repr(s)
    # The variable wins over the file.
    assert influx_settings_from_env({**env, "INFLUXDB_V2_TOKEN": "other"}).token == "other"


def test_settings_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreUrlError, match="INFLUXDB_V2_URL is not set"):
        influx_settings_from_env({})
    with pytest.raises(StoreUrlError, match="http"):
        influx_settings_from_env({"INFLUXDB_V2_URL": "influxdb:8086"})
    with pytest.raises(StoreUrlError, match="credentials") as info:
        influx_settings_from_env({"INFLUXDB_V2_URL": f"http://u:{TOKEN}@h:8086"})
    assert TOKEN not in str(info.value)
    missing = tmp_path / "nope"
    env = {"INFLUXDB_V2_URL": "http://h:8086", "INFLUXDB_V2_TOKEN_FILE": str(missing)}
    with pytest.raises(StoreUrlError, match="cannot read token file"):
        influx_settings_from_env(env)
    (tmp_path / "empty").write_text("\n")
    env["INFLUXDB_V2_TOKEN_FILE"] = str(tmp_path / "empty")
    with pytest.raises(StoreUrlError, match="is empty"):
        influx_settings_from_env(env)


def test_prometheus_compatible_urls() -> None:
    from gpuwatt.store.url import PromTarget

    t = parse_store_url("prometheus://prom.example:9090", {})
    assert t == PromTarget("http://prom.example:9090", "prometheus", "gpuwatt", 30.0)
    t = parse_store_url("victoriametricss://vm:8481/select/0/prometheus/?timeout=2m", {})
    assert t == PromTarget(
        "https://vm:8481/select/0/prometheus", "victoriametrics", "influx", 120.0
    )
    t = parse_store_url("prometheus://[::1]:9090?source=dcgm", {})
    assert isinstance(t, PromTarget) and t.url == "http://[::1]:9090" and t.source == "dcgm"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("prometheus://u:p@prom:9090", "must not carry a user"),
        ("prometheus://prom:9090?source=nvml", "source='nvml'"),
        ("prometheus://prom:9090?timeout=forever", "timeout='forever'"),
        ("prometheus://prom:9090?timeout=0s", "timeout='0s'"),
        ("prometheus://prom:9090?step=1m", "unknown parameter(s) step"),
        ("prometheus:///nohost", "needs a host"),
    ],
)
def test_bad_prometheus_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(StoreUrlError) as err:
        parse_store_url(url, {})
    assert says in str(err.value)
    assert "u:p" not in str(err.value)


def test_collecting_into_prometheus_says_to_scrape_instead(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "GPUWATT_HOME": str(tmp_path)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatt",
            "collect",
            "--simulate",
            "healthy",
            "--store",
            "prometheus://127.0.0.1:9",
            "--duration",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "--metrics-port" in result.stderr and "Traceback" not in result.stderr


def test_influx_read_timeout_comes_from_the_url() -> None:
    target = parse_store_url("influxdb://influx:8086/gpuwatt?org=hpc&timeout=2m", {})
    assert isinstance(target, InfluxTarget) and target.timeout_s == 120.0
    assert parse_store_url("influxdb://influx:8086/gpuwatt?org=hpc", {}).timeout_s == 10.0  # type: ignore[union-attr]
    with open_store("influxdb://127.0.0.1:9/gpuwatt?org=hpc&timeout=45s") as store:
        assert isinstance(store, InfluxStore) and store.timeout_s == 45.0
    with pytest.raises(StoreUrlError, match="timeout='soon'"):
        parse_store_url("influxdb://influx:8086/gpuwatt?timeout=soon", {})


def test_config_file_timeout_applies_where_the_url_sets_none(tmp_path: Path) -> None:
    from gpuwatt.config import load_config
    from gpuwatt.store.promql import PromStore

    path = tmp_path / "gpuwatt.yaml"
    path.write_text("store:\n  url: influxdb://127.0.0.1:9/gpuwatt?org=hpc\n  timeout: 90s\n")
    config = load_config(path, environ={})
    assert config.store_timeout_s == 90.0
    with open_store(config.store_url, {}, timeout_s=config.store_timeout_s) as store:
        assert isinstance(store, InfluxStore) and store.timeout_s == 90.0
    # The URL is the more specific setting: its timeout= wins over the file's.
    url = "influxdb://127.0.0.1:9/gpuwatt?org=hpc&timeout=5s"
    with open_store(url, {}, timeout_s=config.store_timeout_s) as store:
        assert isinstance(store, InfluxStore) and store.timeout_s == 5.0
    with open_store("prometheus://127.0.0.1:9", {}, timeout_s=90.0) as store:
        assert isinstance(store, PromStore) and store.timeout_s == 90.0
    # GPUWATT_STORE replaces the file's URL, not its timeout.
    env = {"GPUWATT_STORE": "victoriametrics://127.0.0.1:9"}
    assert load_config(path, environ=env).store_timeout_s == 90.0


def test_rollups_are_on_for_influxdb_and_off_for_victoriametrics_unless_the_url_says() -> None:
    def rollups(url: str) -> bool:
        target = parse_store_url(url, {})
        assert isinstance(target, InfluxTarget | PromTarget)
        return target.rollups

    assert rollups("influxdb://db:8086/b") is True
    assert rollups("influxdb://db:8086/b?rollups=off") is False
    assert rollups("victoriametrics://vm:8428") is False
    assert rollups("victoriametrics://vm:8428?rollups=on") is True
    with open_store("victoriametrics://127.0.0.1:9?rollups=on", {}) as vm:  # type: ignore[attr-defined]
        assert vm.rollups is not None
    with open_store("prometheus://127.0.0.1:9?rollups=on", {}) as prom:  # type: ignore[attr-defined]
        assert prom.rollups is None  # Prometheus takes no writes: nowhere to keep them


def test_cache_mb_sets_the_memory_a_reader_keeps_rollup_points_in() -> None:
    from gpuwatt.store.rollup_cache import DEFAULT_BUDGET_BYTES

    for url, want in [
        ("influxdb://127.0.0.1:9/b", DEFAULT_BUDGET_BYTES),
        ("influxdb://127.0.0.1:9/b?cache_mb=0", 0),
        ("victoriametrics://127.0.0.1:9?rollups=on&cache_mb=64", 64 * 2**20),
        ("victoriametrics://127.0.0.1:9?rollups=on", DEFAULT_BUDGET_BYTES),
    ]:
        with open_store(url, {}) as store:  # type: ignore[attr-defined]
            assert store.read_rollups.budget_bytes == want, url
