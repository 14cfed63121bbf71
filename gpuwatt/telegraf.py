"""Telegraf's ``nvidia_smi`` input: its field names and types, and how they map onto the model.

Telegraf (plugins/inputs/nvidia_smi, XML schemas v11, v12 and v13) and gpuwatt may write to one
database, even for the same GPUs. Two rules keep that working:

- gpuwatt never writes a field name Telegraf has with another type (InfluxDB rejects a whole
  point whose field changes type in a shard: "field type conflict"). ``TELEGRAF_FIELD_TYPES`` is
  Telegraf's table; a test holds ``gpuwatt.schema.FIELDS`` to it.
- gpuwatt reads Telegraf's fields in Telegraf's types: the remapped-rows flags are the strings
  "Yes"/"No" (gpuwatt's own are booleans named ``row_remap_*``: VictoriaMetrics keeps no
  strings), the clock-event reasons are nine 0/1 integer fields (gpuwatt writes one NVML
  bitmask), and a few metrics have their own names and units (``ALIASES``).

A GPU is identified by its ``uuid`` tag: Telegraf also tags ``pstate``, ``compute_mode`` and
``arch``, so one GPU that changes P-state is two series, and a GPU both collectors write is
written twice (``merge_writers`` reads it once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from gpuwatt.schema import (
    REASON_GPU_IDLE,
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)

if TYPE_CHECKING:
    import pandas as pd

    from gpuwatt.model import GpuSample

log = logging.getLogger(__name__)

MEASUREMENT_PROCESS = "nvidia_smi_process"
MEASUREMENT_MIG = "nvidia_smi_mig"

#: Tags Telegraf adds beside host/index/uuid/name: they are not part of a GPU's identity.
EXTRA_TAGS: tuple[str, ...] = ("pstate", "compute_mode", "arch")


def _words(text: str) -> list[str]:
    return text.split()


#: Telegraf's ``nvidia_smi`` fields and their line-protocol types ("int", "float", "str"), from
#: its README and parsers (schema v11, v12, v13; telegraf at b272631, 2026-08).
TELEGRAF_FIELD_TYPES: dict[str, str] = {
    **dict.fromkeys(
        _words(
            "driver_version cuda_version serial vbios_version display_active display_mode "
            "current_ecc retired_pages_blacklist retired_pages_pending remapped_rows_pending "
            "remapped_rows_failure ecc_errors_aggregate_sram_threshold_exceeded "
            "ecc_errors_channel_repair_pending ecc_errors_tpc_repair_pending "
            "ecc_errors_unrepairable_memory"
        ),
        "str",
    ),
    **dict.fromkeys(
        _words(
            "power_draw power_draw_average power_limit power_limit_default power_limit_min "
            "power_limit_max power_limit_requested module_power_draw"
        ),
        "float",
    ),
    **dict.fromkeys(
        _words(
            "fan_speed memory_free memory_used memory_total memory_reserved utilization_gpu "
            "utilization_memory utilization_encoder utilization_decoder utilization_jpeg "
            "utilization_ofa clocks_current_graphics clocks_current_sm clocks_current_memory "
            "clocks_current_video temperature_gpu temperature_memory temperature_gpu_target "
            "temperature_gpu_target_min temperature_gpu_target_max temperature_max_threshold "
            "temperature_slow_threshold temperature_max_gpu_threshold "
            "temperature_max_mem_threshold temperature_gpu_tlimit "
            "temperature_max_tlimit_threshold temperature_slow_tlimit_threshold "
            "temperature_max_gpu_tlimit_threshold temperature_max_mem_tlimit_threshold "
            "pcie_link_gen_current pcie_link_width_current pcie_rx_util pcie_tx_util "
            "encoder_stats_session_count encoder_stats_average_fps "
            "encoder_stats_average_latency fbc_stats_session_count fbc_stats_average_fps "
            "fbc_stats_average_latency retired_pages_multiple_single_bit "
            "retired_pages_double_bit remapped_rows_correctable remapped_rows_uncorrectable "
            "clocks_event_reasons_counters_sw_power_cap "
            "clocks_event_reasons_counters_sw_therm_slowdown "
            "clocks_event_reasons_counters_hw_therm_slowdown "
            "clocks_event_reasons_counters_hw_power_brake "
            "clocks_event_reasons_counters_sync_boost "
            "ecc_errors_volatile_dram_correctable ecc_errors_volatile_dram_uncorrectable "
            "ecc_errors_volatile_sram_correctable ecc_errors_volatile_sram_uncorrectable "
            "ecc_errors_volatile_sram_uncorrectable_parity "
            "ecc_errors_volatile_sram_uncorrectable_secded "
            "ecc_errors_aggregate_dram_correctable ecc_errors_aggregate_dram_uncorrectable "
            "ecc_errors_aggregate_sram_correctable ecc_errors_aggregate_sram_uncorrectable "
            "ecc_errors_aggregate_sram_uncorrectable_parity "
            "ecc_errors_aggregate_sram_uncorrectable_secded "
            "ecc_errors_aggregate_sram_uncorrectable_l2 "
            "ecc_errors_aggregate_sram_uncorrectable_microcontroller "
            "ecc_errors_aggregate_sram_uncorrectable_other "
            "ecc_errors_aggregate_sram_uncorrectable_pcie "
            "ecc_errors_aggregate_sram_uncorrectable_sm"
        ),
        "int",
    ),
}

#: The nine clock-event reason fields (0/1 integers) and the NVML bit each stands for
#: (nvml.h nvmlClocksEventReason*).
REASON_FIELDS: dict[str, int] = {
    "clocks_event_reason_gpu_idle": REASON_GPU_IDLE,
    "clocks_event_reason_applications_clocks_setting": 0x2,
    "clocks_event_reason_sw_power_cap": REASON_SW_POWER_CAP,
    "clocks_event_reason_hw_slowdown": REASON_HW_SLOWDOWN,
    "clocks_event_reason_sync_boost": 0x10,
    "clocks_event_reason_sw_thermal_slowdown": REASON_SW_THERMAL,
    "clocks_event_reason_hw_thermal_slowdown": REASON_HW_THERMAL,
    "clocks_event_reason_hw_power_brake_slowdown": REASON_HW_POWER_BRAKE,
    "clocks_event_reason_display_clocks_setting": 0x100,
}
TELEGRAF_FIELD_TYPES.update(dict.fromkeys(REASON_FIELDS, "int"))


@dataclass(frozen=True, slots=True)
class Alias:
    """A model attribute that Telegraf stores under other names: the sum of ``fields`` x
    ``scale`` (stored unit -> model unit), used where gpuwatt's own field is absent."""

    attr: str
    fields: tuple[str, ...]
    scale: float = 1.0
    #: how a rollup bucket summarises it (as the attribute's own field: counters take the last)
    last: bool = False
    #: Telegraf's "Yes"/"No" flag (also reads gpuwatt's booleans of the same name, written
    #: before its own flags were renamed)
    flag: bool = False


