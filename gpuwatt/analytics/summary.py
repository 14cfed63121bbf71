"""One call for everyone: ``analyze`` turns a frame of samples into the load-balance, straggler and
efficiency summary. The CLI, the dashboard and the alert evaluator all call it, so a straggler on
screen and a straggler alert are the same computation.

Pure: no I/O and no clock reads; the current time comes in as ``now_ns``. The frame is the
store's long format (``time_ns, host, gpu_index, uuid, name`` then metric columns named as the
``GpuSample`` attributes, NaN = not measured), raw samples or rollups (``step_s=60`` rows are
bucket means, counters the last value). An optional ``job_id`` column (None/NaN/"" = no job) and
``process_count`` are used when present. Designed for 1-minute rollups: 1,024 GPUs x 60 rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuwatt.analytics.accounting import (
    add_row_seen,
    keep_in_range,
    measured,
    slot_ends_ns,
    slot_ns_of,
)
from gpuwatt.analytics.balance import (
    CLUSTER,
    DEFAULT_INDEX,
    IdleGpu,
    balance_over_time,
    idle_gpus,
    mark_idle,
)
from gpuwatt.analytics.efficiency import add_row_tflops, efficiency_over_time, gpu_tflops_quality
from gpuwatt.analytics.energy import (
    WRITERS_CONFLICTS,
    Tariff,
    add_cost_columns,
    add_row_energy,
    energy_figures,
    gpu_energy_quality,
    median_step_ns,
)
from gpuwatt.analytics.quality import Figure, Quality, not_available, worst
from gpuwatt.analytics.reasons import add_bit_columns
from gpuwatt.analytics.reported import JobWork, reported_work
from gpuwatt.analytics.stragglers import Straggler, StragglerConfig, find_stragglers, score_windows
from gpuwatt.analytics.windows import (
    NS_PER_S,
    label_codes,
    per_gpu_window,
    prepare,
    sorted_unique,
    window_list,
    window_starts,
)


@dataclass(frozen=True)
class AnalysisSummary:
    now_ns: int
    start_ns: int
    window_s: float
    windows: list[int]  # window starts (ns), oldest first
    gpus: int
    nodes: int
    jobs: list[str]
    default_imbalance_index: str  # "cv" (see gpuwatt.analytics.balance)
    balance: pd.DataFrame  # window_start_ns, scope, level, metric, n, mean, min, max, cv, ...
    idle: list[IdleGpu]  # idle for the newest windows; allocated ones first
    stragglers: list[Straggler]  # ranked: active first, then severity
    straggler_windows: pd.DataFrame  # per (window, GPU) scores, peer medians, anomalous, flagged
    gpu_windows: pd.DataFrame  # per (window, GPU) means, fault fractions, energy, tflops
    energy_by_gpu: pd.DataFrame
    energy_by_node: pd.DataFrame
    energy_by_job: pd.DataFrame
    efficiency_over_time: pd.DataFrame  # window_start_ns, tflops, power_w, tflops_per_w, ...
    cluster: dict[str, Figure]
    tariff: Tariff
    notes: list[str] = field(default_factory=list)
    # application-reported work (``analyze(job_steps=...)``; see gpuwatt.analytics.reported)
    job_work: list[JobWork] = field(default_factory=list)
    job_work_windows: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: GPUs lost in the range and not seen since (their lost time is in no figure)
    lost: list[LostGpu] = field(default_factory=list)

    @property
    def idle_allocated(self) -> list[IdleGpu]:
        return [i for i in self.idle if i.allocated]

    @property
    def active_stragglers(self) -> list[Straggler]:
        return [s for s in self.stragglers if s.active]

    def imbalance(
        self,
        scope: str = CLUSTER,
        metric: str = "utilization_gpu_pct",
        index: str | None = None,
        level: str = "gpu",
    ) -> pd.Series:
        """The imbalance index over time (indexed by window start) for one scope and metric."""
        b = self.balance
        sel = b.loc[(b["scope"] == scope) & (b["metric"] == metric) & (b["level"] == level)]
        return sel.set_index("window_start_ns")[index or self.default_imbalance_index]


def _empty(now_ns: int, window_s: float, tariff: Tariff, note: str) -> AnalysisSummary:
    na = not_available("", "no samples in the window")
    e = pd.DataFrame()
    return AnalysisSummary(
        now_ns, now_ns, window_s, [], 0, 0, [], DEFAULT_INDEX, balance_over_time(e), [], [], e, e,
        e, e, e, e, {k: na for k in ("energy_kwh", "cost", "co2_kg")}, tariff, [note],
    )  # fmt: skip


def _nanmean_by(codes: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    ok = np.isfinite(v)
    cnt = np.bincount(codes, weights=ok, minlength=n)
    tot = np.bincount(codes, weights=np.where(ok, v, 0.0), minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cnt > 0, tot / cnt, np.nan)


def _seen_mean_by(codes: np.ndarray, v: np.ndarray, seen_s: np.ndarray, n: int) -> np.ndarray:
    """Means weighted by seen time (docs/accounting.md, "Utilisation")."""
    ok = np.isfinite(v) & (seen_s > 0)
    w = np.where(ok, seen_s, 0.0)
    tot = np.bincount(codes, weights=np.where(ok, v * w, 0.0), minlength=n)
    den = np.bincount(codes, weights=w, minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, tot / den, np.nan)


def _nansum_by(codes: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    ok = np.isfinite(v)
    cnt = np.bincount(codes, weights=ok, minlength=n)
    tot = np.bincount(codes, weights=np.where(ok, v, 0.0), minlength=n)
    return np.where(cnt > 0, tot, np.nan)


def _by(gw: pd.DataFrame, key: str, per_gpu: pd.DataFrame, tariff: Tariff) -> pd.DataFrame:
    """Energy, power and utilisation per node (``host``) or per job, from the GPU windows."""
    all_codes, uniq = label_codes(gw, key)
    keep = all_codes >= 0
    if not keep.any():
        return pd.DataFrame(columns=[key, "gpus", "energy_j", "idle_energy_j", "energy_quality"])
    codes = all_codes[keep]
    n = len(uniq)
    gcode = gw["gpu_code"].to_numpy(dtype=np.int64)[keep]
    n_gpu = int(gw["gpu_code"].max()) + 1
    pairs, _ = sorted_unique(codes * n_gpu + gcode)

    def values(c: str) -> np.ndarray:
        return gw[c].to_numpy(dtype=float)[keep]

    col = {c: values(c) for c in ("power_w", "utilization_gpu_pct") if c in gw}
    out = pd.DataFrame(
        {
            key: np.asarray(uniq, dtype=object),
            "gpus": np.bincount(pairs // n_gpu, minlength=n),
            "energy_j": _nansum_by(codes, values("energy_delta_j"), n),
            "idle_energy_j": _nansum_by(codes, values("idle_energy_j"), n),
            "seen_s": np.bincount(codes, weights=values("seen_s"), minlength=n),
            "idle_s": np.bincount(codes, weights=values("idle_s"), minlength=n),
            "straggler_s": np.bincount(codes, weights=values("straggler_s"), minlength=n),
            "power_mean_w": _nanmean_by(codes, col["power_w"], n) if "power_w" in col else np.nan,
            "utilization_mean_pct": _seen_mean_by(
                codes, col["utilization_gpu_pct"], values("seen_s"), n
            )
            if "utilization_gpu_pct" in col
            else np.nan,
        }
    )
    rank = {q: i for i, q in enumerate(_QUALITY_ORDER)}
    gpu_rank = np.full(n_gpu, len(_QUALITY_ORDER) - 1, dtype=np.int64)
    qualities = per_gpu["energy_quality"].to_numpy(dtype=object)  # iterating a Series is slow
    gpu_rank[per_gpu["gpu_code"].to_numpy()] = [rank[q] for q in qualities]
    worst_rank = np.full(n, len(_QUALITY_ORDER) - 1, dtype=np.int64)
    np.minimum.at(worst_rank, pairs // n_gpu, gpu_rank[pairs % n_gpu])
    out["energy_quality"] = [_QUALITY_ORDER[r] for r in worst_rank]
    return add_cost_columns(out, tariff)


def _per_gpu(gw: pd.DataFrame) -> pd.DataFrame:
    """Per GPU (indexed by ``gpu_code``, sorted): its identity and job as ``groupby.last()``
    gives them, energy sums, idle windows and the means of power, utilisation and TFLOPS."""
    codes = gw["gpu_code"].to_numpy(dtype=np.int64)
    newest = _newest_rows(codes, np.ones(len(codes), dtype=bool))
    present = np.flatnonzero(newest >= 0)
    index = pd.Index(present, name="gpu_code")
    cols: dict[str, object] = {"gpu_code": present}
    for c in ("gpu", "host", "gpu_index", "uuid", "name", "job_id"):
        values = _newest_valid(gw[c], codes, newest[present], present)
        cols[c] = pd.Series(values, index=index, dtype=gw[c].dtype)  # object stays object
    g = gw.groupby("gpu_code", sort=True)
    sums = g[["energy_delta_j", "idle_energy_j"]].sum(min_count=1)
    seen_cols = [c for c in ("seen_s", "idle_s", "straggler_s") if c in gw]
    seen = g[seen_cols].sum() if seen_cols else pd.DataFrame(index=sums.index)
    mean_of = {"power_w": "power_mean_w", "utilization_gpu_pct": "utilization_mean_pct"}
    means = g[[c for c in (*mean_of, "tflops_gpm") if c in gw]].mean()
    cols["energy_j"] = sums["energy_delta_j"].to_numpy()
    cols["idle_energy_j"] = sums["idle_energy_j"].to_numpy()
    cols["idle_windows"] = g["idle"].sum().to_numpy()
    for c in ("seen_s", "idle_s", "straggler_s"):
        cols[c] = seen[c].to_numpy() if c in seen else np.nan
    for c, name in mean_of.items():
        cols[name] = means[c].to_numpy() if c in means else np.nan
    if "utilization_gpu_pct" in gw and "seen_s" in gw:
        n = int(codes.max()) + 1
        util = _seen_mean_by(codes, gw["utilization_gpu_pct"].to_numpy(dtype=float),
                             gw["seen_s"].to_numpy(dtype=float), n)  # fmt: skip
        cols["utilization_mean_pct"] = util[present]
    cols["tflops_mean"] = means["tflops_gpm"].to_numpy()
    return pd.DataFrame(cols, index=index)


def _newest_rows(codes: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Per GPU code: the position of its newest row where ``ok`` (rows in time order), or -1."""
    newest = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
    np.maximum.at(newest, codes[ok], np.flatnonzero(ok))
    return newest


