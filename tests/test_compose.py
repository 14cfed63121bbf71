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


def test_alert_evaluator_reads_its_secrets_from_files() -> None:
    alerts = COMPOSE["services"]["alerts"]
    assert alerts["command"][:2] == ["gpuwatt", "alerts"]
    assert {"slack-webhook-url", "smtp-password"} <= set(alerts["secrets"])
    assert alerts["environment"]["INFLUXDB_V2_TOKEN_FILE"].startswith("/run/secrets/")
    config_mount = next(v for v in alerts["volumes"] if v.endswith(":ro"))
    host_path = Path(__file__).resolve().parents[1] / config_mount.split(":")[0]
    text = host_path.read_text()
    assert "/run/secrets/slack-webhook-url" in text and "/run/secrets/smtp-password" in text


def test_the_shipped_deploy_config_is_valid(tmp_path: Path) -> None:
    from gpuwatt.cli.alerts import load_settings

    # the secrets the compose stack mounts, as files in a stand-in /run/secrets
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "slack-webhook-url").write_text("http://127.0.0.1:9/hook\n")
    (secrets / "smtp-password").write_text("pw\n")
    text = (Path(__file__).resolve().parents[1] / "deploy" / "gpuwatt.yaml").read_text()
    config_file = tmp_path / "gpuwatt.yaml"
    config_file.write_text(text.replace("/run/secrets/", f"{secrets}/"))
    config, settings = load_settings(str(config_file), environ={})
    assert set(settings.channels) == {"slack", "oncall-mail"}
    assert config.energy.price_per_kwh == 0.25


def test_dashboard_requires_credentials_and_reads_alert_state() -> None:
    dash = COMPOSE["services"]["dashboard"]
    assert dash["command"][:2] == ["gpuwatt", "dashboard"]
    env = dash["environment"]
    assert env["GPUWATT_DASHBOARD_PASSWORD_FILE"].startswith("/run/secrets/")
    assert all(str(p).startswith("127.0.0.1:") for p in dash["ports"])
    # the evaluator's state volume, read-only, for the alerts page
    assert any(v.startswith("alerts-state:") and v.endswith(":ro") for v in dash["volumes"])
