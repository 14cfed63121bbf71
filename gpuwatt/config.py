"""gpuwatt's configuration: a YAML file plus environment variables, validated at start.

Precedence: command-line flag > environment variable > config file > default. Secrets (the
InfluxDB token) are never part of this file's values printed anywhere: they come from
``INFLUXDB_V2_TOKEN`` or a file named by ``INFLUXDB_V2_TOKEN_FILE`` and are read by the store.

Example::

    collector:
      interval: 1s            # fast cadence: utilisation, power, clocks, GPM ...
      slow_interval: 60s      # ECC, remapped rows
      spool_dir: /var/lib/gpuwatt/spool
      spool_max_mib: 256
      hostname: gpu-node-17   # default: this machine's host name
      tensor_precision: bf16  # which tensor peak the TFLOPS estimate uses: tf32|bf16|fp16|fp8
      job_mapping_dir: /run/gpuwatt/jobs   # optional: files <gpu index|uuid> -> job id
      proc_root: /proc        # where the host's /proc is (a container: its read-only mount)
    store:
      url: influxdb://influx.example.org:8086/gpuwatt?org=hpc
      timeout: 30s            # an engine's read timeout (default 10 s InfluxDB, 30 s Prometheus);
                              # a timeout= in the URL wins
    energy:
      price_per_kwh: 0.25
      currency: EUR
      carbon_g_per_kwh: 350
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatt.gpu_specs import TENSOR_PRECISIONS
from gpuwatt.yamlfile import Located, load_file

ENV_STORE_URL = "GPUWATT_STORE"
ENV_HOME = "GPUWATT_HOME"


def gpuwatt_home(environ: Mapping[str, str] = os.environ) -> Path:
    """Where gpuwatt keeps its embedded store and spool when nothing else is configured."""
    if environ.get(ENV_HOME):
        return Path(environ[ENV_HOME])
    base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpuwatt"


@dataclass(frozen=True)
class CollectorConfig:
    interval_s: float = 1.0
    slow_interval_s: float = 60.0
    spool_dir: Path | None = None  # default: <gpuwatt home>/spool
    spool_max_bytes: int = 256 * 1024 * 1024
    hostname: str = field(default_factory=socket.gethostname)
    tensor_precision: str = "bf16"
    job_mapping_dir: Path | None = None  # a scheduler prolog's GPU -> job files
    proc_root: Path = Path("/proc")  # the host's /proc: GPU processes' cgroups name their jobs


@dataclass(frozen=True)
class EnergyConfig:
    price_per_kwh: float = 0.20
    currency: str = "EUR"
    carbon_g_per_kwh: float = 400.0


@dataclass(frozen=True)
class Config:
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    store_url: str | None = None
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    source: str | None = None  # the file it came from
    #: An engine's per-request timeout (``store: timeout:``); None: the URL's or the default.
    store_timeout_s: float | None = None


# ``alerts:`` belongs to the alert evaluator, which validates it (``gpuwatt.alerts.settings``).
_TOP = {"collector", "store", "energy", "alerts"}
_COLLECTOR = {
    "interval",
    "slow_interval",
    "spool_dir",
    "spool_max_mib",
    "hostname",
    "tensor_precision",
    "job_mapping_dir",
    "proc_root",
}
_STORE = {"url", "timeout"}
_ENERGY = {"price_per_kwh", "currency", "carbon_g_per_kwh"}


def parse_config(doc: Located) -> Config:
    """Validate a loaded YAML document; raises ConfigError naming the line."""
    doc.check_keys(_TOP)
    collector = CollectorConfig()
    if (c := doc.get("collector")) is not None:
        c.check_keys(_COLLECTOR)
        kw: dict[str, object] = {}
        if (v := c.get("interval")) is not None:
            kw["interval_s"] = v.duration_s(minimum=0.05)
        if (v := c.get("slow_interval")) is not None:
            kw["slow_interval_s"] = v.duration_s(minimum=1.0)
        if (v := c.get("spool_dir")) is not None:
            kw["spool_dir"] = v.writable_path("spool directory")
        if (v := c.get("spool_max_mib")) is not None:
            kw["spool_max_bytes"] = v.integer(minimum=16, maximum=1024 * 1024) * 1024 * 1024
        if (v := c.get("hostname")) is not None:
            kw["hostname"] = v.string()
        if (v := c.get("tensor_precision")) is not None:
            kw["tensor_precision"] = v.choice(TENSOR_PRECISIONS)
        if (v := c.get("job_mapping_dir")) is not None:
            kw["job_mapping_dir"] = Path(v.string())
        if (v := c.get("proc_root")) is not None:
            kw["proc_root"] = Path(v.string())
        collector = CollectorConfig(**kw)  # type: ignore[arg-type]
        if collector.slow_interval_s < collector.interval_s:
            raise (c.get("slow_interval") or c).error(
                "slow_interval must not be shorter than interval"
            )
    store_url = None
    store_timeout_s = None
    if (s := doc.get("store")) is not None:
        s.check_keys(_STORE)
        if (v := s.get("url")) is not None:
            store_url = v.string()
            _reject_secret_in_url(v)
        if (v := s.get("timeout")) is not None:
            store_timeout_s = v.duration_s(minimum=0.001)
            if store_timeout_s > 3600:
                raise v.error("timeout must be at most 1h")
    energy = EnergyConfig()
    if (e := doc.get("energy")) is not None:
        e.check_keys(_ENERGY)
        ekw: dict[str, object] = {}
        if (v := e.get("price_per_kwh")) is not None:
            ekw["price_per_kwh"] = v.number(minimum=0.0)
        if (v := e.get("currency")) is not None:
            ekw["currency"] = v.string()
        if (v := e.get("carbon_g_per_kwh")) is not None:
            ekw["carbon_g_per_kwh"] = v.number(minimum=0.0)
        energy = EnergyConfig(**ekw)  # type: ignore[arg-type]
    return Config(
        collector=collector,
        store_url=store_url,
        store_timeout_s=store_timeout_s,
        energy=energy,
        source=doc.path,
    )


def _reject_secret_in_url(node: Located) -> None:
    from urllib.parse import urlsplit

    if urlsplit(str(node.value)).password is not None:
        raise node.error(
            "the store URL carries a password/token; put the token in INFLUXDB_V2_TOKEN or a "
            "file named by INFLUXDB_V2_TOKEN_FILE instead"
        )


def load_config(path: str | Path | None, environ: Mapping[str, str] = os.environ) -> Config:
    """Load and validate ``path`` (None: defaults), then apply environment overrides."""
    config = parse_config(load_file(path)) if path is not None else Config()
    if environ.get(ENV_STORE_URL):
        config = Config(
            collector=config.collector,
            store_url=environ[ENV_STORE_URL],
            store_timeout_s=config.store_timeout_s,
            energy=config.energy,
            source=config.source,
        )
    return config
