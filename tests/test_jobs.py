"""Job resolution from /proc fixture trees: Slurm (cgroup v1, v2), Kubernetes, mapping directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpuwatt.collector.jobs import (
    ChainResolver,
    KubernetesResolver,
    MappingDirResolver,
    SlurmCgroupResolver,
    attach_jobs,
    default_resolver,
)
from gpuwatt.model import GpuSample, ProcessSample

POD = "6f1c2b3a-1111-2222-3333-444455556666"


def _proc(root: Path, pid: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    # Slurm, cgroup v1: one line per controller
    _proc(
        root,
        100,
        "12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n"
        "11:devices:/slurm/uid_1000/job_4242/step_0\n1:name=systemd:/system.slice/slurmd.service\n",
    )
    # Slurm, cgroup v2: the unified hierarchy
    _proc(root, 200, "0::/system.slice/slurmstepd.scope/job_777/step_batch/user/task_0\n")
    # Kubernetes, cgroupfs driver (v1)
    _proc(root, 300, f"11:memory:/kubepods/burstable/pod{POD}/0123456789abcdef\n")
    # Kubernetes, systemd driver (v2)
    _proc(
        root,
        400,
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-abc.scope\n",
    )
    # A process in no job at all
    _proc(root, 500, "0::/user.slice/user-1000.slice/session-3.scope\n")
    return root


def test_slurm_cgroup_v1_and_v2(proc_root: Path) -> None:
    slurm = SlurmCgroupResolver(proc_root)
    assert slurm.job_of(0, "GPU-a", [100]) == "4242"
    assert slurm.job_of(1, "GPU-b", [200]) == "777"
    assert slurm.job_of(2, "GPU-c", [500]) is None
    assert slurm.job_of(3, "GPU-d", [300]) is None  # a pod is no Slurm job


def test_kubernetes_pod_uid_from_both_cgroup_drivers(proc_root: Path) -> None:
    k8s = KubernetesResolver(proc_root)
    assert k8s.job_of(0, "GPU-a", [300]) == f"pod/{POD}"
    assert k8s.job_of(1, "GPU-b", [400]) == f"pod/{POD}"
    assert k8s.job_of(2, "GPU-c", [100]) is None


def test_mapping_directory_by_uuid_then_index(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "GPU-aaaa").write_text("train-17\n")
    (jobs / "3").write_text("sweep-2")
    (jobs / "4").write_text("")  # the epilog emptied it
    mapping = MappingDirResolver(jobs)
    assert mapping.job_of(0, "GPU-aaaa", []) == "train-17"
    assert mapping.job_of(3, "GPU-bbbb", []) == "sweep-2"
    assert mapping.job_of(4, "GPU-cccc", []) is None
    assert MappingDirResolver(tmp_path / "missing").job_of(0, "GPU-aaaa", []) is None


def test_a_process_that_exited_is_skipped(proc_root: Path) -> None:
    slurm = SlurmCgroupResolver(proc_root)
    # pid 999 was listed by NVML but is gone by the time we look; the next pid still counts
    assert slurm.job_of(0, "GPU-a", [999, 200]) == "777"
    assert slurm.job_of(0, "GPU-a", [999]) is None


def test_pid_reuse_does_not_keep_a_stale_job(proc_root: Path) -> None:
    slurm = SlurmCgroupResolver(proc_root)
    assert slurm.job_of(0, "GPU-a", [200]) == "777"
    slurm.forget_except([])  # pid 200 left the GPUs
    (proc_root / "200" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_778/step_0\n")
    assert slurm.job_of(0, "GPU-a", [200]) == "778"


def test_no_permission_to_read_proc_means_unknown(tmp_path: Path) -> None:
    """An unprivileged collector that cannot read /proc: no job, a warning, no exception."""
    repo = Path(__file__).resolve().parents[1]
    if os.geteuid() != 0:
        pytest.skip("needs root to run the resolver as another user")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the unprivileged child")
    # A world-readable copy of the modules the resolver needs, and a /proc tree whose cgroup
    # file only root may read.
    world = Path(tempfile.mkdtemp(prefix="gpuwatt-jobs-", dir="/tmp"))
    try:
        world.chmod(0o755)
        for rel in ("gpuwatt/__init__.py", "gpuwatt/model.py", "gpuwatt/collector/__init__.py",
                    "gpuwatt/collector/jobs.py", "gpuwatt/collector/process_owner.py"):  # fmt: skip
            (world / rel).parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            shutil.copy(repo / rel, world / rel)
        _proc(world / "proc", 100, "0::/system.slice/slurmstepd.scope/job_777/step_0\n")
        for d in (world / "proc", world / "proc" / "100"):
            d.chmod(0o755)
        (world / "proc" / "100" / "cgroup").chmod(0o600)
        script = (
            "from gpuwatt.collector.jobs import SlurmCgroupResolver\n"
            f"print(SlurmCgroupResolver({str(world / 'proc')!r}).job_of(0, 'GPU-a', [100]))\n"
        )
        run = subprocess.run(
            [python, "-c", script],
            user=65534,
            cwd=world,
            env={"PYTHONPATH": str(world)},
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(world)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "None"
    assert "no permission to read" in run.stderr


def test_chain_and_attach_jobs(proc_root: Path, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "2").write_text("notebook-5")  # allocated, no process yet
    resolver = default_resolver(proc_root=proc_root, mapping_dir=jobs)
    assert isinstance(resolver, ChainResolver)

    def sample(index: int, pids: list[int], lost: bool = False) -> GpuSample:
        procs = tuple(ProcessSample(p, 1 << 30) for p in pids)
        return GpuSample(1, "n1", index, f"GPU-{index}", "H100", lost=lost, processes=procs)

    out = attach_jobs(
        [sample(0, [100]), sample(1, [400]), sample(2, []), sample(3, []), sample(4, [], True)],
        resolver,
    )
    assert [s.job_id for s in out] == ["4242", f"pod/{POD}", "notebook-5", None, None]
