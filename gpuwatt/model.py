"""The sample model: what one GPU looked like at one instant.

Units are SI (or SI-prefixed) and sit in the attribute names. ``None`` means "not measured":
the metric is not supported by this GPU or driver, or its query failed. It is never zero.
A GPU that NVML reports as lost is a sample with ``lost=True`` and no metrics, not a GPU at 0 %.
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Any


class EnergyMethod(enum.StrEnum):
    """How ``GpuSample.energy_j`` was obtained."""

    COUNTER = "counter"  # nvmlDeviceGetTotalEnergyConsumption (Volta+), reset-safe
    INTEGRATED = "integrated"  # power integrated over time by the collector (no counter)


class TflopsMethod(enum.StrEnum):
    """How ``GpuSample.tflops_estimate`` was obtained."""

    GPM = "gpm"  # pipe utilisation from GPM counters (Hopper+) x the GPU's peaks x clock ratio
    SM_ACTIVITY_UPPER_BOUND = "sm_activity_upper_bound"  # no pipe counters: an upper bound


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """A compute process on a GPU. A pid is a field of the sample, never a store tag."""

    pid: int
    used_memory_bytes: int | None
    #: the login name (or numeric uid) the process runs as; None where not known
    user: str | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. Identity first, then metrics (None = not measured)."""

    time_ns: int
    host: str
    gpu_index: int
    uuid: str
    name: str
    lost: bool = False
    # utilisation over NVML's last sample period
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    # memory
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    # thermals and power
    temperature_gpu_c: float | None = None
    temperature_memory_c: float | None = None
    fan_speed_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None  # the enforced limit
    energy_j: float | None = None  # cumulative, monotonic for the collector's lifetime
    energy_method: EnergyMethod | None = None
    # clocks and why they are what they are
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    graphics_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    clock_event_reasons: int | None = None  # NVML clocks-event (throttle) reason bitmask
    # interconnect
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    # GPM (Hopper and newer): percent of time / of peak over the sample interval
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    tensor_hmma_active_pct: float | None = None
    tensor_imma_active_pct: float | None = None
    tensor_dfma_active_pct: float | None = None
    fp64_active_pct: float | None = None
    fp32_active_pct: float | None = None
    fp16_active_pct: float | None = None
    dram_active_pct: float | None = None
    # achieved throughput estimate and how it was made
    tflops_estimate: float | None = None
    tflops_method: TflopsMethod | None = None
    # errors: XIDs seen since the previous sample; ECC and row remapping (slow cadence)
    xid_errors: tuple[int, ...] = ()
    ecc_sbe_volatile_count: int | None = None
    ecc_dbe_volatile_count: int | None = None
    # lifetime ECC counts (NVML_AGGREGATE_ECC), as DCGM dashboards show
    ecc_sbe_aggregate_count: int | None = None
    ecc_dbe_aggregate_count: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    mig_enabled: bool | None = None
    processes: tuple[ProcessSample, ...] | None = None
    # the job the GPU's processes belong to (a string field, not a tag: see schema.FIELD_JOB_ID)
    job_id: str | None = None
    # a MIG device: its own uuid ("MIG-...") and name, the parent GPU's index, and these (None on
    # a whole GPU); what is a fact of the whole GPU (power, clocks, temperature) is on the parent
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    # NVML's pciDeviceId (a static fact): resolves the GPU's model where its name is unknown
    pci_device_id: int | None = None
    # free-form provenance, e.g. the job id once jobs are resolved (kept out of tags for now)
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, int, str]:
        """The identity of the GPU this sample belongs to."""
        return (self.host, self.gpu_index, self.uuid)


