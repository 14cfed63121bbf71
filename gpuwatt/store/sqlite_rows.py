"""The embedded store's writer for samples that come as rows (``sample_rows``): a replayed spool.

``write_samples`` reads each ``GpuSample``'s attributes one by one into a packed row; a spool
replay would first have to build those objects from the rows it decodes. Here the rows go
straight into the head's float64 matrix, one NumPy conversion per frame (None is NaN, "not
measured", as the head stores it), and each GPU's identity and tail (``sqlite_schema.KEY_ATTRS``) is
compared as decoded: a GPU's state is looked up in the writer's (``SqliteStore._states``) only
when its decoded key changes (a frame whose keys are the frame before's reuses its ids whole), so
the stored rows, GPU ids and tails are the ones ``write_samples`` gives for the same samples.

Cost (``bench/spool_replay.py``, 120,000 demo samples, CPU on a shared 2-core machine): ~0.09 s
MessagePack decoding, ~0.2 s picking and converting the values, ~0.03 s the keys; the store's own
work after it (``pack_vals``, rollups, compaction) ~0.6 s.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpuwatt.model import EnergyMethod, TflopsMethod
from gpuwatt.sample_rows import ATTRS, RowDecoder, SampleRows
from gpuwatt.store.rounds import Layout, Masked

_I_TIME = ATTRS.index("time_ns")
_TIME = operator.itemgetter(_I_TIME)

#: A GPU's writer state, as ``SqliteStore`` keeps it (``GpuState``).
State = Any


class GpuState:
    """What the writer keeps per GPU: its id, its last ``sqlite_schema.KEY_ATTRS`` values, the
    id of that tail (a float: it is packed with the values) and its ``rounds.Masked`` plan."""

    __slots__ = ("gid", "key", "plan", "tail")

    def __init__(self, gid: int, key: tuple[Any, ...], tail: float, plan: Masked | None) -> None:
        self.gid = gid
        self.key = key
        self.tail = tail
        self.plan = plan


class RowEncoder:
    """Rows -> the head's packed values (``rounds.Layout``: lost, metric columns, tail id)."""

    def __init__(self, key_attrs: Sequence[str], layout: Layout) -> None:
        present = [(j, ATTRS.index(a)) for j, a in enumerate(layout.row_attrs) if a in ATTRS]
        self._width = layout.width
        self._cols = [j for j, _ in present]  # a column the model no longer has: NaN
        self._dense = self._cols == list(range(layout.width - 1))
        self._pick = operator.itemgetter(*(i for _, i in present))
        self._key = operator.itemgetter(*(ATTRS.index(a) for a in key_attrs))
        self._i_key_procs = list(key_attrs).index("processes")
        self._i_key_energy = list(key_attrs).index("energy_method")
        self._i_key_tflops = list(key_attrs).index("tflops_method")
        #: by UUID: (the key as decoded, the writer's state it stands for)
        self._seen: dict[str, tuple[tuple[Any, ...], State]] = {}
        #: the last frame's keys, and its GPU ids and tails (the next frame's, mostly)
        self._frame: tuple[list[tuple[Any, ...]], list[int], list[float]] | None = None

    def forget(self) -> None:
        """Forget the keys seen: the writer made or dropped a GPU's state (``new_state``)."""
        self._seen.clear()
        self._frame = None

    def encode(
        self,
        rows: SampleRows,
        states: dict[str, State],
        new_state: Callable[[tuple[Any, ...], int], State],
    ) -> tuple[np.ndarray, list[int], np.ndarray]:
        """(values, GPU ids, times): ``values[i]`` is sample ``i`` packed as the head stores it.
        ``new_state(key, time_ns)`` makes and records the state of a GPU whose key (with
        enums and ``ProcessSample`` objects, as ``write_samples`` sees it) is new or changed.
        Raises ``TypeError`` or ``ValueError`` for a value that is not a number."""
        key_of, pick, time_of = self._key, self._pick, _TIME
        gids: list[int] = []
        tails: list[float] = []
        times: list[int] = []
        blocks: list[np.ndarray] = []
        for frame in rows.rows():  # a frame at a time: its rows die young (see SampleRows)
            keys = list(map(key_of, frame))
            last = self._frame
            if last is None or keys != last[0]:  # mostly the same GPUs as the frame before
                last = self._frame = self._ids(keys, frame, rows, states, new_state)
            gids += last[1]
            tails += last[2]
            times += map(time_of, frame)
            blocks.append(np.array(list(map(pick, frame)), dtype=np.float64))
        picked = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        n = len(picked)
        if self._dense:
            values = np.empty((n, self._width))
            values[:, :-1] = picked
        else:
            values = np.full((n, self._width), np.nan)
            values[:, self._cols] = picked
        values[:, -1] = tails
        return values, gids, np.array(times, dtype=np.int64)

    def _ids(
        self,
        keys: list[tuple[Any, ...]],
        frame: Sequence[tuple[Any, ...]],
        rows: SampleRows,
        states: dict[str, State],
        new_state: Callable[[tuple[Any, ...], int], State],
    ) -> tuple[list[tuple[Any, ...]], list[int], list[float]]:
        """A frame's keys, and its samples' GPU ids and tail ids."""
        seen = self._seen
        gids: list[int] = []
        tails: list[float] = []
        for key, row in zip(keys, frame, strict=True):
            uuid = key[2]
            known = seen.get(uuid)
            if known is None or known[0] != key:
                st = self._state(key, row[_I_TIME], rows.decoder, states, new_state)
                known = seen[uuid] = (key, st)  # after new_state, which clears ``seen``
            gids.append(known[1].gid)
            tails.append(known[1].tail)
        return keys, gids, tails

    def _state(
        self,
        raw: tuple[Any, ...],
        time_ns: int,
        decoder: RowDecoder,
        states: dict[str, State],
        new_state: Callable[[tuple[Any, ...], int], State],
    ) -> State:
        key = list(raw)
        for i, convert in ((self._i_key_energy, EnergyMethod), (self._i_key_tflops, TflopsMethod)):
            if key[i] is not None:
                key[i] = convert(key[i])
        if key[self._i_key_procs] is not None:
            key[self._i_key_procs] = decoder.processes(key[self._i_key_procs])
        model_key = tuple(key)
        st = states.get(raw[2])
        if st is None or st.key != model_key:
            st = new_state(model_key, time_ns)
        return st
