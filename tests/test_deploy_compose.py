"""The compose files: valid against the Compose specification, and the layout the README promises.

Docker does not run here, so each file is validated against the Compose specification's JSON
schema (vendored in tests/data/compose-spec with its source and licence) and its structure is
checked; ``tests/test_deploy_image.py`` starts each service's command from a fresh install.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuwatt.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "compose-spec" / "compose-spec.json").read_text())
CENTRAL_FILE = ROOT / "docker-compose.yml"
NODE_FILE = ROOT / "docker-compose.node.yml"
CENTRAL: dict[str, Any] = yaml.safe_load(CENTRAL_FILE.read_text())
NODE: dict[str, Any] = yaml.safe_load(NODE_FILE.read_text())


def _errors(doc: dict[str, Any]) -> list[str]:
    # The schema declares draft-07 ("$schema" without the trailing '#', so name it explicitly).
    validator = jsonschema.Draft7Validator(
        SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )
    errors = validator.iter_errors(doc)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def test_the_vendored_schema_is_a_valid_draft_7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", [CENTRAL_FILE, NODE_FILE], ids=lambda p: p.name)
def test_compose_file_validates_against_the_compose_specification(path: Path) -> None:
    assert _errors(yaml.safe_load(path.read_text())) == []


def test_the_schema_check_rejects_what_compose_would_reject() -> None:
    """The validation bites: a misspelt key and a wrongly typed value are both reported."""
    broken = yaml.safe_load(NODE_FILE.read_text())
    broken["services"]["collector"]["pids"] = "host"
    broken["services"]["collector"]["restart"] = ["always"]
    errors = _errors(broken)
    assert any("pids" in e for e in errors), errors
    assert any(e.startswith("services/collector/restart") for e in errors), errors


# --- the central services ----------------------------------------------------------------------


def test_central_file_runs_influxdb_dashboard_and_evaluator_and_no_collector() -> None:
    assert set(CENTRAL["services"]) == {"influxdb", "dashboard", "alerts"}
    for name, service in CENTRAL["services"].items():
        assert "profiles" not in service, name  # `up -d` starts exactly these
        assert "devices" not in str(service.get("deploy", {})), f"{name} asks for GPUs"


def test_influxdb_is_pinned_to_2x_and_health_checked() -> None:
    influx = CENTRAL["services"]["influxdb"]
    assert re.fullmatch(r"influxdb:2\.\d+(\.\d+)?", influx["image"]), influx["image"]
    assert influx["healthcheck"]["test"]
    env = influx["environment"]
    assert env["DOCKER_INFLUXDB_INIT_MODE"] == "setup"
    for key in ("USERNAME", "PASSWORD", "ADMIN_TOKEN"):
        secret_path = env[f"DOCKER_INFLUXDB_INIT_{key}_FILE"]
        assert secret_path.startswith("/run/secrets/")
        assert secret_path.rsplit("/", 1)[1] in influx["secrets"]
    assert all(str(p).startswith("127.0.0.1:") for p in influx["ports"])


@pytest.mark.parametrize("doc", [CENTRAL, NODE], ids=["central", "node"])
def test_no_secret_value_is_written_inline(doc: dict[str, Any]) -> None:
    for name, service in doc["services"].items():
        env = service.get("environment", {})
        for key in env:
            if re.search(r"TOKEN|PASSWORD|SECRET", key):
                assert key.endswith("_FILE"), f"{name}: {key} must come from a secret file"
        assert not any("TOKEN=" in part for part in service.get("command", [])), name
    for secret in doc["secrets"].values():
        assert secret["file"].startswith("./secrets/")


def test_alert_evaluator_reads_its_secrets_from_files() -> None:
    alerts = CENTRAL["services"]["alerts"]
    assert alerts["command"][:2] == ["gpuwatt", "alerts"]
    assert {"slack-webhook-url", "smtp-password"} <= set(alerts["secrets"])
    assert alerts["environment"]["INFLUXDB_V2_TOKEN_FILE"].startswith("/run/secrets/")
    config_mount = next(v for v in alerts["volumes"] if v.endswith(":ro"))
    text = (ROOT / config_mount.split(":")[0]).read_text()
    assert "/run/secrets/slack-webhook-url" in text and "/run/secrets/smtp-password" in text


def test_the_shipped_central_config_is_valid(tmp_path: Path) -> None:
    from gpuwatt.cli.alerts import load_settings

    # the secrets the compose stack mounts, as files in a stand-in /run/secrets
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "slack-webhook-url").write_text("http://127.0.0.1:9/hook\n")
    (secrets / "smtp-password").write_text("pw\n")
    text = (ROOT / "deploy" / "gpuwatt.yaml").read_text()
    config_file = tmp_path / "gpuwatt.yaml"
    config_file.write_text(text.replace("/run/secrets/", f"{secrets}/"))
    config, settings = load_settings(str(config_file), environ={})
    assert set(settings.channels) == {"slack", "oncall-mail"}
    assert config.energy.price_per_kwh == 0.25


def test_dashboard_requires_credentials_and_reads_alert_state() -> None:
    dash = CENTRAL["services"]["dashboard"]
    assert dash["command"][:2] == ["gpuwatt", "dashboard"]
    env = dash["environment"]
    assert env["GPUWATT_DASHBOARD_PASSWORD_FILE"].startswith("/run/secrets/")
    assert all(str(p).startswith("127.0.0.1:") for p in dash["ports"])
    assert any(v.startswith("alerts-state:") and v.endswith(":ro") for v in dash["volumes"])


# --- the GPU node ------------------------------------------------------------------------------


def test_node_file_runs_only_the_collector_with_the_nodes_name_pids_and_gpus() -> None:
    assert set(NODE["services"]) == {"collector"}
    collector = NODE["services"]["collector"]
    assert collector["command"][:2] == ["gpuwatt", "collect"]
    assert collector["uts"] == "host"  # gethostname() is the node's: a stable host tag
    assert collector["pid"] == "host"  # NVML's pids and /proc/<pid>/cgroup are the node's
    devices = collector["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu", "utility"]}]
    assert "depends_on" not in collector  # InfluxDB is on another machine
    # the central InfluxDB's URL must be given; compose refuses to start without it
    assert re.fullmatch(r"\$\{GPUWATT_STORE:\?.+\}", collector["environment"]["GPUWATT_STORE"])
    assert collector["environment"]["INFLUXDB_V2_TOKEN_FILE"] == (
        "/run/secrets/influxdb-writer-token"
    )
    assert collector["secrets"] == ["influxdb-writer-token"]


def test_node_collector_reads_the_mounted_job_mapping_directory() -> None:
    collector = NODE["services"]["collector"]
    mounts = {v.split(":")[1]: v for v in collector["volumes"]}
    config_host_path = next(v.split(":")[0] for v in collector["volumes"] if "gpuwatt.yaml" in v)
    config = load_config(ROOT / config_host_path, environ={})
    job_dir = str(config.collector.job_mapping_dir)
    # the same directory on the node and in the container, read-only: the prolog writes it
    assert mounts[job_dir] == f"{job_dir}:{job_dir}:ro"
    slurm_default = re.search(
        r'GPUWATT_JOB_DIR:-([^}"]+)', (ROOT / "deploy" / "slurm" / "prolog.sh").read_text()
    )
    assert slurm_default is not None and slurm_default.group(1) == job_dir
    # the spool lives on the named volume, so a restarted container replays it
    assert str(config.collector.spool_dir).startswith("/var/lib/gpuwatt/")
    assert mounts["/var/lib/gpuwatt"].startswith("collector-spool:")


def test_dashboard_finds_the_alert_state_without_the_channels_secrets() -> None:
    """The dashboard mounts the shared config but none of the alert channels' secrets, and the
    state volume read-only: finding alerts.db must need neither."""
    from gpuwatt.cli.compose import alerts_db_path

    dash = CENTRAL["services"]["dashboard"]
    assert not {"slack-webhook-url", "smtp-password"} & set(dash["secrets"])
    config_mount = next(v for v in dash["volumes"] if "gpuwatt.yaml" in v)
    host_config = ROOT / config_mount.split(":")[0]
    assert "/run/secrets/slack-webhook-url" in host_config.read_text()  # absent here
    assert alerts_db_path(str(host_config)) == Path("/var/lib/gpuwatt/alerts.db")
    state_mount = next(v for v in dash["volumes"] if v.startswith("alerts-state:"))
    assert state_mount == "alerts-state:/var/lib/gpuwatt:ro"
