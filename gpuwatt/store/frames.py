"""What the embedded store's reads hand back: long frames (``Store.series``) and samples
(``Store.latest``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuwatt.line_protocol import parse_processes
from gpuwatt.model import EnergyMethod, GpuSample, TflopsMethod, make_gpu_sample
from gpuwatt.schema import FIELD_BY_ATTR, FIELDS, Kind
from gpuwatt.store.base import SEEN_COLUMN

if TYPE_CHECKING:
    import pandas as pd


def frame(
    columns: dict[str, Any], attrs: Sequence[str], gpus: list[tuple[Any, ...]]
) -> pd.DataFrame:
    """Columns time_ns, gpu_id and attrs as the long frame, GPU identity joined in numpy.

    Joining and sorting on the small gpus table in numpy, rather than in SQL on every row, keeps
    an hour of 1,024 GPUs' rollups cheap: no per-row strings cross the sqlite3 boundary.
    """
    import pandas as pd

    ident = pd.DataFrame.from_records(gpus, columns=["gpu_id", "host", "gpu_index", "uuid", "name"])
    ident = ident.sort_values(["host", "gpu_index", "uuid"], kind="stable").reset_index(drop=True)
    rank = np.full(int(ident["gpu_id"].max()) + 1 if len(ident) else 1, -1, dtype=np.int64)
    rank[ident["gpu_id"].to_numpy(dtype=np.int64)] = np.arange(len(ident))
    gpu_rank = rank[columns["gpu_id"]]
    time_ns = columns["time_ns"]
    order = np.lexsort((gpu_rank, time_ns))
    gpu_rank = gpu_rank[order]
    out = pd.DataFrame(
        {
            "time_ns": time_ns[order],
            "host": ident["host"].to_numpy(dtype=object)[gpu_rank],
            "gpu_index": ident["gpu_index"].to_numpy(dtype=np.int64)[gpu_rank],
            "uuid": ident["uuid"].to_numpy(dtype=object)[gpu_rank],
            "name": ident["name"].to_numpy(dtype=object)[gpu_rank],
        }
    )
    for a in attrs:
        out[a] = columns[a][order]
    if "seen_ns" in columns:  # each row's seen time (NaN: not known; Store.series)
        seen = np.asarray(columns["seen_ns"], dtype=np.int64)[order]
        out[SEEN_COLUMN] = np.where(seen >= 0, seen / 1e9, np.nan)
    return out


#: How to convert a metric's stored float, per attribute of the schema.
_CONVERTERS: dict[str, Callable[[float], Any]] = {
    a: {Kind.BOOL: bool, Kind.FLOAT: float, Kind.INT: int}[FIELD_BY_ATTR[a].kind]
    for a in (f.attr for f in FIELDS)
}


def sample_from_row(
    ident: Sequence[Any], metrics: dict[str, float], tail: Sequence[Any]
) -> GpuSample:
    """A sample from (time_ns, host, gpu_index, uuid, name, lost), its stored metrics by
    attribute (NaN: not measured; a column the schema no longer has is ignored) and the
    tail's columns."""
    time_ns, host, gpu_index, uuid, name, lost = ident
    kwargs: dict[str, Any] = {
        attr: _CONVERTERS[attr](v)
        for attr, v in metrics.items()
        if v == v and attr in _CONVERTERS  # not NaN
    }
    em, tm, xid_last, _xid_count, procs, job_id = tail
    if em is not None:
        kwargs["energy_method"] = EnergyMethod(em)
    if tm is not None:
        kwargs["tflops_method"] = TflopsMethod(tm)
    if xid_last is not None:
        kwargs["xid_errors"] = (int(xid_last),)
    if procs is not None:
        kwargs["processes"] = parse_processes(procs)
    if job_id is not None:
        kwargs["job_id"] = job_id
    # make_gpu_sample: the same GpuSample as the keyword constructor, ~10x cheaper (latest()
    # builds one per GPU on every dashboard refresh).
    return make_gpu_sample(
        time_ns=time_ns,
        host=host,
        gpu_index=gpu_index,
        uuid=uuid,
        name=name,
        lost=bool(lost),
        **kwargs,
    )