def _newest_valid(col: pd.Series, codes: np.ndarray, rows: np.ndarray, present: np.ndarray) -> Any:
    """``col``'s newest non-missing value per GPU, as ``groupby.last()``: the value of its newest
    row (``rows``) unless missing; only then is the column searched for the newest value.
    Taking one row per GPU avoids testing the strings of every row for missing values."""
    values = col.array.take(rows)
    if not pd.isna(values).any():
        return values
    at = _newest_rows(codes, col.notna().to_numpy())[present]
    if col.dtype != object:
        return col.array.take(at, allow_fill=True)
    out = np.asarray(col.array.take(np.maximum(at, 0)), dtype=object)
    out[at < 0] = None  # ``last()`` of object values all missing is None
    return out


#: Energy qualities, worst first: a node or job takes the worst of its GPUs.
_QUALITY_ORDER: tuple[str, ...] = (
    Quality.NOT_AVAILABLE.value,
    Quality.INTEGRATED_POWER.value,
    Quality.MEASURED_COUNTER.value,
)


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
class _GpuWindows:
    rows: pd.DataFrame  # the samples analysed (prepared, lost ones dropped, in the range)
    gw: pd.DataFrame  # per (window, GPU), see ``per_gpu_window``
    step_ns: int  # the samples' median step
    #: per (window, GPU) of the range and the context rows before it: the straggler scores
    scored: pd.DataFrame
    lost: list[LostGpu]


