"""The sampler: one ``GpuSample`` per GPU per tick, read through an injected NVML module.

The NVML module is an argument (the real ``pynvml`` from ``collector.nvml``, or the simulator's
``FakeNvml``). NVML errors never leave this module:

- every field is queried on its own (``nvml_fields``: one table row per NVML call); what an error
  means is the ``nvml_errors`` policy: a field NVML refuses is None for good on that GPU, any
  other error makes it None for this tick, each (gpu, field, cause) is logged once;
- ``GpuIsLost``/``Unknown`` on any call make that GPU's sample ``lost=True`` with no metrics, while
  the other GPUs keep being sampled; a lost GPU is probed again every tick;
- versioned calls fall back (memory v2 -> v1, ``TemperatureV`` -> legacy, clocks-event reasons ->
  the older throttle-reasons name), and a GPU in MIG mode is sampled at the GPU level wherever NVML
  allows it, each of its MIG devices as a device of its own after it (``nvml_mig``).

Energy is accumulated by ``energy.EnergyAccumulator`` and GPM read by ``gpm.GpmReader``. Handles
and static facts are read once in ``open()``. Cost per GPU-sample: ``bench/collector_cost.py``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpuwatt.collector.energy import EnergyAccumulator
from gpuwatt.collector.gpm import GpmReader, open_gpm
from gpuwatt.collector.nvml_errors import ErrorPolicy, GpuLost
from gpuwatt.collector.nvml_fields import (
    FieldQuery,
    Reader,
    bind,
    bind_all,
    pcie_queries,
    rebind,
    slow_queries,
    tick_queries,
)
from gpuwatt.collector.nvml_mig import MigDeviceInfo, MigDevices
from gpuwatt.collector.xid_events import XidListener
from gpuwatt.errors import NvmlUnavailable
from gpuwatt.gpu_specs import TENSOR_PRECISIONS, GpuSpec, lookup
from gpuwatt.model import EnergyMethod, GpuSample, TflopsMethod, gpu_sample_from_fields
from gpuwatt.tflops import PipePeaks, tflops_from_values

_log = logging.getLogger(__name__)

_COUNTER = EnergyMethod.COUNTER
_INTEGRATED = EnergyMethod.INTEGRATED
_GPM_METHOD = TflopsMethod.GPM
# the query tables, by their index in _Gpu.readers
_TICK = 0  # every tick
_PCIE = 1  # every tick while the GPU has no GPM
_SLOW = 2  # slow-cadence ticks


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Static facts about one GPU, read once in ``open()`` (None = NVML did not say)."""

    index: int
    uuid: str
    name: str
    spec: GpuSpec | None
    memory_total_bytes: int | None
    sm_clock_max_mhz: float | None
    power_limit_default_w: float | None
    power_limit_enforced_w: float | None
    slowdown_temp_c: float | None
    shutdown_temp_c: float | None
    gpm_supported: bool
    mig_enabled: bool | None


class _Gpu:
    """Per-GPU state of the sampler: handle, static facts, readers, energy, GPM, XIDs."""

    __slots__ = (
        "energy",
        "energy_counter",
        "gpm",
        "handle",
        "identity",
        "index",
        "info",
        "lost",
        "mig",
        "mig_enabled",
        "name",
        "off",
        "pci_device_id",
        "readers",
        "sm_clock_max_mhz",
        "spec",
        "tflops_peaks",
        "uuid",
        "xids",
    )

    def __init__(self, index: int, energy: EnergyAccumulator) -> None:
        self.index = index
        self.handle: Any = None
        self.info: DeviceInfo | None = None
        self.uuid = ""
        self.name = ""
        self.spec: GpuSpec | None = None
        self.tflops_peaks: PipePeaks | None = None  # at the configured tensor precision
        self.sm_clock_max_mhz: float | None = None
        self.mig_enabled: bool | None = None
        self.mig: MigDevices | None = None  # its MIG devices while it is in MIG mode
        self.pci_device_id: int | None = None
        self.identity: dict[str, Any] = {}  # what every sample of the GPU starts from
        self.lost = False
        self.off: set[str] = set()  # fields NVML refused for good (NotSupported/NoPermission)
        # the query tables (_TICK, _PCIE, _SLOW) bound to the handle, less the refused rows
        self.readers: list[tuple[Reader, ...]] = []
        self.energy = energy
        self.energy_counter: Callable[[], int] | None = None  # None: power is integrated
        self.gpm: GpmReader | None = None
        self.xids: deque[int] = deque()


