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

import numpy as np
import pandas as pd

from gpuwatt.analytics.balance import (
    CLUSTER,
    DEFAULT_INDEX,
    IdleGpu,
    balance_over_time,
    idle_gpus,
)
from gpuwatt.analytics.efficiency import efficiency_over_time, gpu_tflops_quality
from gpuwatt.analytics.energy import (
    WRITERS_CONFLICTS,
    Tariff,
    add_cost_columns,
    energy_figures,
    gpu_energy_quality,
)
from gpuwatt.analytics.gpu_windows import (
    LostGpu,
    gpu_windows,
    straggler_findings,
)
from gpuwatt.analytics.group_figures import by_group, per_gpu_figures
from gpuwatt.analytics.mig_energy import add_mig_columns, split_parent_energy
from gpuwatt.analytics.quality import Figure, Quality, not_available, worst
from gpuwatt.analytics.reported import JobWork, reported_work
from gpuwatt.analytics.stragglers import Straggler, StragglerConfig
from gpuwatt.analytics.windows import (
    NS_PER_S,
    label_codes,
    window_list,
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
    #: MIG devices among ``energy_by_gpu``'s rows (``gpus`` counts whole GPUs only)
    mig_devices: int = 0

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


#: The columns of the samples analysed that ``analyze`` reads (``GpuWindows.rows``).
ROW_COLUMNS = ("time_ns", "gpu_code", "name", "energy_src", "energy_conflict", "tflops_src")


def _empty(now_ns: int, window_s: float, tariff: Tariff, note: str) -> AnalysisSummary:
    na = not_available("", "no samples in the window")
    e = pd.DataFrame()
    return AnalysisSummary(
        now_ns, now_ns, window_s, [], 0, 0, [], DEFAULT_INDEX, balance_over_time(e), [], [], e, e,
        e, e, e, e, {k: na for k in ("energy_kwh", "cost", "co2_kg")}, tariff, [note],
    )  # fmt: skip


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
        straggler_config=cfg,
    )
    if isinstance(w, str):
        return _empty(now_ns, window_s, tariff, w)
    rows, gw = w.rows(ROW_COLUMNS), w.gw

    balance = balance_over_time(gw)
    idle = idle_gpus(gw, min_windows=idle_windows, window_ns=window_ns)
    found = straggler_findings(w, cfg)
    stragglers, sw = found.stragglers, found.straggler_windows

    # --- per GPU -----------------------------------------------------------------------------
    split_parent_energy(gw)  # MIG devices: their share of the parent's measured energy
    per_gpu = per_gpu_figures(gw)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_gpu["tflops_per_w"] = per_gpu["tflops_mean"] / per_gpu["power_mean_w"].where(
            per_gpu["power_mean_w"] > 0
        )
    per_gpu = per_gpu.join(gpu_energy_quality(rows)).join(gpu_tflops_quality(rows))
    per_gpu = add_mig_columns(per_gpu, gw)
    per_gpu.loc[per_gpu["energy_quality"] == Quality.NOT_AVAILABLE.value, "energy_j"] = np.nan
    per_gpu = add_cost_columns(per_gpu, tariff).reset_index(drop=True)

    by_node = by_group(gw, "host", per_gpu, tariff)
    by_job = by_group(gw, "job_id", per_gpu, tariff)
    waiting_by_job: dict[str, float] = {}
    for s in stragglers:
        if s.job_id is not None and s.peers_waiting_energy_j is not None:
            waiting_by_job[s.job_id] = waiting_by_job.get(s.job_id, 0.0) + s.peers_waiting_energy_j
    if not by_job.empty:
        by_job["peers_waiting_energy_j"] = by_job["job_id"].map(waiting_by_job).fillna(0.0)

    # --- cluster figures -----------------------------------------------------------------------
    notes: list[str] = []
    gpus = per_gpu.loc[~per_gpu["mig"]]  # MIG devices' energy is already in their parent's
    quals = [Quality(q) for q in gpus["energy_quality"]]
    have = gpus["energy_quality"] != Quality.NOT_AVAILABLE.value
    e_quality = worst([q for q in quals if q is not Quality.NOT_AVAILABLE])
    e_reason = ""
    if e_quality is Quality.INTEGRATED_POWER:
        n_int = int((gpus["energy_quality"] == Quality.INTEGRATED_POWER.value).sum())
        e_reason = f"{n_int} of {len(gpus)} GPUs without an energy counter: power integrated"
    if not have.all():
        notes.append(f"{int((~have).sum())} GPUs have no energy data (no counter, no power)")
    conflicts = gpus.get("energy_conflicts", pd.Series(dtype=float))
    if (writers := conflicts >= WRITERS_CONFLICTS).any():
        notes.append(
            f"{int(writers.sum())} GPUs have energy counters that went back and forth (two "
            "collectors writing the same GPU?): those steps were not counted as energy; power "
            "was integrated there"
        )
    energy_j = float(gpus.loc[have, "energy_j"].sum()) if have.any() else None
    cluster = energy_figures(energy_j, e_quality, e_reason, tariff)
    idle_j = float(gpus.loc[have, "idle_energy_j"].sum()) if have.any() else None
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
    cluster.update(_time_figures(gpus, w.lost))
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
        gpus=len(gpus),
        mig_devices=int(per_gpu["mig"].sum()),
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
