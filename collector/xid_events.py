"""XID (critical driver error) events from an NVML event set, on their own daemon thread.

NVML delivers XIDs through an event set that a thread waits on (``nvmlEventSetWait``); polling
cannot see them. The listener registers ``nvmlEventTypeXidCriticalError`` on every device that
supports it and hands each event to ``on_xid(gpu_index, xid)``. The NVML module is passed in (the
real one or the simulator's fake); nothing here raises an NVML exception to the caller.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_WAIT_MS = 200

_log = logging.getLogger(__name__)


def _address(handle: Any) -> int | None:
    """The device pointer's address: how an event's ``device`` is matched to a handle."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class XidListener:
    """Waits on an NVML event set for XID errors and reports them by GPU index.

    ``start()`` registers the devices and starts the thread; ``stop()`` ends it within about one
    wait timeout (``wait_ms``) and frees the event set. Devices that do not support XID events are
    skipped and logged once. If the event set cannot be created at all, the listener logs why and
    stays inactive (``active`` is False): the sampler then simply reports no XIDs.
    """

    def __init__(
        self,
        nvml: Any,
        handles_by_index: Mapping[int, Any],
        on_xid: Callable[[int, int], None],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        logger: logging.Logger | None = None,
    ) -> None:
        self._nvml = nvml
        self._handles = dict(handles_by_index)
        self._on_xid = on_xid
        self._wait_ms = wait_ms
        self._log = logger or _log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._index_by_address: dict[int, int] = {}
        self.registered: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self._log.warning("XID events unavailable: nvmlEventSetCreate failed (%s)", exc)
            return
        registered = []
        for index, handle in sorted(self._handles.items()):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except nvml.NVMLError as exc:
                self._log.info("GPU %d: XID events not registered (%s)", index, exc)
                continue
            address = _address(handle)
            if address is not None:
                self._index_by_address[address] = index
            registered.append(index)
        self.registered = tuple(registered)
        if not registered:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="gpuwatt-xid", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the thread to end and wait for it (at most one wait timeout plus a margin)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(self._wait_ms / 1000.0 + 1.0 if timeout_s is None else timeout_s)
            if thread.is_alive():  # pragma: no cover - NVML did not honour its timeout
                self._log.warning("XID listener did not stop in time; leaving it (daemon)")
                return
            self._thread = None
        self._free()

    def _free(self) -> None:
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except self._nvml.NVMLError as exc:
            self._log.debug("nvmlEventSetFree failed (%s)", exc)

    def _run(self) -> None:
        nvml = self._nvml
        wait = nvml.nvmlEventSetWait
        nvml_error = nvml.NVMLError
        timeout_code = nvml.NVML_ERROR_TIMEOUT
        xid_type = nvml.nvmlEventTypeXidCriticalError
        stop = self._stop
        logged: set[str] = set()
        while not stop.is_set():
            try:
                data = wait(self._event_set, self._wait_ms)
            except nvml_error as exc:
                if getattr(exc, "value", None) == timeout_code:
                    continue
                cause = type(exc).__name__
                if cause not in logged:
                    logged.add(cause)
                    self._log.warning("nvmlEventSetWait failed (%s); still listening", exc)
                stop.wait(self._wait_ms / 1000.0)  # do not spin on a persistent error
                continue
            if not data.eventType & xid_type:
                continue
            index = self._index_by_address.get(_address(data.device) or 0)
            if index is None:
                continue
            try:
                self._on_xid(index, int(data.eventData))
            except Exception:  # a faulty callback must not kill the listener
                self._log.exception("XID callback failed")
