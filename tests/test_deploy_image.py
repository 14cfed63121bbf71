"""The image's dependency set, as shipped: every compose service's command starts from it.

The Dockerfile's COPY lines are copied into a fresh build context, ``pip install`` installs it
with the Dockerfile's extras into a fresh venv (no site packages: only what the image would
have), and each compose service's own command is started from that venv, with only what cannot
exist here swapped for local stand-ins: the InfluxDB URL for a temporary embedded store, the
secret files and volumes for temporary files, the published address for 127.0.0.1 and a free
port, and NVML (no GPU here) for a simulated cluster beside the real command's own start.

- dashboard: serves, and answers an authenticated request with 200 (401 without credentials);
- alerts: starts its evaluator, creates its state database, stops cleanly on SIGTERM;
- collector: the real command gets as far as NVML (so every import it needs is there) and says
  so; the same command on a simulated cluster writes samples that ``gpuwatt status`` then reads.

It takes about a minute (pip from its cache); marked ``deploy_image`` so it can be selected or
left out (``-m "not deploy_image"``), and it runs in ``make test``.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from servers import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.node.yml"]
START_TIMEOUT_S = 120.0

pytestmark = pytest.mark.deploy_image


def dockerfile_extras() -> str:
    (default,) = re.findall(r"^ARG GPUWATT_EXTRAS=(\S+)$", DOCKERFILE, re.M)
    assert re.search(r'pip install [^\n]*"\.\[\$\{GPUWATT_EXTRAS\}\]"', DOCKERFILE)
    return default


def dockerfile_env() -> dict[str, str]:
    """The image's ENV settings (``ENV KEY=VALUE ...``, continued lines joined)."""
    joined = DOCKERFILE.replace("\\\n", " ")
    return dict(
        pair.split("=", 1)
        for line in re.findall(r"^ENV (.+)$", joined, re.M)
        for pair in line.split()
    )


