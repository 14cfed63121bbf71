"""The NVML error policy: what an error on one field of one GPU means, and what is said about it.

- ``GpuIsLost``/``Unknown``: the whole GPU is lost for this tick (``GpuLost`` is raised; the
  sampler reports ``lost=True`` and probes the GPU again next tick).
- ``NotSupported``/``NoPermission`` (or an error that is not an NVML error code at all): the field
  is refused for good on that GPU; it is not asked again and ``unsupported`` says why.
- anything else: the field is None for this tick only.

Each (gpu, field, cause) is logged once, not every tick.
"""

from __future__ import annotations

import logging
from typing import Any


class GpuLost(Exception):
    """NVML said GpuIsLost/Unknown for this GPU during this tick."""

    def __init__(self, cause: str, field: str) -> None:
        super().__init__(cause, field)
        self.cause = cause
        self.field = field


class ErrorPolicy:
    """Classifies NVML errors for the module ``nvml`` and keeps the log-once and refusal records."""

    def __init__(self, nvml: Any, logger: logging.Logger) -> None:
        errors: list[type[BaseException]] = [nvml.NVMLError]
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        if isinstance(mismatch, type) and issubclass(mismatch, Exception):
            errors.append(mismatch)
        #: what an NVML call can raise that the sampler handles (``except policy.errors``)
        self.errors: tuple[type[BaseException], ...] = tuple(errors)
        self._nvml_error: type[BaseException] = nvml.NVMLError
        self._log = logger
        self._lost_codes = frozenset({nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_UNKNOWN})
        self._for_good_codes = frozenset(
            {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NO_PERMISSION}
        )
        # what a versioned or renamed call answers on a driver or library without it
        self._fallback_codes = frozenset(
            {
                nvml.NVML_ERROR_NOT_SUPPORTED,
                nvml.NVML_ERROR_NO_PERMISSION,
                nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            }
        )
        self._logged: set[tuple[int, str, str]] = set()
        self.unsupported: dict[str, str] = {}  # "gpu<index>/<field>" -> cause

    def failed(self, index: int, off: set[str], field: str, exc: BaseException) -> bool:
        """Decide what ``exc`` on ``field`` of GPU ``index`` means; True if refused for good.

        Raises ``GpuLost`` for a lost GPU. A field refused for good is added to ``off``.
        """
        code = getattr(exc, "value", None)
        cause = type(exc).__name__
        if code in self._lost_codes:
            raise GpuLost(cause, field)
        for_good = code in self._for_good_codes or not isinstance(exc, self._nvml_error)
        if for_good:
            off.add(field)
            self.refuse(index, field, cause)
        self.log_once(index, field, cause, "%s: %s", exc)
        return for_good

    def is_lost(self, exc: BaseException) -> bool:
        return getattr(exc, "value", None) in self._lost_codes

    def refused_for_good(self, exc: BaseException) -> bool:
        """NotSupported/NoPermission: asking again will not help."""
        return getattr(exc, "value", None) in self._for_good_codes

    def calls_for_fallback(self, exc: BaseException) -> bool:
        """The call is missing, refused or of the wrong version here: an older one may answer."""
        return getattr(exc, "value", None) in self._fallback_codes

    def refuse(self, index: int, field: str, cause: str) -> None:
        """Record that ``field`` of GPU ``index`` is not measured, and why."""
        self.unsupported[f"gpu{index}/{field}"] = cause

    def log_once(self, index: int, field: str, cause: str, fmt: str, *args: object) -> None:
        """Log ``"GPU <index> <field> " + fmt % (cause, *args)`` once per (gpu, field, cause):
        ``fmt``'s first placeholder is the cause."""
        key = (index, field, cause)
        if key in self._logged:
            return
        self._logged.add(key)
        self._log.info("GPU %d %s " + fmt, index, field, cause, *args)
