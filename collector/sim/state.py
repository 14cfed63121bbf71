"""The state of one simulated GPU: what the simulator writes and the fake NVML reads.

This is the whole contract between ``collector.sim.simulator`` (which advances the dynamics) and
``collector.sim.fake_nvml`` (which answers NVML calls from it). Cumulative counters are integrated
by the simulator so the fake can answer interval queries (GPM, energy) exactly as NVML does: from
the difference of two snapshots.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from gpuwatt.gpu_specs import GpuSpec


@dataclass(kw_only=True)
class GpmActivity:
    """GPM-style cumulative activity counters of a GPU or a MIG device: seconds each unit was
    active (x100/dt = percent)."""

    sm_active_s: float = 0.0
    sm_occupancy_s: float = 0.0
    tensor_any_active_s: float = 0.0
    tensor_hmma_active_s: float = 0.0
    tensor_imma_active_s: float = 0.0
    tensor_dfma_active_s: float = 0.0
    fp64_active_s: float = 0.0
    fp32_active_s: float = 0.0
    fp16_active_s: float = 0.0
    dram_active_s: float = 0.0


@dataclass
class SimGpuState(GpmActivity):
    # --- static facts (set once when the cluster is built) -------------------------------------
    host: str
    index: int
    uuid: str
    name: str  # NVML device name, e.g. "NVIDIA H100 80GB HBM3"
    spec: GpuSpec
    pci_bus_id: str
    memory_total_bytes: int
    power_limit_w: float  # enforced limit (defaults to the spec's TDP)
    power_min_w: float
    sm_clock_max_mhz: float
    memory_clock_max_mhz: float
    slowdown_temp_c: float  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown_temp_c: float  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    idle_power_w: float
    #: NVML's ``pciDeviceId`` (device id << 16 | vendor 0x10DE); None: nvmlDeviceGetPciInfo
    #: answers NotSupported (a dump whose id is redacted)
    pci_device_id: int | None = None
    # --- dynamic, written by the simulator at each step ----------------------------------------
    time_s: float = 0.0  # simulated seconds since the cluster started
    utilization_gpu_pct: float = 0.0
    utilization_memory_pct: float = 0.0
    memory_used_bytes: int = 0
    memory_reserved_bytes: int = 0  # driver/firmware reservation (nvmlMemory_v2 'reserved')
    temperature_c: float = 30.0
    memory_temperature_c: float = 30.0
    fan_speed_pct: float = 30.0
    power_w: float = 0.0
    energy_mj: int = 0  # nvmlDeviceGetTotalEnergyConsumption: mJ since driver load (may reset)
    sm_clock_mhz: float = 0.0
    memory_clock_mhz: float = 0.0
    graphics_clock_mhz: float = 0.0
    clock_event_reasons: int = 0  # NVML clocks-event reason bitmask
    pcie_tx_kib_per_s: float = 0.0
    pcie_rx_kib_per_s: float = 0.0
    # GPM-style cumulative activity counters: GpmActivity
    graphics_active_s: float | None = None  # any kernel running; None: not simulated
    nvlink_tx_bytes: int = 0  # cumulative
    nvlink_rx_bytes: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    # lifetime counts from before this boot: NVML's aggregate count is these plus the volatile
    ecc_sbe_aggregate_base: int = 0
    ecc_dbe_aggregate_base: int = 0
    remapped_rows_correctable: int = 0
    remapped_rows_uncorrectable: int = 0
    remapped_rows_pending: bool = False
    remapped_rows_failure: bool = False
    lost: bool = False  # every NVML call on it raises NVMLError_GpuIsLost
    mig_enabled: bool = False
    #: the MIG devices of a GPU in MIG mode, by MIG device index (None: a free slot)
    mig_devices: list[SimMigState | None] = field(default_factory=list)
    mig_max_devices: int = 7  # nvmlDeviceGetMaxMigDeviceCount
    #: SMs of a GPU instance by its slices (nvmlDeviceGetGpuInstanceProfileInfo; a MIG-capable
    #: GPU's profiles: {1: 16, 2: 32, 3: 60, 4: 64, 7: 132} on an H100 SXM; empty: none)
    mig_profile_sms: dict[int, int] = field(default_factory=dict)
    # --- how the fake misbehaves for this GPU (tests script these) ------------------------------
    #: NVML function names that raise NVMLError_NotSupported on this GPU
    unsupported: set[str] = field(default_factory=set)
    #: NVML function name -> NVML_ERROR_* code raised on every call
    failing: dict[str, int] = field(default_factory=dict)
    # XID events not yet delivered to an event set; the cluster's condition guards it
    pending_xids: deque[int] = field(default_factory=deque)

    @property
    def gpm_supported(self) -> bool:
        return self.spec.has_gpm


#: NVML functions that real NVML refuses (NotSupported) on a MIG device handle: they are facts of
#: the whole GPU, asked on its parent handle.
MIG_REFUSED: frozenset[str] = frozenset(
    {
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleGet",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetIndex",
    }
)


@dataclass
class SimMigState(GpmActivity):
    """One MIG device (a GPU instance with one compute instance) of a simulated GPU.

    What NVML answers on its handle: identity, memory, processes and attributes; GPM comes through
    the parent's handle (``nvmlGpmMigSampleGet`` with the GPU instance id). Everything else is
    refused (``MIG_REFUSED``), as real NVML does. It is lost when its parent is.
    """

    parent: SimGpuState
    index: int  # MIG device index on the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str  # "MIG-..."
    name: str  # e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    profile: str  # e.g. "1g.10gb"
    gpu_instance_id: int
    compute_instance_id: int
    slices: int  # GPU instance slices (of 7 on A100/H100)
    multiprocessor_count: int
    memory_total_bytes: int
    time_s: float = 0.0
    memory_used_bytes: int = 0
    memory_reserved_bytes: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)
    # GPM-style cumulative activity (GpmActivity): percent of the instance's SMs
    graphics_active_s: float = 0.0  # any kernel running (GPM graphics-engine activity)
    nvlink_rx_bytes: int = 0
    nvlink_tx_bytes: int = 0
    pcie_tx_kib_per_s: float = 0.0
    pcie_rx_kib_per_s: float = 0.0
    unsupported: set[str] = field(default_factory=lambda: set(MIG_REFUSED))
    failing: dict[str, int] = field(default_factory=dict)

    @property
    def lost(self) -> bool:
        return self.parent.lost


@dataclass
class SimCluster:
    """All simulated GPUs, grouped by host, plus the lock/condition the event thread waits on."""

    gpus: list[SimGpuState]
    condition: threading.Condition = field(default_factory=threading.Condition)

    def hosts(self) -> list[str]:
        seen: dict[str, None] = {}
        for g in self.gpus:
            seen.setdefault(g.host, None)
        return list(seen)

    def on_host(self, host: str) -> list[SimGpuState]:
        return sorted((g for g in self.gpus if g.host == host), key=lambda g: g.index)

    def raise_xid(self, gpu: SimGpuState, xid: int) -> None:
        with self.condition:
            gpu.pending_xids.append(xid)
            self.condition.notify_all()