def _lost_gpus(rows: pd.DataFrame, ok: np.ndarray) -> list[LostGpu]:
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


def _gpu_windows(
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
) -> _GpuWindows | str:
    """The per (window, GPU) table every part of the analysis starts from, or why there is
    none (a note for the empty summary). Rows before ``start_ns`` are context
    (``analytics.accounting``): the newest one of each GPU starts its counter, and those within
    the straggler persistence before the range let a straggler keep its true onset."""
    rows = prepare(frame, now_ns=now_ns, window_s=window_s, start_ns=None, jobs=jobs, job=job)
    if start_ns is None:
        start_ns = int(rows["time_ns"].min()) if len(rows) else now_ns
    t_all = rows["time_ns"].to_numpy(dtype=np.int64)
    ok = measured(rows)
    lost = _lost_gpus(rows.loc[t_all >= start_ns].reset_index(drop=True), ok[t_all >= start_ns])
    if not ok.any():
        return "every GPU was lost in the analysed range" if len(rows) else "no samples"
    if not ok.all():
        rows = rows.loc[ok].reset_index(drop=True)
    step_ns = median_step_ns(rows)
    slot = slot_ns_of(step_s, step_ns, now_ns - start_ns)
    bucket_ns = round(step_s * NS_PER_S) if step_s else None
    slot_end = slot_ends_ns(rows, end_ns=now_ns, slot_ns=slot, bucket_ns=bucket_ns)
    add_row_energy(rows, step_ns=slot, slot_end_ns=slot_end)
    add_row_seen(rows, start_ns=start_ns, slot_end_ns=slot_end)
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
        rows_in = rows
        gw = full
    else:
        lookback_ns = round(cfg.window_n * window_s * NS_PER_S)
        near = in_range | (t >= start_ns - lookback_ns)
        # the context's energy is before the range: not in the peers' waiting energy either
        rows.loc[~in_range, "energy_delta_j"] = 0.0
        full = per_gpu_window(rows.loc[near].reset_index(drop=True), sums=sums, means=means)
        mark_idle(full, idle_util_pct=idle_util_pct)
        scored = score_windows(full, cfg)
        rows_in = _dense(rows.loc[in_range].reset_index(drop=True))
        gw = per_gpu_window(rows_in, sums=sums, means=means)
        mark_idle(gw, idle_util_pct=idle_util_pct)
    # straggler seconds: the seen time of the rows in a window where the GPU was flagged
    fl = scored.loc[scored["flagged"].to_numpy(dtype=bool), ["window_start_ns", "gpu"]]
    flagged = pd.MultiIndex.from_frame(fl)
    key = pd.MultiIndex.from_arrays([gw["window_start_ns"], gw["gpu"]])
    gw["straggler_s"] = np.where(key.isin(flagged), gw["seen_s"], 0.0)
    # idle: decided per window (its mean utilisation), so raw samples and buckets agree
    gw["idle_s"] = np.where(gw["idle"], gw["seen_s"], 0.0)
    gw["idle_energy_j"] = np.where(gw["idle"], gw["energy_delta_j"], 0.0)
    return _GpuWindows(rows_in, gw, step_ns, scored, lost)


