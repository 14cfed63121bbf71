"""Bucketing samples into analysis windows and aggregating them per GPU and window.

Windows are aligned to multiples of ``window_s`` since the epoch, so that they coincide with the
store's rollup buckets (a 1-minute rollup row falls entirely inside one 60 s window). The last
window may be partial; ``coverage`` says how much of it has data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

NS_PER_S = 1_000_000_000

#: Gauges averaged per GPU and window (when present in the frame).
GAUGES: tuple[str, ...] = (
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_gpu_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "sm_active_pct",
    "tensor_active_pct",
    "process_count",
)

ID_COLUMNS: tuple[str, ...] = ("gpu", "host", "gpu_index", "uuid", "name")


def window_starts(time_ns: pd.Series | np.ndarray, window_s: float) -> np.ndarray:
    """The start (ns) of the epoch-aligned window each timestamp falls in."""
    w = round(window_s * NS_PER_S)
    t = np.asarray(time_ns, dtype=np.int64)
    return (t // w) * w


def _identity(frame: pd.DataFrame, jobs: Mapping[str, str] | None) -> _Identity:
    """Per row: the GPU key's code, the keys (sorted: ``keys[code]`` is the row's key), the
    job id (object, None for no job), and host and job codes (see ``label_codes``).

    A GPU's key is its uuid, or ``host:index`` when the uuid is unknown. Its job is the row's
    own ``job_id`` when it has one, else ``jobs`` of its uuid, else ``jobs`` of its key. All of
    it is worked out once per distinct (host, index, uuid) and spread to the rows: string work
    per row was most of ``prepare``'s time at 1,000 GPUs.
    """
    hcodes, hosts = pd.factorize(frame["host"], use_na_sentinel=False)
    ucodes, uuids = pd.factorize(frame["uuid"], use_na_sentinel=False)
    icodes, indexes = pd.factorize(frame["gpu_index"], use_na_sentinel=False)
    hosts, uuids = np.asarray(hosts, dtype=object), np.asarray(uuids, dtype=object)
    combo = (hcodes.astype(np.int64) * len(indexes) + icodes) * len(uuids) + ucodes
    uniq, inverse = sorted_unique(combo)
    u_code = uniq % len(uuids)
    rest = uniq // len(uuids)
    h_code, i_code = rest // len(indexes), rest % len(indexes)
    names, combo_jobs = [], []
    for h, i, u in zip(h_code.tolist(), i_code.tolist(), u_code.tolist(), strict=True):
        uuid = uuids[u]
        name = uuid if isinstance(uuid, str) and uuid != "" else f"{hosts[h]}:{indexes[i]}"
        names.append(name)
        job = jobs.get(uuid) if jobs else None
        if jobs and (job is None or job != job):  # None or NaN: try the key
            job = jobs.get(name)
        combo_jobs.append(None if job is None or job != job else job)
    keys, key_code = np.unique(np.array(names, dtype=object), return_inverse=True)
    jobs_of_combos = np.array(combo_jobs, dtype=object)
    job_per_row = jobs_of_combos[inverse]
    job_rank = _sorted_codes(jobs_of_combos)
    job_code = None if job_rank is None else job_rank[inverse]
    if "job_id" in frame.columns:
        own = frame["job_id"].to_numpy(dtype=object)
        has = pd.notna(own) & (own != "")
        if has.any():
            job_per_row = np.where(has, own, job_per_row)
            job_code = _sorted_codes(job_per_row)
    host_rank = _sorted_codes(hosts)
    host_code = None if host_rank is None else host_rank[hcodes]
    return _Identity(key_code[inverse].astype(np.int64), keys, job_per_row, host_code, job_code)


def sorted_unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for many integers with few distinct values:
    hashing them and sorting only the distinct ones is cheaper than sorting them all."""
    codes, uniques = pd.factorize(values)
    order = np.argsort(uniques)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return uniques[order], rank[codes]


@dataclass(frozen=True)
class _Identity:
    gpu_code: np.ndarray  # per row, into ``keys``
    keys: np.ndarray  # the GPU keys, sorted
    job_id: np.ndarray  # per row, object (None: no job)
    host_code: np.ndarray | None  # per row, see ``label_codes`` (None: not sortable)
    job_code: np.ndarray | None


def _sorted_codes(values: np.ndarray) -> np.ndarray | None:
    """Codes of ``values`` in the sorted order of the distinct values, -1 for missing, as
    ``pd.factorize(values, sort=True)`` numbers them; None when they cannot be sorted."""
    try:
        codes, _ = pd.factorize(values, sort=True)
    except TypeError:  # mixed types
        return None
    return codes.astype(np.int64)


