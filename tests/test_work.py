"""WorkReporter: a training job's steps reach the store without ever holding up the loop."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest

from gpuwatt.job_step_format import JobStep
from gpuwatt.store.job_steps import InfluxJobStepStore, open_job_step_store
from gpuwatt.work import WorkReporter, gpus_from_environment

FAST = dict(flush_interval_s=0.05, close_timeout_s=10.0, host="node-0")


def _read(url: str) -> pd.DataFrame:
    store = open_job_step_store(url)
    try:
        return store.job_steps(0, 2**62)
    finally:
        store.close()


def test_steps_reach_sqlite(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/g.db"
    rep = WorkReporter("job-1", rank=2, store_url=url, model_flops_per_step=3.166e15,
                       gpus=["GPU-a"], **FAST)  # fmt: skip
    try:
        for _ in range(3):
            with rep.timed_step():
                time.sleep(0.01)
        rep.step(1.5)
        rep.step(0.5, step=100, model_flops_per_step=1e12)
        assert rep.flush(timeout_s=10)
        df = _read(url)
    finally:
        rep.close()
    assert df["step"].tolist() == [0, 1, 2, 3, 100]
    assert (df["step_time_s"].iloc[:3] >= 0.01).all()
    assert df["step_time_s"].iloc[3:].tolist() == [1.5, 0.5]
    assert df["model_flops_per_step"].tolist() == [3.166e15] * 4 + [1e12]
    assert set(df["job_id"]) == {"job-1"} and set(df["rank"]) == {2}
    assert set(df["gpu_uuids"]) == {"GPU-a"} and set(df["precision"]) == {"bf16"}
    assert rep.stats.delivered == 5 and rep.stats.failures == 0


def test_step_without_a_time_measures_since_the_previous(tmp_path: Path) -> None:
    clock = iter([0.0, 2.0, 2.5])  # construction, step, step
    rep = WorkReporter("j", store_url=f"sqlite://{tmp_path}/g.db", monotonic_s=lambda: next(clock),
                       **FAST)  # fmt: skip
    try:
        rep.step()
        rep.step()
        assert rep.flush(timeout_s=10)
    finally:
        rep.close()
    assert _read(f"sqlite://{tmp_path}/g.db")["step_time_s"].tolist() == [2.0, 0.5]


def test_default_store_from_environment(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/env.db"
    with WorkReporter("j", environ={"GPUWATT_STORE": url}, **FAST) as rep:
        rep.step(1.0)
        assert rep.flush(timeout_s=10)
    assert len(_read(url)) == 1


def test_sqlite_down_then_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("a file where the store's directory should be")
    url = f"sqlite://{blocker}/g.db"
    caplog.set_level(logging.WARNING, logger="gpuwatt.work")
    rep = WorkReporter("j", store_url=url, **FAST)
    try:
        started = time.perf_counter()
        for _ in range(50):
            rep.step(1.0)
        assert time.perf_counter() - started < 0.5  # never waits on the store
        deadline = time.monotonic() + 10
        while rep.stats.failures < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rep.stats.failures >= 3 and rep.stats.delivered == 0
        assert rep.stats.buffered == 50
        outage_logs = [r for r in caplog.records if "cannot write job steps" in r.message]
        assert len(outage_logs) == 1  # logged once, however many failures
        blocker.unlink()
        blocker.mkdir()
        assert rep.flush(timeout_s=10)
        assert rep.stats.delivered == 50 and rep.stats.dropped == 0
        assert any("delivering again" in r.message for r in caplog.records)
    finally:
        rep.close()
    assert _read(url)["step"].tolist() == list(range(50))


class _BlockedStore:
    """A store whose writes hang until released (a server that accepts and never answers)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.written: list[JobStep] = []

    def write_job_steps(self, steps: Sequence[JobStep]) -> None:
        self.release.wait(30)
        self.written.extend(steps)

    def job_steps(self, start_ns: int, end_ns: int, *, job_ids: object = None) -> pd.DataFrame:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_hung_store_never_blocks_and_buffer_is_bounded() -> None:
    store = _BlockedStore()
    rep = WorkReporter("j", store=store, max_buffer=10, flush_interval_s=0.01, close_timeout_s=0.2,
                       host="h")  # fmt: skip
    try:
        rep.step(1.0)
        deadline = time.monotonic() + 5
        while rep.stats.buffered != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the writer holds the first step in flight
        started = time.perf_counter()
        for _ in range(100):
            rep.step(1.0)
        assert time.perf_counter() - started < 0.5
        stats = rep.stats
        assert stats.recorded == 101 and stats.dropped == 90 and stats.buffered == 11
        rep.close()  # gives up after close_timeout_s: the step is not the training loop's problem
        assert rep.stats.dropped == 101
    finally:
        store.release.set()
        rep._thread.join(5)
    assert not rep._thread.is_alive()


