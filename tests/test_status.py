"""``gpuwatt status``: the one-word STATE, the filters, --watch, and the missing-extra message."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from gpuwatt.model import GpuSample
from gpuwatt.schema import REASON_HW_SLOWDOWN, REASON_HW_THERMAL, REASON_SW_POWER_CAP
from gpuwatt.status import (
    gpu_state,
    natural_key,
    render_status,
    select_samples,
    summary_line,
    watch,
)
from gpuwatt.store.sqlite import SqliteStore

NOW_NS = 1_800_000_000 * 1_000_000_000
S = 1_000_000_000


def _gpu(host: str, index: int, **kw: object) -> GpuSample:
    base: dict[str, object] = {
        "time_ns": NOW_NS - 2 * S,
        "host": host,
        "gpu_index": index,
        "uuid": f"GPU-{host}-{index}",
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_gpu_pct": 90.0,
        "temperature_gpu_c": 60.0,
        "clock_event_reasons": 0,
    }
    base.update(kw)
    return GpuSample(**base)  # type: ignore[arg-type]


CLUSTER = [
    _gpu("gpu-10", 0, job_id="train"),
    _gpu("gpu-2", 0, job_id="train"),
    _gpu(
        "gpu-2", 1, job_id="train", temperature_gpu_c=90.0, clock_event_reasons=REASON_HW_SLOWDOWN
    ),
    _gpu("gpu-2", 2, job_id="infer", temperature_gpu_c=88.0),
    _gpu("gpu-3", 0, lost=True),
    _gpu("gpu-3", 1, time_ns=NOW_NS - 120 * S),
    _gpu("gpu-3", 2, clock_event_reasons=REASON_SW_POWER_CAP),  # normal at full load
]


def test_the_live_line_writes_a_large_cluster_s_flops_in_pflops() -> None:
    small = [_gpu("n", i, tflops_estimate=400.0) for i in range(2)]
    large = [_gpu("n", i, tflops_estimate=400.0) for i in range(64)]
    assert "800 TFLOPS" in summary_line(small)
    assert "25.6 PFLOPS" in summary_line(large) and "TFLOPS" not in summary_line(large)


def test_state_says_throttled_hot_lost_or_stale() -> None:
    states = {(s.host, s.gpu_index): gpu_state(s, now_ns=NOW_NS) for s in CLUSTER}
    assert states == {
        ("gpu-10", 0): "ok",
        ("gpu-2", 0): "ok",
        ("gpu-2", 1): "throttled",  # 90 °C with hardware slowdown is not "ok"
        ("gpu-2", 2): "hot",
        ("gpu-3", 0): "lost",
        ("gpu-3", 1): "stale",
        ("gpu-3", 2): "ok",
    }
    thermal = _gpu("h", 0, clock_event_reasons=REASON_HW_THERMAL | REASON_SW_POWER_CAP)
    assert gpu_state(thermal, now_ns=NOW_NS) == "throttled"


def test_rows_in_natural_host_order_and_footer_counts_states() -> None:
    text = render_status(CLUSTER, now_ns=NOW_NS)
    hosts = [line.split()[0] for line in text.splitlines()[1:-1]]
    assert hosts == ["gpu-2", "gpu-2", "gpu-2", "gpu-3", "gpu-3", "gpu-3", "gpu-10"]
    assert text.splitlines()[-1] == "7 GPUs, 1 lost, 1 stale, 1 throttled, 1 hot, 3 ok"
    assert sorted(["gpu-101", "gpu-8", "gpu-1"], key=natural_key) == ["gpu-1", "gpu-8", "gpu-101"]


def test_filters_by_host_pattern_job_and_problems() -> None:
    def pick(**kw: object) -> list[tuple[str, int]]:
        chosen = select_samples(CLUSTER, now_ns=NOW_NS, **kw)  # type: ignore[arg-type]
        return sorted((s.host, s.gpu_index) for s in chosen)

    assert pick(host="gpu-2") == [("gpu-2", 0), ("gpu-2", 1), ("gpu-2", 2)]
    assert pick(host="gpu-1*") == [("gpu-10", 0)]
    assert pick(job="train") == [("gpu-10", 0), ("gpu-2", 0), ("gpu-2", 1)]
    assert pick(problems=True) == [("gpu-2", 1), ("gpu-2", 2), ("gpu-3", 0), ("gpu-3", 1)]
    assert pick(problems=True, job="train") == [("gpu-2", 1)]
    shown = select_samples(CLUSTER, now_ns=NOW_NS, problems=True)
    footer = render_status(shown, now_ns=NOW_NS, total=len(CLUSTER)).splitlines()[-1]
    assert footer.endswith("(showing 4 of 7)")


def test_watch_redraws_each_interval_and_stops_on_ctrl_c() -> None:
    frames = iter(["one", "two", "three"])
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        if len(slept) == 2:
            raise KeyboardInterrupt

    out = io.StringIO()
    watch(lambda: next(frames), every_s=5.0, out=out, sleep_s=sleep)
    assert out.getvalue() == "one\ntwo\n"  # not a terminal: no screen clearing
    assert slept == [5.0, 5.0]


def _cli(*args: str, home: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUWATT_HOME": str(home)}
    env.pop("GPUWATT_STORE", None)
    code = f"import sys\n{prelude}\nfrom gpuwatt.cli import main\nsys.exit(main({list(args)!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_status_command_filters_a_real_store(tmp_path: Path) -> None:
    import time

    now = time.time_ns()
    db = tmp_path / "s.db"
    with SqliteStore(db) as store:
        store.write_samples([_gpu(s.host, s.gpu_index, time_ns=now - S, job_id=s.job_id,
                                  temperature_gpu_c=s.temperature_gpu_c,
                                  clock_event_reasons=s.clock_event_reasons)
                             for s in CLUSTER])  # fmt: skip
    url = f"sqlite:///{db}"
    result = _cli("status", "--store", url, "--problems", "--job", "train", home=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("gpu-")]
    assert [r.split()[:2] for r in rows] == [["gpu-2", "1"]]
    assert "throttled" in rows[0] and "hw-slowdown" in rows[0]
    assert "(showing 1 of 7)" in result.stdout


def test_dashboard_without_its_extra_names_the_extra_in_one_line(tmp_path: Path) -> None:
    # sys.modules[name] = None makes the import system raise ModuleNotFoundError for it, as on a
    # compute node that installed the collector alone.
    result = _cli(
        "dashboard",
        "--store",
        f"sqlite:///{tmp_path / 'x.db'}",
        home=tmp_path,
        prelude="sys.modules['dash'] = None",
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "pip install 'gpuwatt[dashboard]'" in lines[0]
    assert "Traceback" not in result.stderr
