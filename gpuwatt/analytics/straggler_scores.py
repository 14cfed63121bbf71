"""Straggler scores per (window, GPU): each busy GPU against its peers' median (SM clock ratio,
fault reasons, temperature, power at equal load), anomalous windows and persistence. The rules
are described in ``gpuwatt.analytics.stragglers``, which turns the scored windows into findings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.analytics.reasons import FAULT_FRACTIONS
from gpuwatt.analytics.windows import label_codes, run_lengths


@dataclass(frozen=True, slots=True)
class StragglerConfig:
    busy_util_pct: float = 20.0
    hard_score: float = 0.75
    soft_score: float = 0.92
    min_fault_fraction: float = 0.2
    hot_delta_c: float = 10.0
    persist_windows: int = 3  # k anomalous windows ...
    persist_of: int = 5  # ... among the last n (never fewer than k)
    steady_duty: float = 0.8  # an episode anomalous in less of its span is intermittent
    min_peers: int = 3
    sync_util_margin_pct: float = 10.0
    holding_util_pct: float = 1.0

    @property
    def window_n(self) -> int:
        return max(self.persist_of, self.persist_windows)


def _col(gw: pd.DataFrame, name: str) -> np.ndarray:
    if name in gw.columns:
        return gw[name].to_numpy(dtype=float)
    return np.full(len(gw), np.nan)


def _peer_groups(
    gw: pd.DataFrame, model_codes: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """First-choice peer group per row as codes into labels: ``job:<id>``, else
    ``node:<host>`` (its job-less GPUs of the same model); and whether the row has a job.
    ``model_codes``: ``label_codes(gw, "name")`` (hashing the names once, not twice)."""
    jcodes, juniq = label_codes(gw, "job_id")
    has_job = jcodes >= 0
    hcodes, huniq = label_codes(gw, "host")
    mcodes, muniq = model_codes
    nm = max(len(muniq), 1)
    m = np.maximum(mcodes, 0)
    # a job that mixes models is compared model by model (their clocks differ by design)
    codes = np.where(has_job, jcodes * nm + m, len(juniq) * nm + hcodes * nm + m)
    models = muniq if len(muniq) else [""]
    labels = [f"job:{j}" for j in juniq for _ in models]
    labels += [f"node:{h}" for h in huniq for _ in models]
    return codes.astype(np.int64), labels, has_job


def _group_medians(
    groups: np.ndarray, work: pd.DataFrame, busy: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per row: the median of each column over its group (one median per group), and the
    number of busy rows in the group."""
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    med = {c: v.to_numpy()[groups] for c, v in work.groupby(groups, sort=True).median().items()}
    n_busy = np.bincount(groups[busy], minlength=n_groups)[groups]
    return med, n_busy


def _rolling_count(gpus: np.ndarray, flags: np.ndarray, n: int) -> np.ndarray:
    """For rows sorted by GPU then window: True flags among the GPU's last ``n`` rows."""
    m = len(flags)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    c = np.cumsum(np.asarray(flags, dtype=np.int64))
    pos = np.arange(m)
    new_gpu = np.ones(m, dtype=bool)
    new_gpu[1:] = gpus[1:] != gpus[:-1]
    first = np.maximum.accumulate(np.where(new_gpu, pos, 0))
    prev = np.maximum(pos - n, first - 1)
    return c - np.where(prev >= 0, c[np.maximum(prev, 0)], 0)


