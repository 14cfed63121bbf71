"""The simulator's per-step arithmetic: jobs compiled to GPU positions, the regime that holds
between two boundaries, and the numpy kernels of one step (synchronous training, served
inference, clock-event reasons, PCIe traffic). Pure functions of arrays: ``simulator`` owns the
state and calls them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuwatt import schema
from gpuwatt.collector.sim.scenario_model import JobSpec

REASON_APP_CLOCKS = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting
CLOCK_STEP_MHZ = 15.0  # NVIDIA clocks move in 15 MHz bins

PCIE_TRAINING_BYTES_PER_S = 20e9
PCIE_INFERENCE_RX_BYTES_PER_S = 0.5e9
PCIE_INFERENCE_TX_BYTES_PER_S = 0.1e9


@dataclass(frozen=True, slots=True)
class CompiledJob:
    spec: JobSpec
    idx: np.ndarray  # GPU positions in rank order
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Slots:
    """The live (job, GPU) slots of one job kind in a regime, flattened so that a step is a few
    numpy calls whatever the number of jobs (``reduceat`` over each job's run of slots)."""

    jobs: tuple[JobSpec, ...]
    gpus: np.ndarray  # GPU position of each slot
    starts: np.ndarray  # first slot of each job
    job_of_slot: np.ndarray
    compute_s: np.ndarray  # per slot: healthy compute time per step (training)
    allreduce_s: np.ndarray  # per job (training)
    load: np.ndarray  # per slot (inference)
    sizes: np.ndarray  # slots per job
    spin: np.ndarray  # per slot: waiting at the all-reduce spins (training)
    round_robin: np.ndarray  # per slot: the balancer ignores speed (inference)

    @classmethod
    def build(cls, jobs: list[CompiledJob], out: np.ndarray) -> Slots:
        live = []
        for j in jobs:
            keep = ~out[j.idx]
            if keep.any():
                live.append((j.spec, j.idx[keep], np.asarray(j.spec.stage_factors())[keep]))
        sizes = [gpus.size for _, gpus, _ in live]
        specs = tuple(spec for spec, _, _ in live)
        base = np.repeat([j.step_time_s * (1 - j.comm_fraction) for j in specs], sizes)
        stage = np.concatenate([f for _, _, f in live]) if live else np.zeros(0)
        return cls(
            jobs=specs,
            gpus=np.concatenate([g for _, g, _ in live]) if live else np.zeros(0, np.intp),
            starts=np.cumsum([0, *sizes[:-1]]).astype(np.intp),
            job_of_slot=np.repeat(np.arange(len(live)), sizes),
            compute_s=base * stage,
            allreduce_s=np.array([j.step_time_s * j.comm_fraction for j in specs]),
            load=np.repeat([j.load for j in specs], sizes),
            sizes=np.array(sizes, dtype=float),
            spin=np.repeat([j.nccl_spin for j in specs], sizes).astype(bool),
            round_robin=np.repeat([j.balancer == "round_robin" for j in specs], sizes).astype(bool),
        )


@dataclass(frozen=True, slots=True)
class Regime:
    """Everything constant between two job or fault boundaries, computed once per interval."""

    lost: np.ndarray
    working: np.ndarray  # in a running training/inference job, neither lost nor idled
    brake: np.ndarray  # clock ratio the power brake allows (1 = none)
    hw_slow: np.ndarray  # clock ratio a HW slowdown alone allows (1 = none)
    sw_thermal: np.ndarray  # clock ratio the driver's SW thermal slowdown allows
    locked: np.ndarray  # clock ratio locked application clocks allow
    host_wait: np.ndarray  # per GPU: input wait per step, as a fraction of its compute time
    link: np.ndarray  # per GPU: all-reduce time multiplier (degraded NVLink/PCIe)
    r_c_per_w: np.ndarray  # thermal resistance including any cooling fault
    power_a: np.ndarray  # demand per unit of compute: 0.3 + 0.9 x intensity
    rest_demand: np.ndarray  # demand of GPUs that are not working
    coef_compute: np.ndarray  # (counters, GPUs): counter rate per unit of compute fraction
    coef_comm: np.ndarray  # (counters, GPUs): counter rate per unit of all-reduce fraction
    training: Slots
    inference: Slots


def train_step(
    slots: Slots,
    r: np.ndarray,
    jitter: np.ndarray,
    compute: np.ndarray,
    comm: np.ndarray,
    spin: np.ndarray,
    reg: Regime,
) -> np.ndarray | None:
    """Synchronous data parallel: each job's step waits for its slowest rank's all-reduce.

    A rank computes (longer when its clock is cut), may first wait for input from its host (slow
    host: the GPU idles at normal clocks), then joins the all-reduce, which starts when the last
    rank arrives and lasts as long as its slowest link. Ranks that arrive early or finish the
    all-reduce early wait: blocked on the host, or spinning in NCCL kernels (``nccl_spin``).
    Fills ``compute``/``comm``/``spin`` (fractions of the step); returns each job's step time."""
    if slots.gpus.size == 0:
        return None
    gpus = slots.gpus
    compute_s = slots.compute_s / r[gpus] * (1.0 + 0.01 * jitter[gpus])
    ready_s = compute_s + reg.host_wait[gpus] * compute_s
    comm_s = slots.allreduce_s[slots.job_of_slot] * reg.link[gpus]
    step_s = np.maximum.reduceat(ready_s, slots.starts) + np.maximum.reduceat(comm_s, slots.starts)
    per_slot = step_s[slots.job_of_slot]
    compute[gpus] = compute_s / per_slot
    comm[gpus] = comm_s / per_slot
    waiting = np.maximum(per_slot - ready_s - comm_s, 0.0) / per_slot
    spin[gpus] = np.where(slots.spin, waiting, 0.0)
    return step_s


def serve_step(slots: Slots, r: np.ndarray, compute: np.ndarray) -> None:
    """Independent replicas. A latency-aware balancer sends traffic as r²; a round-robin one
    gives every replica its share whatever its speed, so a slow replica saturates and queues."""
    if slots.gpus.size == 0:
        return
    rr = r[slots.gpus]
    share = np.where(slots.round_robin, 1.0, rr * rr)
    mean = np.add.reduceat(share, slots.starts) / slots.sizes
    compute[slots.gpus] = np.minimum(slots.load * share / mean[slots.job_of_slot] / rr, 1.0)


def extra_reasons(reg: Regime) -> np.ndarray:
    """Reason bits of the faults that only cap the clock."""
    out = np.where(reg.hw_slow < 1.0, schema.REASON_HW_SLOWDOWN, 0)
    out = out | np.where(reg.sw_thermal < 1.0, schema.REASON_SW_THERMAL, 0)
    out = out | np.where(reg.locked < 1.0, REASON_APP_CLOCKS, 0)
    return out.astype(np.int64)


def pcie_bytes_per_s(compute: np.ndarray, comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Training all-reduces through the NIC (GPUDirect); inference moves requests and replies."""
    inference = (compute > 0) & (comm == 0)
    tx = PCIE_TRAINING_BYTES_PER_S * comm + np.where(
        inference, PCIE_INFERENCE_TX_BYTES_PER_S * compute, 0.0
    )
    rx = PCIE_TRAINING_BYTES_PER_S * comm + np.where(
        inference, PCIE_INFERENCE_RX_BYTES_PER_S * compute, 0.0
    )
    return tx, rx


def clock_reasons(
    working: np.ndarray, power_capped: np.ndarray, hot: np.ndarray, braked: np.ndarray
) -> np.ndarray:
    reasons = np.where(working, 0, schema.REASON_GPU_IDLE)
    reasons = reasons | np.where(power_capped & working, schema.REASON_SW_POWER_CAP, 0)
    reasons = reasons | np.where(hot, schema.REASON_HW_SLOWDOWN | schema.REASON_HW_THERMAL, 0)
    reasons = reasons | np.where(
        braked, schema.REASON_HW_SLOWDOWN | schema.REASON_HW_POWER_BRAKE, 0
    )
    return reasons.astype(np.int64)


def quantise_mhz(mhz: np.ndarray) -> np.ndarray:
    return np.floor(mhz / CLOCK_STEP_MHZ) * CLOCK_STEP_MHZ
