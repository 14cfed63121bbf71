"""The command line as a user runs it: real processes, real files, real exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatt.store import open_store
from gpuwatt.store.sqlite import SqliteStore

GPUS = 32


def gpuwatt(*args: str, home: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUWATT_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("GPUWATT_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "gpuwatt", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_collect_without_nvidia_driver_fails_at_once_with_one_clear_line(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    result = gpuwatt("collect", "--store", f"sqlite:///{db}", home=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "NVML is not available" in lines[0]
    assert "--simulate" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not db.exists()


def test_collect_simulated_writes_one_sample_per_gpu_per_interval(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    result = gpuwatt(
        "collect",
        "--simulate",
        "healthy",
        "--duration",
        "6",
        "--interval",
        "0.5",
        "--store",
        f"sqlite:///{db}",
        "--spool",
        str(tmp_path / "spool"),
        home=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    with SqliteStore(db) as store:
        raw = store.series(0, 2**62, ["power_w"])
    counts = raw.groupby(["host", "gpu_index"]).size().to_dict()
    assert len(counts) == GPUS
    # 6 s at 0.5 s: 12 ticks, exact within one interval, and the same count for every GPU
    assert len(set(counts.values())) == 1
    assert 11 <= next(iter(counts.values())) <= 13


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (
            "name: x\ncluster:\n  nodes: two\n  gpus_per_node: 8\n  model: H100 SXM\n",
            3,
            "expected an integer",
        ),
        ("name: x\ncluster: {nodes: 1, gpus_per_node: 1, model: H100 SXM}\nfaults: [\n", 4, ""),
        ("name: x\ncluster: {nodes: 1, gpus_per_node: 1, model: Z9}\n", 2, "Z9"),
    ],
)
def test_malformed_scenario_is_rejected_by_every_command(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    db = tmp_path / "x.db"
    for args in (
        ("check-config", str(bad)),
        ("collect", "--simulate", str(bad), "--store", f"sqlite:///{db}", "--duration", "1"),
        ("demo", "--scenario", str(bad), "--store", f"sqlite:///{db}", "--duration", "1"),
    ):
        result = gpuwatt(*args, home=tmp_path)
        assert result.returncode != 0, args
        assert f"{bad}:{line}:" in result.stderr, (args, result.stderr)
        assert reason in result.stderr
        assert "Traceback" not in result.stderr
    assert not db.exists()  # nothing was written anywhere


def test_malformed_config_is_rejected_before_anything_runs(tmp_path: Path) -> None:
    bad = tmp_path / "gpuwatt.yaml"
    bad.write_text("collector:\n  interval: 1s\n  spool_max_mib: lots\n")
    db = tmp_path / "x.db"
    for args in (
        ("check-config", str(bad)),
        ("collect", "--simulate", "healthy", "--config", str(bad), "--store", f"sqlite:///{db}"),
        ("status", "--config", str(bad)),
    ):
        result = gpuwatt(*args, home=tmp_path)
        assert result.returncode != 0
        assert f"{bad}:3: expected an integer" in result.stderr
    assert not db.exists()


def test_check_config_accepts_shipped_scenarios_and_a_good_config(tmp_path: Path) -> None:
    good = tmp_path / "gpuwatt.yaml"
    good.write_text("collector:\n  interval: 2s\nenergy:\n  price_per_kwh: 0.3\n")
    scenarios = Path(__file__).resolve().parents[1] / "collector" / "sim" / "scenarios"
    result = gpuwatt("check-config", str(good), *map(str, scenarios.glob("*.yaml")), home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") == 1 + len(list(scenarios.glob("*.yaml")))


def test_store_url_with_a_token_is_refused(tmp_path: Path) -> None:
    result = gpuwatt(
        "status", "--store", "influxdb://user:s3cr3t@127.0.0.1:8086/b?org=o", home=tmp_path
    )
    assert result.returncode != 0
    assert "INFLUXDB_V2_TOKEN" in result.stderr
    assert "s3cr3t" not in result.stderr + result.stdout


def test_demo_then_status_shows_every_gpu(tmp_path: Path) -> None:
    demo = gpuwatt("demo", "--backfill", "60", "--duration", "2", "--port", "0", home=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "backfilled 60 s of history" in demo.stdout
    status = gpuwatt("status", home=tmp_path)
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if line.startswith("node-")]
    assert len(rows) == GPUS
    assert f"{GPUS} GPUs, 0 lost" in status.stdout
    # the default store is the one both commands found without any flag
    store = open_store(f"sqlite:///{tmp_path / 'gpuwatt.db'}")
    try:
        assert len(store.latest()) == GPUS
    finally:
        store.close()


def test_analyze_on_the_demo_names_the_straggler_and_the_idle_allocated_gpu(
    tmp_path: Path,
) -> None:
    # 15 minutes of the demo: the thermal fault starts a few minutes in
    demo = gpuwatt(
        "demo", "--backfill", "900", "--duration", "1", "--no-dashboard", "--no-alerts",
        home=tmp_path,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    result = gpuwatt("analyze", "--since", "15m", home=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ACTIVE node-2 GPU 5 job llm-pretrain: thermal" in out
    assert "hardware thermal slowdown" in out
    assert "ALLOCATED GPU 7 on node-3 is allocated to job notebook-17" in out
    assert "MFU" in out  # the demo's training job reports its steps


def test_a_restarted_demo_carries_on_instead_of_backfilling_over_its_data(tmp_path: Path) -> None:
    """Stopped and started again on the same store, the demo stores one history: no sample twice,
    no second writer's counter interleaved, and the energy of the whole range is what the GPUs
    drew (their power over the seconds sampled) as for one continuous run."""
    from gpuwatt.analytics import ANALYSIS_FIELDS, analyze

    args = ("--backfill", "240", "--duration", "3", "--no-dashboard", "--no-alerts")
    first = gpuwatt("demo", *args, home=tmp_path)
    assert first.returncode == 0, first.stderr
    second = gpuwatt("demo", *args, home=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "carrying on from there instead of backfilling over it" in second.stdout
    with SqliteStore(tmp_path / "gpuwatt.db") as store:
        latest = store.latest()
        end = max(s.time_ns for s in latest) + 1
        start = end - 600 * 1_000_000_000
        raw = store.series(start, end, ["power_w", "energy_j"])
        frame = store.series(start, end, ANALYSIS_FIELDS)
    assert not raw.duplicated(["uuid", "time_ns"]).any()
    summary = analyze(frame, now_ns=end, start_ns=start, window_s=60)
    assert not any("two collectors" in note for note in summary.notes), summary.notes
    raw = raw.sort_values(["uuid", "time_ns"])
    dt_s = raw.groupby("uuid")["time_ns"].diff().fillna(1e9) / 1e9
    # docs/accounting.md: the time between the two runs (over three 1-s steps) was not seen, so
    # it is no energy; the first sample of each run stands for one step.
    drawn_kwh = float((raw["power_w"] * dt_s.where(dt_s <= 3.0, 1.0)).sum()) / 3.6e6
    assert summary.cluster["energy_kwh"].value == pytest.approx(drawn_kwh, rel=0.005)
