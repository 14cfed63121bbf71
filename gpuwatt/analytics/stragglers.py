"""Stragglers: GPUs slower than their peers, persistently, with the cause in words.

Peers always exist: the other GPUs of the same job when it has ``min_peers`` busy ones, else (for
job-less GPUs) the same-model GPUs of the node, else the same-model GPUs of the cluster doing
similar work (busy, in that window) -- so 1- and 2-GPU jobs are compared too, and the explanation
says which peers were used. Each window, every busy GPU is compared with its peers' *median*
through ratios, not z-scores (NVIDIA NVRx scores a rank by reference median / own; a straggler
sits below 0.75):

* performance score = own SM clock / peer median SM clock (the clock is what a thermal slowdown,
  a power brake or a clock lock takes away),
* clock-event reasons present: HW slowdown (0x8), HW thermal (0x40), HW power brake (0x80) are
  faults; SW power cap (0x4) is normal at full load and never counts,
* temperature against the peer median, power per unit of utilisation ("power at equal load"),
  tensor activity,
* the utilisation signature: in synchronous training the straggler is the *busiest* GPU while its
  peers wait at the barrier; in independent work it is the slowest. "Lowest utilisation is the
  straggler" is therefore wrong for synchronous jobs and is not used.

A window is anomalous when the score is below ``hard_score`` (0.75), or below ``soft_score``
(0.92) with a hardware fault reason active for at least ``min_fault_fraction`` of the window (or,
where the reasons cannot be decoded, with the GPU ``hot_delta_c`` hotter than its peers or drawing
far less power at the same load). A GPU is flagged only after ``persist_windows`` consecutive
anomalous windows (Minder's persistence), so a transient dip raises nothing. A healthy GPU under
light load keeps its clocks, and one under heavy load only shows SW power cap, so uneven load
alone is never a straggler.

Hardware evidence does not need the GPU to be busy: a GPU holding work (utilisation above
``holding_util_pct``, or memory or processes held) whose clock is below ``hard_score`` of its
peers' with a HW fault reason active is anomalous whatever its utilisation (an inference replica
starved by its balancer because it is slow). Against cluster-wide peers (not its job's) a clock
deficit alone counts only without SW power cap, as load differs between jobs.

Persistence is ``persist_windows`` (k) anomalous windows among the GPU's last ``persist_of`` (n),
so a fault that comes and goes is found whatever second the run starts. A finding is one episode:
anomalous windows no more than n - k windows apart; it stays active while k of the last n windows
are anomalous (a wobble does not end it), and one anomalous in under ``steady_duty`` of its span
is reported as intermittent with its duty cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuwatt.analytics.reasons import FAULT_FRACTIONS, LABELS
from gpuwatt.analytics.windows import label_codes, run_lengths

CAUSES: tuple[str, ...] = (
    "power_brake",
    "thermal",
    "hw_slowdown",
    "sw_thermal",
    "clock",
    "host_wait",
    "slow_unknown",
)

#: How a cause is named in the explanation (``slow_unknown``: the GPU is slow and its counters do
#: not show why).
CAUSE_LABELS: dict[str, str] = {
    "power_brake": "power brake",
    "thermal": "thermal",
    "hw_slowdown": "hw slowdown",
    "sw_thermal": "sw thermal slowdown",
    "clock": "clock",
    "host_wait": "waits on its host (input pipeline / data loader)",
    "slow_unknown": "slow, cause not visible in GPU counters",
}

ACTIONS: dict[str, str] = {
    "thermal": "check fans, airflow and inlet temperature of the node",
    "power_brake": "check the node's power supplies and the external power-brake signal",
    "hw_slowdown": "check the node's power and temperature sensors; drain it if this persists",
    "sw_thermal": "the driver holds the clock under its target temperature: check cooling",
    "clock": "check for locked or application clocks (nvidia-smi -q -d CLOCK)",
    "host_wait": "check the host's CPU, storage and data loader feeding this rank",
    "slow_unknown": "profile this rank; check its PCIe/NVLink links and the host",
}


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


@dataclass(frozen=True, slots=True)
class Straggler:
    host: str
    gpu_index: int
    uuid: str
    name: str
    job_id: str | None
    peer_group: str  # "job:<id>", "node:<host>" (same model) or "model:<model>" (cluster-wide)
    cause: str  # one of CAUSES
    cause_inferred: bool  # True when the reasons bitmask was unavailable and the cause is inferred
    severity: str  # "critical" | "warning"
    score: float  # own / peer median SM clock (NVRx-style; 1.0 = like its peers)
    signature: str  # "synchronous" | "independent" | "even"
    onset_ns: int  # start of the first anomalous window of the current run
    flagged_ns: int  # start of the window in which persistence was reached
    last_ns: int  # start of the newest anomalous window
    active: bool  # still anomalous in the newest window analysed
    windows_anomalous: int
    evidence: dict[str, float] = field(default_factory=dict)
    peers_waiting_energy_j: float | None = None
    explanation: str = ""
    intermittent: bool = False  # on for under ``steady_duty`` of the episode's time
    duty_cycle: float = 1.0  # share of the episode's time the fault was on
    peers_used: str = ""  # which peers the GPU was compared with, in words

    @property
    def severity_score(self) -> float:
        return max(0.0, 1.0 - self.score) if math.isfinite(self.score) else 0.0


def _col(gw: pd.DataFrame, name: str) -> np.ndarray:
    if name in gw.columns:
        return gw[name].to_numpy(dtype=float)
    return np.full(len(gw), np.nan)


def _peer_groups(gw: pd.DataFrame) -> tuple[np.ndarray, list[str], np.ndarray]:
    """First-choice peer group per row as codes into labels: ``job:<id>``, else
    ``node:<host>`` (its job-less GPUs of the same model); and whether the row has a job."""
    jcodes, juniq = label_codes(gw, "job_id")
    has_job = jcodes >= 0
    hcodes, huniq = label_codes(gw, "host")
    mcodes, muniq = label_codes(gw, "name")
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
    gcodes, guniq, has_job = _peer_groups(gw)
    mcodes, muniq = label_codes(gw, "name")
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

    def group_max(v: np.ndarray) -> np.ndarray:  # NaN skipped; NaN for a group of NaN only
        out = np.full(n_groups, np.nan)
        np.fmax.at(out, groups, v)
        return out[groups]

    def group_min(v: np.ndarray) -> np.ndarray:
        out = np.full(n_groups, np.nan)
        np.fmin.at(out, groups, v)
        return out[groups]

    top = group_max(np.where(busy, util, np.nan))
    is_top = busy & (util >= top)
    n_top = np.bincount(groups[is_top], minlength=n_groups)[groups]
    others = np.where(busy & ~is_top, util, np.nan)
    o_max, o_min = group_max(others), group_min(others)
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
    low = np.full(n_groups, np.nan)
    np.fmin.at(low, groups, np.where(busy, util, np.nan))
    is_low = busy & (util <= low[groups])
    n_low = np.bincount(groups[is_low], minlength=n_groups)[groups]
    others = np.where(busy & ~is_low, util, np.nan)
    o_max = np.full(n_groups, np.nan)
    o_min = np.full(n_groups, np.nan)
    np.fmax.at(o_max, groups, others)
    np.fmin.at(o_min, groups, others)
    t_med = np.full(n_groups, np.nan)
    np.fmax.at(t_med, groups, np.where(busy & ~is_low, tensor, np.nan))
    o_max, o_min, t_med = o_max[groups], o_min[groups], t_med[groups]
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


def _cause(run: pd.DataFrame, cfg: StragglerConfig) -> tuple[str, bool]:
    fr = {f: run[f].mean() if f in run.columns else np.nan for f in FAULT_FRACTIONS}
    known = any(np.isfinite(v) for v in fr.values())
    if known:
        if fr["frac_power_brake"] >= cfg.min_fault_fraction:
            return "power_brake", False
        if fr["frac_hw_thermal"] >= cfg.min_fault_fraction:
            return "thermal", False
        if fr["frac_hw_slowdown"] >= cfg.min_fault_fraction:
            return "hw_slowdown", False
    sw = run["frac_sw_thermal"].mean() if "frac_sw_thermal" in run.columns else np.nan
    if sw >= cfg.min_fault_fraction:
        return "sw_thermal", False
    if not known:
        if (run["temperature_delta_c"] >= cfg.hot_delta_c).mean() >= 0.5:
            return "thermal", True
        if (run["power_score"] < cfg.hard_score).mean() >= 0.5:
            return "power_brake", True
    if run["score"].mean() < cfg.soft_score:
        return "clock", False
    if run["host_wait"].mean() >= 0.5:
        return "host_wait", False
    return "slow_unknown", False


def _fmt_pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def _peers(sw: pd.DataFrame, row: pd.Series, windows: np.ndarray) -> np.ndarray:
    """Positions in ``sw`` of the other members of ``row``'s peer group in ``windows``."""
    mask = (
        (sw["peer_code"].to_numpy() == row["peer_code"])
        & (sw["gpu_code"].to_numpy() != row["gpu_code"])
        & np.isin(sw["window_start_ns"].to_numpy(), windows)
    )
    return np.flatnonzero(mask)


