"""Device profiles from real ``nvidia-smi -q -x`` dumps: the fake NVML answering as that GPU did.

``load_dump(path)`` reads a dump (schemas v10-v13, as Telegraf's ``nvidia_smi`` input tests
them) into one ``DeviceProfile`` per GPU: what it reported (name, uuid, limits, clocks,
thresholds, readings, processes, MIG devices) and which NVML functions answer on it. A value the
dump gives as ``N/A`` or does not give at all is a query the device does not answer: the fake
raises ``NVMLError_NotSupported`` for it, as real NVML does (``nvidia-smi`` prints ``N/A``
exactly when NVML refuses). Calls the driver is too old for raise ``NVMLError_FunctionNotFound``,
as pynvml does when the library lacks the symbol: clocks-event reasons before the rename (the
dump still says ``clocks_throttle_reasons``), memory v2 before the reserved figure existed.

``profile_state(profile, host, index)`` builds the ``SimGpuState`` the fake answers from, with
the dump's readings as its state (and its MIG devices, if the dump shows MIG mode).

Dumps are parsed with the standard library's expat parser, which fetches no external entity or
DTD; they come from the repository's test data or from the operator's own ``nvidia-smi``.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuwatt.collector.sim.mig_scenario import architecture_profile_sms
from gpuwatt.collector.sim.state import SimGpuState, SimMigState
from gpuwatt.gpu_specs import NVIDIA_VENDOR_ID, GpuSpec, lookup

MIB = 1024 * 1024
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_PRE_VOLTA = frozenset({"Kepler", "Maxwell", "Pascal"})
_PASCAL_NAMES = re.compile(r"GTX 10\d\d|Quadro P\d|Tesla P\d|TITAN X", re.IGNORECASE)
NVML_ERROR_FUNCTION_NOT_FOUND = 13  # pynvml.NVML_ERROR_FUNCTION_NOT_FOUND

#: clocks-event reason element suffix -> NVML bit (nvmlClocksEventReason*)
_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG device as the dump shows it."""

    index: int
    gpu_instance_id: int
    compute_instance_id: int
    multiprocessor_count: int | None
    memory_total_mib: int
    memory_used_mib: int
    memory_reserved_mib: int


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """What one real GPU reported. None: the dump says N/A or nothing (the query is refused)."""

    source: str  # the dump's file name
    name: str
    uuid: str
    architecture: str | None
    driver_version: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_reserved_mib: int | None
    utilization_gpu_pct: float | None
    utilization_memory_pct: float | None
    temperature_c: float | None
    slowdown_temp_c: float | None
    shutdown_temp_c: float | None
    fan_speed_pct: float | None
    power_w: float | None
    power_limit_w: float | None  # enforced
    power_limit_default_w: float | None
    power_limit_min_w: float | None
    sm_clock_mhz: float | None
    memory_clock_mhz: float | None
    graphics_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    memory_clock_max_mhz: float | None
    clock_event_reasons: int | None
    reasons_renamed: bool  # the dump says clocks_event_reasons (driver 530+), not throttle
    pcie_tx_kib_per_s: float | None
    pcie_rx_kib_per_s: float | None
    pci_device_id: int | None  # NVML's pciDeviceId; None where the dump's is redacted or zero
    pci_bus_id: str
    ecc_enabled: bool
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    remapped_rows: tuple[int, int, bool, bool] | None  # corr, unc, pending, failure
    compute_processes: tuple[tuple[int, int | None], ...]  # (pid, bytes)
    mig_enabled: bool | None  # None: not MIG capable (N/A)
    mig_devices: tuple[MigProfile, ...] = ()
    #: NVML functions that raise NotSupported on this device; function -> error code for others
    unsupported: frozenset[str] = frozenset()
    failing: dict[str, int] = field(default_factory=dict)
    #: lifetime ECC errors (``<ecc_errors><aggregate>``), DRAM plus SRAM
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None

    @property
    def energy_counter(self) -> bool:
        """nvmlDeviceGetTotalEnergyConsumption: Volta and newer, and only where power is read."""
        return self.power_w is not None and self.architecture not in _PRE_VOLTA


