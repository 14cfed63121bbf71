"""What only a real GPU can show: gpuwatt's collector against the real NVML of this machine.

    python bench/real_gpu.py [--load-s 30] [--samples 100] [--json FILE]

It changes no GPU setting (MIG mode, clocks and power limits are only read). Needs an NVIDIA
GPU, ``nvidia-ml-py`` and, for the load, PyTorch with CUDA. It prints, for GPU 0:

1. every sample field: the value read, or "not measured" with NVML's reason;
2. the time one ``NvmlSampler.sample()`` takes (wall and CPU; fast tick, and the slow tick
   that also reads the static and per-minute fields), idle and under load;
3. the TFLOPS estimate (GPM pipe activity x the datasheet's dense peak x clock ratio) against
   the TFLOPS a bf16 matrix product measures with CUDA events at the same time, and the ratio;
4. energy: the NVML total-energy counter's increase against power integrated over the same
   window, and the ratio;
5. a cross-check against ``nvidia-smi`` for the values both read;
6. MIG mode as NVML reports it;
7. ``gpuwatt collect`` end to end into the embedded store (two runs on one database: a
   restart), then ``gpuwatt status`` and ``gpuwatt analyze`` on what it wrote. Each run's CPU
   includes Python's start-up and imports; the collector's steady CPU, thread by thread, is
   ``bench/collector_threads.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatt.collector.nvml import real_module  # noqa: E402
from gpuwatt.collector.nvml_source import NvmlSampler  # noqa: E402
from gpuwatt.model import GpuSample  # noqa: E402

# A bf16 matrix product in a loop; one JSON line per second with the TFLOPS CUDA events measured.
GEMM = r"""
import json, sys, time, torch
n, seconds = 8192, float(sys.argv[1])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
end = time.time() + seconds
while time.time() < end:
    start_ev, stop_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    start_ev.record()
    iters = 0
    while time.time() - t0 < 1.0:
        for _ in range(20):
            a @ b
        iters += 20
        torch.cuda.synchronize()
    stop_ev.record()
    torch.cuda.synchronize()
    s = start_ev.elapsed_time(stop_ev) / 1000.0
    print(json.dumps({"t0": t0, "t1": time.time(), "tflops": 2 * n**3 * iters / s / 1e12}),
          flush=True)
"""

_CLI = "import sys; from gpuwatt.cli.main import main; sys.exit(main())"

SMI_FIELDS = (
    "name,driver_version,power.draw,clocks.sm,clocks.mem,utilization.gpu,"
    "temperature.gpu,memory.used,memory.total,power.limit,mig.mode.current"
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_samples(sampler: NvmlSampler, n: int, *, slow: bool) -> dict[str, float]:
    wall, cpu = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.process_time()
        sampler.sample(include_slow=slow)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {
        "n": n,
        "wall_p50_ms": 1e3 * statistics.median(wall),
        "wall_p95_ms": 1e3 * pct(wall, 0.95),
        "cpu_mean_ms": 1e3 * statistics.fmean(cpu),
    }


class TimedNvml:
    """The NVML module with the wall time of every ``nvml*`` call summed by function name."""

    def __init__(self, nvml: Any) -> None:
        self._nv = nvml
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nv, name)
        if not name.startswith("nvml") or not callable(value) or isinstance(value, type):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1

        return call


def nvml_call_profile(nv: Any, host: str, n: int) -> list[dict[str, Any]]:
    """Where a fast tick's time goes: NVML calls by total time over ``n`` ticks."""
    timed = TimedNvml(nv)
    with NvmlSampler(timed, host, xid_events=False) as sampler:
        sampler.sample(include_slow=True)
        timed.seconds.clear()
        timed.calls.clear()
        for _ in range(n):
            sampler.sample(include_slow=False)
    ranked = sorted(timed.seconds.items(), key=lambda kv: -kv[1])
    return [
        {"call": k, "per_tick_us": 1e6 * v / n, "calls_per_tick": timed.calls[k] / n}
        for k, v in ranked
    ]