def _peer_util(sw: pd.DataFrame, row: pd.Series) -> float:
    pos = _peers(sw, row, np.array([row["window_start_ns"]]))
    util = sw["utilization_gpu_pct"].to_numpy(dtype=float)[pos] if len(pos) else np.array([])
    return float(np.nanmedian(util)) if np.isfinite(util).any() else float("nan")


def _signature(own_util: float, peers_util: float, row: pd.Series, cfg: StragglerConfig) -> str:
    """synchronous: busiest while peers wait; independent: does less work than its peers."""
    if own_util - peers_util >= cfg.sync_util_margin_pct:
        return "synchronous"
    tensor = float(row.get("tensor_active_pct", np.nan))
    peer_tensor = float(row["peer_median_tensor_active_pct"])
    less_work = math.isfinite(tensor) and peer_tensor > 0 and tensor / peer_tensor <= 0.9
    if peers_util - own_util >= cfg.sync_util_margin_pct / 2 or less_work:
        return "independent"
    return "even"


def _waiting_energy(sw: pd.DataFrame, run: pd.DataFrame) -> float:
    """Energy peers spent waiting at the barrier: their energy x (1 - own util / straggler's)."""
    if "energy_delta_j" not in sw.columns or run.empty:
        return float("nan")
    windows = run["window_start_ns"].to_numpy(dtype=np.int64)
    own = pd.Series(run["utilization_gpu_pct"].to_numpy(dtype=float), index=windows)
    pos = _peers(sw, run.iloc[-1], windows)
    if not len(pos):
        return 0.0
    peer_w = sw["window_start_ns"].to_numpy(dtype=np.int64)[pos]
    su = own.reindex(peer_w).to_numpy()
    pu = sw["utilization_gpu_pct"].to_numpy(dtype=float)[pos]
    e = sw["energy_delta_j"].to_numpy(dtype=float)[pos]
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = np.where(su > 0, np.clip(1.0 - pu / su, 0.0, 1.0), 0.0)
    return float(np.nansum(wait * e))


