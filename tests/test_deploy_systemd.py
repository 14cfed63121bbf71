"""The systemd units under deploy/systemd: verified by systemd's own tools, hardened, and runnable.

``systemd-analyze verify`` runs offline against a throw-away root holding the units, the
system's own unit library (for the targets they name) and an executable at the ExecStart path;
it must print nothing at all (an unknown key or an unparsable value is only a warning there, so
the output is checked, not just the status). ``systemd-analyze security --offline`` scores the
hardening; ``systemd-sysusers`` and ``systemd-tmpfiles`` create the user and the job directory
in a throw-away root. Debian's ``systemd`` package provides all four (Makefile: TEST_APT_PACKAGES).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwatt.cli.main import _parser
from gpuwatt.config import load_config

ROOT = Path(__file__).resolve().parents[1]
UNITS_DIR = ROOT / "deploy" / "systemd"
UNITS = sorted(UNITS_DIR.glob("*.service"))
SYSTEM_UNIT_LIBRARY = next(
    (p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()),
    None,
)
# systemd's own exposure score, 0 (locked down) to 10 (unprotected): "OK" is below 4.
EXPOSURE_MAX = 2.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: install Debian's systemd package (make test-deps)"
    return path


def _entries(unit: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of every setting, in order (keys repeat in unit files)."""
    section, out = "", []
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def _values(unit: Path, key: str) -> list[str]:
    return [v for _, k, v in _entries(unit) if k == key]


@pytest.fixture
def offline_root(tmp_path: Path) -> Path:
    """A root with the units installed, the system's unit library and /opt/gpuwatt/bin/gpuwatt."""
    assert SYSTEM_UNIT_LIBRARY is not None, "no systemd unit library: install Debian's systemd"
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNIT_LIBRARY, root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    etc = root / "etc" / "systemd" / "system"
    etc.mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(unit, etc / unit.name)
    exe = root / "opt" / "gpuwatt" / "bin" / "gpuwatt"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return root


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("systemd-analyze"), "verify", f"--root={root}", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_three_services_are_shipped() -> None:
    assert [u.name for u in UNITS] == [
        "gpuwatt-alerts.service",
        "gpuwatt-collector.service",
        "gpuwatt-dashboard.service",
    ]


