"""Samples as rows of attribute values: what the binary spool decodes, before any ``GpuSample``.

A store on this machine can take a replayed spool as rows (``SqliteStore.write_rows``) and turn
them straight into its columns, with no Python object per sample in between; anything else asks
for the samples (``SampleRows.samples``). A row is a tuple of ``ATTRS`` values in that order, as
MessagePack gives them back: the energy and TFLOPS methods as their string values, XIDs as a
tuple, processes as tuples ``(pid, used_memory_bytes[, user])``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod, make_gpu_sample

#: The attributes of a row, in order (``extra`` is free-form provenance, never stored).
ATTRS: tuple[str, ...] = tuple(f.name for f in fields(GpuSample) if f.name != "extra")
#: Each attribute's value in a sample that does not say (a row of an older spool, say).
DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(GpuSample) if f.name in ATTRS}
DEFAULTS["xid_errors"] = ()

_ENERGY = {m.value: m for m in EnergyMethod}
_TFLOPS = {m.value: m for m in TflopsMethod}
_I_ENERGY, _I_TFLOPS = ATTRS.index("energy_method"), ATTRS.index("tflops_method")
_I_PROCS = ATTRS.index("processes")


class RowDecoder:
    """Makes samples of rows. A GPU's processes are the same tick after tick: one tuple of them
    is shared (kept here), which the store then compares by identity instead of field by field."""

    def __init__(self) -> None:
        self._processes: dict[tuple[Any, ...], tuple[ProcessSample, ...]] = {}

    def sample(self, values: Sequence[Any]) -> GpuSample:
        """A sample from one row."""
        row = list(values)
        if (m := row[_I_ENERGY]) is not None:
            row[_I_ENERGY] = _ENERGY[m]
        if (m := row[_I_TFLOPS]) is not None:
            row[_I_TFLOPS] = _TFLOPS[m]
        if (procs := row[_I_PROCS]) is not None:
            row[_I_PROCS] = self.processes(procs)
        return make_gpu_sample(*row)

    def processes(self, procs: tuple[Any, ...]) -> tuple[ProcessSample, ...]:
        """A row's processes as the sample holds them (shared between equal rows)."""
        shared = self._processes.get(procs)
        if shared is None:
            if len(self._processes) >= 4096:
                self._processes.clear()
            shared = self._processes[procs] = tuple(ProcessSample(*p) for p in procs)
        return shared


@dataclass(frozen=True, slots=True)
class SampleRows:
    """Samples still encoded, as a spool holds them: ``frames`` (each a tick's samples), which
    ``decode`` turns into rows in ``ATTRS`` order. Decoding a frame at a time and dropping its
    rows once used keeps a replay's objects short-lived: rows kept for a whole batch cost
    the garbage collector more than their decoding."""

    frames: list[bytes]
    decode: Callable[[bytes], Sequence[tuple[Any, ...]]]
    decoder: RowDecoder
    count: int  # samples in all frames

    def __len__(self) -> int:
        return self.count

    def rows(self) -> Iterator[Sequence[tuple[Any, ...]]]:
        """The rows of each frame in turn."""
        decode = self.decode
        for frame in self.frames:
            yield decode(frame)

    def samples(self) -> list[GpuSample]:
        """The samples as ``GpuSample`` objects (a store that takes no rows; a batch to bisect)."""
        sample = self.decoder.sample
        return [sample(row) for rows in self.rows() for row in rows]
