"""Config files are validated at start: file, line and reason on every error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatt.config import load_config
from gpuwatt.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpuwatt.yaml"
    path.write_text(text)
    return path


def test_full_config_is_read(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "collector:\n  interval: 500ms\n  slow_interval: 2m\n  spool_max_mib: 64\n"
        "  hostname: n1\n  tensor_precision: fp8\n  proc_root: /host/proc\n"
        "store:\n  url: sqlite:///tmp/x.db\n"
        "energy:\n  price_per_kwh: 0.3\n  carbon_g_per_kwh: 120\n",
    )
    config = load_config(path, environ={})
    assert config.collector.interval_s == 0.5
    assert config.collector.slow_interval_s == 120
    assert config.collector.spool_max_bytes == 64 * 1024 * 1024
    assert config.collector.hostname == "n1"
    assert config.collector.tensor_precision == "fp8"
    assert config.collector.proc_root == Path("/host/proc")
    assert config.store_url == "sqlite:///tmp/x.db"
    assert config.energy.price_per_kwh == 0.3


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "store:\n  url: sqlite:///a.db\n")
    assert load_config(path, environ={"GPUWATT_STORE": "sqlite:///b.db"}).store_url == (
        "sqlite:///b.db"
    )


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("collector:\n  interval: [1\n", 3, "invalid YAML"),
        ("collector:\n  intervall: 1s\n", 2, "unknown field 'intervall'"),
        ("collector:\n  interval: soon\n", 2, "bad duration 'soon'"),
        ("collector:\n  interval: 1s\n  tensor_precision: fp4\n", 3, "'fp4' is not one of"),
        ("energy:\n  price_per_kwh: -1\n", 2, "at least 0"),
        ("store:\n  url: influxdb://u:secret@h/b\n", 2, "INFLUXDB_V2_TOKEN"),
        ("store:\n  url: influxdb://h/b\n  timeout: soon\n", 3, "bad duration 'soon'"),
        ("store:\n  timeout: 0s\n", 2, "at least 0.001"),
        ("store:\n  timeout: 2h\n", 2, "at most 1h"),
        ("store:\n  timeout_s: 30\n", 2, "unknown field 'timeout_s'"),
        ("collector:\n  interval: 10s\n  slow_interval: 5s\n", 3, "slow_interval"),
        ("- just\n- a list\n", 1, "expected a mapping"),
    ],
)
def test_malformed_config_names_file_line_and_reason(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert err.value.path == str(path)
    assert err.value.line == line
    assert reason in str(err.value)
    assert "secret" not in str(err.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml", environ={})