def test_systemd_analyze_verify_passes_without_a_single_warning(offline_root: Path) -> None:
    result = _verify(offline_root, *(u.name for u in UNITS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""


def test_verify_reports_a_misspelt_setting(offline_root: Path) -> None:
    """The check bites: a bad value is a warning with status 0, which the test above refuses."""
    unit = offline_root / "etc" / "systemd" / "system" / "gpuwatt-collector.service"
    text = unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=strikt")
    unit.write_text(text.replace("Restart=always", "Restart=always\nRestartSecs=5s"))
    result = _verify(offline_root, unit.name)
    output = result.stdout + result.stderr
    assert "strikt" in output and "RestartSecs" in output, output


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_systemd_scores_the_hardening_as_ok(unit: Path, offline_root: Path) -> None:
    result = subprocess.run(
        [
            *(_tool("systemd-analyze"), "security", "--offline=yes", f"--root={offline_root}"),
            *(f"--threshold={round(EXPOSURE_MAX * 10)}", unit.name),  # threshold is x10
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    last = (result.stdout.strip().splitlines() or [""])[-1]
    assert result.returncode == 0, last or result.stderr
    assert "Overall exposure level" in last


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_unit_runs_as_the_dedicated_user_and_is_hardened(unit: Path) -> None:
    settings = {k: v for _, k, v in _entries(unit)}
    assert settings["User"] == settings["Group"] == "gpuwatt"
    assert settings["ProtectSystem"] == "strict"
    assert settings["Restart"] == "always"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelModules"):
        assert settings[key] == "yes", key
    assert settings["CapabilityBoundingSet"] == ""  # no capabilities at all
    assert settings["StateDirectory"] == "gpuwatt" and settings["StateDirectoryMode"] == "0700"
    assert settings["UMask"] == "0077"  # spool, alert state: 0600 files


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_secrets_come_as_credentials_never_on_the_command_line(unit: Path) -> None:
    exec_start = _values(unit, "ExecStart")
    assert len(exec_start) == 1
    assert not any(w in exec_start[0].upper() for w in ("TOKEN", "PASSWORD", "SECRET"))
    credentials = {v.split(":", 1)[0]: v.split(":", 1)[1] for v in _values(unit, "LoadCredential")}
    assert "influxdb-token" in credentials
    assert all(src.startswith("/etc/gpuwatt/credentials/") for src in credentials.values())
    env = dict(e.split("=", 1) for e in _values(unit, "Environment"))
    assert env["INFLUXDB_V2_TOKEN_FILE"] == "%d/influxdb-token"
    for key, value in env.items():
        if any(w in key for w in ("TOKEN", "PASSWORD", "SECRET")):
            assert key.endswith("_FILE") and value.startswith("%d/"), key
            assert value.removeprefix("%d/") in credentials, key
    assert not _values(unit, "EnvironmentFile")  # nothing secret in a world-readable place


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_exec_start_is_a_command_line_gpuwatt_accepts(unit: Path) -> None:
    argv = shlex.split(_values(unit, "ExecStart")[0])
    assert argv[0] == "/opt/gpuwatt/bin/gpuwatt"
    args = _parser().parse_args(argv[1:])
    assert args.command == unit.stem.removeprefix("gpuwatt-").replace("collector", "collect")
    assert args.config == "/etc/gpuwatt/gpuwatt.yaml"


def test_the_collector_keeps_the_gpus_behind_its_device_allow_list() -> None:
    """ProtectClock=yes implies DeviceAllow=char-rtc r, which turns the device policy into an
    allow-list: without an explicit nvidia entry NVML could not open /dev/nvidiactl."""
    collector = UNITS_DIR / "gpuwatt-collector.service"
    implies_allow_list = _values(collector, "ProtectClock") == ["yes"]
    if implies_allow_list or _values(collector, "DeviceAllow"):
        assert "char-nvidia* rw" in _values(collector, "DeviceAllow")
    assert _values(collector, "PrivateDevices") in ([], ["no"])  # would hide /dev/nvidia*
    assert _values(collector, "DevicePolicy") == ["closed"]  # no other device


def test_dashboard_binds_loopback_and_the_collector_reads_the_job_directory() -> None:
    dash = shlex.split(_values(UNITS_DIR / "gpuwatt-dashboard.service", "ExecStart")[0])
    assert dash[dash.index("--host") + 1] == "127.0.0.1"
    collector = UNITS_DIR / "gpuwatt-collector.service"
    job_dir = load_config(ROOT / "deploy" / "gpuwatt-node.yaml", environ={})
    assert job_dir.collector.job_mapping_dir is not None
    # ProtectSystem=strict: readable, and explicitly read-only for the collector
    assert any(
        str(job_dir.collector.job_mapping_dir).startswith(p.removeprefix("-"))
        for p in _values(collector, "ReadOnlyPaths")
    )


def test_sysusers_creates_the_service_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [_tool("systemd-sysusers"), f"--root={tmp_path}", str(UNITS_DIR / "gpuwatt.sysusers.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text().splitlines()
    (entry,) = [line.split(":") for line in passwd if line.startswith("gpuwatt:")]
    assert entry[5] == "/var/lib/gpuwatt" and entry[6] == "/usr/sbin/nologin"


def test_tmpfiles_creates_the_job_mapping_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *(_tool("systemd-tmpfiles"), f"--root={tmp_path}", "--create"),
            str(UNITS_DIR / "gpuwatt.tmpfiles.conf"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    config = load_config(ROOT / "deploy" / "gpuwatt-node.yaml", environ={})
    job_dir = tmp_path / str(config.collector.job_mapping_dir).lstrip("/")
    assert job_dir.is_dir()
    assert job_dir.stat().st_mode & 0o777 == 0o755  # the prolog (root) writes, the collector reads
