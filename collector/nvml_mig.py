"""MIG: each MIG device of a GPU in MIG mode, sampled as a device of its own.

A GPU in MIG mode is split into GPU instances (and compute instances within them); NVML gives
each (GPU instance, compute instance) pair a MIG device handle with its own uuid (``MIG-...``)
and name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``). On that handle NVML answers memory, processes
and attributes (SM count); power, clocks, temperature and utilisation are refused there: they
are facts of the whole GPU, sampled on the parent. Activity comes from GPM through the parent's
handle (``nvmlGpmMigSampleGet`` with the GPU instance id, Hopper and newer), in percent of the
instance's own SMs, so its TFLOPS estimate is the parent's peaks x the instance's share of SMs;
its ``utilization_gpu_pct`` is GPM's graphics-engine activity (``gpm.MIG_GPM_METRICS``).

A MIG device's sample carries the parent's index (``gpu_index``) and uuid (``parent_uuid``) and
its GPU and compute instance ids. The devices are found when the parent is opened and again on
every slow tick (MIG can be reconfigured while the collector runs). Errors follow the sampler's
policy (``nvml_errors``), recorded under ``gpu<parent>/mig<index>/<field>``; a lost parent loses
its MIG devices with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpuwatt.collector.gpm import MIG_GPM_METRICS, GpmReader, open_gpm
from gpuwatt.collector.nvml_errors import ErrorPolicy
from gpuwatt.collector.nvml_fields import FieldQuery, Reader, bind, bind_all, mig_queries
from gpuwatt.model import GpuSample, TflopsMethod, gpu_sample_from_fields
from gpuwatt.tflops import PipePeaks, tflops_from_values


@dataclass(frozen=True, slots=True)
class MigDeviceInfo:
    """Static facts of one MIG device (None = NVML did not say)."""

    parent_index: int
    parent_uuid: str
    mig_index: int  # its index on the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str
    name: str
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessor_count: int | None
    memory_total_bytes: int | None
    gpm_supported: bool


class _Mig:
    """One MIG device's handle, facts, readers and GPM."""

    __slots__ = ("gpm", "handle", "identity", "info", "label", "off", "readers", "sm_fraction")

    def __init__(self, handle: Any, info: MigDeviceInfo, label: str, off: set[str]) -> None:
        self.handle = handle
        self.info = info
        self.label = label  # "mig<index>": what its fields are recorded under
        self.off = off
        self.readers: tuple[Reader, ...] = ()
        self.gpm: GpmReader | None = None
        self.sm_fraction: float | None = None  # its SMs / the parent's
        self.identity: dict[str, Any] = {}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class MigDevices:
    """The MIG devices of one GPU in MIG mode: ``scan()`` finds them, ``sample()`` samples them."""

    def __init__(
        self, nv: Any, policy: ErrorPolicy, parent_index: int, host: str, log: logging.Logger
    ) -> None:
        self._nv = nv
        self._policy = policy
        self._errors = policy.errors
        self._index = parent_index
        self._host = host
        self._log = log
        self._queries: tuple[FieldQuery, ...] = mig_queries(nv)
        self._devices: list[_Mig] = []
        self._off: set[str] = set()  # the parent's MIG-level refusals (the scan itself)

    def infos(self) -> list[MigDeviceInfo]:
        return [m.info for m in self._devices]

    # --- finding them ---------------------------------------------------------------------------

    def _static(self, off: set[str], field: str, fn: Any, *args: Any) -> Any:
        """One static fact, or None (refused, failed, or the module lacks ``fn``)."""
        if fn is None or field in off:
            return None
        try:
            return fn(*args)
        except self._errors as exc:
            self._policy.failed(self._index, off, field, exc)
            return None

    def scan(self, parent: Any, parent_uuid: str) -> None:
        """Find the parent's MIG devices (kept as they were where their uuid is unchanged)."""
        nv, q = self._nv, self._static
        count = q(
            self._off, "mig_devices", getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None), parent
        )
        by_index = getattr(nv, "nvmlDeviceGetMigDeviceHandleByIndex", None)
        if count is None or by_index is None:
            return
        parent_sms = self._parent_sms(parent)
        known = {m.info.uuid: m for m in self._devices}
        found: list[_Mig] = []
        for i in range(int(count)):
            try:
                handle = by_index(parent, i)
            except self._errors as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_NOT_FOUND:  # NotFound: a free slot
                    self._policy.failed(self._index, set(), f"mig{i}/handle", exc)
                continue
            uuid_raw = q(set(), f"mig{i}/uuid", nv.nvmlDeviceGetUUID, handle)
            uuid = _text(uuid_raw) if uuid_raw is not None else ""
            old = known.get(uuid) if uuid else None
            if old is not None and old.info.mig_index == i:
                old.handle = handle
                found.append(old)
                continue
            found.append(self._open(handle, i, uuid, parent, parent_uuid, parent_sms))
        for m in self._devices:
            if m not in found and m.gpm is not None:
                m.gpm.close(self._log)
        self._devices = found

    def _parent_sms(self, parent: Any) -> int:
        """The whole GPU's SMs, which a MIG device's share of the peaks is taken of (0: unknown,
        no TFLOPS). NVML answers ``nvmlDeviceGetAttributes`` on MIG device handles only, so
        this is the full (7-slice) GPU instance profile's count: the whole GPU on Hopper, 98 of
        the A100's 108 SMs (an A100 has no GPM, hence no MIG TFLOPS, anyway)."""
        nv = self._nv
        info = self._static(
            self._off,
            "gpu_instance_profile",
            getattr(nv, "nvmlDeviceGetGpuInstanceProfileInfo", None),
            parent,
            getattr(nv, "NVML_GPU_INSTANCE_PROFILE_7_SLICE", 4),
        )
        return int(info.multiprocessorCount) if info is not None else 0

    def _open(
        self, handle: Any, i: int, uuid: str, parent: Any, parent_uuid: str, parent_sms: int
    ) -> _Mig:
        nv, q = self._nv, self._static
        label = f"mig{i}"
        off: set[str] = set()
        name = q(off, f"{label}/name", nv.nvmlDeviceGetName, handle)
        gi = q(
            off, f"{label}/gpu_instance_id", getattr(nv, "nvmlDeviceGetGpuInstanceId", None), handle
        )
        ci = q(
            off,
            f"{label}/compute_instance_id",
            getattr(nv, "nvmlDeviceGetComputeInstanceId", None),
            handle,
        )
        attrs = q(off, f"{label}/attributes", getattr(nv, "nvmlDeviceGetAttributes", None), handle)
        sms = int(attrs.multiprocessorCount) if attrs is not None else None
        mem_mb = int(attrs.memorySizeMB) if attrs is not None else None
        gpm = None
        if gi is not None:
            gpm = open_gpm(
                nv,
                self._policy,
                self._index,
                off,
                parent,
                mig_gpu_instance_id=int(gi),
                label=f"{label}/gpm",
                metrics=MIG_GPM_METRICS,
            )
        info = MigDeviceInfo(
            parent_index=self._index,
            parent_uuid=parent_uuid,
            mig_index=i,
            uuid=uuid,
            name=_text(name) if name is not None else "",
            gpu_instance_id=int(gi) if gi is not None else None,
            compute_instance_id=int(ci) if ci is not None else None,
            multiprocessor_count=sms,
            memory_total_bytes=mem_mb * 1024 * 1024 if mem_mb is not None else None,
            gpm_supported=gpm is not None,
        )
        m = _Mig(handle, info, label, off)
        m.gpm = gpm
        m.readers = bind_all(self._queries, handle)
        if sms and parent_sms:
            m.sm_fraction = sms / parent_sms
        m.identity = {
            "host": self._host,
            "gpu_index": self._index,
            "uuid": info.uuid,
            "name": info.name,
            "parent_uuid": parent_uuid or None,
            "gpu_instance_id": info.gpu_instance_id,
            "compute_instance_id": info.compute_instance_id,
        }
        return m

    # --- sampling -------------------------------------------------------------------------------

    def sample(
        self, parent: Any, t_ns: int, sm_clock_mhz: float | None, peaks: PipePeaks | None
    ) -> list[GpuSample]:
        """One sample per MIG device. Raises ``GpuLost`` when the parent is lost."""
        out = []
        for m in self._devices:
            values = m.identity.copy()
            values["time_ns"] = t_ns
            self._read(m, values)
            gpm = m.gpm
            if gpm is not None:
                if gpm.read(parent, values):
                    self._tflops(m, values, sm_clock_mhz, peaks)
                elif gpm.refused:
                    gpm.close(self._log)
                    m.gpm = None
            out.append(gpu_sample_from_fields(values))
        return out

    def lost_samples(self, t_ns: int) -> list[GpuSample]:
        """Each known MIG device as lost (its parent is)."""
        out = []
        for m in self._devices:
            if m.gpm is not None:
                m.gpm.primed = False
            out.append(gpu_sample_from_fields({**m.identity, "time_ns": t_ns, "lost": True}))
        return out

    def close(self) -> None:
        for m in self._devices:
            if m.gpm is not None:
                m.gpm.close(self._log)
                m.gpm = None

    def _tflops(
        self,
        m: _Mig,
        values: dict[str, Any],
        sm_clock_mhz: float | None,
        peaks: PipePeaks | None,
    ) -> None:
        """The instance's share of the parent's peaks at the parent's clock (no share known:
        no estimate)."""
        if peaks is None or m.sm_fraction is None:
            return
        tflops = tflops_from_values(peaks, sm_clock_mhz, values)
        if tflops is not None:
            values["tflops_estimate"] = tflops * m.sm_fraction
            values["tflops_method"] = TflopsMethod.GPM

    def _read(
        self, m: _Mig, values: dict[str, Any], rows: tuple[Reader, ...] | None = None
    ) -> None:
        for read, convert, field, query in m.readers if rows is None else rows:
            try:
                answer = read()
            except self._errors as exc:
                self._failed(m, query, exc, values)
                continue
            if field is None:
                convert(answer, values)
            else:
                values[field] = convert(answer)

    def _failed(
        self, m: _Mig, query: FieldQuery, exc: BaseException, values: dict[str, Any]
    ) -> None:
        """As the sampler's ``_query_failed``: the older call where there is one, else the
        policy (a row refused for good leaves the device's readers)."""
        policy = self._policy
        fallback = query.fallback.available() if query.fallback is not None else None
        key = f"{m.label}/{query.key}"
        if fallback is None or policy.is_lost(exc) or not policy.calls_for_fallback(exc):
            if policy.failed(self._index, m.off, key, exc):
                m.readers = tuple(r for r in m.readers if r[3] is not query)
            return
        policy.log_once(
            self._index, key, query.via, "%s: %s, falling back to %s", exc, fallback.via
        )
        reader = bind(fallback, m.handle)
        m.readers = tuple(reader if r[3] is query else r for r in m.readers)
        self._read(m, values, (reader,))
