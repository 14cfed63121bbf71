"""XID events read over a range (``store.base.xid_events``) from the embedded store and from
InfluxDB (Debian's influxd on 127.0.0.1): each sample that carries XIDs, with its last code and
count, whatever step a page draws at."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatt.model import GpuSample
from gpuwatt.store.base import XID_COLUMNS, xid_events
from gpuwatt.store.influx import InfluxStore
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


@pytest.fixture(params=["sqlite", "influxdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path, make_sample: Any) -> Iterator[Any]:
    if request.param == "sqlite":
        s: Any = SqliteStore(tmp_path / "x.db")
    else:
        server, db = request.getfixturevalue("influx_db")
        s = InfluxStore(server.url, "", db, timeout_s=30)
    s.write_samples(samples(make_sample))
    yield s
    s.close()


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
