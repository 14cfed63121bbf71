"""XID events read over a range (``store.base.xid_events``) from the embedded store, from
InfluxDB and from VictoriaMetrics (Debian's servers on 127.0.0.1): each sample that carries XIDs,
with its last code and count, whatever step a page draws at."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loaded_stores import store_fixture
from servers import http

from gpuwatt.model import GpuSample
from gpuwatt.store import open_store
from gpuwatt.store.base import XID_COLUMNS, xid_events
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
T0 = 1_767_225_600 * NS
XIDS = {(65, "node1", 1): (13, 79), (200, "node2", 0): (48,)}  # (s, host, gpu): codes


def samples(make_sample: Callable[..., GpuSample]) -> list[GpuSample]:
    return [
        make_sample(T0 + s * NS, host, gpu, xid_errors=XIDS.get((s, host, gpu), ()))
        for s in range(0, 300, 5)
        for host in ("node1", "node2")
        for gpu in (0, 1)
    ]


store = store_fixture(samples)


def events(store: Any, start_s: int, end_s: int, hosts: Any = None) -> list[tuple[Any, ...]]:
    frame = xid_events(store, T0 + start_s * NS, T0 + end_s * NS, hosts)
    assert frame is not None and tuple(frame.columns) == XID_COLUMNS
    return [
        ((t - T0) // NS, h, g, int(last), int(n))
        for t, h, g, last, n in frame[["time_ns", "host", "gpu_index", "xid_last", "xid_count"]]
        .itertuples(index=False)
    ]  # fmt: skip


def test_each_sample_with_xids_is_an_event_with_its_last_code_and_count(store: Any) -> None:
    assert events(store, 0, 300) == [(65, "node1", 1, 79, 2), (200, "node2", 0, 48, 1)]


def test_xid_events_keep_to_the_range_and_the_hosts(store: Any) -> None:
    assert events(store, 0, 300, ["node2"]) == [(200, "node2", 0, 48, 1)]
    assert events(store, 66, 200) == []  # [start, end): neither event
    assert events(store, 65, 201) == [(65, "node1", 1, 79, 2), (200, "node2", 0, 48, 1)]


def test_a_bucketed_series_cannot_carry_them_but_the_events_do(store: Any) -> None:
    """Why a read of its own: a 5-minute bucket of the GPU's series holds one row for its
    sixty samples, while both XIDs are still read from the samples."""
    frame = store.series(T0, T0 + 300 * NS, ["power_w"], step_s=300)
    assert len(frame) == 4  # one bucket per GPU
    assert [e[:3] for e in events(store, 0, 300)] == [(65, "node1", 1), (200, "node2", 0)]


def test_xid_events_of_compacted_samples(tmp_path: Path, make_sample: Any) -> None:
    """Samples moved from the head into compressed chunks keep their XIDs."""
    with SqliteStore(tmp_path / "c.db") as s:
        s.write_samples(samples(make_sample))
        s.compact()
        assert events(s, 0, 300) == [(65, "node1", 1, 79, 2), (200, "node2", 0, 48, 1)]


def test_a_store_that_keeps_no_xids_says_so() -> None:
    class Bare:
        pass

    assert xid_events(Bare(), T0, T0 + NS) is None  # type: ignore[arg-type]


@pytest.mark.servers
@pytest.mark.parametrize("engine", ["victoriametrics", "prometheus"])
def test_dcgm_exporters_last_xid_gauge_is_an_event_where_it_changes(
    engine: str, request: pytest.FixtureRequest, make_sample: Any
) -> None:
    """dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` holds the last XID scrape after scrape: an
    event where it changes to a code, none where a code stands since before the range."""
    from prom_fixtures import dcgm_store_url, have_prometheus

    if engine == "prometheus" and not have_prometheus():
        pytest.skip("needs Debian's prometheus (make test-deps)")
    vm = request.getfixturevalue("victoria_metrics") if engine == "victoriametrics" else None
    held = [
        make_sample(
            T0 + s * NS, host, gpu,  # its job: job "42", quoted
            xid_errors=(79,) if (host, gpu) == ("node1", 1) and s >= 65 else
            (48,) if (host, gpu) == ("node2", 0) and s >= 200 else (),
        )
        for s in range(0, 300, 5)
        for host in ("node1", "node2")
        for gpu in (0, 1)
    ]  # fmt: skip
    with dcgm_store_url(engine, held, vm) as url, open_store(url) as store:
        assert events(store, 0, 300) == [(65, "node1", 1, 79, 1), (200, "node2", 0, 48, 1)]
        assert events(store, 100, 300) == [(200, "node2", 0, 48, 1)]  # 79 stands since 65 s
        assert events(store, 0, 300, ["node1"]) == [(65, "node1", 1, 79, 1)]


@pytest.mark.servers
def test_gpuwatt_metrics_xid_counter_is_an_event_where_it_rises(victoria_metrics: Any) -> None:
    """Scraped from a collector's ``/metrics``: ``gpuwatt_xid_errors`` counts XIDs without
    their codes; a rise is an event of that many (code unknown), a restart's drop none."""
    counts = [0, 0, 1, 1, 3, 0, 0, 2]  # the collector restarted after the fifth scrape
    labels = 'host="node1",gpu="0",uuid="GPU-1",name="NVIDIA H100 80GB HBM3",job_id=""'
    body = "".join(
        f"gpuwatt_xid_errors{{{labels}}} {c} {(T0 + k * 15 * NS) // 1_000_000}\n"
        for k, c in enumerate(counts)
    ).encode()
    status, answer = http("POST", f"{victoria_metrics.url}/api/v1/import/prometheus", data=body)
    assert status in (200, 204), answer[:300]
    victoria_metrics.force_flush()
    url = victoria_metrics.url.replace("http://", "victoriametrics://") + "?source=gpuwatt"
    with open_store(url) as store:
        frame = xid_events(store, T0, T0 + 200 * NS)
    assert frame is not None
    assert [
        ((t - T0) // NS, h, n) for t, h, n in frame[["time_ns", "host", "xid_count"]].values
    ] == [
        (30, "node1", 1.0),
        (60, "node1", 2.0),
        (105, "node1", 2.0),
    ]
    assert frame["xid_last"].isna().all()
