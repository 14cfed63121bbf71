"""Which job a GPU works for, from its processes: Slurm, Kubernetes, or a scheduler's mapping.

Resolvers look at the compute processes NVML lists on a GPU and find the job they belong to:

- ``MappingDirResolver``: a directory that a scheduler prolog fills with one file per GPU, named
  by the GPU's index or UUID and holding the job id (the epilog removes it). Works for any
  scheduler, and for GPUs allocated to a job that has not started a process yet.
- ``SlurmCgroupResolver``: the job id from the process's cgroup path, ``.../job_<id>/...``, in
  both the cgroup v1 (``4:memory:/slurm/uid_1000/job_123/step_0``) and v2
  (``0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0``) layouts.
- ``KubernetesResolver``: the pod UID from the cgroup path (cgroupfs
  ``/kubepods/burstable/pod<uid>``, or systemd
  ``kubepods-burstable-pod<uid_with_underscores>.slice``), reported as ``pod/<uid>``.

The ``/proc`` root is a constructor argument, so tests point it at fixture trees. A process that
exits between NVML's listing and our lookup is skipped; no permission to read ``/proc`` means
"unknown", logged once. A GPU with no job is not an error: its sample simply has no job id.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from gpuwatt.collector.process_owner import process_user
from gpuwatt.model import GpuSample

log = logging.getLogger(__name__)

# gpuwatt.mig.MIG_UUID_PREFIX; not imported: this module runs with the model alone (see the
# unprivileged-resolver test), and gpuwatt.mig needs pandas
_MIG_UUID_PREFIX = "MIG-"

_SLURM_JOB = re.compile(r"/job_(\d+)(?=/|$)")
_K8S_POD = re.compile(
    r"(?:/pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(?=/|$))"
    r"|(?:-pod([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})\.slice)"
)


class JobResolver(Protocol):
    def job_of(self, gpu_index: int, uuid: str, pids: Sequence[int]) -> str | None:
        """The job of the GPU, or None when it has none (or it cannot be known)."""


class _CgroupResolver:
    """Reads ``<proc_root>/<pid>/cgroup`` and extracts a job id from the paths in it."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.proc_root = Path(proc_root)
        self._cache: dict[int, str | None] = {}
        self._denied_logged = False

    def job_of(self, gpu_index: int, uuid: str, pids: Sequence[int]) -> str | None:
        for pid in pids:
            job = self._job_of_pid(pid)
            if job is not None:
                return job
        return None

    def forget_except(self, live_pids: Iterable[int]) -> None:
        """Drop cached pids that are gone (a pid number may be reused by another job)."""
        live = set(live_pids)
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]

    def _job_of_pid(self, pid: int) -> str | None:
        if pid in self._cache:
            return self._cache[pid]
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text(encoding="utf-8")
        except (FileNotFoundError, ProcessLookupError):
            return None  # exited between NVML's listing and now: not cached, not an error
        except PermissionError:
            if not self._denied_logged:
                self._denied_logged = True
                log.warning(
                    "no permission to read %s/<pid>/cgroup: jobs cannot be resolved from "
                    "processes (run the collector with access to /proc, or use a job mapping "
                    "directory)",
                    self.proc_root,
                )
            return None
        except OSError as exc:
            log.debug("cannot read cgroup of pid %d: %s", pid, exc)
            return None
        job = None
        for line in text.splitlines():
            _, _, path = line.partition(":")
            _, _, path = path.partition(":")
            job = self.parse(path)
            if job is not None:
                break
        self._cache[pid] = job
        return job

    def parse(self, cgroup_path: str) -> str | None:
        raise NotImplementedError


class SlurmCgroupResolver(_CgroupResolver):
    def parse(self, cgroup_path: str) -> str | None:
        m = _SLURM_JOB.search(cgroup_path)
        return m.group(1) if m else None


class KubernetesResolver(_CgroupResolver):
    def parse(self, cgroup_path: str) -> str | None:
        m = _K8S_POD.search(cgroup_path)
        if not m:
            return None
        uid = m.group(1) or m.group(2).replace("_", "-")
        return f"pod/{uid}"


class MappingDirResolver:
    """``<directory>/<gpu index>`` or ``<directory>/<GPU uuid>`` holds the job id (a MIG
    device: ``<directory>/<MIG uuid>``)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def job_of(self, gpu_index: int, uuid: str, pids: Sequence[int]) -> str | None:
        # a MIG device shares its parent's index: only its own uuid names it
        for name in (uuid,) if uuid.startswith(_MIG_UUID_PREFIX) else (uuid, str(gpu_index)):
            try:
                job = (self.directory / name).read_text(encoding="utf-8").strip()
            except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
                continue
            if job:
                return job
        return None


class ChainResolver:
    """The first resolver that knows the job wins."""

    def __init__(self, resolvers: Sequence[JobResolver]) -> None:
        self.resolvers = list(resolvers)

    def job_of(self, gpu_index: int, uuid: str, pids: Sequence[int]) -> str | None:
        for resolver in self.resolvers:
            job = resolver.job_of(gpu_index, uuid, pids)
            if job is not None:
                return job
        return None


def default_resolver(
    *, proc_root: str | Path = "/proc", mapping_dir: str | Path | None = None
) -> ChainResolver:
    """Mapping directory (when configured), then Slurm, then Kubernetes."""
    chain: list[JobResolver] = []
    if mapping_dir is not None:
        chain.append(MappingDirResolver(mapping_dir))
    chain += [SlurmCgroupResolver(proc_root), KubernetesResolver(proc_root)]
    return ChainResolver(chain)


def attach_jobs(samples: list[GpuSample], resolver: JobResolver) -> list[GpuSample]:
    """The samples with ``job_id`` filled in where the resolver knows it."""
    out = []
    for s in samples:
        # a GPU in MIG mode lists its MIG devices' processes: the jobs are theirs, not its own
        if s.lost or s.job_id is not None or s.mig_enabled:
            out.append(s)
            continue
        pids = [p.pid for p in s.processes or ()]
        job = resolver.job_of(s.gpu_index, s.uuid, pids)
        out.append(s if job is None else replace(s, job_id=job))
    live = {p.pid for s in samples for p in s.processes or ()}
    for r in getattr(resolver, "resolvers", [resolver]):
        if isinstance(r, _CgroupResolver):
            r.forget_except(live)
    return out


class JobAttributingSource:
    """Wraps a sample source so that every sample carries its job (see ``attach_jobs``)."""

    def __init__(
        self, source: object, resolver: JobResolver, *, proc_root: str | Path | None = None
    ) -> None:
        """``proc_root``: the host's /proc, where each GPU process's user is read (None: users
        are left unknown)."""
        self.source = source
        self.resolver = resolver
        self.proc_root = proc_root

    def open(self) -> None:
        self.source.open()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.source.close()  # type: ignore[attr-defined]

    def sample(self, *, include_slow: bool) -> list[GpuSample]:
        samples = self.source.sample(include_slow=include_slow)  # type: ignore[attr-defined]
        if self.proc_root is not None:
            samples = attach_users(samples, self.proc_root)
        return attach_jobs(samples, self.resolver)


def attach_users(samples: list[GpuSample], proc_root: str | Path) -> list[GpuSample]:
    """The samples with each process's user filled in from ``proc_root`` where NVML gave none."""
    out = []
    for s in samples:
        procs = s.processes
        if not procs or all(p.user is not None for p in procs):
            out.append(s)
            continue
        users = tuple(
            p if p.user is not None else replace(p, user=process_user(proc_root, p.pid))
            for p in procs
        )
        out.append(replace(s, processes=users))
    return out
