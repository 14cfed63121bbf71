"""gpuwatt's own exceptions. Library code raises these; only the CLI turns them into exit codes."""

from __future__ import annotations


class GpuwattError(Exception):
    """Base of every error gpuwatt reports to a person."""


class ConfigError(GpuwattError):
    """A config, scenario or rules file is malformed: says the file, the line and what is wrong."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


class StoreUnavailable(GpuwattError):
    """The store cannot be reached right now; the caller keeps the data and retries."""


class NvmlUnavailable(GpuwattError):
    """NVML (the NVIDIA driver's management library) cannot be loaded or initialised."""