def score_windows(gw: pd.DataFrame, cfg: StragglerConfig) -> pd.DataFrame:
    """Per (window, GPU): peer medians, ratios, ``anomalous`` and ``flagged`` (persistent)."""
    w = gw["window_start_ns"].to_numpy(dtype=np.int64)
    order = np.lexsort((w, gw["gpu_code"].to_numpy(dtype=np.int64)))  # by GPU, then window
    gw = gw.take(order).reset_index(drop=True)
    mcodes, muniq = label_codes(gw, "name")
    gcodes, guniq, has_job = _peer_groups(gw, (mcodes, muniq))
    util = _col(gw, "utilization_gpu_pct")
    clock = _col(gw, "sm_clock_mhz")
    power = _col(gw, "power_w")
    temp = _col(gw, "temperature_gpu_c")
    tensor = _col(gw, "tensor_active_pct")
    busy = np.where(np.isfinite(util), util >= cfg.busy_util_pct, np.isfinite(clock))
    mem = _col(gw, "memory_used_bytes")
    procs = _col(gw, "process_count")
    holding = busy | (util >= cfg.holding_util_pct) | (mem > 0) | (procs > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ppu = np.where(util > 0, power / util, np.nan)

    def masked(v: np.ndarray) -> np.ndarray:
        return np.where(busy, v, np.nan)

    wcodes, _ = pd.factorize(w[order])
    wcodes = wcodes.astype(np.int64)
    # one group per (window, peer group), numbered once and reduced with numpy
    groups, _ = pd.factorize(wcodes * max(len(guniq), 1) + gcodes)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    work = pd.DataFrame(
        {
            "clock": masked(clock),
            "temp": masked(temp),
            "ppu": masked(ppu),
            "tensor": masked(tensor),
            "util": util,
        }
    )
    med, n_busy = _group_medians(groups, work, busy)
    # fallback: the same-model GPUs of the cluster doing similar work (busy) in that window
    own_ok = n_busy >= cfg.min_peers
    fallback = ~own_ok
    if fallback.any():
        cgroups, _ = pd.factorize(wcodes * max(len(muniq), 1) + np.maximum(mcodes, 0))
        cmed, cn_busy = _group_medians(cgroups, work, busy)
        for c in med:
            med[c] = np.where(fallback, cmed[c], med[c])
        n_busy = np.where(fallback, cn_busy, n_busy)
    cluster_label = np.asarray([f"model:{m}" for m in muniq] or ["model:"], dtype=object)
    peer_group = np.where(
        fallback, cluster_label[np.maximum(mcodes, 0)], np.asarray(guniq, dtype=object)[gcodes]
    )
    peer_code = np.where(fallback, -1 - np.maximum(mcodes, 0), gcodes)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = clock / med["clock"]
        power_score = ppu / med["ppu"]
    temp_delta = temp - med["temp"]

    fracs = np.vstack([_col(gw, f) for f in FAULT_FRACTIONS])
    fault_known = np.isfinite(fracs).any(axis=0)
    fault = np.nanmax(np.where(np.isfinite(fracs), fracs, -1.0), axis=0)
    fault = np.where(fault_known, fault, np.nan)
    sw_thermal = _col(gw, "frac_sw_thermal")
    capped = _col(gw, "frac_sw_power_cap") >= 0.5

    scored = (n_busy >= cfg.min_peers) & np.isfinite(score)
    eligible = busy & scored
    faulty = fault_known & (fault >= cfg.min_fault_fraction)
    faulty |= sw_thermal >= cfg.min_fault_fraction
    inferred = ~fault_known & ((temp_delta >= cfg.hot_delta_c) | (power_score < cfg.hard_score))
    soft = score < cfg.soft_score
    # a clock deficit alone convicts against the job's own peers; against cluster-wide peers
    # only where the GPU is not simply power-capped under a heavier load than theirs
    hard = (score < cfg.hard_score) & (own_ok | ~capped)
    anomalous = eligible & (hard | (soft & (faulty | inferred)))
    # hardware evidence whatever the utilisation: holding work, far slower, a HW reason active
    # (one busy peer is enough here: the reason bits, not the comparison, carry the verdict)
    anomalous |= holding & (n_busy >= 1) & np.isfinite(score) & (score < cfg.hard_score) & faulty

    # synchronous-training signature without a clock deficit: in a job, exactly one busy GPU far
    # busier than the other busy GPUs, which all wait alike (slow for a reason clocks do not show)
    sync_slow = _sync_outlier(
        groups, n_groups, util, busy, n_busy, has_job & eligible & own_ok, cfg
    )
    host_wait = _host_wait(
        groups, n_groups, util, tensor, busy, has_job & eligible & own_ok & ~anomalous, cfg
    )
    anomalous = anomalous | sync_slow | host_wait

    gpus = gw["gpu_code"].to_numpy()
    runs = run_lengths(gpus, anomalous)
    recent = _rolling_count(gpus, anomalous, cfg.window_n)
    scores = pd.DataFrame(
        dict(
            peer_group=peer_group,
            peer_code=peer_code,
            busy=busy,
            holding=holding,
            peers_busy=n_busy,
            peer_median_sm_clock_mhz=med["clock"],
            peer_median_temperature_c=med["temp"],
            peer_median_power_per_util=med["ppu"],
            peer_median_tensor_active_pct=med["tensor"],
            peer_median_utilization_pct=med["util"],
            score=score,
            power_score=power_score,
            temperature_delta_c=temp_delta,
            fault_fraction=fault,
            sync_slow=sync_slow,
            host_wait=host_wait,
            anomalous=anomalous,
            run=runs,
            recent_anomalous=recent,
            flagged=anomalous & (recent >= cfg.persist_windows),
        )
    )
    return pd.concat([gw, scores], axis=1)  # one frame, not a column at a time


def _per_group(reduce: np.ufunc, groups: np.ndarray, n_groups: int, v: np.ndarray) -> np.ndarray:
    """Per row: ``reduce`` (``np.fmax``, ``np.fmin``) of ``v`` over the row's group; NaN skipped,
    NaN for a group of NaN only."""
    out = np.full(n_groups, np.nan)
    reduce.at(out, groups, v)
    return out[groups]


def _sync_outlier(
    groups: np.ndarray,
    n_groups: int,
    util: np.ndarray,
    busy: np.ndarray,
    n_busy: np.ndarray,
    candidate: np.ndarray,
    cfg: StragglerConfig,
) -> np.ndarray:
    """Per row: the one busy GPU of its group far busier than the others, which all wait alike."""
    top = _per_group(np.fmax, groups, n_groups, np.where(busy, util, np.nan))
    is_top = busy & (util >= top)
    n_top = np.bincount(groups[is_top], minlength=n_groups)[groups]
    others = np.where(busy & ~is_top, util, np.nan)
    o_max = _per_group(np.fmax, groups, n_groups, others)
    o_min = _per_group(np.fmin, groups, n_groups, others)
    return (
        candidate
        & is_top
        & (n_top == 1)
        & (n_busy >= 4)
        & (util - o_max >= 2 * cfg.sync_util_margin_pct)
        & (o_max - o_min <= cfg.sync_util_margin_pct)
    )


def _host_wait(
    groups: np.ndarray,
    n_groups: int,
    util: np.ndarray,
    tensor: np.ndarray,
    busy: np.ndarray,
    candidate: np.ndarray,
    cfg: StragglerConfig,
) -> np.ndarray:
    """Per row: in a synchronous job whose waiting ranks spin in NCCL (high utilisation), the one
    rank far *less* busy than the others, all alike, yet doing as much tensor work per step: it
    sits idle between kernels, waiting on its host, at normal clocks."""
    n_rows = np.bincount(groups[busy], minlength=n_groups)[groups]
    low = _per_group(np.fmin, groups, n_groups, np.where(busy, util, np.nan))
    is_low = busy & (util <= low)
    n_low = np.bincount(groups[is_low], minlength=n_groups)[groups]
    others = np.where(busy & ~is_low, util, np.nan)
    o_max = _per_group(np.fmax, groups, n_groups, others)
    o_min = _per_group(np.fmin, groups, n_groups, others)
    t_med = _per_group(np.fmax, groups, n_groups, np.where(busy & ~is_low, tensor, np.nan))
    with np.errstate(invalid="ignore"):
        same_work = ~np.isfinite(tensor) | (tensor >= 0.9 * t_med)
        return (
            candidate
            & is_low
            & (n_low == 1)
            & (n_rows >= 4)
            & (o_min - util >= 2 * cfg.sync_util_margin_pct)
            & (o_max - o_min <= cfg.sync_util_margin_pct)
            & (o_min >= 80.0)
            & same_work
        )