ALIASES: tuple[Alias, ...] = (
    Alias("remapped_rows_pending", ("remapped_rows_pending",), last=True, flag=True),
    Alias("remapped_rows_failure", ("remapped_rows_failure",), last=True, flag=True),
    Alias("temperature_memory_c", ("temperature_memory",)),
    # NVML's PCIe throughput is in KiB/s; nvidia-smi prints the same number as "KB/s"
    Alias("pcie_tx_bytes_per_s", ("pcie_tx_util",), 1024.0),
    Alias("pcie_rx_bytes_per_s", ("pcie_rx_util",), 1024.0),
    # schema v13 splits volatile ECC counts by DRAM and SRAM; NVML's totals are their sums
    Alias(
        "ecc_sbe_volatile_count",
        ("ecc_errors_volatile_dram_correctable", "ecc_errors_volatile_sram_correctable"),
        last=True,
    ),
    Alias(
        "ecc_dbe_volatile_count",
        ("ecc_errors_volatile_dram_uncorrectable", "ecc_errors_volatile_sram_uncorrectable"),
        last=True,
    ),
)
ALIAS_BY_ATTR: dict[str, Alias] = {a.attr: a for a in ALIASES}

#: Every field ``telegraf_attrs`` reads.
_TELEGRAF_ONLY: frozenset[str] = frozenset(REASON_FIELDS).union(*(a.fields for a in ALIASES))

