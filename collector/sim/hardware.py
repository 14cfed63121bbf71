"""The static facts of each simulated GPU: its NVML name, uuid, PCI ids, limits and clocks,
from the GPU table (``gpu_specs``) and the simulated model's profile (``scenario.gpu_profile``)."""

from __future__ import annotations

import numpy as np

from gpuwatt.collector.sim.scenario_model import ClusterSpec, GpuRef, gpu_profile
from gpuwatt.collector.sim.state import SimGpuState
from gpuwatt.gpu_specs import SPECS, GpuSpec, nvml_pci_device_id

MIB = 1024**2

#: PCI bus numbers of the eight GPUs on an HGX H100 baseboard.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def build_states(
    cluster: ClusterSpec, refs: list[GpuRef], rng: np.random.Generator
) -> list[SimGpuState]:
    """One ``SimGpuState`` per GPU of ``refs``, idle, in that order (uuids drawn from ``rng``)."""
    states = []
    for host, index in refs:
        model = cluster.model_of(host)
        spec, profile = SPECS[model], gpu_profile(model)
        limit = cluster.power_limit_of((host, index))
        states.append(
            SimGpuState(
                host=host,
                index=index,
                uuid=_uuid(rng),
                name=profile.nvml_name,
                spec=spec,
                pci_bus_id=_pci_bus_id(index),
                pci_device_id=_pci_device_id(spec, profile.pci_device),
                memory_total_bytes=profile.memory_total_mib * MIB,
                power_limit_w=float(limit),
                power_min_w=float(profile.power_min_w),
                sm_clock_max_mhz=float(spec.peak_clock_mhz),
                memory_clock_max_mhz=float(profile.memory_clock_max_mhz),
                slowdown_temp_c=float(profile.slowdown_temp_c),
                shutdown_temp_c=float(profile.shutdown_temp_c),
                idle_power_w=float(profile.idle_power_w),
            )
        )
    return states


def _uuid(rng: np.random.Generator) -> str:
    h = "".join(f"{b:02x}" for b in rng.integers(0, 256, 16).tolist())
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _pci_device_id(spec: GpuSpec, device: int | None) -> int | None:
    """NVML's ``pciDeviceId`` of a simulated ``spec`` (its profile's device id, else the spec's
    first); None for a model with no known id."""
    if device is None and spec.pci_device_ids:
        device = spec.pci_device_ids[0]
    return None if device is None else nvml_pci_device_id(device)


def _pci_bus_id(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0x10 + index * 0x10 & 0xFF
    return f"00000000:{bus:02X}:00.0"
