"""The house rules: one installed import name, and the layering enforced by ruff's banned-api.

Services (collector, dashboard, alerts) depend on the core, never on each other nor on the command
line; the core depends on no service and not on the command line; only ``gpuwatt.cli`` composes.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).with_name("ruff")

SERVICES = ("collector", "dashboard", "alerts")


def _banned(probe_path: str, source: str) -> list[str]:
    """ruff's TID251 findings for ``source`` as if it were the file ``probe_path`` of the tree."""
    out = subprocess.run(
        [
            *(str(RUFF), "check", "--select", "TID251", "--output-format", "concise"),
            *("--stdin-filename", probe_path, "-"),
        ],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    return [line for line in out.stdout.splitlines() if "TID251" in line]


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_may_not_import_another_service_or_the_cli(service: str) -> None:
    others = [s for s in SERVICES if s != service]
    for target in [*(f"gpuwatt.{o}" for o in others), "gpuwatt.cli"]:
        for stmt in (f"import {target}.x\n", f"from {target} import x\n"):
            assert _banned(f"{service}/probe.py", stmt), f"{service} may import {target}: {stmt}"
    # ... but its own package and the core are fine.
    assert not _banned(f"{service}/probe.py", f"import gpuwatt.{service}.x\nimport gpuwatt.model\n")


@pytest.mark.parametrize("core_file", ["gpuwatt/probe.py", "gpuwatt/store/probe.py"])
def test_the_core_may_not_import_a_service_or_the_cli(core_file: str) -> None:
    for target in [*(f"gpuwatt.{s}" for s in SERVICES), "gpuwatt.cli"]:
        assert _banned(core_file, f"from {target}.x import y\n"), f"core may import {target}"
    assert not _banned(core_file, "from gpuwatt.model import GpuSample\n")


def test_the_cli_composes_every_service() -> None:
    source = "".join(f"import gpuwatt.{s}.x\n" for s in SERVICES)
    assert not _banned("gpuwatt/cli/probe.py", source)


def test_only_the_collector_nvml_module_imports_pynvml() -> None:
    assert _banned("collector/probe.py", "import pynvml\n")
    assert _banned("gpuwatt/probe.py", "import pynvml\n")
    assert not _banned("collector/nvml.py", "import pynvml\n")


def test_service_folders_are_the_gpuwatt_subpackages() -> None:
    for service in SERVICES:
        link = ROOT / "gpuwatt" / service
        assert link.is_symlink() and link.resolve() == (ROOT / service).resolve()


def test_the_wheel_installs_one_top_level_name(tmp_path: Path) -> None:
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("-w", str(tmp_path), str(ROOT)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("gpuwatt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"gpuwatt"}
    # Package data travels with the services and the core.
    for data in (
        "gpuwatt/gpu_specs.toml",
        "gpuwatt/collector/sim/scenarios/demo.yaml",
        "gpuwatt/alerts/default_rules.yaml",
        "gpuwatt/dashboard/assets/gpuwatt.css",
    ):
        assert data in names
