"""The read-path contract every store honours, run against SqliteStore, against InfluxStore
reading a real InfluxDB 1.6.7 (loaded through its /write endpoint with our encoder), and against
the PromQL store on a real VictoriaMetrics (loaded through the store's own line-protocol writes)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pytest

from gpuwatt.dashboard.pages import health
from gpuwatt.model import METRIC_FIELDS, EnergyMethod, GpuSample, GpuSeen
from gpuwatt.store import KEY_COLUMNS, LAST_VALUE_ATTRS, Store, engine_rollups, open_store
from gpuwatt.store.base import SEEN_COLUMN, XID_ATTR, gpus_seen, latest_of
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour (and minute) since the epoch


@dataclass
class Backend:
    store: Store
    load: Callable[[Sequence[GpuSample]], None]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("influxdb1", marks=pytest.mark.servers),
        pytest.param("victoriametrics", marks=pytest.mark.servers),
        pytest.param("influxdb1+rollups", marks=pytest.mark.servers),
        pytest.param("victoriametrics+rollups", marks=pytest.mark.servers),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each store; ``+rollups``: the engine also keeps its rollups of what was loaded
    (``engine_rollups``), so that bucketed reads are served from them."""
    rollups = request.param.endswith("+rollups")
    if request.param.startswith("victoriametrics"):
        vm = request.getfixturevalue("victoria_metrics")
        url = vm.url.replace("http://", "victoriametrics://") + ("?rollups=on" if rollups else "")
        prom = open_store(url)
        # latest() looks back an hour by default; these tests' samples are from 2023.
        prom.latest_lookback_s = 10 * 365 * 86400.0  # type: ignore[attr-defined]

        def load(samples: Sequence[GpuSample]) -> None:
            prom.write_samples(samples)
            vm.force_flush()
            if rollups and samples:
                _roll(prom, samples)
                vm.force_flush()

        try:
            yield Backend(prom, load)
        finally:
            prom.close()
    elif request.param == "sqlite":
        store = SqliteStore(tmp_path / "contract.db")
        try:
            yield Backend(store, store.write_samples)
        finally:
            store.close()
    else:
        server, db = request.getfixturevalue("influx_db")
        with InfluxStore(server.url, "", db, timeout_s=10) as influx:

            def load_influx(samples: Sequence[GpuSample]) -> None:
                server.write_samples(db, samples)
                if rollups and samples:
                    _roll(influx, samples)

            yield Backend(influx, load_influx)


def _roll(store: Store, samples: Sequence[GpuSample]) -> None:
    """Roll every minute and hour the samples touch, as collectors do for their own GPUs."""
    times = [s.time_ns for s in samples]
    engine_rollups.roll_range(store.rollups, min(times), max(times) + 1)  # type: ignore[attr-defined]


def lost(t_ns: int, host: str = "node1", gpu_index: int = 0) -> GpuSample:
    return GpuSample(
        time_ns=t_ns,
        host=host,
        gpu_index=gpu_index,
        uuid=f"GPU-{host}-{gpu_index}",
        name="NVIDIA H100 80GB HBM3",
        lost=True,
    )


def sparse(t_ns: int, host: str = "node1", gpu_index: int = 0) -> GpuSample:
    """An old GPU: most metrics unsupported (None)."""
    return GpuSample(
        time_ns=t_ns,
        host=host,
        gpu_index=gpu_index,
        uuid=f"GPU-{host}-{gpu_index}",
        name="Tesla K80",
        power_w=70.5,
        memory_used_bytes=1024 * 1024 * 1024,
    )


def test_full_sample_round_trips_through_latest(backend: Backend, make_sample) -> None:
    """Every field, the job id (with a quote and a space), and how energy and TFLOPS were
    obtained included; on VictoriaMetrics all but per-process details and the XIDs' list (it
    keeps numbers: the strings go in an info series' labels, ``line_protocol.with_info_line``)."""
    full = make_sample(T0, "node1", 0)
    old = sparse(T0, "node2", 0)
    backend.load([full, old])
    got = backend.store.latest()
    assert got == [_kept_by(backend.store, full), _kept_by(backend.store, old)]
    assert got[0].job_id == 'job "42"' and got[0].energy_method is EnergyMethod.COUNTER
    assert got[1].temperature_gpu_c is None and got[1].utilization_gpu_pct is None


def metric_columns(df: pd.DataFrame) -> list[str]:
    """A frame's columns but the seen time, which a store gives where it knows it."""
    return [c for c in df.columns if c != SEEN_COLUMN]