# --- reading a dump -----------------------------------------------------------------------------


def load_dump(path: str | Path) -> list[DeviceProfile]:
    """One profile per ``<gpu>`` of an ``nvidia-smi -q -x`` dump."""
    path = Path(path)
    root = ET.parse(path).getroot()
    driver = _text(root, "driver_version")
    return [_profile(gpu, path.name, driver) for gpu in root.findall("gpu")]


def _text(node: ET.Element | None, path: str) -> str | None:
    """The element's text, or None where it is absent, empty, N/A or not available."""
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    if not text or text in ("N/A", "[N/A]", "Unknown Error") or "deprecated" in text.lower():
        return None
    if text.startswith(("[Not Supported]", "Not Supported", "[Unknown")):
        return None
    return text


def _num(node: ET.Element | None, *paths: str) -> float | None:
    """The first of ``paths`` with a number (units after it ignored: ``67.03 W``)."""
    for p in paths:
        text = _text(node, p)
        if text is not None:
            m = _NUMBER.match(text)
            if m:
                return float(m.group(1))
    return None


def _int(node: ET.Element | None, *paths: str) -> int | None:
    v = _num(node, *paths)
    return None if v is None else int(v)


def _architecture(gpu: ET.Element, name: str) -> str | None:
    arch = _text(gpu, "product_architecture")
    if arch is None and _PASCAL_NAMES.search(name):
        return "Pascal"  # older dumps do not say; these names are Pascal parts
    return arch


def _reasons(gpu: ET.Element) -> tuple[int | None, bool]:
    for section, prefix, renamed in (
        ("clocks_event_reasons", "clocks_event_reason_", True),
        ("clocks_throttle_reasons", "clocks_throttle_reason_", False),
    ):
        node = gpu.find(section)
        if node is None:
            continue
        mask, seen = 0, False
        for suffix, bit in _REASON_BITS.items():
            text = _text(node, prefix + suffix)
            if text is not None:
                seen = True
                mask |= bit if text == "Active" else 0
        return (mask if seen else None), renamed
    return None, False


def _remapped(gpu: ET.Element) -> tuple[int, int, bool, bool] | None:
    node = gpu.find("remapped_rows")
    if node is None or len(node) == 0:
        return None
    corr, unc = _int(node, "remapped_row_corr"), _int(node, "remapped_row_unc")
    pending, failure = _text(node, "remapped_row_pending"), _text(node, "remapped_row_failure")
    if corr is None or unc is None or pending is None or failure is None:
        return None
    return corr, unc, pending == "Yes", failure == "Yes"


def _processes(gpu: ET.Element) -> tuple[tuple[int, int | None], ...]:
    """Compute processes (type C or C+G): what nvmlDeviceGetComputeRunningProcesses lists."""
    out = []
    for p in gpu.findall("processes/process_info"):
        pid, kind = _int(p, "pid"), _text(p, "type") or ""
        if pid is None or "C" not in kind:
            continue
        used = _int(p, "used_memory")
        out.append((pid, used * MIB if used is not None else None))
    return tuple(out)


def _mig_devices(gpu: ET.Element) -> tuple[MigProfile, ...]:
    out = []
    for m in gpu.findall("mig_devices/mig_device"):
        index, gi, ci = _int(m, "index"), _int(m, "gpu_instance_id"), _int(m, "compute_instance_id")
        total = _int(m, "fb_memory_usage/total")
        if index is None or gi is None or ci is None or total is None:
            continue
        out.append(
            MigProfile(
                index=index,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                multiprocessor_count=_int(m, "device_attributes/shared/multiprocessor_count"),
                memory_total_mib=total,
                memory_used_mib=_int(m, "fb_memory_usage/used") or 0,
                memory_reserved_mib=_int(m, "fb_memory_usage/reserved") or 0,
            )
        )
    return tuple(out)


