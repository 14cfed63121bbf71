"""Every measurement, tag and field name gpuwatt writes (the codecs: ``line_protocol``,
``job_step_format``).

The fields Telegraf's ``nvidia_smi`` input has keep Telegraf's names, units and types, so a site
that already runs Telegraf + InfluxDB can point gpuwatt's dashboard at the data it has. Our extra
fields carry their unit in the name. A metric that was not measured (``None``) is omitted from the
point, never written as zero (Telegraf does the same).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MEASUREMENT = "nvidia_smi"

# Tags (Telegraf's names). Never a PID; a job id only when its cardinality is known to be modest.
TAG_HOST = "host"
TAG_INDEX = "index"
TAG_UUID = "uuid"
TAG_NAME = "name"
TAGS: tuple[str, ...] = (TAG_HOST, TAG_INDEX, TAG_UUID, TAG_NAME)

MIB = 1024 * 1024


class Kind(enum.Enum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """How one ``GpuSample`` attribute is stored: field name, type and scale.

    ``scale`` converts the model's unit into the stored unit (stored = model / scale):
    memory is bytes in the model and MiB in Telegraf's fields.
    """

    attr: str
    field: str
    kind: Kind
    scale: float = 1.0
    telegraf: bool = False
    doc: str = ""


def _t(attr: str, fld: str, kind: Kind, scale: float = 1.0, doc: str = "") -> FieldSpec:
    return FieldSpec(attr, fld, kind, scale, True, doc)


def _x(attr: str, kind: Kind, doc: str = "") -> FieldSpec:
    """An extra (non-Telegraf) field: stored under the model's own, unit-bearing name."""
    return FieldSpec(attr, attr, kind, 1.0, False, doc)


#: Numeric metric fields, in the order they are written.
FIELDS: tuple[FieldSpec, ...] = (
    _t("utilization_gpu_pct", "utilization_gpu", Kind.INT, doc="% of time a kernel ran"),
    _t("utilization_memory_pct", "utilization_memory", Kind.INT, doc="% of time memory was R/W"),
    _t("memory_used_bytes", "memory_used", Kind.INT, MIB, "MiB"),
    _t("memory_total_bytes", "memory_total", Kind.INT, MIB, "MiB"),
    _t("memory_free_bytes", "memory_free", Kind.INT, MIB, "MiB"),
    _t("memory_reserved_bytes", "memory_reserved", Kind.INT, MIB, "MiB"),
    _t("temperature_gpu_c", "temperature_gpu", Kind.INT, doc="°C"),
    _x("temperature_memory_c", Kind.FLOAT, "HBM temperature, °C"),
    _t("fan_speed_pct", "fan_speed", Kind.INT, doc="%"),
    _t("power_w", "power_draw", Kind.FLOAT, doc="W"),
    _t("power_limit_w", "power_limit", Kind.FLOAT, doc="enforced power limit, W"),
    _x("energy_j", Kind.FLOAT, "cumulative energy, J (see energy_method)"),
    _t("sm_clock_mhz", "clocks_current_sm", Kind.INT, doc="MHz"),
    _t("memory_clock_mhz", "clocks_current_memory", Kind.INT, doc="MHz"),
    _t("graphics_clock_mhz", "clocks_current_graphics", Kind.INT, doc="MHz"),
    # gpuwatt's own field (Telegraf has no max clocks): its name predates the unit-in-name rule
    FieldSpec("sm_clock_max_mhz", "clocks_max_sm", Kind.INT, doc="MHz"),
    _x("clock_event_reasons", Kind.INT, "NVML clocks-event reason bitmask"),
    _x("pcie_tx_bytes_per_s", Kind.FLOAT),
    _x("pcie_rx_bytes_per_s", Kind.FLOAT),
    _x("nvlink_tx_bytes_per_s", Kind.FLOAT),
    _x("nvlink_rx_bytes_per_s", Kind.FLOAT),
    _x("sm_active_pct", Kind.FLOAT, "GPM: % of SMs busy"),
    _x("sm_occupancy_pct", Kind.FLOAT, "GPM: % of warps resident vs max"),
    _x("tensor_active_pct", Kind.FLOAT, "GPM: % of time any tensor pipe active"),
    _x("tensor_hmma_active_pct", Kind.FLOAT, "GPM: half-precision tensor (FP16/BF16/TF32)"),
    _x("tensor_imma_active_pct", Kind.FLOAT, "GPM: integer tensor"),
    _x("tensor_dfma_active_pct", Kind.FLOAT, "GPM: FP64 tensor"),
    _x("fp64_active_pct", Kind.FLOAT, "GPM: non-tensor FP64 pipe"),
    _x("fp32_active_pct", Kind.FLOAT, "GPM: non-tensor FP32 pipe"),
    _x("fp16_active_pct", Kind.FLOAT, "GPM: non-tensor FP16 pipe"),
    _x("dram_active_pct", Kind.FLOAT, "GPM: % of peak DRAM bandwidth"),
    _x("tflops_estimate", Kind.FLOAT, "achieved TFLOPS estimate (see tflops_method)"),
    _x("ecc_sbe_volatile_count", Kind.INT),
    _x("ecc_dbe_volatile_count", Kind.INT),
    _x("ecc_sbe_aggregate_count", Kind.INT, "lifetime single-bit ECC errors"),
    _x("ecc_dbe_aggregate_count", Kind.INT, "lifetime double-bit ECC errors"),
    _t("remapped_rows_correctable", "remapped_rows_correctable", Kind.INT),
    _t("remapped_rows_uncorrectable", "remapped_rows_uncorrectable", Kind.INT),
    # Telegraf writes remapped_rows_pending/_failure as the strings "Yes"/"No", which an engine
    # such as VictoriaMetrics does not keep: gpuwatt's flags are booleans under names of their
    # own (a shared InfluxDB then holds one type per field name), and Telegraf's are read too.
    FieldSpec("remapped_rows_pending", "row_remap_pending", Kind.BOOL),
    FieldSpec("remapped_rows_failure", "row_remap_failure", Kind.BOOL),
    _x("mig_enabled", Kind.BOOL),
)