def label_codes(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(frame[column], sort=True)`` as (codes, labels as an object array).

    From the integer ``<column>_code`` that ``prepare`` adds, when the frame has it: the
    analysis groups GPU windows by host and by job in several places, and hashing the strings
    of every row each time was a large part of its cost at 1,000 GPUs.
    """
    code_column = f"{column}_code"
    if code_column not in frame.columns:
        per_gpu = _per_gpu_label_codes(frame, column)
        if per_gpu is not None:
            return per_gpu
        codes, labels = pd.factorize(frame[column], sort=True)
        return codes.astype(np.int64), np.asarray(labels, dtype=object)
    # the codes are small integers: renumbering them densely needs a count, not a sort
    shifted = frame[code_column].to_numpy(dtype=np.int64) + 1  # missing (-1) -> 0
    seen = np.bincount(shifted, minlength=1) > 0
    seen[0] = False  # missing values get no label
    dense = np.cumsum(seen) - 1  # by raw code; -1 for missing
    row_of = np.zeros(len(seen), dtype=np.int64)
    row_of[shifted] = np.arange(len(shifted))  # a row holding each code (all share its label)
    return dense[shifted], frame[column].to_numpy(dtype=object)[row_of[seen]]


def _per_gpu_label_codes(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``label_codes`` of a column that holds one value per GPU (a model name), hashing one
    value per ``gpu_code`` instead of every row (~5 ms less per call at 1,024 GPUs x 1 h);
    None when the frame has no ``gpu_code`` or a GPU's rows differ (NaN included)."""
    per_gpu = _per_gpu_values(frame, column)
    if per_gpu is None:
        return None
    reps, rep_of_row = per_gpu
    codes, labels = pd.factorize(reps, sort=True)
    return codes.astype(np.int64)[rep_of_row], np.asarray(labels, dtype=object)


def _per_gpu_values(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A column that holds one value per GPU as (each GPU's value, the index of its row's GPU
    in them); None when the frame has no ``gpu_code`` or a GPU's rows differ (NaN included)."""
    if "gpu_code" not in frame.columns or len(frame) == 0:
        return None
    g = frame["gpu_code"].to_numpy(dtype=np.int64)
    values = frame[column].to_numpy(dtype=object)
    first = np.full(int(g.max()) + 1, len(g), dtype=np.int64)
    np.minimum.at(first, g, np.arange(len(g)))
    present = first < len(g)
    reps = values[first[present]]
    rep_of_row = (np.cumsum(present) - 1)[g]
    if not bool((values == reps[rep_of_row]).all()):
        return None
    return reps, rep_of_row


def model_codes(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(rows["name"].astype(str))``: per row a code into the model names as
    strings (-1: no name), up to the order of the names; from one name per GPU where the rows
    have ``gpu_code`` (converting and hashing the names of every row was ~5 ms of each caller
    at 1,024 GPUs x 1 h)."""
    per_gpu = _per_gpu_values(rows, "name")
    if per_gpu is None:
        codes, names = pd.factorize(rows["name"].astype(str).to_numpy())
        return codes, np.asarray(names, dtype=object)
    reps, rep_of_row = per_gpu
    codes, names = pd.factorize(pd.Series(reps, dtype=object).astype(str).to_numpy())
    return codes[rep_of_row], np.asarray(names, dtype=object)


def gpu_keys(frame: pd.DataFrame) -> pd.Series:
    """A GPU's identity: its uuid, or ``host:index`` when the uuid is unknown."""
    if frame.empty:
        return pd.Series([], index=frame.index, dtype=str)
    ident = _identity(frame, None)
    return pd.Series(ident.keys[ident.gpu_code], index=frame.index).astype(str)


def prepare(
    frame: pd.DataFrame,
    *,
    now_ns: int,
    window_s: float,
    start_ns: int | None = None,
    jobs: Mapping[str, str] | None = None,
    job: str | None = None,
) -> pd.DataFrame:
    """Restrict to ``[start_ns, now_ns)``, add ``gpu``, ``window_start_ns`` and ``job_id``.

    ``jobs`` maps a uuid (or ``host:index``) to a job id for rows that carry none; ``job``
    keeps only that job's GPUs. Rows are sorted by GPU then time, and ``gpu_code`` numbers
    the GPUs in the sorted order of their keys.
    """
    t = frame["time_ns"].to_numpy(dtype=np.int64)
    keep = t < now_ns
    if start_ns is not None:
        keep &= t >= start_ns
    rows = np.flatnonzero(keep)
    sub = frame.take(rows) if len(rows) < len(frame) else frame
    empty = np.zeros(0, dtype=np.int64)
    ident = (
        _identity(sub, jobs)
        if len(sub)
        else _Identity(empty, np.zeros(0, dtype=object), np.zeros(0, dtype=object), empty, empty)
    )
    codes, keys, job_ids = ident.gpu_code, ident.keys, ident.job_id
    extra = {"host_code": ident.host_code, "job_id_code": ident.job_code}
    if job is not None:
        mine = job_ids == job
        rows, job_ids = rows[mine], job_ids[mine]
        present, codes = np.unique(codes[mine], return_inverse=True)  # codes stay dense
        keys = keys[present]
        extra = {k: None if v is None else v[mine] for k, v in extra.items()}
    order = np.lexsort((t[rows], codes))  # by GPU, then time (stable)
    out = frame.take(rows[order]).reset_index(drop=True)
    codes = codes[order]
    out["gpu"] = pd.Series(keys[codes], dtype=object).astype(str)
    out["job_id"] = pd.Series(job_ids[order], dtype=object)
    out["window_start_ns"] = window_starts(out["time_ns"], window_s)
    for col in GAUGES:
        if col in out.columns and out[col].dtype != np.float64:
            out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    out["gpu_code"] = codes  # integer identity: cheap to sort and group by
    for column, values in extra.items():  # see ``label_codes``
        if values is not None:
            out[column] = values[order]
    return out


def per_gpu_window(
    rows: pd.DataFrame, *, sums: tuple[str, ...] = (), means: tuple[str, ...] = ()
) -> pd.DataFrame:
    """One row per (window, GPU): gauge means, ``samples``, sums of ``sums`` columns, the job.

    Columns starting with ``frac_`` (per-row 0/1/NaN flags) are averaged into fractions, as are
    the GAUGES and ``means`` present in the rows. Means skip NaN; a sum with no value is NaN.
    Rows must be sorted by GPU then time (as ``prepare`` leaves them): a (window, GPU) is then
    a run of consecutive rows, reduced in one pass (``reduceat``); the identity and job of a
    (window, GPU) are those of its newest row. Output rows are ordered by window, then GPU.
    """
    n = len(rows)
    gcodes = rows["gpu_code"].to_numpy(dtype=np.int64)
    w = rows["window_start_ns"].to_numpy(dtype=np.int64)
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (gcodes[1:] != gcodes[:-1]) | (w[1:] != w[:-1])
    starts = np.flatnonzero(new_run)
    m = len(starts)
    ends = np.append(starts[1:], n)
    order = np.lexsort((gcodes[starts], w[starts]))  # by window, then GPU
    singles = m == n  # one row per (window, GPU): the usual case (rollups read at the window)
    ident = ["gpu", "gpu_code", "host", "gpu_index", "uuid", "name", "job_id"]
    ident += [c for c in ("host_code", "job_id_code") if c in rows.columns]
    out = rows[ident].take((ends - 1)[order]).reset_index(drop=True)
    out.insert(0, "window_start_ns", w[starts][order])
    cols: dict[str, np.ndarray] = {}
    mean_cols = [c for c in rows.columns if c in GAUGES or c in means or c.startswith("frac_")]
    sum_cols = [c for c in sums if c in rows.columns]
    samples = (ends - starts)[order]
    for col in (*mean_cols, "samples", *sum_cols):
        if col == "samples":
            cols[col] = samples
            continue
        v = rows[col].to_numpy(dtype=float)
        ok = np.isfinite(v)
        if singles:
            cols[col] = np.where(ok, v, np.nan)[order]
            continue
        cnt = np.add.reduceat(ok.astype(np.int64), starts)[order]
        tot = np.add.reduceat(np.where(ok, v, 0.0), starts)[order]
        with np.errstate(divide="ignore", invalid="ignore"):
            cols[col] = np.where(cnt > 0, tot / cnt if col in mean_cols else tot, np.nan)
    return pd.concat([out, pd.DataFrame(cols)], axis=1)


def window_list(rows: pd.DataFrame) -> list[int]:
    return sorted(int(x) for x in pd.unique(rows["window_start_ns"]))


def run_lengths(gpus: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """For rows sorted by GPU then window: the length of the run of True flags ending at each row.

    Consecutive rows of one GPU are taken as consecutive windows (a GPU with no data in a window
    simply has no row there).
    """
    n = len(flags)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    f = np.asarray(flags, dtype=bool)
    new_gpu = np.ones(n, dtype=bool)
    new_gpu[1:] = gpus[1:] != gpus[:-1]
    # a run starts at a break (a new GPU or a False flag); after it every row is True, so the
    # count at a row is its distance from the run's start, plus one if that start is True
    breaks = new_gpu | ~f
    pos = np.arange(n)
    start = np.maximum.accumulate(np.where(breaks, pos, 0))
    return np.where(f, pos - start + f[start], 0)