_YES_NO = {"yes": True, "no": False, "true": True, "false": False}


def yes_no(value: Any) -> bool | None:
    """Telegraf's "Yes"/"No" (and gpuwatt's older booleans) as a bool; None if neither."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _YES_NO.get(value.strip().lower())
    if isinstance(value, int | float):
        return bool(value)
    return None


def reasons_from_fields(values: Mapping[str, Any]) -> int | None:
    """The NVML reason bitmask from Telegraf's nine 0/1 fields; None when none is present."""
    mask, seen = 0, False
    for name, bit in REASON_FIELDS.items():
        v = values.get(name)
        if v is None:
            continue
        seen = True
        if v:
            mask |= bit
    return mask if seen else None


def telegraf_attrs(values: Mapping[str, Any]) -> dict[str, Any]:
    """Model attributes derivable from Telegraf-only fields of one point (reasons, aliases)."""
    if _TELEGRAF_ONLY.isdisjoint(values):  # a gpuwatt point: the common case, kept cheap
        return {}
    out: dict[str, Any] = {}
    reasons = reasons_from_fields(values)
    if reasons is not None:
        out["clock_event_reasons"] = reasons
    for alias in ALIASES:
        present = [values[f] for f in alias.fields if values.get(f) is not None]
        if alias.flag:
            flags = [b for v in present if (b := yes_no(v)) is not None]
            if flags:
                out[alias.attr] = any(flags)
        elif present:
            total = sum(float(v) for v in present) * alias.scale
            out[alias.attr] = round(total) if alias.last else total
    return out


def is_gpuwatt_point(values: Mapping[str, Any]) -> bool:
    """gpuwatt writes ``gpu_lost`` in every point; Telegraf never does."""
    return values.get("gpu_lost") is not None


# --- the same GPU under several tag sets or writers ---------------------------------------------

#: A writer's newest point older than this behind another writer's is not preferred.
PREFER_GPUWATT_WITHIN_NS = 60 * 1_000_000_000


def merge_writers(
    candidates: Iterable[tuple[GpuSample, str]],
) -> tuple[list[GpuSample], dict[str, tuple[str, ...]]]:
    """One sample per GPU uuid from ``(sample, writer)`` candidates ("gpuwatt"/"telegraf").

    Several candidates of one uuid are one GPU under several tag sets (Telegraf's P-state tag)
    or writers. gpuwatt's newest point is taken if it is within a minute of the newest of all
    (it carries energy, GPM and jobs), else the newest; its absent metrics are filled from the
    others of the same minute, never summed. Returns the samples and, per uuid written by more
    than one writer, the writers (for a report). A sample without a uuid keeps its own identity.
    """
    by_uuid: dict[Any, list[tuple[GpuSample, str]]] = {}
    for sample, writer in candidates:
        key = sample.uuid or (sample.host, sample.gpu_index, sample.name)
        by_uuid.setdefault(key, []).append((sample, writer))
    out: list[GpuSample] = []
    shared: dict[str, tuple[str, ...]] = {}
    for key, group in by_uuid.items():
        if len(group) == 1:
            out.append(group[0][0])
            continue
        group.sort(key=lambda c: c[0].time_ns, reverse=True)
        newest = group[0][0].time_ns
        ours = [s for s, w in group if w == "gpuwatt"]
        base = ours[0] if ours and newest - ours[0].time_ns <= PREFER_GPUWATT_WITHIN_NS else None
        base = base or group[0][0]
        fill: dict[str, Any] = {}
        for other, _ in group:
            if other is base or other.lost or base.lost:
                continue
            if abs(other.time_ns - base.time_ns) > PREFER_GPUWATT_WITHIN_NS:
                continue  # too old to stand for the GPU now
            for f in fields(other):
                if f.name in _IDENTITY or getattr(base, f.name) is not None:
                    continue
                if f.name not in fill and (v := getattr(other, f.name)) is not None:
                    fill[f.name] = v
        out.append(replace(base, **fill) if fill else base)
        writers = tuple(sorted({w for _, w in group}))
        if len(writers) > 1 and isinstance(key, str):
            shared[key] = writers
    return out, shared


