"""Shared fixtures: real test servers (session-scoped) and generic helpers.

Server fixtures skip, with the reason, only when the server's binary is not installed (.ci
installs both, so in CI they always run). Servers are always terminated at the end of the session.

- ``influxdb1``: a running Debian ``influxd`` 1.6.7 (``servers.InfluxDB1Server``).
- ``influx_db``: a fresh, empty database on it for one test: ``(server, db_name)``;
  load points with ``server.write_samples(db_name, samples)`` (its /write endpoint).
- ``victoria_metrics``: the session's ``servers.VictoriaMetricsServer``, started again on an
  empty data directory for this test (``vm.wipe()``). Outage tests may ``vm.stop()`` (SIGTERM)
  or ``vm.kill()`` (SIGKILL) it and ``vm.start()`` it again: same port and data directory, so its
  ``vm.url`` stays valid and what was flushed before the stop is still there. Read back with
  ``vm.export()`` (force-flushes first) or ``vm.force_flush()``.
- ``make_sample``: builds a full ``GpuSample`` (every metric set, values exact in every backend).
"""

from __future__ import annotations

import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# This venv has the deprecated ``urllib3-secure-extra`` installed (nothing requires it), which
# makes ``import urllib3`` warn, and warnings are errors here: import it once, quietly.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", "'urllib3\\[secure\\]' extra is deprecated", DeprecationWarning
    )
    import urllib3  # noqa: F401
from servers import INFLUXD, VICTORIA_METRICS, InfluxDB1Server, VictoriaMetricsServer

from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod

MIB = 1024 * 1024


def _require(binary: str) -> None:
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed (Debian package; .ci installs it)")


@pytest.fixture(scope="session")
def influxdb1() -> Iterator[InfluxDB1Server]:
    _require(INFLUXD)
    server = InfluxDB1Server()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def influx_db(influxdb1: InfluxDB1Server) -> Iterator[tuple[InfluxDB1Server, str]]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    influxdb1.create_database(name)
    try:
        yield influxdb1, name
    finally:
        influxdb1.drop_database(name)


@pytest.fixture(scope="session")
def victoria_metrics_server() -> Iterator[VictoriaMetricsServer]:
    _require(VICTORIA_METRICS)
    server = VictoriaMetricsServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def victoria_metrics(
    victoria_metrics_server: VictoriaMetricsServer,
) -> VictoriaMetricsServer:
    victoria_metrics_server.wipe()
    return victoria_metrics_server


def _make_sample(
    time_ns: int, host: str = "node1", gpu_index: int = 0, **overrides: Any
) -> GpuSample:
    """Every metric set; ints for Telegraf's integer fields and whole MiB for memory, so the
    sample reads back identical from SQLite and from InfluxDB."""
    k = gpu_index + 1
    values: dict[str, Any] = dict(
        time_ns=time_ns,
        host=host,
        gpu_index=gpu_index,
        uuid=f"GPU-{host}-{gpu_index}",
        name="NVIDIA H100 80GB HBM3",
        utilization_gpu_pct=90.0 + k,
        utilization_memory_pct=40.0,
        memory_used_bytes=(60_000 + k) * MIB,
        memory_total_bytes=81_559 * MIB,
        memory_free_bytes=(21_559 - k) * MIB,
        memory_reserved_bytes=512 * MIB,
        temperature_gpu_c=61.0,
        temperature_memory_c=70.5,
        fan_speed_pct=30.0,
        power_w=600.25 + k,
        power_limit_w=700.0,
        energy_j=1.0e6 + time_ns / 1e9,
        energy_method=EnergyMethod.COUNTER,
        sm_clock_mhz=1980.0,
        memory_clock_mhz=2619.0,
        graphics_clock_mhz=1980.0,
        sm_clock_max_mhz=1980.0,
        clock_event_reasons=4,
        pcie_tx_bytes_per_s=1.5e9,
        pcie_rx_bytes_per_s=2.5e9,
        nvlink_tx_bytes_per_s=1.25e11,
        nvlink_rx_bytes_per_s=1.125e11,
        sm_active_pct=80.5,
        sm_occupancy_pct=45.25,
        tensor_active_pct=60.5,
        tensor_hmma_active_pct=55.5,
        tensor_imma_active_pct=0.0,
        tensor_dfma_active_pct=0.25,
        fp64_active_pct=0.5,
        fp32_active_pct=10.5,
        fp16_active_pct=2.5,
        dram_active_pct=70.75,
        tflops_estimate=512.5,
        tflops_method=TflopsMethod.GPM,
        xid_errors=(79,),
        ecc_sbe_volatile_count=3,
        ecc_dbe_volatile_count=0,
        remapped_rows_correctable=1,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        mig_enabled=False,
        processes=(ProcessSample(1234, 30 * 1024 * MIB), ProcessSample(5678, None)),
        job_id='job "42"',
    )
    values.update(overrides)
    return GpuSample(**values)


@pytest.fixture
def make_sample() -> Callable[..., GpuSample]:
    """``make_sample(time_ns, host="node1", gpu_index=0, **overrides) -> GpuSample``."""
    return _make_sample
