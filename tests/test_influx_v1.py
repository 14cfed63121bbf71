"""Writing to InfluxDB 1.6/1.7, which has no /api/v2/write: the store asks /ping and uses /write.

Against Debian's influxd 1.6.7 on 127.0.0.1 (``conftest.influx_db``): the store's own write path
(not the test helper's loader), the collector command end to end, and a command that delivered
nothing exiting non-zero.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_cli import gpuwatt

from gpuwatt.line_protocol import LineEncoder
from gpuwatt.store import influx_reads, open_store
from gpuwatt.store.influx import InfluxStore

pytestmark = pytest.mark.servers


def test_the_store_finds_the_1x_write_endpoint(influx_db, make_sample) -> None:
    server, db = influx_db
    now = time.time_ns()
    samples = [make_sample(now - i * 1_000_000_000, "node1", g) for i in range(3) for g in (0, 1)]
    with InfluxStore(server.url, "", db, timeout_s=10) as store:
        store.write_samples(samples)
        assert store.api == "v1"
        assert store.count_samples(now - 10 * 1_000_000_000, now + 1) == 6
        got = store.series(now - 10 * 1_000_000_000, now + 1, ["power_w"])
    assert sorted(got["power_w"]) == sorted(s.power_w for s in samples)


def test_collect_into_influxdb_1_6(influx_db, tmp_path: Path) -> None:
    server, db = influx_db
    url = server.url.replace("http://", "influxdb://") + f"/{db}"
    result = gpuwatt(
        "collect", "--simulate", "healthy", "--interval", "0.5", "--duration", "3",
        "--store", url, "--spool", str(tmp_path / "spool"), home=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with open_store(url) as store:
        assert store.count_samples(0, time.time_ns()) >= 32


def test_a_collector_that_delivered_nothing_exits_non_zero(influx_db, tmp_path: Path) -> None:
    server, _ = influx_db
    url = server.url.replace("http://", "influxdb://") + "/no_such_database"
    result = gpuwatt(
        "collect", "--simulate", "healthy", "--interval", "0.5", "--duration", "2",
        "--store", url, "--spool", str(tmp_path / "spool"), home=tmp_path,
    )  # fmt: skip
    assert result.returncode != 0
    assert "delivered nothing" in result.stderr
    assert "Traceback" not in result.stderr


def test_latest_is_asked_by_host_in_parts_and_finds_every_gpu(
    influx_db, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``latest`` is sent as a query per part of the hosts, at once; together they find every
    GPU: those of every host, one silent for hours and one written without a host tag."""
    server, db = influx_db
    now = time.time_ns()
    s = 1_000_000_000
    gpus = [(f"node{h}", g) for h in range(5) for g in (0, 1)]
    samples = [make_sample(now - i * s, h, g) for i in range(3) for h, g in gpus]
    samples.append(make_sample(now - 5 * 3600 * s, "node9", 0, power_w=123.0))  # silent since
    no_host = LineEncoder().encode_many([make_sample(now - 2 * s, "gone", 3, power_w=77.0)])
    assert all(",host=gone" in line for line in no_host)
    with InfluxStore(server.url, "", db, timeout_s=10) as store:
        store.write_samples(samples)
        store.write_lines([line.replace(",host=gone", "") for line in no_host])
        parts = influx_reads._host_parts(store, 2)
        assert len(parts) == 2
        got = store.latest()
        # parts that miss a series (here: the one without a host) are noticed by the number
        # of series, and the whole measurement is asked for in one query
        without_empty = [parts[0].replace("\"host\" = '' OR ", ""), parts[1]]
        assert without_empty[0] != parts[0]
        monkeypatch.setattr(influx_reads, "_host_parts", lambda *_: without_empty)
        assert store.latest() == got
        monkeypatch.undo()
        monkeypatch.setattr(influx_reads, "LATEST_PARTS", 1)
        store._raw_hosts = None
        assert influx_reads._host_parts(store, influx_reads.LATEST_PARTS) == [""]
        assert store.latest() == got
    assert len(got) == 5 * 2 + 2
    by_host = {(x.host, x.gpu_index): x for x in got}
    assert by_host["node9", 0].power_w == 123.0
    assert by_host["node9", 0].time_ns == now - 5 * 3600 * s
    assert by_host["", 3].power_w == 77.0
    assert all(by_host[f"node{h}", g].time_ns == now for h in range(5) for g in (0, 1))