# Fields that are not a plain attribute of GpuSample.
FIELD_LOST = "gpu_lost"
FIELD_ENERGY_METHOD = "energy_method"
FIELD_TFLOPS_METHOD = "tflops_method"
FIELD_XID_LAST = "xid_last"
FIELD_XID_COUNT = "xid_count"
FIELD_PROCESS_COUNT = "process_count"
FIELD_PROCESSES = "processes"  # "pid:bytes;pid:bytes" (bytes empty when unknown)
# The job id is a string *field*, not a tag: a tag per job id creates one series per GPU and job,
# and a cluster running thousands of short jobs a day would grow the series index without bound.
# As a field it costs nothing in cardinality; InfluxQL can still filter on it (a scan, not an
# index lookup). Sites with few long jobs may prefer a tag; see the README.
FIELD_JOB_ID = "job_id"
# A MIG device's point (tags: its own uuid and name, the parent GPU's index): its parent GPU's
# uuid (string) and its GPU and compute instance ids (int). Absent on a whole GPU.
FIELD_PARENT_UUID = "parent_uuid"
FIELD_GPU_INSTANCE_ID = "gpu_instance_id"
FIELD_COMPUTE_INSTANCE_ID = "compute_instance_id"
# NVML's pciDeviceId (device id << 16 | vendor 0x10DE, e.g. 0x233010DE for an H100 SXM5): an
# integer field; the GPU table resolves a model by it where its name is unknown.
FIELD_PCI_DEVICE_ID = "pci_device_id"

FIELD_BY_ATTR: dict[str, FieldSpec] = {f.attr: f for f in FIELDS}
FIELD_BY_NAME: dict[str, FieldSpec] = {f.field: f for f in FIELDS}

#: Fields whose rollup is the last value in the bucket (counters), not the mean.
COUNTER_ATTRS: frozenset[str] = frozenset(
    {
        "energy_j",
        "ecc_sbe_volatile_count",
        "ecc_dbe_volatile_count",
        "ecc_sbe_aggregate_count",
        "ecc_dbe_aggregate_count",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
    }
)


# NVML clock-event (throttle) reason bits carried in ``clock_event_reasons`` (nvml.h's
# nvmlClocksEventReason*). HW slowdown, HW thermal slowdown and HW power brake are faults; the SW
# power cap is what a GPU at full load normally shows.
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