def _dense(rows: pd.DataFrame) -> pd.DataFrame:
    """Renumber ``gpu_code`` densely after rows were dropped."""
    _, codes = np.unique(rows["gpu_code"].to_numpy(dtype=np.int64), return_inverse=True)
    rows["gpu_code"] = codes.astype(np.int64)
    return rows


def _stragglers(w: _GpuWindows, cfg: StragglerConfig) -> StragglerFindings:
    sw = w.scored
    found = find_stragglers(sw, cfg, reasons_sampled=w.step_ns >= 10 * NS_PER_S)
    first_window = int(w.gw["window_start_ns"].min()) if len(w.gw) else 0
    found = [s for s in found if s.last_ns >= first_window]  # not one that ended before
    in_range = sw.loc[sw["window_start_ns"].to_numpy() >= first_window].reset_index(drop=True)
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
    w = _gpu_windows(
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
    return _stragglers(w, straggler_config or StragglerConfig())


def analyze(
    frame: pd.DataFrame,
    *,
    now_ns: int,
    window_s: float = 60.0,
    start_ns: int | None = None,
    jobs: Mapping[str, str] | None = None,
    job: str | None = None,
    price_per_kwh: float | None = None,
    carbon_g_per_kwh: float | None = None,
    currency: str = "",
    tensor_precision: str = "bf16",
    idle_util_pct: float = 5.0,
    idle_windows: int = 3,
    straggler_config: StragglerConfig | None = None,
    job_steps: pd.DataFrame | None = None,
    step_s: float | None = None,
) -> AnalysisSummary:
    """Load balance, stragglers and efficiency of the samples in ``[start_ns, now_ns)``.

    ``jobs`` maps a GPU (uuid or ``host:index``) to a job id for rows without one; ``job``
    restricts the analysis to one job. ``price_per_kwh`` (in ``currency``) and
    ``carbon_g_per_kwh`` turn energy into cost and CO2; without them those figures are absent.
    ``tensor_precision`` picks the tensor peak for the GPM estimate (tf32, bf16, fp16, fp8).
    ``job_steps`` (``schema.JOB_STEP_COLUMNS``, as ``JobStepStore.job_steps`` returns) adds the
    jobs' own reported TFLOPS and MFU beside the counter estimate (``job_work``); without it the
    result is unchanged. ``step_s`` is the bucket size of the frame's rows (None: raw samples,
    or infer it from their spacing). Rows before ``start_ns`` are context, counted in nothing
    (see ``gpuwatt.analytics.accounting``; ``analytics.inputs`` adds them).
    """
    cfg = straggler_config or StragglerConfig()
    tariff = Tariff(price_per_kwh, carbon_g_per_kwh, currency)
    window_ns = round(window_s * NS_PER_S)
    w = _gpu_windows(
        frame,
        now_ns=now_ns,
        window_s=window_s,
        start_ns=start_ns,
        jobs=jobs,
        job=job,
        tensor_precision=tensor_precision,
        idle_util_pct=idle_util_pct,
        step_s=step_s,
        straggler_config=cfg,
    )
    if isinstance(w, str):
        return _empty(now_ns, window_s, tariff, w)
    rows, gw = w.rows, w.gw

    balance = balance_over_time(gw)
    idle = idle_gpus(gw, min_windows=idle_windows, window_ns=window_ns)
    found = _stragglers(w, cfg)
    stragglers, sw = found.stragglers, found.straggler_windows

    # --- per GPU -----------------------------------------------------------------------------
    per_gpu = _per_gpu(gw)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_gpu["tflops_per_w"] = per_gpu["tflops_mean"] / per_gpu["power_mean_w"].where(
            per_gpu["power_mean_w"] > 0
        )
    per_gpu = per_gpu.join(gpu_energy_quality(rows)).join(gpu_tflops_quality(rows))
    per_gpu.loc[per_gpu["energy_quality"] == Quality.NOT_AVAILABLE.value, "energy_j"] = np.nan
    per_gpu = add_cost_columns(per_gpu, tariff).reset_index(drop=True)

    by_node = _by(gw, "host", per_gpu, tariff)
    by_job = _by(gw, "job_id", per_gpu, tariff)
    waiting_by_job: dict[str, float] = {}
    for s in stragglers:
        if s.job_id is not None and s.peers_waiting_energy_j is not None:
            waiting_by_job[s.job_id] = waiting_by_job.get(s.job_id, 0.0) + s.peers_waiting_energy_j
    if not by_job.empty:
        by_job["peers_waiting_energy_j"] = by_job["job_id"].map(waiting_by_job).fillna(0.0)

    # --- cluster figures -----------------------------------------------------------------------
    notes: list[str] = []
    quals = [Quality(q) for q in per_gpu["energy_quality"]]
    have = per_gpu["energy_quality"] != Quality.NOT_AVAILABLE.value
    e_quality = worst([q for q in quals if q is not Quality.NOT_AVAILABLE])
    e_reason = ""
    if e_quality is Quality.INTEGRATED_POWER:
        n_int = int((per_gpu["energy_quality"] == Quality.INTEGRATED_POWER.value).sum())
        e_reason = f"{n_int} of {len(per_gpu)} GPUs without an energy counter: power integrated"
    if not have.all():
        notes.append(f"{int((~have).sum())} GPUs have no energy data (no counter, no power)")
    conflicts = per_gpu.get("energy_conflicts", pd.Series(dtype=float))
    if (writers := conflicts >= WRITERS_CONFLICTS).any():
        notes.append(
            f"{int(writers.sum())} GPUs have energy counters that went back and forth (two "
            "collectors writing the same GPU?): those steps were not counted as energy; power "
            "was integrated there"
        )
    energy_j = float(per_gpu.loc[have, "energy_j"].sum()) if have.any() else None
    cluster = energy_figures(energy_j, e_quality, e_reason, tariff)
    idle_j = float(per_gpu.loc[have, "idle_energy_j"].sum()) if have.any() else None
    cluster["idle_energy_kwh"] = energy_figures(idle_j, e_quality, e_reason, tariff)["energy_kwh"]
    waiting = [s.peers_waiting_energy_j for s in stragglers if s.peers_waiting_energy_j is not None]
    cluster["peers_waiting_energy_kwh"] = (
        Figure(
            sum(waiting) / 3.6e6,
            "kWh",
            Quality.MODEL_ESTIMATE,
            "estimate: peers' energy x their utilisation gap to the straggler",
        )
        if waiting and energy_j is not None
        else not_available("kWh", "no synchronous straggler")
    )
    tf = per_gpu["tflops_mean"]
    with_tf = tf.notna()
    if with_tf.any():
        tflops = float(tf[with_tf].sum())
        pw = float(per_gpu.loc[with_tf, "power_mean_w"].sum())
        why = f"{int(with_tf.sum())} of {len(per_gpu)} GPUs have a GPM estimate"
        cluster["tflops"] = Figure(tflops, "TFLOPS", Quality.GPM_ESTIMATE, why)
        cluster["tflops_per_w"] = (
            Figure(tflops / pw, "TFLOPS/W", Quality.GPM_ESTIMATE, why)
            if pw > 0
            else not_available("TFLOPS/W", "no power readings for the GPUs with an estimate")
        )
    else:
        reasons = sorted(set(per_gpu["tflops_reason"]))
        why = "; ".join(reasons) or "no TFLOPS estimate"
        cluster["tflops"] = not_available("TFLOPS", why)
        cluster["tflops_per_w"] = not_available("TFLOPS/W", why)
    if "power_w" in gw:
        pm = per_gpu["power_mean_w"]
        cluster["power_w"] = (
            Figure(float(pm.sum()), "W", Quality.MEASURED)
            if pm.notna().any()
            else not_available("W", "no power readings")
        )
    cluster.update(_time_figures(per_gpu, w.lost))
    if w.lost:
        notes.append(
            f"{len(w.lost)} GPUs lost in this range: their lost time is in no figure "
            "(not in GPU-hours, not in utilisation means)"
        )
    fault_unknown = sw["fault_fraction"].isna().all() if len(sw) else True
    if fault_unknown:
        notes.append(
            "clock-event reasons not decodable in this data (rollup means): causes are inferred "
            "from temperature and power"
        )

    jobs_seen = sorted(str(j) for j in label_codes(gw, "job_id")[1])
    job_work_windows, job_work = _job_work(
        job_steps,
        gw,
        start_ns=int(rows["time_ns"].min()) if start_ns is None else start_ns,
        now_ns=now_ns,
        job=job,
        window_s=window_s,
        tensor_precision=tensor_precision,
    )
    return AnalysisSummary(
        now_ns=now_ns,
        start_ns=int(rows["time_ns"].min()) if start_ns is None else start_ns,
        window_s=window_s,
        windows=window_list(gw),
        gpus=len(per_gpu),
        nodes=len(label_codes(gw, "host")[1]),
        jobs=jobs_seen,
        default_imbalance_index=DEFAULT_INDEX,
        balance=balance,
        idle=idle,
        stragglers=stragglers,
        straggler_windows=sw,
        gpu_windows=gw,
        energy_by_gpu=per_gpu,
        energy_by_node=by_node,
        energy_by_job=by_job,
        efficiency_over_time=efficiency_over_time(gw),
        cluster=cluster,
        tariff=tariff,
        notes=notes,
        job_work=job_work,
        job_work_windows=job_work_windows,
        lost=w.lost,
    )


def _time_figures(per_gpu: pd.DataFrame, lost: list[LostGpu]) -> dict[str, Figure]:
    """GPU-hours, idle GPU-hours and mean utilisation (weighted by seen time) are measured;
    straggler minutes are a detector's verdict over measured inputs: a model estimate."""
    seen_s = float(per_gpu["seen_s"].sum())
    why = f"{len(lost)} GPUs lost: their lost time is not counted" if lost else ""
    util = per_gpu["utilization_mean_pct"].to_numpy(dtype=float)
    w = per_gpu["seen_s"].to_numpy(dtype=float)
    ok = np.isfinite(util) & (w > 0)
    return {
        "gpu_hours": Figure(seen_s / 3600, "h", Quality.MEASURED, why),
        "idle_gpu_hours": Figure(float(per_gpu["idle_s"].sum()) / 3600, "h", Quality.MEASURED),
        "utilization_pct": (
            Figure(float(np.sum(util[ok] * w[ok]) / np.sum(w[ok])), "%", Quality.MEASURED, why)
            if ok.any()
            else not_available("%", "no utilisation readings")
        ),
        "straggler_minutes": Figure(
            float(per_gpu["straggler_s"].sum()) / 60,
            "min",
            Quality.MODEL_ESTIMATE,
            "minutes in which the straggler detector flagged a GPU",
        ),
    }


def _job_work(
    job_steps: pd.DataFrame | None,
    gw: pd.DataFrame,
    *,
    start_ns: int,
    now_ns: int,
    job: str | None,
    window_s: float,
    tensor_precision: str,
) -> tuple[pd.DataFrame, list[JobWork]]:
    """The reported work of the steps in ``[start_ns, now_ns)`` (of ``job`` only, when given)."""
    if job_steps is None or job_steps.empty:
        return pd.DataFrame(), []
    t = job_steps["time_ns"].to_numpy(dtype=np.int64)
    keep = (t >= start_ns) & (t < now_ns)
    if job is not None:
        keep &= (job_steps["job_id"] == job).to_numpy()
    return reported_work(
        job_steps.loc[keep],
        gw,
        window_s=window_s,
        tensor_precision=tensor_precision,
        start_ns=start_ns,
        now_ns=now_ns,
    )


#: The GpuSample attributes ``analyze`` uses: what a caller should read from the store.
ANALYSIS_FIELDS: tuple[str, ...] = (
    "utilization_gpu_pct",
    "memory_used_bytes",
    "temperature_gpu_c",
    "power_w",
    "energy_j",
    "sm_clock_mhz",
    "clock_event_reasons",
    "tensor_active_pct",
    "tensor_hmma_active_pct",
    "tensor_dfma_active_pct",
    "fp64_active_pct",
    "fp32_active_pct",
    "fp16_active_pct",
    "tflops_estimate",
)