def explain(
    host: str,
    idx: int,
    cause: str,
    ev: dict[str, float],
    signature: str,
    job: str | None,
    *,
    sampled: bool = False,
    peers: str = "",
    duty: tuple[int, int, float] | None = None,
) -> str:
    """The one-line explanation of a straggler, numbers first, then what to do.

    ``peers`` says which GPUs it was compared with; ``duty`` (anomalous windows, windows spanned,
    share of the time the fault was on) marks an intermittent fault."""
    parts = [
        f"GPU {idx} on {host} runs at {ev['sm_clock_mhz']:.0f} MHz against a peer median of "
        f"{ev['peer_median_sm_clock_mhz']:.0f} MHz ({ev['clock_delta_pct']:+.0f} %)"
    ]
    specific = False
    for frac in ("frac_power_brake", "frac_hw_thermal", "frac_hw_slowdown"):
        v = ev.get(frac, float("nan"))
        if frac == "frac_hw_slowdown" and specific:
            continue  # HW slowdown accompanies thermal and power brake: not worth repeating
        if math.isfinite(v) and v > 0:
            specific = True
            if sampled:
                parts.append(f"{LABELS[frac]} seen at {_fmt_pct(v)} of the sampled instants")
            else:
                parts.append(f"{LABELS[frac]} active {_fmt_pct(v)} of the window")
    if math.isfinite(ev.get("temperature_c", float("nan"))):
        t = f"{ev['temperature_c']:.0f} °C"
        d = ev.get("temperature_delta_c", float("nan"))
        if math.isfinite(d) and abs(d) >= 5:
            t += f" ({d:+.0f} °C vs peers)"
        parts.append(t)
    ps = ev.get("power_score", float("nan"))
    if math.isfinite(ps) and ps < 0.85:
        parts.append(f"draws {_fmt_pct(1 - ps)} less power than peers at the same load")
    where = f"job {job}" if job else "its node"
    if signature == "synchronous":
        parts.append(
            f"busiest of {where} ({ev['utilization_gpu_pct']:.0f} % vs peers "
            f"{ev['peers_utilization_pct']:.0f} %): peers wait for it"
        )
    elif signature == "independent":
        own_t, peer_t = ev["tensor_active_pct"], ev["peer_median_tensor_active_pct"]
        own_u, peer_u = ev["utilization_gpu_pct"], ev["peers_utilization_pct"]
        parts.append(
            f"does the least work in {where} (tensor activity {own_t:.0f} % vs peers "
            f"{peer_t:.0f} %, utilisation {own_u:.0f} % vs {peer_u:.0f} %)"
        )
    if peers:
        parts.append(f"compared with {peers}")
    if duty is not None:
        a, n, on = duty
        parts.append(f"intermittent: anomalous in {a} of {n} windows, duty cycle {_fmt_pct(on)}")
    return f"{'; '.join(parts)} -> {CAUSE_LABELS[cause]}: {ACTIONS[cause]}"