#: Readings that are one number at one path of a GPU's element: profile attribute, path
_READINGS: tuple[tuple[str, str], ...] = (
    ("utilization_gpu_pct", "utilization/gpu_util"),
    ("utilization_memory_pct", "utilization/memory_util"),
    ("temperature_c", "temperature/gpu_temp"),
    ("slowdown_temp_c", "temperature/gpu_temp_slow_threshold"),
    ("shutdown_temp_c", "temperature/gpu_temp_max_threshold"),
    ("fan_speed_pct", "fan_speed"),
    ("sm_clock_mhz", "clocks/sm_clock"),
    ("memory_clock_mhz", "clocks/mem_clock"),
    ("graphics_clock_mhz", "clocks/graphics_clock"),
    ("sm_clock_max_mhz", "max_clocks/sm_clock"),
    ("memory_clock_max_mhz", "max_clocks/mem_clock"),
    ("pcie_tx_kib_per_s", "pci/tx_util"),
    ("pcie_rx_kib_per_s", "pci/rx_util"),
)


def _profile(gpu: ET.Element, source: str, driver: str | None) -> DeviceProfile:
    name = _text(gpu, "product_name") or ""
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    reasons, renamed = _reasons(gpu)
    mig_text = _text(gpu, "mig_mode/current_mig")
    ecc_text = _text(gpu, "ecc_mode/current_ecc")
    readings: dict[str, Any] = {attr: _num(gpu, path) for attr, path in _READINGS}
    p = DeviceProfile(
        source=source,
        name=name,
        uuid=_text(gpu, "uuid") or "",
        architecture=_architecture(gpu, name),
        driver_version=driver,
        memory_total_mib=_int(gpu, "fb_memory_usage/total"),
        memory_used_mib=_int(gpu, "fb_memory_usage/used"),
        memory_reserved_mib=_int(gpu, "fb_memory_usage/reserved"),
        power_w=_num(power, "power_draw", "instant_power_draw", "average_power_draw"),
        power_limit_w=_num(power, "enforced_power_limit", "current_power_limit"),
        power_limit_default_w=_num(power, "default_power_limit"),
        power_limit_min_w=_num(power, "min_power_limit"),
        clock_event_reasons=reasons,
        reasons_renamed=renamed,
        pci_device_id=_pci_device_id(_text(gpu, "pci/pci_device_id")),
        pci_bus_id=_text(gpu, "pci/pci_bus_id") or "",
        ecc_enabled=ecc_text == "Enabled",
        ecc_corrected=_ecc(gpu, "correctable"),
        ecc_uncorrected=_ecc(gpu, "uncorrectable"),
        ecc_aggregate_corrected=_ecc(gpu, "correctable", "aggregate"),
        ecc_aggregate_uncorrected=_ecc(gpu, "uncorrectable", "aggregate"),
        remapped_rows=_remapped(gpu),
        compute_processes=_processes(gpu),
        mig_enabled=None if mig_text is None else mig_text == "Enabled",
        mig_devices=_mig_devices(gpu),
        **readings,
    )
    unsupported, failing = _refusals(p)
    return replace(p, unsupported=unsupported, failing=failing)


def _pci_device_id(text: str | None) -> int | None:
    """``221610DE`` as an int; None where the dump's id is redacted or has no device part
    (Telegraf's a10g.xml says ``000000DE``)."""
    try:
        value = int(text or "", 16)
    except ValueError:
        return None
    return value if value >> 16 and value & 0xFFFF == NVIDIA_VENDOR_ID else None