_IDENTITY = frozenset({"time_ns", "host", "gpu_index", "uuid", "name", "lost", "extra"})
_warned: set[str] = set()


def report_shared(shared: Mapping[str, tuple[str, ...]]) -> None:
    """Log, once per GPU and process, that a GPU is written by several collectors."""
    new = [u for u in shared if u not in _warned]
    if not new:
        return
    _warned.update(new)
    log.warning(
        "%d GPU(s) are written by more than one collector (%s), e.g. %s: each is read once, "
        "gpuwatt's points first; run one collector per GPU to halve the writes",
        len(new),
        " and ".join(shared[new[0]]),
        new[0],
    )


# --- series reads (InfluxQL): Telegraf's columns beside gpuwatt's --------------------------------


def extra_columns(attrs: Iterable[str]) -> list[tuple[str, str, bool]]:
    """The Telegraf fields a read of ``attrs`` also selects: ``(field, column, last)``."""
    out: list[tuple[str, str, bool]] = []
    for attr in attrs:
        if attr == "clock_event_reasons":
            out += [(f, f"_tg_{f}", True) for f in REASON_FIELDS]
        elif (alias := ALIAS_BY_ATTR.get(attr)) is not None:
            out += [(f, f"_tg_{f}", alias.last) for f in alias.fields]
    return out


def fill_from_telegraf(frame: pd.DataFrame) -> pd.DataFrame:
    """Fill each attribute column where it is NaN from the Telegraf columns ``extra_columns``
    added, and drop those (in place; returned)."""
    import numpy as np

    tg = [c for c in frame.columns if c.startswith("_tg_")]
    if not tg:
        return frame
    if "clock_event_reasons" in frame.columns:
        bit_cols = [(f"_tg_{f}", bit) for f, bit in REASON_FIELDS.items()]
        present = [(c, bit) for c, bit in bit_cols if c in frame.columns]
        if present:
            bits = np.vstack([frame[c].to_numpy(dtype=float) for c, _ in present])
            seen = np.isfinite(bits).any(axis=0)
            mask = sum(
                np.where(np.nan_to_num(bits[i]) > 0, bit, 0) for i, (_, bit) in enumerate(present)
            )
            mine = frame["clock_event_reasons"].to_numpy(dtype=float)
            frame["clock_event_reasons"] = np.where(
                np.isnan(mine) & seen, np.asarray(mask, dtype=float), mine
            )
    for alias in ALIASES:
        if alias.attr not in frame.columns:
            continue
        cols = [f"_tg_{f}" for f in alias.fields if f"_tg_{f}" in frame.columns]
        if not cols:
            continue
        block = frame[cols].to_numpy(dtype=float)  # a flag's "Yes"/"No" read as 1.0/0.0
        seen = np.isfinite(block).any(axis=1)
        if alias.flag:
            total = np.where(seen, np.nan_to_num(block).max(axis=1), np.nan)
        else:
            total = np.nansum(block, axis=1) * alias.scale
        mine = frame[alias.attr].to_numpy(dtype=float)
        frame[alias.attr] = np.where(np.isnan(mine) & seen, total, mine)
    return frame.drop(columns=tg)


