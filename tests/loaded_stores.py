"""One store of each kind loaded with the same samples through its own write path, for tests
that say a thing holds on every store: the embedded store, InfluxDB and VictoriaMetrics
(Debian's servers on 127.0.0.1, the session's fixtures)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuwatt.model import GpuSample
from gpuwatt.store import engine_rollups, open_store
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.sqlite import SqliteStore

#: ``@pytest.fixture(params=STORE_KINDS)``: each kind, the engines marked ``servers``.
STORE_KINDS = [
    "sqlite",
    pytest.param("influxdb", marks=pytest.mark.servers),
    pytest.param("victoriametrics", marks=pytest.mark.servers),
]


def loaded_store(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    samples: Sequence[GpuSample],
    *,
    rolled: tuple[int, int] | None = None,
) -> Any:
    """A store of ``kind`` holding ``samples``; ``rolled``: an engine also keeps its rollups of
    that span, as the collectors of these GPUs roll them (the embedded store keeps its own)."""
    if kind == "sqlite":
        s: Any = SqliteStore(tmp_path / "store.db")
        s.write_samples(samples)
        s.flush_rollups()
        return s
    if kind == "influxdb":
        server, db = request.getfixturevalue("influx_db")
        s = InfluxStore(server.url, "", db, timeout_s=30)
        s.write_samples(samples)
        if rolled:
            engine_rollups.roll_range(s.rollups, *rolled)
        return s
    vm = request.getfixturevalue("victoria_metrics")
    s = open_store(
        vm.url.replace("http://", "victoriametrics://") + ("?rollups=on" if rolled else "")
    )
    s.latest_lookback_s = 10 * 365 * 86400.0  # samples of the past, not of the last hour
    s.write_samples(samples)
    vm.force_flush()
    if rolled:
        engine_rollups.roll_range(s.rollups, *rolled)
        vm.force_flush()
    return s


def store_fixture(
    samples_of: Callable[[Callable[..., GpuSample]], Sequence[GpuSample]],
    *,
    rolled: tuple[int, int] | None = None,
    now_ns: int | None = None,
) -> Any:
    """A ``store`` fixture over ``STORE_KINDS``, each loaded with ``samples_of(make_sample)``
    (``rolled``: see ``loaded_store``; ``now_ns``: the engine's clock for its newest-sample
    reads)."""

    @pytest.fixture(params=STORE_KINDS)
    def store(request: pytest.FixtureRequest, tmp_path: Path, make_sample: Any) -> Iterator[Any]:
        s = loaded_store(request.param, request, tmp_path, samples_of(make_sample), rolled=rolled)
        if now_ns is not None:
            s.clock_ns = lambda: now_ns
        yield s
        s.close()

    return store