def test_none_is_nan_in_series_never_zero(backend: Backend) -> None:
    backend.load([sparse(T0 + i * S) for i in range(3)])
    df = backend.store.series(T0, T0 + 10 * S, ["power_w", "temperature_gpu_c", "energy_j"])
    assert metric_columns(df) == [*KEY_COLUMNS, "power_w", "temperature_gpu_c", "energy_j"]
    assert df["power_w"].tolist() == [70.5] * 3
    assert df["temperature_gpu_c"].isna().all()
    assert df["energy_j"].isna().all()


def test_latest_is_newest_per_gpu_and_reports_lost_gpus(backend: Backend, make_sample) -> None:
    samples = [make_sample(T0 + i * S, "node1", g) for i in range(3) for g in range(2)]
    samples.append(lost(T0 + 3 * S, "node1", 1))
    samples.append(make_sample(T0 - 3600 * S, "gone", 0))
    backend.load(samples)
    got = backend.store.latest(since_ns=T0)
    assert [(s.host, s.gpu_index, s.time_ns, s.lost) for s in got] == [
        ("node1", 0, T0 + 2 * S, False),
        ("node1", 1, T0 + 3 * S, True),
    ]
    assert _kept_by(backend.store, got[0]) == _kept_by(backend.store, samples[4])
    assert got[1].power_w is None and got[1].utilization_gpu_pct is None
    assert {s.host for s in backend.store.latest()} == {"node1", "gone"}


def test_the_gpus_seen_are_latests_without_their_values(backend: Backend, make_sample) -> None:
    """``base.gpus_seen`` (an engine's own read of each GPU's newest sample time, else from
    ``latest``) gives the GPUs ``latest`` gives: identity, newest time, job (as each store keeps
    it), in its order, since a time or over the lookback; a lost GPU is seen too. And
    ``base.latest_of`` gives ``latest``'s samples of some nodes' GPUs, or with one metric."""
    samples = [
        make_sample(T0 + i * S, host, g, job_id=f"job-{g}")
        for i in range(3)
        for host in ("node-b", "node-a")
        for g in range(2)
    ]
    samples.append(lost(T0 + 3 * S, "node-a", 1))
    samples.append(make_sample(T0 - 3600 * S, "gone", 0))
    backend.load(samples)
    for since in (T0, None):
        latest = backend.store.latest(since_ns=since)
        seen = gpus_seen(backend.store, since_ns=since)
        assert seen == [GpuSeen.of(s) for s in latest]
        assert len(seen) == (4 if since else 5)
    assert [(s.host, s.gpu_index, s.time_ns) for s in seen][:2] == [
        ("gone", 0, T0 - 3600 * S),
        ("node-a", 0, T0 + 2 * S),
    ]
    # one node's newest samples (``base.latest_of``: an engine's own read of its GPUs alone)
    for hosts in (["node-a"], ["gone", "node-b"], ["elsewhere"], ["node"]):
        want = [s for s in backend.store.latest() if s.host in hosts]
        assert latest_of(backend.store, hosts) == want
        assert len(want) == {"node-a": 2, "gone": 3}.get(hosts[0], 0)
    # one metric of every GPU, and each GPU's state; the health page's metrics and each GPU's
    # newest XID (``XID_ATTR``, a sample attribute like the metrics)
    whole = backend.store.latest()

    def shown(samples: list[GpuSample], attrs: Sequence[str]) -> list[tuple[object, ...]]:
        return [(s.key, s.time_ns, s.lost, *(getattr(s, a) for a in attrs)) for s in samples]

    part = latest_of(backend.store, attrs=("power_w",))
    assert shown(part, ["power_w"]) == shown(whole, ["power_w"])
    assert any(s.lost for s in part) and any(s.power_w for s in part)
    assert XID_ATTR in health.NEWEST_SHOWN
    some = latest_of(backend.store, attrs=health.NEWEST_SHOWN)
    assert shown(some, health.NEWEST_SHOWN) == shown(whole, health.NEWEST_SHOWN)
    # so the GPUs seen are those of any metric's newest samples (a page that reads one serves
    # them to its view)
    assert [GpuSeen.of(s) for s in part] == gpus_seen(backend.store)


