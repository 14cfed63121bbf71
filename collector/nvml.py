"""The one module that imports ``pynvml`` (from the ``nvidia-ml-py`` distribution).

Everything else receives the NVML module as an argument: the real one from here, or the
simulated cluster's fake (``collector.sim.fake_nvml``), which re-exports this module's constants,
error classes and ctypes structs.
"""

from __future__ import annotations

from types import ModuleType

import pynvml

from gpuwatt.errors import NvmlUnavailable


def real_module() -> ModuleType:
    """The real ``pynvml`` module (importing it needs no driver; calling it does)."""
    return pynvml


def init_real_nvml() -> ModuleType:
    """Initialise real NVML, or raise ``NvmlUnavailable`` with the reason in one line."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML is not available on this machine ({exc})") from None
    except OSError as exc:  # pragma: no cover - defensive: loader problems surface as OSError
        raise NvmlUnavailable(f"NVML is not available on this machine ({exc})") from None
    return pynvml
