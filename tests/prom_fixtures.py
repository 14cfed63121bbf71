"""A simulated cluster as dcgm-exporter would have exposed it, loaded into real engines.

- ``dcgm_exposition``: gpuwatt's simulated samples written as dcgm-exporter's series
  (``tests/data/dcgm_counters.csv`` lists the fields and the units they are documented in; the
  conversion here is the fixture's own, independent of the store's mapping under test), with
  dcgm-exporter's labels (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``,
  ``DCGM_FI_DRIVER_VERSION``, ``hpc_job``) and a timestamp per sample.
- ``PrometheusServer``: Debian's ``prometheus`` on 127.0.0.1 over a TSDB that ``promtool tsdb
  create-blocks-from openmetrics`` built from that exposition (how history is backfilled into a
  real Prometheus).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from servers import free_port, http

from gpuwatt.model import GpuSample

COUNTERS_CSV = Path(__file__).parent / "data" / "dcgm_counters.csv"
PROMETHEUS = "prometheus"
PROMTOOL = "promtool"

#: Which simulated quantity each dcgm-exporter field reports (by its documented meaning).
SOURCE_OF_FIELD: dict[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "memory_clock_mhz",
    "DCGM_FI_DEV_MEMORY_TEMP": "temperature_memory_c",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_gpu_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_j",
    "DCGM_FI_DEV_GPU_UTIL": "utilization_gpu_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "utilization_memory_pct",
    "DCGM_FI_DEV_XID_ERRORS": "xid_errors",
    "DCGM_FI_DEV_FB_FREE": "memory_free_bytes",
    "DCGM_FI_DEV_FB_USED": "memory_used_bytes",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clock_event_reasons",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active_pct",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy_pct",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active_pct",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active_pct",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "fp64_active_pct",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "fp32_active_pct",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "fp16_active_pct",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "pcie_tx_bytes_per_s",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "pcie_rx_bytes_per_s",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "nvlink_tx_bytes_per_s",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "nvlink_rx_bytes_per_s",
}


def dcgm_fields() -> list[tuple[str, str, str]]:
    """(field, type, unit) rows of the counters file."""
    rows = []
    for line in COUNTERS_CSV.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            field, kind, unit = (part.strip() for part in line.split(","))
            rows.append((field, kind, unit))
    return rows


def in_dcgm_unit(sample: GpuSample, attr: str, unit: str) -> float | None:
    """The sample's quantity as dcgm-exporter reports it."""
    if attr == "xid_errors":
        return float(sample.xid_errors[-1]) if sample.xid_errors else 0.0
    value = getattr(sample, attr)
    if value is None:
        return None
    factor = {"mJ": 1000.0, "MiB": 1 / 1024**2, "ratio": 0.01}.get(unit, 1.0)
    return float(value) * factor


def _labels(s: GpuSample) -> str:
    pairs = [
        ("gpu", str(s.gpu_index)),
        ("UUID", s.uuid),
        ("device", f"nvidia{s.gpu_index}"),
        ("modelName", s.name),
        ("Hostname", s.host),
        ("DCGM_FI_DRIVER_VERSION", "550.54.15"),
    ]
    if s.job_id:
        pairs.append(("hpc_job", s.job_id))
    return ",".join(f'{k}="{_escaped(v)}"' for k, v in pairs)


def _escaped(value: str) -> str:
    """A label value as the exposition formats write it (backslash, quote and newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def dcgm_exposition(samples: Iterable[GpuSample], *, openmetrics: bool) -> str:
    """Every non-lost sample as dcgm-exporter series with timestamps.

    ``openmetrics``: OpenMetrics text (seconds, ``# EOF``; every family typed ``unknown``, since
    OpenMetrics wants ``_total`` on counters and dcgm-exporter's names have none), as promtool
    backfills it; otherwise the Prometheus text format with millisecond timestamps, as
    VictoriaMetrics imports it.
    """
    live = [s for s in samples if not s.lost]
    out: list[str] = []
    for field, _kind, unit in dcgm_fields():
        attr = SOURCE_OF_FIELD[field]
        out.append(f"# TYPE {field} {'unknown' if openmetrics else 'gauge'}")
        for s in live:
            value = in_dcgm_unit(s, attr, unit)
            if value is None:
                continue
            ts = f"{s.time_ns / 1e9:.3f}" if openmetrics else str(s.time_ns // 1_000_000)
            out.append(f"{field}{{{_labels(s)}}} {value!r} {ts}")
    if openmetrics:
        out.append("# EOF")
    return "\n".join(out) + "\n"


class PrometheusServer:
    """Debian's Prometheus on 127.0.0.1: over a TSDB backfilled from ``openmetrics``, and/or
    scraping ``scrape_targets`` (``host:port``) every second."""

    def __init__(self, openmetrics: str | None = None, scrape_targets: Sequence[str] = ()) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="gpuwatt-prometheus-"))
        self.port = free_port()
        data = self.tmp / "data"
        if openmetrics is not None:
            source = self.tmp / "history.om"
            source.write_text(openmetrics)
            built = subprocess.run(
                [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if built.returncode != 0:
                raise RuntimeError(f"promtool failed: {built.stderr[-2000:]}")
        config = self.tmp / "prometheus.yml"
        scrape = "scrape_configs: []\n"
        if scrape_targets:
            scrape = (
                "scrape_configs:\n  - job_name: gpuwatt\n    scrape_interval: 1s\n"
                f"    static_configs:\n      - targets: {list(scrape_targets)!r}\n"
            )
        config.write_text("global:\n  scrape_interval: 15s\n" + scrape)
        self._log = (self.tmp / "server.log").open("wb")
        self._proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                "--storage.tsdb.retention.time=100y",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if http("GET", f"{self.url}/-/ready", timeout_s=2)[0] == 200:
                    return
            if self._proc.poll() is not None:
                break
            time.sleep(0.2)
        self.cleanup()
        raise RuntimeError("prometheus did not become ready")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cleanup(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def have_prometheus() -> bool:
    return bool(shutil.which(PROMETHEUS) and shutil.which(PROMTOOL))


@contextlib.contextmanager
def dcgm_store_url(engine: str, samples: Sequence[GpuSample], vm: Any = None) -> Iterator[str]:
    """The store URL of ``samples`` as dcgm-exporter's series in a real engine: ``prometheus``
    (a TSDB backfilled by promtool, its own server) or ``victoriametrics`` (imported into the
    running server ``vm``)."""
    if engine == "prometheus":
        server = PrometheusServer(dcgm_exposition(samples, openmetrics=True))
        try:
            yield server.url.replace("http://", "prometheus://") + "?source=dcgm"
        finally:
            server.cleanup()
        return
    body = dcgm_exposition(samples, openmetrics=False).encode()
    status, answer = http("POST", f"{vm.url}/api/v1/import/prometheus", data=body)
    assert status in (200, 204), answer[:300]
    vm.force_flush()
    yield vm.url.replace("http://", "victoriametrics://") + "?source=dcgm"
