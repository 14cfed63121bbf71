"""The Kubernetes manifests: valid against the API's schemas, and the shape the README promises.

``kubernetes-validate`` (strict: unknown fields are errors) checks every document against the
oldest and the newest Kubernetes versions it ships schemas for in the range we support; a kind
it has no schema for fails here instead of being skipped with a warning, as its CLI would.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwatt.alerts.notify.alertmanager import AlertmanagerChannel
from gpuwatt.alerts.settings import parse_alert_settings
from gpuwatt.cli.main import _parser
from gpuwatt.config import parse_config
from gpuwatt.yamlfile import load_text

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSIONS = ["1.29", "1.37"]  # oldest supported upstream in 2026 .. newest schema
DOCS: list[tuple[str, dict[str, Any]]] = [
    (path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc
]


def find(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_spec(kind: str, name: str) -> dict[str, Any]:
    return find(kind, name)["spec"]["template"]["spec"]


def test_the_manifests_hold_the_expected_objects() -> None:
    assert sorted((d["kind"], d["metadata"]["name"]) for _, d in DOCS) == [
        ("ConfigMap", "gpuwatt-central"),
        ("ConfigMap", "gpuwatt-collector"),
        ("DaemonSet", "gpuwatt-collector"),
        ("Deployment", "gpuwatt-central"),
        ("Namespace", "gpuwatt"),
        ("PersistentVolumeClaim", "gpuwatt-alerts-state"),
        ("Service", "gpuwatt-dashboard"),
        ("Service", "influxdb"),
        ("StatefulSet", "influxdb"),
    ]
    for _, d in DOCS:
        assert d["kind"] == "Namespace" or d["metadata"]["namespace"] == "gpuwatt"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "doc", [d for _, d in DOCS], ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in DOCS]
)
def test_manifest_validates_strictly(doc: dict[str, Any], version: str) -> None:
    assert kubernetes_validate.validate(doc, version, strict=True) == version


def test_strict_validation_rejects_a_misplaced_field() -> None:
    """The check bites: ``hostPID`` in the container instead of the pod is an error."""
    broken = yaml.safe_load(yaml.safe_dump(find("DaemonSet", "gpuwatt-collector")))
    broken["spec"]["template"]["spec"]["containers"][0]["hostPID"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_collector_daemonset_runs_on_gpu_nodes_with_the_nodes_pids_and_name() -> None:
    spec = pod_spec("DaemonSet", "gpuwatt-collector")
    assert spec["hostPID"] is True
    assert spec["hostNetwork"] is True  # the node's UTS namespace: a stable host tag
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "nvidia.com/gpu" not in str(container["resources"])  # watches GPUs, allocates none


@pytest.mark.parametrize(
    ("kind", "name"), [("DaemonSet", "gpuwatt-collector"), ("Deployment", "gpuwatt-central")]
)
def test_pods_are_locked_down_and_limited(kind: str, name: str) -> None:
    spec = pod_spec(kind, name)
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] == 10001
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert not sc.get("privileged", False)
        assert set(c["resources"]["limits"]) == {"cpu", "memory"}
        assert set(c["resources"]["requests"]) == {"cpu", "memory"}
        # every mount is read-only except the state/spool and /tmp
        for m in c["volumeMounts"]:
            if m["mountPath"] not in ("/var/lib/gpuwatt", "/tmp"):
                assert m["readOnly"] is True, (c["name"], m)
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    if kind != "DaemonSet":
        assert host_paths == {}
        return
    # the collector's one host path is the node's /proc, read-only, where its config looks
    assert host_paths == {"host-proc": "/proc"}
    (proc_mount,) = [
        m for c in spec["containers"] for m in c["volumeMounts"] if m["name"] == "host-proc"
    ]
    assert proc_mount["readOnly"] is True
    text = find("ConfigMap", "gpuwatt-collector")["data"]["gpuwatt.yaml"]
    config = parse_config(load_text(text, "gpuwatt.yaml"))
    assert str(config.collector.proc_root) == proc_mount["mountPath"]


def test_the_image_user_is_the_one_the_pods_run_as() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--uid 10001" in dockerfile and "\nUSER 10001\n" in dockerfile


@pytest.mark.parametrize(
    ("kind", "name"), [("DaemonSet", "gpuwatt-collector"), ("Deployment", "gpuwatt-central")]
)
def test_commands_are_ones_gpuwatt_accepts_and_tokens_come_from_files(kind: str, name: str) -> None:
    spec = pod_spec(kind, name)
    mounts_by_volume = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"]:
        args = _parser().parse_args(c["command"][1:])
        assert args.config == "/etc/gpuwatt/gpuwatt.yaml"
        for e in c["env"]:
            if any(w in e["name"] for w in ("TOKEN", "PASSWORD", "SECRET")):
                assert e["name"].endswith("_FILE"), e
                # the file is inside a mounted Secret
                mount = next(m for m in c["volumeMounts"] if e["value"].startswith(m["mountPath"]))
                assert "secret" in mounts_by_volume[mount["name"]]


def test_central_runs_exactly_one_evaluator_and_serves_the_dashboard() -> None:
    deployment = find("Deployment", "gpuwatt-central")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    containers = {c["name"]: c for c in pod_spec("Deployment", "gpuwatt-central")["containers"]}
    assert [c["command"][1] for c in containers.values()] == ["dashboard", "alerts"]
    dash = containers["dashboard"]
    env = {e["name"]: e["value"] for e in dash["env"]}
    assert env["GPUWATT_DASHBOARD_USER"] and env["GPUWATT_DASHBOARD_PASSWORD_FILE"]
    service = find("Service", "gpuwatt-dashboard")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == dash["ports"][0]["name"]
    assert dash["ports"][0]["containerPort"] == int(dash["command"][-1])


def test_the_shipped_configs_are_valid(tmp_path: Path) -> None:
    collector = load_text(find("ConfigMap", "gpuwatt-collector")["data"]["gpuwatt.yaml"], "cm")
    config = parse_config(collector)
    assert config.store_url and config.store_url.startswith("influxdb://")
    text = find("ConfigMap", "gpuwatt-central")["data"]["gpuwatt.yaml"]
    # the Secret's files, in a stand-in for their mount
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "slack-webhook-url").write_text("http://127.0.0.1:9/hook\n")
    doc = load_text(text.replace("/var/run/secrets/gpuwatt-alerts", str(secrets)), "cm")
    assert parse_config(doc).energy.price_per_kwh == 0.25
    mapping = dict(doc.mapping())
    settings = parse_alert_settings(mapping["alerts"], environ={})
    assert isinstance(settings.channels["alertmanager"], AlertmanagerChannel)
    assert set(settings.channels) == {"slack", "alertmanager"}


def test_the_stores_url_is_the_shipped_influxdb_service() -> None:
    influx = pod_spec("StatefulSet", "influxdb")
    (container,) = influx["containers"]
    assert re.fullmatch(r"influxdb:2\.\d+\.\d+", container["image"])  # not :latest (3 Core)
    env = {e["name"]: e["value"] for e in container["env"]}
    service = find("Service", "influxdb")
    (port,) = service["spec"]["ports"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    bucket, org = env["DOCKER_INFLUXDB_INIT_BUCKET"], env["DOCKER_INFLUXDB_INIT_ORG"]
    for name in ("gpuwatt-collector", "gpuwatt-central"):
        config = parse_config(load_text(find("ConfigMap", name)["data"]["gpuwatt.yaml"], name))
        assert config.store_url == f"influxdb://{host}:{port['port']}/{bucket}?org={org}"
    for key in ("USERNAME", "PASSWORD", "ADMIN_TOKEN"):
        assert env[f"DOCKER_INFLUXDB_INIT_{key}_FILE"].startswith("/var/run/secrets/")
