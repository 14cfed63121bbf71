"""The per (window, GPU) table every part of the analysis starts from (energy, seen time,
TFLOPS and straggler scores added to the prepared samples), the GPUs lost in the range, and
the straggler findings read from it (``find_stragglers_in``: stragglers without the rest)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.analytics.accounting import (
    add_row_seen,
    add_sample_seen,
    keep_in_range,
    measured,
    slot_ends_ns,
    slot_ns_of,
    stored_seen_s,
)
from gpuwatt.analytics.balance import mark_idle
from gpuwatt.analytics.efficiency import add_row_tflops
from gpuwatt.analytics.energy import add_row_energy, median_step_ns
from gpuwatt.analytics.reasons import add_bit_columns
from gpuwatt.analytics.stragglers import Straggler, StragglerConfig, find_stragglers, score_windows
from gpuwatt.analytics.windows import NS_PER_S, per_gpu_window, prepare, window_starts


@dataclass(frozen=True)
class StragglerFindings:
    """The straggler part of an analysis, as ``find_stragglers_in`` returns it: the same two
    fields of the ``AnalysisSummary`` of the same call to ``analyze``."""

    stragglers: list[Straggler]  # ranked: active first, then severity
    straggler_windows: pd.DataFrame  # per (window, GPU) scores, peer medians, anomalous, flagged


@dataclass(frozen=True)
class LostGpu:
    """A GPU reported lost (fallen off the bus) in the range and not seen since."""

    host: str
    gpu_index: int
    uuid: str
    name: str
    last_seen_ns: int | None  # its newest measured row in the analysed rows (None: none)
    lost_since_ns: int  # its first lost marker after that


@dataclass(frozen=True)
class GpuWindows:
    gw: pd.DataFrame  # per (window, GPU), see ``per_gpu_window``
    step_ns: int  # the samples' median step
    #: per (window, GPU) of the range and the context rows before it: the straggler scores
    scored: pd.DataFrame
    lost: list[LostGpu]
    #: the samples prepared (lost ones dropped), and which of them are in the range (None: all)
    prepared: pd.DataFrame
    in_range: np.ndarray | None = None

    def rows(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The samples analysed (prepared, lost ones dropped, in the range, ``gpu_code``
        numbered densely), with only ``columns`` where given: a copy of every column, the
        identity strings of each row included, was ~12 ms at 1,024 GPUs x 1 h where the
        summary reads a few (``time_ns``, ``gpu_code``, ``name``, the energy and TFLOPS
        sources)."""
        return _rows_in(self.prepared, self.in_range, columns)