def _ecc(gpu: ET.Element, kind: str, counter: str = "volatile") -> int | None:
    """ECC errors of ``kind`` (correctable/uncorrectable), DRAM plus SRAM, of ``counter``
    (volatile or aggregate)."""
    node = gpu.find(f"ecc_errors/{counter}")
    if node is None:
        return None
    values = [
        _int(node, f"{where}_{kind}{tail}")
        for where in ("dram", "sram")
        for tail in ("", "_parity", "_secded")
    ]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _refusals(p: DeviceProfile) -> tuple[frozenset[str], dict[str, int]]:
    """The NVML functions this device refuses (NotSupported), and those the driver lacks."""
    refused = set()
    for fn, value in (
        ("nvmlDeviceGetUtilizationRates", p.utilization_gpu_pct),
        ("nvmlDeviceGetFanSpeed", p.fan_speed_pct),
        ("nvmlDeviceGetPowerUsage", p.power_w),
        ("nvmlDeviceGetEnforcedPowerLimit", p.power_limit_w),
        ("nvmlDeviceGetPowerManagementLimit", p.power_limit_w),
        ("nvmlDeviceGetPowerManagementDefaultLimit", p.power_limit_default_w),
        ("nvmlDeviceGetTemperatureV", p.temperature_c),
        ("nvmlDeviceGetTemperature", p.temperature_c),
        ("nvmlDeviceGetPcieThroughput", p.pcie_tx_kib_per_s),
        ("nvmlDeviceGetRemappedRows", p.remapped_rows),
        ("nvmlDeviceGetMemoryInfo", p.memory_total_mib),
        ("nvmlDeviceGetPciInfo", p.pci_device_id),
    ):
        if value is None:
            refused.add(fn)
    if p.sm_clock_mhz is None:
        refused.add("nvmlDeviceGetClockInfo")
    if p.sm_clock_max_mhz is None:
        refused.add("nvmlDeviceGetMaxClockInfo")
    if not p.ecc_enabled or p.ecc_corrected is None:
        refused.add("nvmlDeviceGetTotalEccErrors")
    if not p.energy_counter:
        refused.add("nvmlDeviceGetTotalEnergyConsumption")
    if p.mig_enabled is None:
        refused |= {"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount"}
    if p.clock_event_reasons is None:
        refused |= {
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        }
    failing: dict[str, int] = {}
    if p.clock_event_reasons is not None and not p.reasons_renamed:
        failing["nvmlDeviceGetCurrentClocksEventReasons"] = NVML_ERROR_FUNCTION_NOT_FOUND
    if p.memory_reserved_mib is None and p.memory_total_mib is not None:
        failing["nvmlDeviceGetMemoryInfo_v2"] = NVML_ERROR_FUNCTION_NOT_FOUND
    if not p.reasons_renamed:  # a driver before the rename (R530) has no TemperatureV either
        failing["nvmlDeviceGetTemperatureV"] = NVML_ERROR_FUNCTION_NOT_FOUND
        refused.discard("nvmlDeviceGetTemperatureV")
    return frozenset(refused), failing


# --- the fake's state ---------------------------------------------------------------------------

_NAN = math.nan


def _or_nan(value: float | None) -> float:
    """A static fact the fake refuses to tell (NotSupported) is NaN in its state."""
    return _NAN if value is None else float(value)


def profile_spec(p: DeviceProfile) -> GpuSpec:
    """gpuwatt's spec of the model where it knows it, else one with no peaks (and no GPM), with
    the device's own default power limit as its TDP (the fake answers the default limit from
    it: an A100 SXM4 80GB board says 500 W where the table has 400 W; NaN: N/A)."""
    known = lookup(p.name)
    if known is not None:
        return replace(known, tdp_w=_or_nan(p.power_limit_default_w))
    return GpuSpec(
        model=p.name,
        architecture=p.architecture or "unknown",
        tdp_w=_or_nan(p.power_limit_default_w),
        peak_clock_mhz=_or_nan(p.sm_clock_max_mhz),
        fp64_tflops=None,
        fp64_tensor_tflops=None,
        fp32_tflops=None,
        fp16_tflops=None,
        tf32_tensor_tflops=None,
        bf16_tensor_tflops=None,
        fp16_tensor_tflops=None,
        fp8_tensor_tflops=None,
        int8_tensor_tops=None,
        has_gpm=False,
        source=f"nvidia-smi dump {p.source}",
    )