class NvmlSampler:
    """Samples every GPU NVML sees on this host. ``open()`` once, ``sample()`` each tick."""

    def __init__(
        self,
        nvml: Any,
        host: str,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic_s: Callable[[], float] = time.monotonic,
        tensor_precision: str = "bf16",
        logger: logging.Logger | None = None,
        xid_events: bool = True,
        xid_wait_ms: int = 200,
    ) -> None:
        if tensor_precision not in TENSOR_PRECISIONS:
            raise ValueError(f"tensor_precision must be one of {TENSOR_PRECISIONS}")
        self._nv = nvml
        self._host = host
        self._clock_ns = clock_ns
        self._monotonic_s = monotonic_s
        self._precision = tensor_precision
        self._log = logger or _log
        self._want_xids = xid_events
        self._xid_wait_ms = xid_wait_ms
        self._gpus: list[_Gpu] = []
        self._listener: XidListener | None = None
        self._opened = False
        self._policy = ErrorPolicy(nvml, self._log)
        self._errors = self._policy.errors
        self._tables = (tick_queries(nvml), pcie_queries(nvml), slow_queries(nvml))

    # --- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML, enumerate the GPUs, read static facts, start the XID listener."""
        nv = self._nv
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except self._errors as exc:
            raise NvmlUnavailable(f"NVML is not available ({exc})") from None
        self._opened = True
        self._gpus = []
        for i in range(count):
            g = _Gpu(i, EnergyAccumulator(on_reset=self._energy_reset_logger(i)))
            self._gpus.append(g)
            self._open_gpu(g)
        if self._want_xids:
            handles = {g.index: g.handle for g in self._gpus if g.handle is not None}
            self._listener = XidListener(
                nv, handles, self._on_xid, wait_ms=self._xid_wait_ms, logger=self._log
            )
            self._listener.start()

    def close(self) -> None:
        """Stop the XID listener, free GPM buffers and shut NVML down. Idempotent."""
        if not self._opened:
            return
        self._opened = False
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        for g in self._gpus:
            if g.gpm is not None:
                g.gpm.close(self._log)
                g.gpm = None
            if g.mig is not None:
                g.mig.close()
                g.mig = None
        try:
            self._nv.nvmlShutdown()
        except self._errors as exc:
            self._log.debug("nvmlShutdown failed (%s)", exc)

    def __enter__(self) -> NvmlSampler:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- public queries -------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    def devices(self) -> list[DeviceInfo]:
        """Static facts of the GPUs whose facts could be read (a lost GPU may have none yet)."""
        return [g.info for g in self._gpus if g.info is not None]

    def mig_devices(self) -> list[MigDeviceInfo]:
        """Static facts of the MIG devices found on GPUs in MIG mode."""
        return [info for g in self._gpus if g.mig is not None for info in g.mig.infos()]

    def unsupported_fields(self) -> dict[str, str]:
        """``"gpu<index>/<field>"`` -> cause, for every field NVML refused for good."""
        return dict(self._policy.unsupported)

    @property
    def xid_listener_active(self) -> bool:
        return self._listener is not None and self._listener.active

    # --- open -----------------------------------------------------------------------------------

    def _open_gpu(self, g: _Gpu) -> None:
        try:
            g.handle = self._nv.nvmlDeviceGetHandleByIndex(g.index)
            self._read_static(g)
        except self._errors as exc:
            self._mark_lost(g, type(exc).__name__, "handle")
        except GpuLost as lost:
            self._mark_lost(g, lost.cause, lost.field)

    def _static(self, g: _Gpu, field: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """One static fact, or None (refused, failed, or the module lacks ``fn``)."""
        if fn is None or field in g.off:
            return None
        try:
            return fn(g.handle, *args)
        except self._errors as exc:
            self._policy.failed(g.index, g.off, field, exc)
            return None

    def _read_static(self, g: _Gpu) -> None:
        nv, h, q = self._nv, g.handle, self._static
        if g.readers:  # a GPU found again: the same rows, fallbacks taken stay taken
            g.readers = [rebind(readers, h) for readers in g.readers]
        else:
            g.readers = [bind_all(queries, h) for queries in self._tables]
        if g.energy.method is _COUNTER:
            g.energy_counter = partial(nv.nvmlDeviceGetTotalEnergyConsumption, h)
        uuid = q(g, "uuid", nv.nvmlDeviceGetUUID)
        name = q(g, "name", nv.nvmlDeviceGetName)
        g.uuid = _text(uuid) if uuid is not None else ""
        g.name = _text(name) if name is not None else ""
        pci = q(g, "pci_device_id", getattr(nv, "nvmlDeviceGetPciInfo", None))
        g.pci_device_id = int(pci.pciDeviceId) if pci is not None else None
        # by name, else by PCI device id; an unknown model is logged once by lookup
        g.spec = spec = lookup(g.name, g.pci_device_id)
        g.tflops_peaks = PipePeaks.of(spec, self._precision) if spec is not None else None
        mem = q(g, "memory_total_bytes", nv.nvmlDeviceGetMemoryInfo)
        sm_max = q(g, "sm_clock_max_mhz", nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM)
        g.sm_clock_max_mhz = float(sm_max) if sm_max is not None else None
        default_mw = q(g, "power_limit_default_w", nv.nvmlDeviceGetPowerManagementDefaultLimit)
        enforced_mw = q(g, "power_limit_w", nv.nvmlDeviceGetEnforcedPowerLimit)
        thr = nv.nvmlDeviceGetTemperatureThreshold
        slowdown = q(g, "slowdown_temp_c", thr, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        shutdown = q(g, "shutdown_temp_c", thr, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        mig = q(g, "mig_enabled", getattr(nv, "nvmlDeviceGetMigMode", None))
        g.mig_enabled = bool(mig[0]) if mig is not None else None
        if g.mig_enabled:
            if g.mig is None:
                g.mig = MigDevices(nv, self._policy, g.index, self._host, self._log)
            g.mig.scan(h, g.uuid)
        elif g.mig is not None:
            g.mig.close()
            g.mig = None
        if g.gpm is None:
            g.gpm = open_gpm(nv, self._policy, g.index, g.off, h)
        g.identity = {
            "host": self._host,
            "gpu_index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "sm_clock_max_mhz": g.sm_clock_max_mhz,
            "mig_enabled": g.mig_enabled,
            "pci_device_id": g.pci_device_id,
        }
        g.info = DeviceInfo(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            spec=g.spec,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            sm_clock_max_mhz=g.sm_clock_max_mhz,
            power_limit_default_w=default_mw / 1000.0 if default_mw is not None else None,
            power_limit_enforced_w=enforced_mw / 1000.0 if enforced_mw is not None else None,
            slowdown_temp_c=float(slowdown) if slowdown is not None else None,
            shutdown_temp_c=float(shutdown) if shutdown is not None else None,
            gpm_supported=g.gpm is not None,
            mig_enabled=g.mig_enabled,
        )

    def _mark_lost(self, g: _Gpu, cause: str, field: str) -> None:
        if not g.lost:
            g.lost = True
            self._log.warning(
                "GPU %d is lost (%s on %s); other GPUs continue", g.index, cause, field
            )
        if g.gpm is not None:
            g.gpm.primed = False

    def _on_xid(self, gpu_index: int, xid: int) -> None:
        if 0 <= gpu_index < len(self._gpus):
            self._gpus[gpu_index].xids.append(xid)

    def _energy_reset_logger(self, index: int) -> Callable[[float, float], None]:
        def reset(last_j: float, counter_j: float) -> None:
            self._log.info(
                "GPU %d energy counter reset (%.0f J -> %.0f J)", index, last_j, counter_j
            )

        return reset

    # --- sampling -------------------------------------------------------------------------------

    def sample(self, include_slow: bool = False) -> list[GpuSample]:
        """One sample per GPU for this tick (a lost GPU: ``lost=True``). Raises no NVML error."""
        if not self._opened:
            raise RuntimeError("NvmlSampler.sample() before open()")
        t_ns = self._clock_ns()
        mono_s = self._monotonic_s()
        out = []
        for g in self._gpus:
            try:
                if g.handle is None or g.info is None:
                    self._reopen(g)
                s = self._sample_gpu(g, t_ns, mono_s, include_slow)
                mig = g.mig
                if mig is not None:
                    if include_slow:  # MIG may have been reconfigured
                        mig.scan(g.handle, g.uuid)
                    migs = mig.sample(g.handle, t_ns, s.sm_clock_mhz, g.tflops_peaks)
                if g.lost:
                    g.lost = False
                    self._log.warning("GPU %d answers again", g.index)
            except GpuLost as lost:
                self._mark_lost(g, lost.cause, lost.field)
                s = GpuSample(
                    time_ns=t_ns,
                    host=self._host,
                    gpu_index=g.index,
                    uuid=g.uuid,
                    name=g.name,
                    lost=True,
                    xid_errors=_drain(g.xids),
                )
                mig = g.mig
                if mig is not None:
                    migs = mig.lost_samples(t_ns)
            out.append(s)
            if mig is not None:
                out.extend(migs)
        return out

    def _reopen(self, g: _Gpu) -> None:
        try:
            if g.handle is None:
                g.handle = self._nv.nvmlDeviceGetHandleByIndex(g.index)
        except self._errors as exc:
            raise GpuLost(type(exc).__name__, "handle") from None
        self._read_static(g)

    def _sample_gpu(self, g: _Gpu, t_ns: int, mono_s: float, include_slow: bool) -> GpuSample:
        """The GPU's sample: its fields gathered by name in ``values``, then built by keyword
        (a field not measured keeps its default, None)."""
        values = g.identity.copy()
        values["time_ns"] = t_ns
        self._read(g, _TICK, values)
        counter = g.energy_counter
        if counter is None:
            self._integrate_energy(g, mono_s, values)
        else:
            try:
                values["energy_j"] = g.energy.from_counter(counter() / 1000.0)  # mJ
                values["energy_method"] = _COUNTER
            except self._errors as exc:
                self._energy_counter_failed(g, mono_s, values, exc)
        gpm = g.gpm
        if gpm is not None:
            if gpm.read(g.handle, values):
                peaks = g.tflops_peaks
                if peaks is not None:
                    tflops = tflops_from_values(peaks, values.get("sm_clock_mhz"), values)
                    if tflops is not None:
                        values["tflops_estimate"] = tflops
                        values["tflops_method"] = _GPM_METHOD
            elif gpm.refused:
                gpm.close(self._log)
                g.gpm = None
        if g.gpm is None:  # no GPM, or it was refused for good just now
            self._read(g, _PCIE, values)
        if include_slow:
            self._read(g, _SLOW, values)
        if g.xids:
            values["xid_errors"] = _drain(g.xids)
        return gpu_sample_from_fields(values)

    def _read(
        self, g: _Gpu, table: int, values: dict[str, Any], rows: tuple[Reader, ...] | None = None
    ) -> None:
        """Ask each row of the GPU's ``table`` (or only ``rows`` of it) its NVML call, and store
        the value(s) in ``values``."""
        for read, convert, field, query in g.readers[table] if rows is None else rows:
            try:
                answer = read()
            except self._errors as exc:
                self._query_failed(g, table, query, exc, values)
                continue
            if field is None:
                convert(answer, values)
            else:
                values[field] = convert(answer)

    def _query_failed(
        self, g: _Gpu, table: int, query: FieldQuery, exc: BaseException, values: dict[str, Any]
    ) -> None:
        """A reader's call raised: the older call from now on (and for this tick), or the error
        policy; a row refused for good leaves the GPU's table (the loop reading it goes on over
        the table as it was)."""
        policy = self._policy
        fallback = query.fallback.available() if query.fallback is not None else None
        if fallback is None or policy.is_lost(exc) or not policy.calls_for_fallback(exc):
            if policy.failed(g.index, g.off, query.key, exc):
                g.readers[table] = tuple(r for r in g.readers[table] if r[3] is not query)
            return
        cause = type(exc).__name__
        for lacking in query.lacks:
            policy.refuse(g.index, lacking, f"{cause} ({query.via}; using {fallback.via})")
        # log_once's format takes the cause (here the call) first
        policy.log_once(
            g.index, query.key, query.via, "%s: %s, falling back to %s", cause, fallback.via
        )
        reader = bind(fallback, g.handle)
        g.readers[table] = tuple(reader if r[3] is query else r for r in g.readers[table])
        self._read(g, table, values, (reader,))  # this tick's value, from the fallback

    def _energy_counter_failed(
        self, g: _Gpu, mono_s: float, values: dict[str, Any], exc: BaseException
    ) -> None:
        """The energy counter raised: no energy this tick, or power integrated from now on."""
        policy = self._policy
        # a lost GPU raises GpuLost from failed(); a transient error means none this tick
        if not policy.refused_for_good(exc) and not policy.failed(g.index, g.off, "energy_j", exc):
            return
        g.energy_counter = None
        g.energy.counter_refused()
        policy.refuse(
            g.index, "energy_counter", f"{type(exc).__name__} (integrating power instead)"
        )
        policy.log_once(g.index, "energy_j", "counter", "%s: %s, integrating power", exc)
        self._integrate_energy(g, mono_s, values)

    def _integrate_energy(self, g: _Gpu, mono_s: float, values: dict[str, Any]) -> None:
        energy_j = g.energy.from_power(mono_s, values.get("power_w"))
        if energy_j is not None:
            values["energy_j"] = energy_j
            values["energy_method"] = _INTEGRATED


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _drain(xids: deque[int]) -> tuple[int, ...]:
    out = []
    while xids:
        out.append(xids.popleft())
    return tuple(out)