def _rows_in(
    prepared: pd.DataFrame, in_range: np.ndarray | None, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """``GpuWindows.rows``."""
    if in_range is None:
        return prepared if columns is None else prepared[list(columns)]
    kept = prepared.loc[in_range] if columns is None else prepared.loc[in_range, list(columns)]
    return _dense(kept.reset_index(drop=True))


def lost_gpus(rows: pd.DataFrame, ok: np.ndarray) -> list[LostGpu]:
    """GPUs whose newest rows hold no measurement (lost-GPU markers, or buckets of only
    markers: both stores keep them as rows), with when they were last seen and since when
    they are lost."""
    if rows.empty or ok.all():
        return []
    marker = ~ok
    out: list[LostGpu] = []
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    codes = rows["gpu_code"].to_numpy(dtype=np.int64)
    for code in np.unique(codes[marker]):
        mine = np.flatnonzero(codes == code)
        if ok[mine[-1]]:
            continue  # seen again after its markers: not lost now
        seen = mine[ok[mine]]
        last_seen = int(t[seen[-1]]) if len(seen) else None
        first_marker = mine[marker[mine] & (t[mine] > (last_seen if last_seen is not None else -1))]
        r = rows.iloc[int(mine[-1])]
        out.append(
            LostGpu(str(r["host"]), int(r["gpu_index"]), str(r["uuid"]), str(r["name"]),
                    last_seen, int(t[first_marker[0]]))
        )  # fmt: skip
    return out


def gpu_windows(
    frame: pd.DataFrame,
    *,
    now_ns: int,
    window_s: float,
    start_ns: int | None,
    jobs: Mapping[str, str] | None,
    job: str | None,
    tensor_precision: str,
    idle_util_pct: float,
    step_s: float | None = None,
    straggler_config: StragglerConfig | None = None,
) -> GpuWindows | str:
    """The per (window, GPU) table every part of the analysis starts from, or why there is
    none (a note for the empty summary). Rows before ``start_ns`` are context
    (``analytics.accounting``): the newest one of each GPU starts its counter, and those within
    the straggler persistence before the range let a straggler keep its true onset."""
    rows = prepare(frame, now_ns=now_ns, window_s=window_s, start_ns=None, jobs=jobs, job=job)
    if start_ns is None:
        start_ns = int(rows["time_ns"].min()) if len(rows) else now_ns
    t_all = rows["time_ns"].to_numpy(dtype=np.int64)
    ok = measured(rows)
    if not step_s:  # raw samples: each one's slot, where the store did not give it
        add_sample_seen(rows, ok)
    ok_in = ok[t_all >= start_ns]
    lost = (
        [] if ok_in.all() else lost_gpus(rows.loc[t_all >= start_ns].reset_index(drop=True), ok_in)
    )
    if not ok.any():
        return "every GPU was lost in the analysed range" if len(rows) else "no samples"
    if not ok.all():
        rows = rows.loc[ok].reset_index(drop=True)
    step_ns = median_step_ns(rows)
    slot = slot_ns_of(step_s, step_ns, now_ns - start_ns)
    bucket_ns = round(step_s * NS_PER_S) if step_s else None
    slot_end = slot_ends_ns(rows, end_ns=now_ns, slot_ns=slot, bucket_ns=bucket_ns)
    stored_s = stored_seen_s(rows)
    add_row_energy(rows, step_ns=slot, slot_end_ns=slot_end, fill_s=stored_s)
    add_row_seen(rows, start_ns=start_ns, slot_end_ns=slot_end, stored_s=stored_s)
    add_row_tflops(rows, tensor_precision=tensor_precision)
    add_bit_columns(rows)
    t = rows["time_ns"].to_numpy(dtype=np.int64)
    in_range = keep_in_range(rows, start_ns)
    if not in_range.any():
        return "every GPU was lost in the analysed range" if lost else "no samples in the range"
    if rows["carried"].any():  # moved to the range's start: into its first window
        rows["window_start_ns"] = window_starts(rows["time_ns"], window_s)
    sums = ("energy_delta_j", "seen_s")
    means = ("tflops", "tflops_gpm")
    cfg = straggler_config or StragglerConfig()
    if in_range.all():
        full = per_gpu_window(rows, sums=sums, means=means)
        mark_idle(full, idle_util_pct=idle_util_pct)
        scored = score_windows(full, cfg)
        gw = full
        scored_codes: np.ndarray | None = gw["gpu_code"].to_numpy()
        subset: np.ndarray | None = None  # every row prepared is in the range
    else:
        lookback_ns = round(cfg.window_n * window_s * NS_PER_S)
        near = in_range | (t >= start_ns - lookback_ns)
        # the context's energy is before the range: not in the peers' waiting energy either
        rows.loc[~in_range, "energy_delta_j"] = 0.0
        rows_near = rows if near.all() else rows.loc[near].reset_index(drop=True)
        full = per_gpu_window(rows_near, sums=sums, means=means)
        mark_idle(full, idle_util_pct=idle_util_pct)
        scored = score_windows(full, cfg)
        in_full = _windows_in_range(rows_near, in_range[near])
        scored_codes = None
        subset = in_range
        if in_full is None:  # a window holds rows on both sides of the range's start
            rows, subset = _rows_in(rows, in_range), None
            gw = per_gpu_window(rows, sums=sums, means=means)
            mark_idle(gw, idle_util_pct=idle_util_pct)
        else:  # the range's windows of ``full`` are those of the range's rows
            scored_codes = full["gpu_code"].to_numpy()[in_full]
            gw = _dense(full.loc[in_full].reset_index(drop=True))
    # straggler seconds: the seen time of the rows in a window where the GPU was flagged; the
    # GPUs matched by ``scored``'s codes where ``gw``'s rows have them (integers, not strings)
    flagged = scored["flagged"].to_numpy(dtype=bool)
    if scored_codes is None:
        fl = scored.loc[flagged, ["window_start_ns", "gpu"]]
        key = pd.MultiIndex.from_arrays([gw["window_start_ns"], gw["gpu"]])
        was_flagged = key.isin(pd.MultiIndex.from_frame(fl))
    else:
        was_flagged = _pairs_in(
            (gw["window_start_ns"].to_numpy(dtype=np.int64), scored_codes),
            (
                scored["window_start_ns"].to_numpy(dtype=np.int64)[flagged],
                scored["gpu_code"].to_numpy(dtype=np.int64)[flagged],
            ),
        )
    gw["straggler_s"] = np.where(was_flagged, gw["seen_s"], 0.0)
    # idle: decided per window (its mean utilisation), so raw samples and buckets agree
    gw["idle_s"] = np.where(gw["idle"], gw["seen_s"], 0.0)
    gw["idle_energy_j"] = np.where(gw["idle"], gw["energy_delta_j"], 0.0)
    return GpuWindows(gw, step_ns, scored, lost, rows, subset)


def _pairs_in(
    pairs: tuple[np.ndarray, np.ndarray], among: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Per (window start, GPU code) pair of ``pairs``: whether it is one of ``among``'s, each
    pair as one integer (a ``MultiIndex.isin`` of the same pairs was ~8 ms at 1,024 GPUs x
    1 h)."""
    (w, g), (w_among, g_among) = pairs, among
    if not len(w_among) or not len(w):
        return np.zeros(len(w), dtype=bool)
    w_codes, _ = pd.factorize(np.concatenate([w, w_among]))
    width = int(max(g.max(), g_among.max())) + 1
    key = w_codes * width + np.concatenate([g, g_among])
    return np.isin(key[: len(w)], key[len(w) :])


def _windows_in_range(rows: pd.DataFrame, in_range: np.ndarray) -> np.ndarray | None:
    """Which rows of ``per_gpu_window(rows)`` are windows of the rows in range (in its output
    order), or None when a window mixes rows in and out of the range. Taking them from the
    context's table is ~20 ms less than a second ``per_gpu_window`` at 1,024 GPUs x 1 h."""
    gcodes = rows["gpu_code"].to_numpy(dtype=np.int64)
    w = rows["window_start_ns"].to_numpy(dtype=np.int64)
    new_run = np.ones(len(rows), dtype=bool)
    new_run[1:] = (gcodes[1:] != gcodes[:-1]) | (w[1:] != w[:-1])
    starts = np.flatnonzero(new_run)
    n_in = np.add.reduceat(in_range.astype(np.int64), starts) if len(starts) else starts
    if ((n_in > 0) & (n_in < np.diff(np.append(starts, len(rows))))).any():
        return None
    order = np.lexsort((gcodes[starts], w[starts]))  # as ``per_gpu_window`` orders them
    return (n_in > 0)[order]


def _dense(rows: pd.DataFrame) -> pd.DataFrame:
    """Renumber ``gpu_code`` densely after rows were dropped (as ``np.unique``'s inverse
    numbers them; the codes are small integers: a count, not a sort)."""
    codes = rows["gpu_code"].to_numpy(dtype=np.int64)
    if not len(codes):
        return rows
    present = np.bincount(codes) > 0
    rows["gpu_code"] = (np.cumsum(present) - 1)[codes]
    return rows


def straggler_findings(w: GpuWindows, cfg: StragglerConfig) -> StragglerFindings:
    sw = w.scored
    found = find_stragglers(sw, cfg, reasons_sampled=w.step_ns >= 10 * NS_PER_S)
    first_window = int(w.gw["window_start_ns"].min()) if len(w.gw) else 0
    found = [s for s in found if s.last_ns >= first_window]  # not one that ended before
    keep = sw["window_start_ns"].to_numpy() >= first_window
    in_range = sw if keep.all() else sw.loc[keep].reset_index(drop=True)  # no context: no copy
    return StragglerFindings(found, in_range)


def find_stragglers_in(
    frame: pd.DataFrame,
    *,
    now_ns: int,
    window_s: float = 60.0,
    start_ns: int | None = None,
    jobs: Mapping[str, str] | None = None,
    job: str | None = None,
    tensor_precision: str = "bf16",
    idle_util_pct: float = 5.0,
    straggler_config: StragglerConfig | None = None,
    step_s: float | None = None,
) -> StragglerFindings:
    """``analyze``'s stragglers alone (the same arguments give the same result), without the
    load balance, energy and efficiency parts: about half its cost at 1,000 GPUs. For a caller
    that needs only them, such as the dashboard's look at the newest hour of a long range."""
    w = gpu_windows(
        frame,
        now_ns=now_ns,
        window_s=window_s,
        start_ns=start_ns,
        jobs=jobs,
        job=job,
        tensor_precision=tensor_precision,
        idle_util_pct=idle_util_pct,
        step_s=step_s,
        straggler_config=straggler_config,
    )
    if isinstance(w, str):
        return StragglerFindings([], pd.DataFrame())
    return straggler_findings(w, straggler_config or StragglerConfig())
