"""The newest samples on VictoriaMetrics (``PromStore.latest``), against a server started by the
fixture: asked over the last minutes first, they are still each GPU's newest over the whole
lookback, for a GPU silent for longer (a lost node) and for a metric measured less often."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuwatt.model import GpuSample
from gpuwatt.store import open_store, promql_latest

pytestmark = pytest.mark.servers

S = 1_000_000_000
NOW = 1_767_225_600 * S
MIB = 2**20  # the store keeps memory in MiB, as Telegraf


def mib(t_ns: int) -> float:
    return float((2000 + (NOW - t_ns) // (10 * S)) * MIB)


def test_latest_finds_old_values_beyond_the_last_minutes(
    victoria_metrics, make_sample: Callable[..., GpuSample], monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = []
    for t in range(NOW - 40 * 60 * S, NOW, 10 * S):
        for gpu in (0, 1):  # node1 reports; GPU 0's memory figure stopped 20 minutes ago
            memory = mib(t) if gpu == 1 or t < NOW - 20 * 60 * S else None
            samples.append(
                make_sample(t, "node1", gpu, power_w=200.0 + gpu, memory_used_bytes=memory)
            )
        if t < NOW - 30 * 60 * S:  # node2 silent for the last 30 minutes
            samples.append(make_sample(t, "node2", 0, power_w=300.0, memory_used_bytes=1024 * MIB))
    store = open_store(victoria_metrics.url.replace("http://", "victoriametrics://"))
    try:
        store.write_samples(samples)
        victoria_metrics.force_flush()
        got = store.latest(now_ns=NOW)
        # one node's GPUs alone: their older values asked for that node only
        for host in ("node1", "node2"):
            assert store.latest_of([host], now_ns=NOW) == [s for s in got if s.host == host]
        monkeypatch.setattr(promql_latest, "LATEST_NARROW_NS", 3600 * S)  # one query over the hour
        assert store.latest(now_ns=NOW) == got
    finally:
        store.close()
    by_gpu = {(s.host, s.gpu_index): s for s in got}
    assert sorted(by_gpu) == [("node1", 0), ("node1", 1), ("node2", 0)]
    silent = by_gpu["node2", 0]
    assert silent.time_ns == NOW - 30 * 60 * S - 10 * S and silent.power_w == 300.0
    assert silent.memory_used_bytes == 1024 * MIB
    old = by_gpu["node1", 0]  # its newest sample, with the newest memory figure it had
    assert old.time_ns == NOW - 10 * S and old.power_w == 200.0
    assert old.memory_used_bytes == mib(NOW - 20 * 60 * S - 10 * S)
    assert by_gpu["node1", 1].memory_used_bytes == mib(NOW - 10 * S)
