"""MIG devices among GPUs: telling them apart and finding each one's parent GPU.

The collector samples each MIG device as a device of its own (``collector.nvml_mig``): its own
uuid (``MIG-...``) and NVML name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``), under the parent GPU's
host and index. Its sample says its parent's uuid and its instance ids, but a store that keeps
only the GPU's identity (the embedded store) returns the uuid, name, host and index alone: the
parent is then the whole GPU (a ``GPU-...`` uuid) on the same host and index. These helpers work
from either.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuwatt.model import GpuSample

MIG_UUID_PREFIX = "MIG-"
_MIG_NAME = " MIG "


def is_mig_uuid(uuid: object) -> bool:
    return isinstance(uuid, str) and uuid.startswith(MIG_UUID_PREFIX)


def is_mig_device(s: GpuSample) -> bool:
    """A MIG device's sample (not a whole GPU's)."""
    return s.parent_uuid is not None or is_mig_uuid(s.uuid)


def mig_profile(name: str) -> str | None:
    """``1g.10gb`` from NVML's name of a MIG device, None for a whole GPU."""
    _, sep, profile = name.rpartition(_MIG_NAME)
    return (profile.strip() or None) if sep else None


def parents(samples: Iterable[GpuSample]) -> dict[str, str]:
    """MIG device uuid -> its parent GPU's uuid (from the sample, else the whole GPU on the same
    host and index; a MIG device whose parent is not among ``samples`` and says none is left
    out)."""
    samples = list(samples)
    whole = {(s.host, s.gpu_index): s.uuid for s in samples if not is_mig_device(s)}
    out = {}
    for s in samples:
        if is_mig_device(s):
            parent = s.parent_uuid or whole.get((s.host, s.gpu_index))
            if parent:
                out[s.uuid] = parent
    return out