def test_bad_input_is_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    store = _BlockedStore()
    store.release.set()
    with WorkReporter("j", store=store, **FAST) as rep:
        rep.step("not a number")  # type: ignore[arg-type]
        rep.step(-1.0)  # ignored: not a step time
        rep.step(float("nan"))
        rep.step(1.0)
        assert rep.flush(timeout_s=10)
        assert rep.stats.failures == 1 and rep.stats.delivered == 1
    assert [s.step for s in store.written] == [0]


def test_exception_in_timed_block_is_not_a_step() -> None:
    store = _BlockedStore()
    store.release.set()
    with WorkReporter("j", store=store, **FAST) as rep:
        with pytest.raises(RuntimeError), rep.timed_step():
            raise RuntimeError("OOM")
        with rep.timed_step():
            pass
        assert rep.flush(timeout_s=10)
    assert len(store.written) == 1


def test_gpus_from_environment() -> None:
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert gpus_from_environment(uuids, "h") == ("GPU-a", "GPU-b")
    idx = {"CUDA_VISIBLE_DEVICES": "0,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus_from_environment(idx, "h") == ("h:0", "h:3")
    assert gpus_from_environment({"CUDA_VISIBLE_DEVICES": "0,3"}, "h") == ()
    assert gpus_from_environment({}, "h") == ()


@pytest.mark.servers
def test_influx_down_then_up(victoria_metrics) -> None:
    vm = victoria_metrics
    vm.stop()
    store = InfluxJobStepStore.connect(vm.url, "org", "gpuwatt", timeout_s=2.0)
    ticks = iter(range(10**6))
    t0_ns = 1_700_000_000 * 10**9  # one step a second (the server keeps milliseconds)
    rep = WorkReporter("train-9", rank=0, store=store, model_flops_per_step=1e15,
                       clock_ns=lambda: t0_ns + next(ticks) * 10**9, **FAST)  # fmt: skip
    try:
        started = time.perf_counter()
        for k in range(20):
            rep.step(1.0 + k / 100)
        assert time.perf_counter() - started < 0.5
        deadline = time.monotonic() + 10
        while rep.stats.failures < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rep.stats.failures >= 2 and rep.stats.delivered == 0
        vm.start()
        assert rep.flush(timeout_s=30)
        assert rep.stats.delivered == 20
    finally:
        rep.close()
    series = vm.export('{__name__="gpuwatt_job_step_step_time_s"}')
    assert len(series) == 1 and series[0]["metric"]["job_id"] == "train-9"
    assert series[0]["values"] == pytest.approx([1.0 + k / 100 for k in range(20)])


def test_close_is_idempotent_and_late_steps_are_dropped(tmp_path: Path) -> None:
    rep = WorkReporter("j", store_url=f"sqlite://{tmp_path}/g.db", **FAST)
    rep.close()
    rep.close()
    rep.step(1.0)
    assert rep.stats.dropped == 1
    shutil.rmtree(tmp_path, ignore_errors=True)