def dockerfile_copies() -> list[tuple[str, str]]:
    """(source, destination) of every COPY, destinations relative to the WORKDIR."""
    pairs = []
    for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M):
        *sources, dest = line.split()
        for source in sources:
            target = source if dest.endswith("/") and dest in ("./", ".") else dest
            pairs.append((source, target.removeprefix("./")))
    return pairs


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding what the image holds: the COPY'd tree installed with the image's extras."""
    base = tmp_path_factory.mktemp("image")
    context = base / "context"
    context.mkdir()
    for source, dest in dockerfile_copies():
        src, dst = ROOT / source, context / dest
        if src.is_dir():
            shutil.copytree(
                src, dst, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(src, dst)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    result = subprocess.run(
        [
            *(str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"),
            # --no-compile: the same files, without byte-compiling thousands of them up front
            *("--disable-pip-version-check", "--no-compile", f"{context}[{dockerfile_extras()}]"),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return venv


def services() -> dict[str, dict[str, Any]]:
    out = {}
    for name in COMPOSE_FILES:
        doc = yaml.safe_load((ROOT / name).read_text())
        for service_name, service in doc["services"].items():
            if service.get("build") == ".":
                out[service_name] = service
    return out


class Stage:
    """Local stand-ins for one service's mounts, secrets and environment."""

    def __init__(self, tmp: Path, service: dict[str, Any]) -> None:
        self.tmp = tmp
        self.home = tmp / "home"
        self.home.mkdir()
        self.secrets = tmp / "secrets"
        self.secrets.mkdir()
        for name in service.get("secrets", []):
            value = "http://127.0.0.1:9/hook" if "url" in name else f"stand-in-{name}"
            (self.secrets / name).write_text(value + "\n")
        self.store_url = f"sqlite:///{tmp / 'store.db'}"
        self.mounts: dict[str, Path] = {}
        for volume in service.get("volumes", []):
            host, container = volume.split(":")[:2]
            if host.startswith("./"):
                staged = tmp / Path(host).name
                staged.write_text(self.localise((ROOT / host).read_text()))
                self.mounts[container] = staged

    def localise(self, text: str) -> str:
        for container_path, local in (
            ("/run/secrets", self.secrets),
            ("/var/lib/gpuwatt", self.home),
            ("/run/gpuwatt/jobs", self.tmp / "jobs"),
        ):
            text = text.replace(container_path, str(local))
        return text

    def argv(self, venv: Path, command: list[str], port: int | None = None) -> list[str]:
        argv = [str(venv / "bin" / command[0])]
        args = iter(command[1:])
        for arg in args:
            if arg in ("--store", "--config", "--host", "--port"):
                value = next(args)
                if arg == "--store":
                    value = self.store_url
                elif arg == "--config":
                    value = str(self.mounts.get(value, value))
                elif arg == "--host":
                    value = "127.0.0.1"
                else:
                    value = str(port)
                argv += [arg, value]
            else:
                argv.append(arg)
        return argv

    def env(self, service: dict[str, Any]) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUWATT_", "INFLUXDB_", "VIRTUAL_ENV", "PYTHON"))
        }
        env.update(dockerfile_env())
        for key, value in (service.get("environment") or {}).items():
            env[key] = self.localise(str(value))
        env["GPUWATT_HOME"] = str(self.home)
        if "GPUWATT_STORE" in env:
            env["GPUWATT_STORE"] = self.store_url
        return env


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_until(proc: subprocess.Popen[bytes], log: Path, ready: Any, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{what} (exit {proc.poll()}):\n{log.read_text()[-4000:]}")


@pytest.fixture
def staged(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def make(name: str) -> tuple[dict[str, Any], Stage, list[subprocess.Popen[bytes]]]:
        service = services()[name]
        return service, Stage(tmp_path, service), procs

    yield make
    for proc in procs:
        stop(proc)


def test_every_built_service_is_covered() -> None:
    assert sorted(services()) == ["alerts", "collector", "dashboard"]


def test_the_image_holds_the_extras_the_services_import(image: Path) -> None:
    result = subprocess.run(
        [str(image / "bin" / "python"), "-c", "import dash, plotly, werkzeug, pynvml, gpuwatt"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    # nothing from the test environment leaks in: the venv has no site packages
    assert "include-system-site-packages = false" in (image / "pyvenv.cfg").read_text()


def test_dashboard_service_serves_from_the_image(image: Path, staged: Any) -> None:
    service, stage, procs = staged("dashboard")
    port = free_port()
    env = stage.env(service)
    password = (stage.secrets / "dashboard-password").read_text().strip()
    log = stage.tmp / "dashboard.log"
    proc = start(stage.argv(image, service["command"], port), env, log)
    procs.append(proc)
    auth = base64.b64encode(f"{env['GPUWATT_DASHBOARD_USER']}:{password}".encode()).decode()

    def status(headers: dict[str, str]) -> int | None:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code
        except OSError:
            return None

    wait_until(proc, log, lambda: status({"Authorization": f"Basic {auth}"}) == 200, "no 200")
    assert status({}) == 401
    assert stop(proc) == 0


def test_alert_evaluator_service_runs_from_the_image(image: Path, staged: Any) -> None:
    service, stage, procs = staged("alerts")
    log = stage.tmp / "alerts.log"
    proc = start(stage.argv(image, service["command"]), stage.env(service), log)
    procs.append(proc)
    wait_until(
        proc,
        log,
        lambda: "gpuwatt alerts:" in log.read_text() and (stage.home / "alerts.db").exists(),
        "the evaluator did not start",
    )
    time.sleep(1.0)  # past its first evaluation
    assert proc.poll() is None, log.read_text()
    assert stop(proc) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_collector_service_reaches_nvml_and_collects_from_the_image(
    image: Path, staged: Any
) -> None:
    service, stage, _ = staged("collector")
    env = stage.env(service)
    argv = stage.argv(image, service["command"])
    real = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    # no GPU here: the real command must fail at NVML, having imported everything before it
    assert real.returncode != 0
    assert "NVML is not available" in real.stderr, real.stderr
    assert "Traceback" not in real.stderr and "ModuleNotFoundError" not in real.stderr

    simulated = subprocess.run(
        [*argv, "--simulate", "healthy", "--duration", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert simulated.returncode == 0, simulated.stdout[-2000:] + simulated.stderr[-2000:]
    status = subprocess.run(
        [str(image / "bin" / "gpuwatt"), "status", "--store", stage.store_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    assert "node-0" in status.stdout
    # the node config's spool lives under GPUWATT_HOME's volume
    assert (stage.home / "spool").is_dir()
