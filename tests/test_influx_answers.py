"""How ``InfluxStore`` asks Debian's InfluxDB 1.6.7 (started by the fixtures): answers in
MessagePack read exactly as the same answers in JSON, and raw reads wholly older than the oldest
raw sample are not sent (the time of the oldest sample is asked again after a while, so samples
written later with older times are found, and reads at once ask it once)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample
from gpuwatt.store import engine_rollups, influx_reads
from gpuwatt.store.engine_rollups import MINUTE_NS
from gpuwatt.store.influx import InfluxStore

pytestmark = pytest.mark.servers

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour
ATTRS = ("power_w", "utilization_gpu_pct", "energy_j", "clock_event_reasons")


class RecordingStore(InfluxStore):
    """The store, with each InfluxQL statement it sends and the content type of each answer."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.statements: list[str] = []
        self.content_types: list[str] = []

    def _query_request(self, influxql: str, accept: str) -> object:
        resp = super()._query_request(influxql, accept)
        self.statements.append(influxql)
        self.content_types.append(resp.headers.get("Content-Type", ""))  # type: ignore[attr-defined]
        return resp


@pytest.fixture
def store(influx_db: tuple[object, str]) -> Iterator[RecordingStore]:
    server, db = influx_db
    s = RecordingStore(server.url, "", db, timeout_s=30)  # type: ignore[attr-defined]
    try:
        yield s
    finally:
        s.close()


def _samples(make_sample: Callable[..., GpuSample], start_ns: int, end_ns: int) -> list[GpuSample]:
    out = []
    for t in range(start_ns, end_ns, 10 * S):
        k = (t - T0) // S
        for index in range(2):
            out.append(
                make_sample(
                    t,
                    gpu_index=index,
                    power_w=250.0 + 0.5 * (k % 41) + index,  # whole numbers among them
                    utilization_gpu_pct=float((k // 10) % 101),
                    energy_j=1.0e6 + 300.0 * k,
                    clock_event_reasons=[0, 4][(k // 60) % 2],
                )
            )
    return out


def _write(store: InfluxStore, samples: list[GpuSample]) -> None:
    store.write_lines(LineEncoder().encode_many(samples))


def test_messagepack_answers_read_as_json_answers(
    store: RecordingStore, make_sample: Callable[..., GpuSample]
) -> None:
    _write(store, _samples(make_sample, T0, T0 + 63 * MINUTE_NS))
    engine_rollups.roll_range(store.rollups, T0, T0 + 63 * MINUTE_NS)
    reads = [(None, False), (60, True), (60, False), (3600, True), (300, True)]

    def everything() -> tuple[list[pd.DataFrame], list[GpuSample]]:
        frames = []
        for step, rollups in reads:
            store.use_rollups = rollups
            frames.append(store.series(T0 + 17 * S, T0 + 63 * MINUTE_NS, ATTRS, step_s=step))
        return frames, store.latest()

    packed = everything()
    assert store.content_types and all(
        c.startswith("application/x-msgpack") for c in store.content_types
    )
    store._msgpack = False
    store.content_types.clear()
    plain = everything()
    assert all(c.startswith("application/json") for c in store.content_types)
    for a, b in zip(packed[0], plain[0], strict=True):
        assert len(a)
        pd.testing.assert_frame_equal(a, b)
    assert packed[1] == plain[1]


def test_raw_reads_older_than_every_sample_are_not_sent(
    store: RecordingStore, make_sample: Callable[..., GpuSample], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(store, _samples(make_sample, T0, T0 + 62 * MINUTE_NS))
    engine_rollups.roll_range(store.rollups, T0, T0 + 62 * MINUTE_NS)
    store.statements.clear()
    # a range with its context before the data: minutes of 2 hours before it, read raw
    before = store.series(T0 - 2 * 3600 * S, T0, ATTRS, step_s=60)
    assert before.empty
    raw = [q for q in store.statements if 'FROM "nvidia_smi" WHERE' in q]
    assert raw == []
    # Samples written later with older times: found once the oldest time is asked again.
    _write(store, _samples(make_sample, T0 - 3 * MINUTE_NS, T0))
    assert store.series(T0 - 2 * 3600 * S, T0, ATTRS, step_s=60).empty  # the kept time
    monkeypatch.setattr(influx_reads, "OLDEST_RAW_TTL_S", 0.0)
    found = store.series(T0 - 2 * 3600 * S, T0, ATTRS, step_s=60)
    assert sorted(set(found["time_ns"])) == [T0 - 3 * MINUTE_NS + i * MINUTE_NS for i in range(3)]
    assert len(found) == 3 * 2


def test_the_oldest_raw_time_is_asked_once_by_reads_at_once(
    store: RecordingStore, make_sample: Callable[..., GpuSample]
) -> None:
    """The parallel reads of a cold view all need the oldest raw sample's time: one asks the
    server, the others wait for its answer (each asking cost InfluxDB two all-time queries)."""
    _write(store, _samples(make_sample, T0, T0 + 3 * MINUTE_NS))
    asked = threading.Barrier(8)

    def oldest() -> int | None:
        asked.wait()  # all eight at once
        return influx_reads.oldest_raw_ns(store)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: oldest(), range(8)))
    assert answers == [T0] * 8
    firsts = [q for q in store.statements if q.startswith("SELECT first(")]
    assert len(firsts) == 2, firsts  # gpu_lost's and utilization_gpu's, once