def profile_state(p: DeviceProfile, host: str = "node-0", index: int = 0) -> SimGpuState:
    """The fake NVML's state of the GPU ``p`` describes, with its readings as they were."""
    total = (p.memory_total_mib or 0) * MIB
    g = SimGpuState(
        host=host,
        index=index,
        uuid=p.uuid,
        name=p.name,
        spec=profile_spec(p),
        pci_bus_id=p.pci_bus_id,
        pci_device_id=p.pci_device_id,
        memory_total_bytes=total,
        power_limit_w=_or_nan(p.power_limit_w),
        power_min_w=_or_nan(p.power_limit_min_w),
        sm_clock_max_mhz=_or_nan(p.sm_clock_max_mhz),
        memory_clock_max_mhz=_or_nan(p.memory_clock_max_mhz),
        slowdown_temp_c=_or_nan(p.slowdown_temp_c),
        shutdown_temp_c=_or_nan(p.shutdown_temp_c),
        idle_power_w=p.power_w or 0.0,
        utilization_gpu_pct=p.utilization_gpu_pct or 0.0,
        utilization_memory_pct=p.utilization_memory_pct or 0.0,
        memory_used_bytes=(p.memory_used_mib or 0) * MIB,
        memory_reserved_bytes=(p.memory_reserved_mib or 0) * MIB,
        temperature_c=p.temperature_c or 0.0,
        fan_speed_pct=p.fan_speed_pct or 0.0,
        power_w=p.power_w or 0.0,
        sm_clock_mhz=p.sm_clock_mhz or 0.0,
        memory_clock_mhz=p.memory_clock_mhz or 0.0,
        graphics_clock_mhz=p.graphics_clock_mhz or 0.0,
        clock_event_reasons=p.clock_event_reasons or 0,
        pcie_tx_kib_per_s=p.pcie_tx_kib_per_s or 0.0,
        pcie_rx_kib_per_s=p.pcie_rx_kib_per_s or 0.0,
        processes=[(pid, -1 if used is None else used) for pid, used in p.compute_processes],
        ecc_sbe_volatile=p.ecc_corrected or 0,
        ecc_dbe_volatile=p.ecc_uncorrected or 0,
        ecc_sbe_aggregate_base=max(0, (p.ecc_aggregate_corrected or 0) - (p.ecc_corrected or 0)),
        ecc_dbe_aggregate_base=max(
            0, (p.ecc_aggregate_uncorrected or 0) - (p.ecc_uncorrected or 0)
        ),
        mig_enabled=bool(p.mig_enabled),
        mig_max_devices=7 if p.mig_enabled is not None else 0,
        unsupported=set(p.unsupported),
        failing=dict(p.failing),
    )
    if p.remapped_rows is not None:
        corr, unc, pending, failure = p.remapped_rows
        g.remapped_rows_correctable, g.remapped_rows_uncorrectable = corr, unc
        g.remapped_rows_pending, g.remapped_rows_failure = pending, failure
    if p.mig_enabled:
        _add_mig_devices(g, p)
    return g


def _add_mig_devices(g: SimGpuState, p: DeviceProfile) -> None:
    """The dump's MIG devices. A v12 dump names no profile and no MIG uuid: the name is NVML's
    ``<GPU> MIG <slices>g.<GB>gb`` from the SM count (14 per slice on the A100, 16 on H100)
    and the memory, the uuid derived from the parent's and the instance ids."""
    per_slice = 16 if (p.architecture or "").startswith("Hopper") else 14
    g.mig_profile_sms = architecture_profile_sms(p.architecture)
    devices: list[SimMigState | None] = [None] * max(
        (m.index + 1 for m in p.mig_devices), default=0
    )
    for m in p.mig_devices:
        sms = m.multiprocessor_count or 0
        slices = max(1, round(sms / per_slice)) if sms else 1
        gb = round(m.memory_total_mib / 1000 / 5) * 5 or 5
        profile = f"{slices}g.{gb}gb"
        tail = g.uuid.removeprefix("GPU-")
        devices[m.index] = SimMigState(
            parent=g,
            index=m.index,
            uuid=f"MIG-{tail[:-4]}{m.gpu_instance_id:02x}{m.compute_instance_id:02x}",
            name=f"{p.name} MIG {profile}",
            profile=profile,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            slices=slices,
            multiprocessor_count=sms,
            memory_total_bytes=m.memory_total_mib * MIB,
            memory_used_bytes=m.memory_used_mib * MIB,
            memory_reserved_bytes=m.memory_reserved_mib * MIB,
        )
    g.mig_devices = devices
