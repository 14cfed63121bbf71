"""MIG devices sampled as devices of their own, through the fake NVML (scripted per GPU)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from nvml_fixtures import (
    Activity,
    make_cluster,
    run_all,
    run_mig_for,
    scenario_mig_partitioned,
)

from gpuwatt.collector.jobs import MappingDirResolver, attach_jobs
from gpuwatt.collector.nvml_source import NvmlSampler
from gpuwatt.collector.sim.fake_nvml import FakeNvml
from gpuwatt.collector.sim.state import SimCluster
from gpuwatt.gpu_specs import SPECS
from gpuwatt.line_protocol import LineEncoder, decode_line
from gpuwatt.model import GpuSample, TflopsMethod
from gpuwatt.store.influx import InfluxStore
from gpuwatt.tflops import PipePeaks, tflops_from_pipes

HOST = "node-1"
GIB = 1024**3
BUSY = Activity()


class Ticker:
    def __init__(self, cluster: SimCluster, sampler: NvmlSampler) -> None:
        self.cluster, self.sampler, self.mono_s = cluster, sampler, 100.0

    def __call__(self, activity: Activity = BUSY, *, include_slow: bool = False) -> list[GpuSample]:
        run_all(self.cluster, 1.0, activity)
        for g in self.cluster.gpus:
            for m in g.mig_devices:
                if m is not None:
                    run_mig_for(m, 1.0, activity)
        self.mono_s += 1.0
        return self.sampler.sample(include_slow)


def _sampler(cluster: SimCluster) -> tuple[NvmlSampler, Ticker]:
    ticker: Ticker
    s = NvmlSampler(
        FakeNvml(cluster, HOST),
        HOST,
        clock_ns=lambda: int(ticker.mono_s * 1e9),
        monotonic_s=lambda: ticker.mono_s,
        xid_events=False,
    )
    ticker = Ticker(cluster, s)
    return s, ticker


def test_each_mig_device_is_a_device_of_its_own_after_its_parent() -> None:
    cluster = make_cluster(2)
    migs = scenario_mig_partitioned(cluster, index=0)
    migs[0].processes = [(4242, 30 * GIB)]
    migs[0].memory_used_bytes = 30 * GIB
    sampler, tick = _sampler(cluster)
    with sampler:
        samples = tick()
        infos = sampler.mig_devices()
    assert [(s.gpu_index, s.uuid) for s in samples] == [
        (0, cluster.gpus[0].uuid),
        *((0, m.uuid) for m in migs),
        (1, cluster.gpus[1].uuid),
    ]
    parent, first = samples[0], samples[1]
    assert parent.mig_enabled is True and parent.parent_uuid is None
    assert parent.power_w == 500.0  # the whole GPU's facts stay on the parent
    assert first.name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert first.parent_uuid == cluster.gpus[0].uuid
    assert (first.gpu_instance_id, first.compute_instance_id) == (1, 0)
    assert first.memory_total_bytes == 40320 * 1024 * 1024
    assert first.memory_used_bytes == 30 * GIB
    assert first.processes is not None and [p.pid for p in first.processes] == [4242]
    # what NVML refuses on a MIG handle is absent, never zero
    for s in samples[1:4]:
        assert s.power_w is None and s.temperature_gpu_c is None and s.energy_j is None
        assert s.utilization_gpu_pct is None and s.sm_clock_mhz is None
        assert not s.lost
    # the parent's utilisation and device-level GPM are refused in MIG mode; nothing of the MIG
    # devices is (the sampler asks them only what NVML answers on a MIG handle)
    assert sampler.unsupported_fields() == {
        "gpu0/gpm": "NVMLError_NotSupported",
        "gpu0/utilization": "NVMLError_NotSupported",
    }
    assert [(i.mig_index, i.gpu_instance_id, i.multiprocessor_count) for i in infos] == [
        (0, 1, 60),
        (1, 2, 32),
        (2, 3, 16),
    ]


def test_mig_activity_comes_from_gpm_through_the_parent_and_tflops_scale_by_sms() -> None:
    cluster = make_cluster(1)
    migs = scenario_mig_partitioned(cluster, index=0)
    busy = Activity(tensor_hmma_pct=50.0, sm_active_pct=80.0, fp32_pct=6.0, sm_clock_mhz=1755.0)
    sampler, tick = _sampler(cluster)
    with sampler:
        tick(busy)  # GPM needs two snapshots
        samples = tick(busy)
    peaks = PipePeaks.of(SPECS["H100 SXM"], "bf16")
    assert peaks is not None
    whole = tflops_from_pipes(peaks, 1755.0, 50.0, 0.0, 0.0, 6.0, 0.0)
    assert whole is not None
    for s, m in zip(samples[1:], migs, strict=True):
        assert s.utilization_gpu_pct == pytest.approx(100.0)  # GPM graphics-engine activity
        assert s.sm_active_pct == pytest.approx(80.0)
        assert s.tensor_hmma_active_pct == pytest.approx(50.0)
        assert s.tflops_method is TflopsMethod.GPM
        assert s.tflops_estimate == pytest.approx(whole * m.multiprocessor_count / 132)
    assert samples[0].tflops_estimate is None  # the parent's own GPM is refused in MIG mode


def test_a_free_slot_is_skipped_and_reconfiguration_is_found_on_a_slow_tick() -> None:
    cluster = make_cluster(1)
    migs = scenario_mig_partitioned(cluster, index=0, profiles=("1g.10gb", "1g.10gb"))
    g = cluster.gpus[0]
    g.mig_devices.insert(0, None)  # slot 0 free
    migs[0].index, migs[1].index = 1, 2
    sampler, tick = _sampler(cluster)
    with sampler:
        assert [s.uuid for s in tick()[1:]] == [migs[0].uuid, migs[1].uuid]
        g.mig_devices[2] = None  # the second instance is destroyed
        assert [s.uuid for s in tick()[1:]] == [migs[0].uuid, migs[1].uuid]  # until rescanned
        assert [s.uuid for s in tick(include_slow=True)[1:]] == [migs[0].uuid]


def test_a_lost_parent_loses_its_mig_devices_and_they_come_back_with_it() -> None:
    cluster = make_cluster(1)
    migs = scenario_mig_partitioned(cluster, index=0)
    sampler, tick = _sampler(cluster)
    with sampler:
        tick()
        cluster.gpus[0].lost = True
        lost = tick()
        assert [s.lost for s in lost] == [True, True, True, True]
        assert [s.uuid for s in lost[1:]] == [m.uuid for m in migs]
        assert all(s.parent_uuid == cluster.gpus[0].uuid for s in lost[1:])
        cluster.gpus[0].lost = False
        back = tick()
    assert [s.lost for s in back] == [False] * 4
    assert back[1].memory_total_bytes is not None


def test_a_gpu_leaving_mig_mode_has_no_mig_devices_after_it_is_found_again() -> None:
    cluster = make_cluster(1)
    scenario_mig_partitioned(cluster, index=0)
    sampler, tick = _sampler(cluster)
    with sampler:
        assert len(tick()) == 4
    cluster.gpus[0].mig_enabled = False
    with sampler:
        assert len(tick()) == 1
    assert sampler.mig_devices() == []


def test_a_gpu_without_gpm_gives_mig_devices_memory_and_processes_but_no_activity() -> None:
    cluster = make_cluster(1, model="A100 SXM")
    scenario_mig_partitioned(cluster, index=0, profiles=("2g.20gb", "2g.20gb"))
    sampler, tick = _sampler(cluster)
    with sampler:
        tick()
        samples = tick()
    for s in samples[1:]:
        assert s.memory_total_bytes is not None and s.processes == ()
        assert s.sm_active_pct is None and s.tflops_estimate is None
    assert "gpu0/mig0/gpm" in sampler.unsupported_fields()


def test_a_mig_device_keeps_its_parent_and_instance_ids_through_line_protocol() -> None:
    cluster = make_cluster(1)
    scenario_mig_partitioned(cluster, index=0, profiles=("1g.10gb",))
    sampler, tick = _sampler(cluster)
    with sampler:
        parent, mig = tick()
    line = LineEncoder().encode(mig)
    assert f'parent_uuid="{parent.uuid}"' in line and "gpu_instance_id=1i" in line
    back = decode_line(line)
    assert (back.uuid, back.parent_uuid, back.gpu_instance_id, back.compute_instance_id) == (
        mig.uuid,
        parent.uuid,
        1,
        0,
    )
    assert back.memory_total_bytes == mig.memory_total_bytes
    assert "parent_uuid" not in LineEncoder().encode(parent)


def test_jobs_are_resolved_per_mig_device_and_never_for_the_gpu_in_mig_mode(
    tmp_path: Path,
) -> None:
    cluster = make_cluster(1)
    migs = scenario_mig_partitioned(cluster, index=0, profiles=("3g.40gb", "3g.40gb"))
    (tmp_path / migs[1].uuid).write_text("slurm-77\n")
    (tmp_path / "0").write_text("whole-gpu-job\n")  # a stale file for the parent's index
    migs[1].processes = [(4242, GIB)]
    sampler, tick = _sampler(cluster)
    with sampler:
        parent, first, second = attach_jobs(tick(), MappingDirResolver(tmp_path))
    assert parent.processes is not None and [p.pid for p in parent.processes] == [4242]
    assert parent.job_id is None  # its processes are its MIG devices'
    assert first.job_id is None  # a MIG device is named by its uuid only, never by the index
    assert second.job_id == "slurm-77"


def test_mig_devices_keep_their_parent_through_a_real_influxdb(influx_db: Any) -> None:
    server, db = influx_db
    cluster = make_cluster(1)
    migs = scenario_mig_partitioned(cluster, index=0, profiles=("3g.40gb", "1g.10gb"))
    sampler, tick = _sampler(cluster)
    with sampler:
        written = tick()
    now = time.time_ns()
    written = [dataclasses.replace(s, time_ns=now) for s in written]
    with InfluxStore(server.url, "", db, timeout_s=10) as store:
        store.write_samples(written)
        got = {s.uuid: s for s in store.latest()}
    assert set(got) == {cluster.gpus[0].uuid, *(m.uuid for m in migs)}
    for m in migs:
        s = got[m.uuid]
        assert (s.parent_uuid, s.gpu_instance_id, s.compute_instance_id) == (
            cluster.gpus[0].uuid,
            m.gpu_instance_id,
            0,
        )
        assert s.gpu_index == 0 and s.memory_total_bytes == m.memory_total_bytes
    assert got[cluster.gpus[0].uuid].parent_uuid is None