def one_identity_per_uuid(frame: pd.DataFrame, preferred: Any = None) -> pd.DataFrame:
    """Rows of one GPU uuid under several (host, index, name) identities, e.g. Telegraf tagging
    the host by its FQDN and gpuwatt by its short name, under one identity: that of a row marked
    ``preferred`` (a boolean per row: gpuwatt's, as ``merge_writers`` prefers it), else the first
    seen. Rows then sharing a time are one row (each column's mean of what was measured, never a
    sum)."""
    if frame.empty or "uuid" not in frame.columns:
        return frame
    keys = ["host", "gpu_index", "uuid", "name"]
    ids = frame[keys].drop_duplicates()
    ids = ids.loc[ids["uuid"] != ""]
    if not ids["uuid"].duplicated().any():
        return frame
    if preferred is not None:
        ranked = frame[keys].assign(_pref=preferred).groupby(keys, sort=False)["_pref"].any()
        ids = ranked.reset_index().sort_values("_pref", ascending=False, kind="stable")[keys]
        ids = ids.loc[ids["uuid"] != ""]
    first = ids.drop_duplicates("uuid").set_index("uuid")
    shared = frame["uuid"].isin(ids.loc[ids["uuid"].duplicated(), "uuid"])
    frame = frame.copy()
    for col in ("host", "gpu_index", "name"):
        frame.loc[shared, col] = frame.loc[shared, "uuid"].map(first[col]).to_numpy()
    group = ["time_ns", *keys]
    if not frame.duplicated(group).any():
        return frame
    values = [c for c in frame.columns if c not in group]
    merged = frame.groupby(group, sort=False, as_index=False)[values].mean()
    return merged.sort_values(["time_ns", "host", "gpu_index", "uuid"], kind="stable").reset_index(
        drop=True
    )


# --- nvidia_smi_process and nvidia_smi_mig --------------------------------------------------------

MIB_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TelegrafProcess:
    """One ``nvidia_smi_process`` point. Telegraf tags it with the process name and context type
    only (no GPU uuid or index): on a host with several GPUs it cannot be tied to one of them."""

    time_ns: int
    host: str
    pid: int | None
    used_memory_bytes: int | None
    process_name: str
    context_type: str  # "C" compute, "G" graphics, "C+G"


@dataclass(frozen=True, slots=True)
class TelegrafMigDevice:
    """One ``nvidia_smi_mig`` point: a MIG device of the GPU ``gpu_uuid`` (the parent's tags)."""

    time_ns: int
    host: str
    gpu_uuid: str
    mig_index: int | None  # tag ``index``: the MIG device's index on its GPU
    gpu_instance_id: int | None  # tag ``gpu_index`` (Telegraf's name for the GPU instance id)
    compute_instance_id: int | None  # tag ``compute_index``
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    memory_free_bytes: int | None
    memory_reserved_bytes: int | None
    sram_uncorrectable: int | None


def _int(v: Any) -> int | None:
    try:
        return None if v is None or v == "" else int(v)
    except (TypeError, ValueError):
        return None


def _mib(v: Any) -> int | None:
    n = _int(v)
    return None if n is None else n * MIB_BYTES


def process_from_point(
    time_ns: int, tags: Mapping[str, str], values: Mapping[str, Any]
) -> TelegrafProcess:
    return TelegrafProcess(
        int(time_ns),
        tags.get("host", ""),
        _int(values.get("pid")),
        _mib(values.get("used_memory")),
        tags.get("name", ""),
        tags.get("type", ""),
    )


def mig_from_point(
    time_ns: int, tags: Mapping[str, str], values: Mapping[str, Any]
) -> TelegrafMigDevice:
    return TelegrafMigDevice(
        int(time_ns),
        tags.get("host", ""),
        tags.get("uuid", ""),
        _int(tags.get("index")),
        _int(tags.get("gpu_index")),
        _int(tags.get("compute_index")),
        _mib(values.get("memory_fb_used")),
        _mib(values.get("memory_fb_total")),
        _mib(values.get("memory_fb_free")),
        _mib(values.get("memory_fb_reserved")),
        _int(values.get("sram_uncorrectable")),
    )