def test_a_gpu_that_changed_jobs_is_seen_in_its_newest_job(backend: Backend, make_sample) -> None:
    """A GPU's newest sample names its job, its newest values are the newest job's, whatever
    the store (on a Prometheus-compatible engine a job is a label: the GPU's series of its
    older job are still within the lookback, their values older)."""
    samples = [
        make_sample(T0 + i * S, "node1", 0, job_id="job-y" if i < 3 else "job-b", power_w=100.0 + i)
        for i in range(5)
    ]
    samples += [make_sample(T0 + i * S, "node1", 1, job_id="job-c", power_w=50.0) for i in range(5)]
    backend.load(samples)
    for since in (T0, None):
        got = backend.store.latest(since_ns=since)
        assert [(s.gpu_index, s.job_id, s.time_ns, s.power_w) for s in got] == [
            (0, "job-b", T0 + 4 * S, 104.0),
            (1, "job-c", T0 + 4 * S, 50.0),
        ]
        assert gpus_seen(backend.store, since_ns=since) == [GpuSeen.of(s) for s in got]
    assert [s.power_w for s in latest_of(backend.store, ["node1"], attrs=("power_w",))] == [
        104.0,
        50.0,
    ]
    # a lost marker before the change does not make the GPU lost
    backend.load(
        [lost(T0 + 5 * S, "node1", 1), make_sample(T0 + 6 * S, "node1", 1, job_id="job-d")]
    )
    got = backend.store.latest(since_ns=T0)
    assert [(s.gpu_index, s.job_id, s.lost) for s in got] == [
        (0, "job-b", False),
        (1, "job-d", False),
    ]


def test_a_job_change_inside_a_bucket_keeps_the_bucket_whole(backend: Backend, make_sample) -> None:
    """A bucket holds all of a GPU's samples whatever jobs they name (a job is no part of the
    series on any store)."""
    samples = [
        make_sample(T0 + i * S, "node1", 0, job_id="job-y" if i < 3 else "job-b", power_w=100.0 + i)
        for i in range(6)
    ]
    backend.load(samples)
    df = backend.store.series(T0, T0 + 60 * S, ["power_w", "energy_j"], step_s=60)
    assert len(df) == 1
    assert df["power_w"].iloc[0] == pytest.approx(102.5)
    assert df["energy_j"].iloc[0] == samples[-1].energy_j  # the bucket's last value


def _kept_by(store: Store, s: GpuSample) -> GpuSample:
    """``s`` as a store can keep it: VictoriaMetrics keeps numbers and labels (no per-process
    details, no list of XIDs)."""
    if "PromStore" not in type(store).__name__:
        return s
    return replace(s, xid_errors=(), processes=None)


def test_series_raw(backend: Backend, make_sample) -> None:
    samples = [
        make_sample(T0 + i * S, "node1", g, power_w=100.0 + 10 * i + g)
        for i in range(4)
        for g in (0, 1)
    ]
    samples.append(lost(T0 + 4 * S, "node1", 0))
    backend.load(samples)
    df = backend.store.series(T0 + S, T0 + 5 * S)
    assert metric_columns(df) == [*KEY_COLUMNS, *METRIC_FIELDS]
    assert len(df) == 7  # 3 rounds x 2 GPUs, plus the lost marker (NaN metrics)
    if SEEN_COLUMN in df.columns:  # each sample's slot: a second, the lost marker none
        is_lost = df["power_w"].isna().to_numpy()
        assert df.loc[is_lost, SEEN_COLUMN].tolist() == [0.0]
        assert df.loc[~is_lost, SEEN_COLUMN].tolist() == [1.0] * 6
    assert df["time_ns"].tolist() == sorted(df["time_ns"].tolist())
    assert df["gpu_index"].dtype == "int64" and df["time_ns"].dtype == "int64"
    first = df.iloc[0]
    assert (first["time_ns"], first["host"], first["gpu_index"]) == (T0 + S, "node1", 0)
    assert first["uuid"] == "GPU-node1-0" and first["name"] == "NVIDIA H100 80GB HBM3"
    assert df["power_w"].tolist()[:6] == [110.0, 111.0, 120.0, 121.0, 130.0, 131.0]
    assert first["memory_used_bytes"] == samples[2].memory_used_bytes  # bytes, not MiB
    assert first["energy_j"] == pytest.approx(samples[2].energy_j, rel=1e-15)
    marker = df.iloc[-1]
    assert marker["time_ns"] == T0 + 4 * S and math.isnan(marker["power_w"])


