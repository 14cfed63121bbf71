"""The gpuwatt_job_step measurement: schema codec, SQLite table, InfluxDB write and read paths."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuwatt.errors import StoreUnavailable
from gpuwatt.job_step_format import JOB_STEP_COLUMNS, JobStep, decode_job_step, encode_job_step
from gpuwatt.line_protocol import LineProtocolError
from gpuwatt.store import open_store
from gpuwatt.store.job_steps import (
    InfluxJobStepStore,
    JobStepStore,
    SqliteJobStepStore,
    open_job_step_store,
)

NS = 1_000_000_000
T0 = 1_700_000_040 * NS


def _step(k: int, **kw: object) -> JobStep:
    values: dict[str, object] = dict(
        time_ns=T0 + k * NS,
        job_id="llm 7,b=1",
        rank=3,
        step=k,
        step_time_s=1.25,
        model_flops_per_step=3.166e15,
        tokens_per_step=524288.0,
        gpu_uuids=("GPU-aaaa", "GPU-bbbb"),
        precision="bf16",
        host="node 1",
    )
    values.update(kw)
    return JobStep(**values)  # type: ignore[arg-type]


# --- schema ------------------------------------------------------------------------------------


def test_encoder_round_trip_with_escapes() -> None:
    s = _step(5)
    line = encode_job_step(s)
    assert line.startswith(r"gpuwatt_job_step,host=node\ 1,job_id=llm\ 7\,b\=1,rank=3 step=5i,")
    assert 'gpu_uuids="GPU-aaaa,GPU-bbbb"' in line
    assert decode_job_step(line) == s


def test_optional_fields_left_out() -> None:
    s = _step(1, model_flops_per_step=None, tokens_per_step=math.nan, gpu_uuids=(), precision=None)
    line = encode_job_step(s)
    assert "model_flops_per_step" not in line and "tokens_per_step" not in line
    assert "gpu_uuids" not in line and "precision" not in line
    back = decode_job_step(line)
    assert back == _step(1, model_flops_per_step=None, tokens_per_step=None, gpu_uuids=(),
                         precision=None)  # fmt: skip


def test_large_and_small_floats_exact() -> None:
    s = _step(1, model_flops_per_step=1.234567890123e19, step_time_s=0.000123)
    assert decode_job_step(encode_job_step(s)) == s


def test_encoder_rejects_bad_steps() -> None:
    with pytest.raises(ValueError):
        encode_job_step(_step(1, job_id=""))
    with pytest.raises(ValueError):
        encode_job_step(_step(1, step_time_s=math.inf))


def test_decoder_rejects_other_measurements() -> None:
    with pytest.raises(LineProtocolError):
        decode_job_step("nvidia_smi,host=a gpu_lost=true 1")
    with pytest.raises(LineProtocolError):
        decode_job_step("gpuwatt_job_step,job_id=a,rank=0 step_time_s=1.0 1")


# --- SQLite ------------------------------------------------------------------------------------


def test_sqlite_write_read_idempotent(tmp_path: Path) -> None:
    with SqliteJobStepStore(tmp_path / "g.db") as store:
        assert isinstance(store, JobStepStore)
        steps = [_step(k) for k in range(5)]
        store.write_job_steps(steps)
        store.write_job_steps(steps[:2])  # a retry: stored once
        other = _step(9, job_id="other", rank=0)
        store.write_job_steps([other])
        df = store.job_steps(T0, T0 + 100 * NS)
        assert list(df.columns) == list(JOB_STEP_COLUMNS)
        assert len(df) == 6
        mine = store.job_steps(T0 + NS, T0 + 100 * NS, job_ids=["llm 7,b=1"])
        assert mine["step"].tolist() == [1, 2, 3, 4]
        row = mine.iloc[0]
        assert row["rank"] == 3 and row["host"] == "node 1"
        assert row["model_flops_per_step"] == 3.166e15 and row["step_time_s"] == 1.25
        assert row["gpu_uuids"] == "GPU-aaaa,GPU-bbbb" and row["precision"] == "bf16"
        assert store.job_steps(T0, T0 + 100 * NS, job_ids=[]).empty


def test_sqlite_shares_the_samples_file(tmp_path: Path, make_sample) -> None:
    path = tmp_path / "g.db"
    samples = open_store(f"sqlite://{path}")
    steps = open_job_step_store(f"sqlite://{path}")
    try:
        samples.write_samples([make_sample(T0)])
        steps.write_job_steps([_step(0)])
        samples.write_samples([make_sample(T0 + NS)])
        assert samples.count_samples(T0, T0 + 10 * NS) == 2
        assert len(steps.job_steps(T0, T0 + 10 * NS)) == 1
    finally:
        samples.close()
        steps.close()


def test_sqlite_retention(tmp_path: Path) -> None:
    with SqliteJobStepStore(tmp_path / "g.db", retention_s=3600) as store:
        store.write_job_steps([_step(0)])
        store.write_job_steps([_step(7200)])
        assert store.job_steps(0, T0 + 10**6 * NS)["step"].tolist() == [7200]


def test_sqlite_unreachable_raises_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with SqliteJobStepStore(tmp_path / "file" / "g.db") as store, pytest.raises(StoreUnavailable):
        store.write_job_steps([_step(0)])


def test_open_job_step_store_dispatch(tmp_path: Path) -> None:
    s = open_job_step_store(f"sqlite://{tmp_path}/x.db")
    assert isinstance(s, SqliteJobStepStore) and s.path == tmp_path / "x.db"
    s.close()
    assert not (tmp_path / "x.db").exists()  # nothing touched until used
    i = open_job_step_store("influxdb://127.0.0.1:1/b?org=o", environ={})
    assert isinstance(i, InfluxJobStepStore)
    i.close()


# --- InfluxDB ------------------------------------------------------------------------------------


@pytest.mark.servers
def test_influx_write_through_api_v2(victoria_metrics) -> None:
    vm = victoria_metrics
    with InfluxJobStepStore.connect(vm.url, "org", "gpuwatt") as store:
        store.write_job_steps([_step(k) for k in range(3)])
    series = vm.export('{__name__=~"gpuwatt_job_step_.*"}')
    by_name = {s["metric"]["__name__"]: s for s in series}
    st = by_name["gpuwatt_job_step_step_time_s"]
    assert st["metric"]["job_id"] == "llm 7,b=1" and st["metric"]["rank"] == "3"
    assert st["values"] == [1.25, 1.25, 1.25]
    assert st["timestamps"] == [(T0 + k * NS) // 1_000_000 for k in range(3)]
    assert by_name["gpuwatt_job_step_model_flops_per_step"]["values"] == [3.166e15] * 3


@pytest.mark.servers
def test_influx_read_with_influxql(influx_db) -> None:
    server, db = influx_db
    steps = [_step(k) for k in range(4)] + [_step(2, job_id="other", rank=0, host="n2")]
    server.write_lines(db, [encode_job_step(s) for s in steps])
    with InfluxJobStepStore.connect(server.url, "", db) as store:
        df = store.job_steps(T0 + NS, T0 + 10 * NS)
        assert list(df.columns) == list(JOB_STEP_COLUMNS)
        assert len(df) == 4
        mine = store.job_steps(T0, T0 + 10 * NS, job_ids=["llm 7,b=1"])
        assert mine["step"].tolist() == [0, 1, 2, 3]
        row = mine.iloc[1]
        assert row["time_ns"] == T0 + NS and row["rank"] == 3 and row["host"] == "node 1"
        assert row["gpu_uuids"] == "GPU-aaaa,GPU-bbbb" and row["precision"] == "bf16"
        assert row["model_flops_per_step"] == 3.166e15 and row["tokens_per_step"] == 524288.0
        assert store.job_steps(T0, T0 + 10 * NS, job_ids=[]).empty
