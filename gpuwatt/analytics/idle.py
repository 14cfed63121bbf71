"""Idle GPUs in three classes, each worded for what a person should do about it.

- ``free``: no job and nothing held -- capacity the scheduler can hand out.
- ``allocated_idle``: a job holds the GPU but does no work on it -- fix the job's placement or
  release the GPU.
- ``held_no_job``: memory used or processes present, but no job accounts for them -- an orphaned
  or unmanaged process; find it and stop it (or register its job) before the GPU is handed out.
"""

from __future__ import annotations

from gpuwatt.precision import settled

IDLE_CLASSES: tuple[str, ...] = ("free", "allocated_idle", "held_no_job")

#: memory below this is the driver's own context, not a process's data
HELD_MIN_BYTES = 256 * 2**20


def idle_class(job_id: str | None, memory_used_bytes: float | None, processes: float | None) -> str:
    """The class of an idle GPU from its job and what it holds."""
    if job_id is not None:
        return "allocated_idle"
    if (memory_used_bytes or 0.0) >= HELD_MIN_BYTES or (processes or 0.0) > 0:
        return "held_no_job"
    return "free"


def explain_idle(
    cls: str,
    *,
    host: str,
    gpu_index: int,
    job_id: str | None,
    minutes: float,
    util_pct: float,
    memory_used_bytes: float | None,
    processes: float | None,
) -> str:
    """One line: what the GPU is doing (nothing), what it holds, and what to do (its figures
    settled first: ``gpuwatt.precision``)."""
    minutes, util_pct = settled(minutes), settled(util_pct)
    memory_used_bytes = None if memory_used_bytes is None else settled(memory_used_bytes)
    processes = None if processes is None else settled(processes)
    held = []
    if memory_used_bytes is not None and memory_used_bytes > 0:
        held.append(f"holds {memory_used_bytes / 2**30:.1f} GiB")
    if processes:
        held.append(f"{processes:.0f} process(es)")
    what = ", ".join(held)
    gpu = f"GPU {gpu_index} on {host}"
    if cls == "allocated_idle":
        return (
            f"{gpu} is allocated to job {job_id}{', ' + what if what else ''}, but has run at "
            f"{util_pct:.0f} % utilisation for {minutes:.0f} min; check the job's device "
            "placement or release the GPU"
        )
    if cls == "held_no_job":
        return (
            f"{gpu} has no job but {what or 'holds memory'}, idle for {minutes:.0f} min: "
            "a process no job accounts for; find it (nvidia-smi --query-compute-apps) and stop "
            "it or register its job before the GPU is handed out"
        )
    return f"{gpu} is free: no job, nothing held, idle for {minutes:.0f} min; it can take work"
