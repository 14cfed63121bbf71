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
from gpuwatt.analytics.straggler_scores import StragglerConfig, score_windows
from gpuwatt.precision import settled

__all__ = [
    "ACTIONS",
    "CAUSES",
    "CAUSE_LABELS",
    "Straggler",
    "StragglerConfig",
    "explain",
    "find_stragglers",
    "peers_in_words",
    "score_windows",
]

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
    ev = {k: settled(v) if isinstance(v, float) else v for k, v in ev.items()}  # precision
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
