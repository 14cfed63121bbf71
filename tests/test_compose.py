"""docker-compose.yml cannot run here (no Docker), so its structure is checked instead."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml").read_text())


def test_influxdb_is_pinned_to_2x_and_health_checked() -> None:
    influx = COMPOSE["services"]["influxdb"]
    assert re.fullmatch(r"influxdb:2\.\d+(\.\d+)?", influx["image"]), influx["image"]
    assert influx["healthcheck"]["test"]
    env = influx["environment"]
    assert env["DOCKER_INFLUXDB_INIT_MODE"] == "setup"
    for key in ("USERNAME", "PASSWORD", "ADMIN_TOKEN"):
        secret_path = env[f"DOCKER_INFLUXDB_INIT_{key}_FILE"]
        assert secret_path.startswith("/run/secrets/")
        assert secret_path.rsplit("/", 1)[1] in influx["secrets"]
    # published on loopback only
    assert all(str(p).startswith("127.0.0.1:") for p in influx["ports"])


def test_collector_gets_gpus_and_its_token_from_a_secret_file() -> None:
    collector = COMPOSE["services"]["collector"]
    devices = collector["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert collector["environment"]["INFLUXDB_V2_TOKEN_FILE"].startswith("/run/secrets/")
    assert collector["depends_on"]["influxdb"]["condition"] == "service_healthy"
    assert "gpu" in collector["profiles"]


def test_no_secret_value_is_written_inline() -> None:
    for name, service in COMPOSE["services"].items():
        env = service.get("environment", {})
        for key in env:
            if re.search(r"TOKEN|PASSWORD|SECRET", key):
                assert key.endswith("_FILE"), f"{name}: {key} must come from a secret file"
        assert not any("TOKEN=" in part for part in service.get("command", [])), name
    for secret in COMPOSE["secrets"].values():
        assert secret["file"].startswith("./secrets/")