def fields_report(sample: GpuSample, unsupported: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(sample):
        value = getattr(sample, f.name)
        if value is None:
            why = [c for k, c in unsupported.items() if k.endswith("/" + f.name)]
            value = "not measured" + (f" ({why[0]})" if why else "")
        out[f.name] = value if not isinstance(value, float) else round(value, 3)
    return out


def nvidia_smi() -> dict[str, str]:
    try:
        line = subprocess.run(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    return dict(zip(SMI_FIELDS.split(","), (v.strip() for v in line.split(",")), strict=False))


def load_phase(sampler: NvmlSampler, load_s: float) -> dict[str, Any]:
    """A GEMM in a child process; the sampler samples GPU 0 each second meanwhile."""
    gemm = subprocess.Popen(
        [sys.executable, "-c", GEMM, str(load_s)], stdout=subprocess.PIPE, text=True
    )
    measured: list[dict[str, float]] = []
    reader = threading.Thread(
        target=lambda: measured.extend(json.loads(line) for line in gemm.stdout or ()),
        daemon=True,
    )
    reader.start()
    rows, wall, smi = [], [], {}
    t_next = time.time()
    while gemm.poll() is None:
        t_next += 1.0
        time.sleep(max(0.0, t_next - time.time()))
        w0 = time.perf_counter()
        s = sampler.sample(include_slow=False)[0]
        wall.append(time.perf_counter() - w0)
        rows.append((time.time(), s))
        if len(rows) == int(load_s / 2):
            smi = {"nvidia_smi": nvidia_smi(), "gpuwatt_same_moment": fields_report(s, {})}
    reader.join(timeout=10)
    if not measured:
        return {"error": "the GEMM child printed nothing (no torch/CUDA?)", "rc": gemm.returncode}
    # Steady window: after the first 5 s of load, before the last second.
    lo, hi = measured[0]["t0"] + 5.0, measured[-1]["t1"] - 1.0
    steady = [r for r in rows if lo <= r[0] <= hi]
    est = [s.tflops_estimate for _, s in steady if s.tflops_estimate is not None]
    meas = [m["tflops"] for m in measured if m["t0"] >= lo - 1.0 and m["t1"] <= hi + 1.0]
    energy = [(t, s.energy_j, s.power_w) for t, s in rows if s.energy_j is not None and s.power_w]
    integrated = sum(
        (t1 - t0) * (p0 + p1) / 2 for (t0, _, p0), (t1, _, p1) in itertools.pairwise(energy)
    )
    counter = energy[-1][1] - energy[0][1] if len(energy) > 1 else None
    return {
        "gemm_tflops_measured_mean": statistics.fmean(meas) if meas else None,
        "gpuwatt_tflops_estimate_mean": statistics.fmean(est) if est else None,
        "estimate_over_measured": (statistics.fmean(est) / statistics.fmean(meas))
        if est and meas
        else None,
        "tflops_method": steady[-1][1].tflops_method if steady else None,
        "tensor_hmma_active_pct_mean": statistics.fmean(
            [s.tensor_hmma_active_pct for _, s in steady if s.tensor_hmma_active_pct is not None]
            or [float("nan")]
        ),
        "sm_clock_mhz_mean": statistics.fmean(
            [s.sm_clock_mhz for _, s in steady if s.sm_clock_mhz is not None] or [float("nan")]
        ),
        "power_w_mean": statistics.fmean([p for _, _, p in energy] or [float("nan")]),
        "clock_event_reasons_seen": sorted({s.clock_event_reasons or 0 for _, s in rows}),
        "energy_method": rows[-1][1].energy_method if rows else None,
        "energy_counter_delta_j": counter,
        "energy_integrated_power_j": integrated,
        "counter_over_integrated": counter / integrated if counter and integrated else None,
        "sample_wall_under_load_p50_ms": 1e3 * statistics.median(wall),
        "sample_wall_under_load_p95_ms": 1e3 * pct(wall, 0.95),
        "per_second": [
            {
                "t": round(t - rows[0][0], 1),
                "tflops_est": s.tflops_estimate,
                "hmma_pct": s.tensor_hmma_active_pct,
                "sm_mhz": s.sm_clock_mhz,
                "power_w": s.power_w,
            }
            for t, s in rows
        ],
        "gemm_per_second": measured,
        **smi,
    }


def cli(*args: str, env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``gpuwatt ARGS``: (wall s, CPU s of the child, output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CLI, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, f"rc={done.returncode}\n{done.stdout}{done.stderr}"


def end_to_end(load_s: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuwatt-real-"))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "GPUWATT_HOME": str(tmp)}
    store = f"sqlite:///{tmp}/real.db"
    gemm = subprocess.Popen([sys.executable, "-c", GEMM, str(load_s)], stdout=subprocess.DEVNULL)
    time.sleep(3)
    short = cli("collect", "--store", store, "--interval", "1", "--duration", "5", env=env)
    long = cli("collect", "--store", store, "--interval", "1", "--duration", "25", env=env)
    gemm.wait()
    status = cli("status", "--store", store, env=env)
    analyze = cli("analyze", "--store", store, "--since", "2m", env=env)
    return {
        "collect_5s": {"wall_s": short[0], "cpu_s": short[1], "out": short[2][-1500:]},
        "collect_25s": {"wall_s": long[0], "cpu_s": long[1], "out": long[2][-1500:]},
        "status": status[2][-3000:],
        "analyze": analyze[2][-4000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-s", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()

    nv = real_module()
    where = getattr(nv, "__file__", repr(nv))
    report: dict[str, Any] = {"host": socket.gethostname(), "pynvml": where}
    with NvmlSampler(nv, socket.gethostname()) as sampler:
        report["driver"] = nv.nvmlSystemGetDriverVersion()
        report["nvml"] = getattr(nv, "nvmlSystemGetNVMLVersion", lambda: None)()
        report["devices"] = [
            {**dataclasses.asdict(d), "spec": d.spec.model if d.spec else None}
            for d in sampler.devices()
        ]
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        try:
            report["mig_mode_current_pending"] = list(nv.nvmlDeviceGetMigMode(handle))
        except nv.NVMLError as exc:
            report["mig_mode_current_pending"] = f"not available ({exc})"
        report["mig_devices"] = [dataclasses.asdict(m) for m in sampler.mig_devices()]
        report["xid_listener_active"] = sampler.xid_listener_active
        first = sampler.sample(include_slow=True)[0]
        time.sleep(1.1)  # GPM needs two reads one interval apart
        second = sampler.sample(include_slow=True)[0]
        report["unsupported_fields"] = sampler.unsupported_fields()
        report["fields_first_slow_sample"] = fields_report(first, sampler.unsupported_fields())
        report["fields_second_slow_sample"] = fields_report(second, sampler.unsupported_fields())
        report["sample_idle_fast"] = timed_samples(sampler, args.samples, slow=False)
        report["sample_idle_slow"] = timed_samples(sampler, max(5, args.samples // 10), slow=True)
        report["load"] = load_phase(sampler, args.load_s)
    report["nvml_calls_fast_tick"] = nvml_call_profile(nv, socket.gethostname(), args.samples)
    report["end_to_end"] = end_to_end(args.load_s + 10)
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
