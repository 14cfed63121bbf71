"""Build ``SimGpuState``/``SimCluster`` directly for NVML tests, without the simulator.

Scenarios are named like gpustat's (``scenario_failing_one_gpu``): each scripts how NVML answers
per GPU index, on states built here. ``run_for`` advances one GPU's counters the way the simulator
integrates them, so the fake's interval answers (GPM, energy) are known exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuwatt.collector.nvml import real_module
from gpuwatt.collector.sim.state import SimCluster, SimGpuState, SimMigState
from gpuwatt.gpu_specs import SPECS, nvml_pci_device_id

NV = real_module()
GIB = 1024**3

#: spec model -> (NVML device name, memory GiB, max SM clock MHz, max memory clock MHz)
DEVICES: dict[str, tuple[str, int, float, float]] = {
    "H100 SXM": ("NVIDIA H100 80GB HBM3", 80, 1980.0, 2619.0),
    "H100 PCIe": ("NVIDIA H100 PCIe", 80, 1755.0, 1593.0),
    "A100 SXM": ("NVIDIA A100-SXM4-80GB", 80, 1410.0, 1593.0),
}


def make_gpu(host: str = "node-1", index: int = 0, model: str = "H100 SXM") -> SimGpuState:
    """One idle GPU of ``model`` with plausible static facts and a few dynamic values set."""
    name, mem_gib, sm_max, mem_max = DEVICES[model]
    spec = SPECS[model]
    return SimGpuState(
        host=host,
        index=index,
        uuid=f"GPU-{host}-{index:02d}-0000-0000-000000000000",
        name=name,
        spec=spec,
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        pci_device_id=nvml_pci_device_id(spec.pci_device_ids[0]),
        memory_total_bytes=mem_gib * GIB,
        power_limit_w=spec.tdp_w,
        power_min_w=spec.tdp_w / 4,
        sm_clock_max_mhz=sm_max,
        memory_clock_max_mhz=mem_max,
        slowdown_temp_c=87.0,
        shutdown_temp_c=92.0,
        idle_power_w=70.0,
        utilization_gpu_pct=0.0,
        memory_used_bytes=1 * GIB,
        memory_reserved_bytes=512 * 1024 * 1024,
        temperature_c=35.0,
        power_w=70.0,
        sm_clock_mhz=345.0,
        memory_clock_mhz=mem_max,
        graphics_clock_mhz=345.0,
    )


def make_cluster(
    gpus_per_host: int = 8, hosts: Iterable[str] = ("node-1",), model: str = "H100 SXM"
) -> SimCluster:
    return SimCluster([make_gpu(h, i, model) for h in hosts for i in range(gpus_per_host)])


@dataclass(frozen=True)
class Activity:
    """What a GPU does over an interval: percentages of time (GPM-style) and clocks/power."""

    sm_clock_mhz: float = 1980.0
    power_w: float = 500.0
    utilization_gpu_pct: float = 100.0
    sm_active_pct: float = 90.0
    sm_occupancy_pct: float = 40.0
    tensor_any_pct: float = 50.0
    tensor_hmma_pct: float = 50.0
    tensor_imma_pct: float = 0.0
    tensor_dfma_pct: float = 0.0
    fp64_pct: float = 0.0
    fp32_pct: float = 0.0
    fp16_pct: float = 0.0
    dram_pct: float = 30.0
    nvlink_rx_bytes_per_s: float = 0.0
    nvlink_tx_bytes_per_s: float = 0.0


#: GPM counter of a simulated device -> the Activity percentage it integrates
_GPM_PCT = (
    ("sm_active_s", "sm_active_pct"),
    ("sm_occupancy_s", "sm_occupancy_pct"),
    ("tensor_any_active_s", "tensor_any_pct"),
    ("tensor_hmma_active_s", "tensor_hmma_pct"),
    ("tensor_imma_active_s", "tensor_imma_pct"),
    ("tensor_dfma_active_s", "tensor_dfma_pct"),
    ("fp64_active_s", "fp64_pct"),
    ("fp32_active_s", "fp32_pct"),
    ("fp16_active_s", "fp16_pct"),
    ("dram_active_s", "dram_pct"),
)
#: what a MIG device integrates (a kernel runs whenever the GPU is busy)
_MIG_GPM_PCT = (
    *(
        pair
        for pair in _GPM_PCT
        if pair[1] not in ("tensor_imma_pct", "tensor_dfma_pct", "fp64_pct")
    ),
    ("graphics_active_s", "utilization_gpu_pct"),
)


def _integrate(
    d: SimGpuState | SimMigState, seconds: float, a: Activity, counters: tuple[tuple[str, str], ...]
) -> None:
    d.time_s += seconds
    for counter, pct in counters:
        setattr(d, counter, getattr(d, counter) + getattr(a, pct) / 100 * seconds)


def run_for(g: SimGpuState, seconds: float, a: Activity = Activity()) -> None:
    """Advance ``g`` by ``seconds`` of constant activity ``a``, integrating every counter."""
    _integrate(g, seconds, a, _GPM_PCT)
    g.sm_clock_mhz = g.graphics_clock_mhz = a.sm_clock_mhz
    g.power_w = a.power_w
    g.utilization_gpu_pct = a.utilization_gpu_pct
    g.energy_mj += round(a.power_w * seconds * 1000)
    g.nvlink_rx_bytes += round(a.nvlink_rx_bytes_per_s * seconds)
    g.nvlink_tx_bytes += round(a.nvlink_tx_bytes_per_s * seconds)


def run_all(cluster: SimCluster, seconds: float, a: Activity = Activity()) -> None:
    for g in cluster.gpus:
        run_for(g, seconds, a)


# --- named scenarios (gpustat style): script NVML's answers per GPU index ----------------------


def scenario_failing_one_gpu(cluster: SimCluster, index: int = 1) -> SimGpuState:
    """GPU ``index`` fell off the bus: every call on it raises GpuIsLost."""
    g = cluster.gpus[index]
    g.lost = True
    return g


def scenario_unknown_error_one_gpu(cluster: SimCluster, index: int = 1) -> SimGpuState:
    """Every call on GPU ``index`` raises NVMLError_Unknown (a wedged driver)."""
    g = cluster.gpus[index]
    g.failing = dict.fromkeys(_EVERY_PER_TICK_CALL, NV.NVML_ERROR_UNKNOWN)
    return g


def scenario_no_fan(cluster: SimCluster) -> None:
    """Passively cooled GPUs (SXM): the fan query is not supported anywhere."""
    for g in cluster.gpus:
        g.unsupported.add("nvmlDeviceGetFanSpeed")


def scenario_old_driver(cluster: SimCluster, index: int = 0) -> SimGpuState:
    """A driver without memory v2 or TemperatureV on GPU ``index``."""
    g = cluster.gpus[index]
    g.failing["nvmlDeviceGetMemoryInfo_v2"] = NV.NVML_ERROR_FUNCTION_NOT_FOUND
    g.unsupported.add("nvmlDeviceGetTemperatureV")
    return g


def scenario_no_energy_counter(cluster: SimCluster, index: int = 0) -> SimGpuState:
    """A GPU without the energy counter (pre-Volta): the collector integrates power."""
    g = cluster.gpus[index]
    g.unsupported.add("nvmlDeviceGetTotalEnergyConsumption")
    return g


def scenario_mig(cluster: SimCluster, index: int = 0) -> SimGpuState:
    g = cluster.gpus[index]
    g.mig_enabled = True
    return g


_EVERY_PER_TICK_CALL: tuple[str, ...] = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlGpmSampleGet",
)


#: MIG profiles of an H100 80GB used by ``scenario_mig_partitioned``: (name, slices, SMs, MiB)
H100_MIG_PROFILES: dict[str, tuple[int, int, int]] = {
    "1g.10gb": (1, 16, 9984),
    "2g.20gb": (2, 32, 20096),
    "3g.40gb": (3, 60, 40320),
}


def scenario_mig_partitioned(
    cluster: SimCluster, index: int = 0, profiles: Iterable[str] = ("3g.40gb", "2g.20gb", "1g.10gb")
) -> list[SimMigState]:
    """GPU ``index`` in MIG mode, split into MIG devices of ``profiles`` (GPU instance ids from
    1, compute instance 0 each), with no work yet."""
    g = cluster.gpus[index]
    g.mig_enabled = True
    g.mig_profile_sms = {1: 16, 2: 32, 3: 60, 4: 64, 7: 132}
    g.mig_devices = []
    for i, profile in enumerate(profiles):
        slices, sms, mib = H100_MIG_PROFILES[profile]
        g.mig_devices.append(
            SimMigState(
                parent=g,
                index=i,
                uuid=f"MIG-{g.host}-{index:02d}-{i:02d}-0000-000000000000",
                name=f"{g.name} MIG {profile}",
                profile=profile,
                gpu_instance_id=i + 1,
                compute_instance_id=0,
                slices=slices,
                multiprocessor_count=sms,
                memory_total_bytes=mib * 1024 * 1024,
            )
        )
    return [m for m in g.mig_devices if m is not None]


def run_mig_for(m: SimMigState, seconds: float, a: Activity = Activity()) -> None:
    """Advance one MIG device's GPM counters by ``seconds`` of activity ``a``."""
    _integrate(m, seconds, a, _MIG_GPM_PCT)