def test_series_step_60_means_gauges_and_takes_last_counter(backend: Backend, make_sample) -> None:
    samples = []
    for i in range(18):  # three minutes at 10 s
        for g in (0, 1):
            samples.append(
                make_sample(
                    T0 + i * 10 * S,
                    "node1",
                    g,
                    power_w=100.0 + i + g,
                    utilization_gpu_pct=float(10 * (i % 6)),
                    energy_j=1000.0 * i + g,
                    ecc_sbe_volatile_count=i,
                    remapped_rows_pending=i % 6 == 5,
                )
            )
    samples.append(lost(T0 + 175 * S, "node1", 1))  # a lost marker does not reset the last value
    backend.load(samples)
    fields = ["power_w", "utilization_gpu_pct", "energy_j", "ecc_sbe_volatile_count"]
    fields.append("remapped_rows_pending")
    df = backend.store.series(T0, T0 + 180 * S, fields, step_s=60)
    assert len(df) == 6
    assert df["time_ns"].tolist() == [T0, T0, T0 + 60 * S, T0 + 60 * S, T0 + 120 * S, T0 + 120 * S]
    assert df["gpu_index"].tolist() == [0, 1] * 3
    for m in range(3):
        for g in (0, 1):
            row = df[(df["time_ns"] == T0 + m * 60 * S) & (df["gpu_index"] == g)].iloc[0]
            idx = range(6 * m, 6 * m + 6)
            assert row["power_w"] == pytest.approx(sum(100.0 + i + g for i in idx) / 6)
            assert row["utilization_gpu_pct"] == pytest.approx(25.0)
            assert row["energy_j"] == 1000.0 * (6 * m + 5) + g
            assert row["ecc_sbe_volatile_count"] == 6 * m + 5
            assert row["remapped_rows_pending"] == 1.0
    assert {"energy_j", "ecc_sbe_volatile_count", "remapped_rows_pending"} <= LAST_VALUE_ATTRS


def test_series_host_filter(backend: Backend, make_sample) -> None:
    hosts = ("a", "b", "c", "a.lab")  # a.lab: a store that matches ``host.domain`` keeps it out
    backend.load([make_sample(T0 + i * S, h, g) for i in range(2) for h in hosts for g in (0, 1)])
    df = backend.store.series(T0, T0 + 10 * S, ["power_w"], hosts=["a", "c"])
    assert sorted(set(df["host"])) == ["a", "c"] and len(df) == 8
    df = backend.store.series(T0, T0 + 120 * S, ["power_w"], hosts=["a.lab"], step_s=60)
    assert df["host"].tolist() == ["a.lab", "a.lab"] and df["gpu_index"].tolist() == [0, 1]
    df = backend.store.series(T0, T0 + 120 * S, ["power_w"], hosts=["b"], step_s=60)
    assert df["host"].tolist() == ["b", "b"] and df["gpu_index"].tolist() == [0, 1]
    assert backend.store.series(T0, T0 + 10 * S, ["power_w"], hosts=["nope"]).empty


def test_count_samples(backend: Backend, make_sample) -> None:
    samples = [make_sample(T0 + i * S, "node1", g) for i in range(5) for g in range(3)]
    samples.append(lost(T0 + 5 * S, "node1", 2))
    backend.load(samples)
    assert backend.store.count_samples(T0, T0 + 10 * S) == 16
    assert backend.store.count_samples(T0 + S, T0 + 3 * S) == 6
    assert backend.store.count_samples(T0 + 5 * S, T0 + 6 * S) == 1
    assert backend.store.count_samples(T0 + 100 * S, T0 + 200 * S) == 0


def test_empty_store_reads(backend: Backend) -> None:
    assert backend.store.latest() == []
    df = backend.store.series(T0, T0 + 60 * S, ["power_w"], step_s=60)
    assert df.empty and metric_columns(df) == [*KEY_COLUMNS, "power_w"]


def test_unknown_field_is_an_error(backend: Backend) -> None:
    with pytest.raises(ValueError, match="unknown field"):
        backend.store.series(T0, T0 + S, ["power_draw"])


@pytest.mark.servers
def test_victoriametrics_written_before_the_info_series_still_reads(
    victoria_metrics, make_sample
) -> None:
    """Samples written as before ``nvidia_smi_info`` existed (the plain lines, string fields
    dropped by the engine) read back as they did: every number, no job or methods."""
    from gpuwatt.line_protocol import LineEncoder

    store = open_store(victoria_metrics.url.replace("http://", "victoriametrics://"))
    store.latest_lookback_s = 10 * 365 * 86400.0  # type: ignore[attr-defined]
    sample = make_sample(T0, "node1", 0)
    store._writer.write_lines(LineEncoder().encode_many([sample]))  # type: ignore[attr-defined]
    victoria_metrics.force_flush()
    (got,) = store.latest()
    assert got == replace(
        sample, xid_errors=(), processes=None, job_id=None, energy_method=None, tflops_method=None
    )
    assert [s.job_id for s in gpus_seen(store)] == [None]
    store.close()
