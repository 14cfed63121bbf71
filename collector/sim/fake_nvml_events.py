"""The XID event calls of the fake NVML: event sets, registration, and a wait on the simulated
cluster's condition until an XID is pending. Mixed into ``FakeNvml``."""

from __future__ import annotations

import time
from typing import Any

from gpuwatt.collector.sim.fake_nvml_base import (
    NV,
    address_of,
    fake_pointer,
    gpu_of,
    nvml_error,
    require_init,
)
from gpuwatt.collector.sim.state import SimCluster

_XID = NV.nvmlEventTypeXidCriticalError


class EventCalls:
    """NVML's event functions; only critical XIDs are ever delivered."""

    _cluster: SimCluster
    _event_sets: dict[int, list[Any]]
    _init_count: int

    def nvmlEventSetCreate(self) -> Any:
        require_init(self._init_count)
        event_set = fake_pointer(NV.c_nvmlEventSet_t)
        self._event_sets[address_of(event_set)] = []
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu_of(handle, "nvmlDeviceRegisterEvents")
        registered = self._event_sets.get(address_of(eventSet))
        if registered is None:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & _XID:
            registered.append(handle)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu_of(handle, "nvmlDeviceGetSupportedEventTypes")
        return _XID

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        """Block on the cluster's condition until an XID is pending or ``timeoutms`` passes."""
        registered = self._event_sets.get(address_of(eventSet))
        if registered is None:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000.0
        condition = self._cluster.condition
        with condition:
            while True:
                for handle in registered:
                    pending = handle._sim.pending_xids
                    if pending:
                        data = NV.c_nvmlEventData_t()
                        data.device = handle
                        data.eventType = _XID
                        data.eventData = pending.popleft()
                        data.gpuInstanceId = 0xFFFFFFFF
                        data.computeInstanceId = 0xFFFFFFFF
                        return data
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise nvml_error(NV.NVML_ERROR_TIMEOUT)
                condition.wait(remaining_s)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        if self._event_sets.pop(address_of(eventSet), None) is None:
            raise nvml_error(NV.NVML_ERROR_INVALID_ARGUMENT)