def peers_in_words(peer_group: str, n_busy: int, model: str) -> str:
    """Which peers a GPU was compared with, for the explanation."""
    kind, _, what = peer_group.partition(":")
    if kind == "job":
        return f"the {n_busy} busy GPUs of its job {what}"
    if kind == "node":
        return f"the {n_busy} busy {model} GPUs of node {what} (no job known)"
    return f"{n_busy} busy {what} GPUs across the cluster doing similar work (too few job peers)"


def _episode(anom: np.ndarray, last: int, gap: int) -> tuple[int, int]:
    """First and last position of the episode around ``last`` (an anomalous position): anomalous
    positions at most ``gap`` non-anomalous ones apart."""
    pos = np.flatnonzero(anom)
    k = int(np.searchsorted(pos, last))
    lo = k
    while lo > 0 and pos[lo] - pos[lo - 1] - 1 <= gap:
        lo -= 1
    hi = k
    while hi + 1 < len(pos) and pos[hi + 1] - pos[hi] - 1 <= gap:
        hi += 1
    return int(pos[lo]), int(pos[hi])


def find_stragglers(
    sw: pd.DataFrame, cfg: StragglerConfig, *, reasons_sampled: bool = False
) -> list[Straggler]:
    """One entry per GPU flagged in any window (its newest flagged run), ranked by severity.

    ``reasons_sampled``: the rows are rollups whose bitmask is one sample per bucket, so reason
    fractions are over sampled instants (the explanation says so), averaged over the run.
    """
    flagged = sw.loc[sw["flagged"]]
    if flagged.empty:
        return []
    newest_window = int(sw["window_start_ns"].max())
    gap = cfg.window_n - cfg.persist_windows
    out: list[Straggler] = []
    for gpu, rows in flagged.groupby("gpu_code", sort=False):
        last_flag = rows.iloc[-1]
        mine = sw.loc[sw["gpu_code"] == gpu]
        anom = mine["anomalous"].to_numpy(dtype=bool)
        first, end = _episode(anom, mine.index.get_loc(last_flag.name), gap)
        span = mine.iloc[first : end + 1]
        run = span.loc[span["anomalous"].to_numpy(dtype=bool)]
        latest = run.iloc[-1]
        # the share of the episode's time the fault was on: per anomalous window, the share of it
        # with a HW reason active where the reasons say so (a brake on 2 minutes in 3 shows in
        # every window, a part of each), else the whole window
        on = span["fault_fraction"].to_numpy(dtype=float)
        on = np.where(np.isfinite(on) & (on > 0), on, 1.0)
        duty = float(np.sum(np.where(span["anomalous"].to_numpy(dtype=bool), on, 0.0)) / len(span))
        intermittent = duty < cfg.steady_duty
        newest = mine.iloc[-1]
        active = (
            int(newest["window_start_ns"]) == newest_window
            and int(newest["recent_anomalous"]) >= cfg.persist_windows
            and end >= len(mine) - 1 - gap
        )
        cause, inferred = _cause(run, cfg)
        peers_util = _peer_util(sw, latest)
        own_util = float(latest["utilization_gpu_pct"])
        signature = _signature(own_util, peers_util, latest, cfg)
        ev = {
            "sm_clock_mhz": float(latest["sm_clock_mhz"]),
            "peer_median_sm_clock_mhz": float(latest["peer_median_sm_clock_mhz"]),
            "clock_delta_pct": (float(latest["score"]) - 1.0) * 100.0,
            "score": float(latest["score"]),
            "temperature_c": float(latest.get("temperature_gpu_c", np.nan)),
            "temperature_delta_c": float(latest["temperature_delta_c"]),
            "power_w": float(latest.get("power_w", np.nan)),
            "power_score": float(latest["power_score"]),
            "utilization_gpu_pct": own_util,
            "peers_utilization_pct": peers_util,
            "tensor_active_pct": float(latest.get("tensor_active_pct", np.nan)),
            "peer_median_tensor_active_pct": float(latest["peer_median_tensor_active_pct"]),
        }
        for frac in (
            "frac_power_brake",
            "frac_hw_thermal",
            "frac_hw_slowdown",
            "frac_sw_power_cap",
        ):
            if frac not in run.columns:
                ev[frac] = float("nan")
            elif reasons_sampled:
                ev[frac] = float(run[frac].mean())
            else:
                ev[frac] = float(latest[frac])
        score = float(run["score"].median())
        severity = "critical" if (score < 0.7 or cause == "power_brake") else "warning"
        waiting = _waiting_energy(sw, run) if signature == "synchronous" else float("nan")
        peers = peers_in_words(
            str(latest["peer_group"]), int(latest["peers_busy"]), str(latest["name"])
        )
        job = latest["job_id"]
        out.append(
            Straggler(
                host=str(latest["host"]),
                gpu_index=int(latest["gpu_index"]),
                uuid=str(latest["uuid"]),
                name=str(latest["name"]),
                job_id=job,
                peer_group=str(latest["peer_group"]),
                cause=cause,
                cause_inferred=inferred,
                severity=severity,
                score=score,
                signature=signature,
                onset_ns=int(run["window_start_ns"].iloc[0]),
                flagged_ns=int(run.loc[run["flagged"], "window_start_ns"].iloc[0]),
                last_ns=int(latest["window_start_ns"]),
                active=active,
                windows_anomalous=len(run),
                evidence=ev,
                peers_waiting_energy_j=waiting if math.isfinite(waiting) else None,
                explanation=explain(
                    str(latest["host"]),
                    int(latest["gpu_index"]),
                    cause,
                    ev,
                    signature,
                    job,
                    sampled=reasons_sampled,
                    peers=peers,
                    duty=(len(run), len(span), duty) if intermittent else None,
                ),
                intermittent=intermittent,
                duty_cycle=duty,
                peers_used=peers,
            )
        )
    out.sort(key=lambda s: (not s.active, s.severity != "critical", -s.severity_score))
    return out