@dataclass(frozen=True, slots=True)
class GpuSeen:
    """A GPU a store has seen: its identity and its newest sample's time and job, without the
    sample's metrics (``store.base.gpus_seen``). What a view needs to count and attribute the
    GPUs of its range, at a fraction of the cost of every GPU's newest values on an engine."""

    time_ns: int
    host: str
    gpu_index: int
    uuid: str
    name: str
    job_id: str | None = None
    parent_uuid: str | None = None
    #: how its newest sample's energy was obtained: a GPU without NVML's energy counter has its
    #: power integrated by the collector, which the analysis must label so
    energy_method: EnergyMethod | None = None

    @classmethod
    def of(cls, s: GpuSample) -> GpuSeen:
        return cls(
            s.time_ns, s.host, s.gpu_index, s.uuid, s.name, s.job_id, s.parent_uuid,
            s.energy_method,
        )  # fmt: skip


IDENTITY_FIELDS: tuple[str, ...] = ("time_ns", "host", "gpu_index", "uuid", "name", "lost")

#: Every numeric metric attribute of ``GpuSample`` in declaration order.
METRIC_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in fields(GpuSample)
    if f.name not in IDENTITY_FIELDS
    and f.name not in {"energy_method", "tflops_method", "xid_errors", "processes", "extra"}
    and f.name not in {"mig_enabled", "job_id", "parent_uuid"}
    and f.name not in {"gpu_instance_id", "compute_instance_id", "pci_device_id"}
)


def _slot_twin(cls: type) -> type | None:
    """A non-frozen twin of frozen slotted dataclass ``cls`` whose instances can become ``cls``.

    A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__`` (a global
    lookup, an attribute lookup and a call per field): about 9 us for GpuSample's 51 fields, against
    under 3 us this way. Kept because the benches of the running paths show the need (issue 19,
    point 4: plain code unless a bench shows a trick is needed): in ``bench/collector_cost.py``
    (which prints both) the sampler's construction is ~2 us this way against ~6 us by the dataclass,
    which would take the collector's own cost per GPU-sample past the 1.3x of the previous commit
    that issue 19 allows; in ``bench/spool_replay.py`` a sample decoded from the spool is built in
    ~1.2 us against ~5 us (a replay into the embedded store now takes rows, no samples; a batch
    it refuses is decoded into samples to find the one refused). The
    twin has the same fields, defaults and ``__slots__`` (so the same memory layout) and a plain
    dataclass ``__init__`` (one slot store per field); its instance's class is then switched to
    ``cls``, which CPython allows between classes whose layouts and slot names are identical. What
    comes out is an ordinary frozen ``cls`` instance (``type(x) is cls``; equality, hashing,
    ``dataclasses.replace``, pickling as usual). None where that does not hold (``__post_init__``,
    other slots, an interpreter refusing the switch): then ``cls`` itself is used.
    """
    flds = fields(cls)
    if hasattr(cls, "__post_init__") or getattr(cls, "__slots__", None) != tuple(
        f.name for f in flds
    ):
        return None
    twin: type = make_dataclass(
        f"_{cls.__name__}Twin",
        [
            (f.name, f.type, field(default=f.default, default_factory=f.default_factory))
            for f in flds
        ],
        slots=True,
    )
    probe = twin(*(None for f in flds if f.default is MISSING and f.default_factory is MISSING))
    try:
        probe.__class__ = cls
    except TypeError:  # __class__ assignment refused by this interpreter
        return None
    return twin if type(probe) is cls else None


_GPU_SAMPLE_TWIN = _slot_twin(GpuSample)


def make_gpu_sample(*args: Any, **kwargs: Any) -> GpuSample:
    """``GpuSample(*args, **kwargs)``, the same result in about a third of the time (hot paths:
    the store's reads). See ``_slot_twin``."""
    if _GPU_SAMPLE_TWIN is None:
        return GpuSample(*args, **kwargs)
    sample: Any = _GPU_SAMPLE_TWIN(*args, **kwargs)
    sample.__class__ = GpuSample
    return sample


def gpu_sample_from_fields(values: dict[str, Any]) -> GpuSample:
    """``GpuSample(**values)``, as ``make_gpu_sample`` builds it (the collector's tick: its
    fields are gathered by name, and passing the dict on at once spares a second copy)."""
    if _GPU_SAMPLE_TWIN is None:
        return GpuSample(**values)
    sample: Any = _GPU_SAMPLE_TWIN(**values)
    sample.__class__ = GpuSample
    return sample
