"""The Slurm prolog and epilog, run as slurmd runs them, read back by the collector's resolver.

slurmd runs them as root with no search path and the job's environment (the variables below are
those Slurm documents for Prolog/Epilog: SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_GPUS,
CUDA_VISIBLE_DEVICES, SLURM_SCRIPT_CONTEXT ...). Each test runs the real scripts with exactly that
environment (no PATH: the scripts set their own) and reads the directory with
``MappingDirResolver``, the code the collector runs.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from gpuwatt.collector.jobs import MappingDirResolver

SLURM_DIR = Path(__file__).resolve().parents[1] / "deploy" / "slurm"
PROLOG = SLURM_DIR / "prolog.sh"
EPILOG = SLURM_DIR / "epilog.sh"
UUID_0 = "GPU-5f3a2c4e-8d7b-4e21-9a0f-1b2c3d4e5f60"
UUID_2 = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


def slurm_env(job_dir: Path, context: str, **overrides: str) -> dict[str, str]:
    """The environment slurmd gives Prolog/Epilog for a 2-GPU job of alice on node-3."""
    env = {
        "SLURM_SCRIPT_CONTEXT": context,  # prolog_slurmd | epilog_slurmd
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GID": "1000",
        "SLURM_JOB_ACCOUNT": "ml",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_NODELIST": "node-[3-4]",
        "SLURM_CLUSTER_NAME": "hpc",
        "SLURMD_NODENAME": "node-3",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_JOB_GPUS": "0,2",
        "CUDA_VISIBLE_DEVICES": "0,2",
        "GPU_DEVICE_ORDINAL": "0,2",
        "GPUWATT_JOB_DIR": str(job_dir),
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v != ""}


def run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=30
    )


def jobs(job_dir: Path, gpus: int = 4, uuids: dict[int, str] | None = None) -> list[str | None]:
    resolver = MappingDirResolver(job_dir)
    names = uuids or {}
    return [resolver.job_of(i, names.get(i, f"GPU-unknown-{i}"), []) for i in range(gpus)]


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "run" / "gpuwatt" / "jobs"  # created by the prolog


def test_the_scripts_are_executable() -> None:
    for script in (PROLOG, EPILOG):
        assert script.stat().st_mode & stat.S_IXUSR, script
        assert script.read_text().startswith("#!/bin/sh\n")


def test_prolog_maps_the_jobs_gpus_and_epilog_clears_them(job_dir: Path) -> None:
    result = run(PROLOG, slurm_env(job_dir, "prolog_slurmd"))
    assert result.returncode == 0, result.stderr
    assert jobs(job_dir) == ["4242", None, "4242", None]
    assert sorted(p.name for p in job_dir.iterdir()) == ["0", "2"]  # no temporary file left
    for f in job_dir.iterdir():
        assert f.stat().st_mode & 0o777 == 0o644  # the collector's user reads it
    assert job_dir.stat().st_mode & 0o777 == 0o755

    result = run(EPILOG, slurm_env(job_dir, "epilog_slurmd"))
    assert result.returncode == 0, result.stderr
    assert jobs(job_dir) == [None, None, None, None]
    assert list(job_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"SLURM_JOB_GPUS": "", "SLURM_STEP_GPUS": "1,3"}, [None, "4242", None, "4242"]),
        (
            {"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "3", "GPU_DEVICE_ORDINAL": ""},
            [None, None, None, "4242"],
        ),
        ({"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}, [None, "4242", None, None]),
    ],
    ids=["step-gpus", "cuda-visible-devices", "job-gpus-first"],
)
def test_prolog_takes_the_gpu_list_slurm_gives(
    job_dir: Path, variables: dict[str, str], expected: list[str | None]
) -> None:
    env = slurm_env(job_dir, "prolog_slurmd", **variables)
    assert run(PROLOG, env).returncode == 0
    assert jobs(job_dir) == expected


def test_gpus_given_by_uuid_are_mapped_by_uuid(job_dir: Path) -> None:
    env = slurm_env(
        job_dir, "prolog_slurmd", SLURM_JOB_GPUS="", CUDA_VISIBLE_DEVICES=f"{UUID_0},{UUID_2}"
    )
    assert run(PROLOG, env).returncode == 0
    assert jobs(job_dir, uuids={0: UUID_0, 2: UUID_2}) == ["4242", None, "4242", None]
    assert run(EPILOG, slurm_env(job_dir, "epilog_slurmd")).returncode == 0
    assert list(job_dir.iterdir()) == []


def test_a_job_without_gpus_writes_nothing(job_dir: Path) -> None:
    env = slurm_env(job_dir, "prolog_slurmd", SLURM_JOB_GPUS="", CUDA_VISIBLE_DEVICES="")
    result = run(PROLOG, env)
    assert result.returncode == 0 and result.stderr == ""
    assert not job_dir.exists()
    assert run(EPILOG, slurm_env(job_dir, "epilog_slurmd")).returncode == 0


def test_epilog_leaves_a_gpu_that_another_job_has_taken(job_dir: Path) -> None:
    assert run(PROLOG, slurm_env(job_dir, "prolog_slurmd")).returncode == 0
    # job 4243 shares GPU 2 (shared GRES / MPS): its prolog runs after 4242's
    later = slurm_env(job_dir, "prolog_slurmd", SLURM_JOB_ID="4243", SLURM_JOB_GPUS="2")
    assert run(PROLOG, later).returncode == 0
    assert jobs(job_dir) == ["4242", None, "4243", None]
    assert run(EPILOG, slurm_env(job_dir, "epilog_slurmd")).returncode == 0
    assert jobs(job_dir) == [None, None, "4243", None]
    ended = slurm_env(job_dir, "epilog_slurmd", SLURM_JOB_ID="4243", SLURM_JOB_GPUS="2")
    assert run(EPILOG, ended).returncode == 0
    assert jobs(job_dir) == [None, None, None, None]


@pytest.mark.parametrize(
    "gpus",
    ["../../etc/passwd", "0,../x", "MIG-GPU-5f3a2c4e/1/0", "NoDevFiles", "-rf", "0;touch x", "*"],
)
def test_prolog_refuses_names_that_are_not_gpus(job_dir: Path, tmp_path: Path, gpus: str) -> None:
    env = slurm_env(job_dir, "prolog_slurmd", SLURM_JOB_GPUS=gpus)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = run(PROLOG, env)
    assert result.returncode == 0  # never drain the node
    assert "skipping GPU" in result.stderr
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    allowed = {Path("run"), Path("run/gpuwatt"), Path("run/gpuwatt/jobs")}
    if gpus.startswith("0,"):
        allowed.add(Path("run/gpuwatt/jobs/0"))  # the valid entry of the list is still mapped
    assert set(written) - set(before) <= allowed


@pytest.mark.parametrize("job_id", ["", "42;rm -rf /", "../4242"])
def test_a_bad_job_id_writes_nothing_and_never_fails(job_dir: Path, job_id: str) -> None:
    env = slurm_env(job_dir, "prolog_slurmd", SLURM_JOB_ID=job_id)
    assert run(PROLOG, env).returncode == 0
    assert not job_dir.exists()
    assert run(EPILOG, slurm_env(job_dir, "epilog_slurmd", SLURM_JOB_ID=job_id)).returncode == 0


def test_an_unwritable_directory_is_logged_and_the_node_is_not_drained(tmp_path: Path) -> None:
    blocker = tmp_path / "run"
    blocker.write_text("a file where the directory should be")
    result = run(PROLOG, slurm_env(blocker / "jobs", "prolog_slurmd"))
    assert result.returncode == 0
    assert "not mapped" in result.stderr
