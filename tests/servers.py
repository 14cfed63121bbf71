"""Real servers for the InfluxDB backend's tests, started from Debian's packages.

- ``InfluxDB1Server``: ``influxd`` 1.6.7 (reads: InfluxQL over /query; loaded through /write,
  since 1.6 has no /api/v2/write).
- ``VictoriaMetricsServer``: ``victoria-metrics`` (writes: it accepts /api/v2/write; read back
  with /internal/force_flush then /api/v1/export). It can be stopped and started again on the
  same port and data directory, for outage tests.

Both bind 127.0.0.1 on a free port, keep their data in their own temporary directory and log to a
file there (shown when a server fails to start).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample

INFLUXD = "influxd"
VICTORIA_METRICS = "victoria-metrics"
START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(
    method: str, url: str, *, data: bytes | None = None, timeout_s: float = 10.0
) -> tuple[int, bytes]:
    """One HTTP request; (status, body). HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


class _Server:
    binary: str = ""
    ready_path: str = ""

    def __init__(self) -> None:
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"gpuwatt-{self.binary}-"))
        self.log_path = self.tmp / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        """Start the server (same port, same data) and wait until it answers."""
        if self.running:
            return
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            self._argv(), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"{self.binary} exited at start:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                status, _ = http("GET", self.url + self.ready_path, timeout_s=1.0)
                if 200 <= status < 300:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"{self.binary} did not answer in {START_TIMEOUT_S} s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM; SIGKILL only after 120 s); its data stays.

        Patient on purpose: on a loaded machine a server flushing its buffers can take a while,
        and killing it then would lose points it had acknowledged (use ``kill()`` for a crash).
        """
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.stop()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class InfluxDB1Server(_Server):
    """Debian's influxd 1.6.7 with its own meta/data/wal directories, auth disabled."""

    binary = INFLUXD
    ready_path = "/ping"

    def __init__(self) -> None:
        super().__init__()
        self.rpc_port = free_port()
        self.config_path = self.tmp / "influxdb.conf"
        self.config_path.write_text(
            f"""reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"

[meta]
  dir = "{self.tmp / "meta"}"

[data]
  dir = "{self.tmp / "data"}"
  wal-dir = "{self.tmp / "wal"}"
  query-log-enabled = false
  index-version = "inmem"

[http]
  enabled = true
  bind-address = "127.0.0.1:{self.port}"
  auth-enabled = false
  log-enabled = false

[monitor]
  store-enabled = false

[continuous_queries]
  enabled = false

[subscriber]
  enabled = false
"""
        )

    def _argv(self) -> list[str]:
        return [INFLUXD, "run", "-config", str(self.config_path)]

    def query(self, q: str, *, db: str | None = None, method: str = "GET") -> dict[str, Any]:
        params = {"q": q, "epoch": "ns", **({"db": db} if db else {})}
        encoded = urllib.parse.urlencode(params)
        if method == "POST":
            status, body = http("POST", f"{self.url}/query", data=encoded.encode())
        else:
            status, body = http("GET", f"{self.url}/query?{encoded}")
        if status != 200:
            raise RuntimeError(f"influxd /query {status}: {body[:300]!r}")
        return json.loads(body)

    def create_database(self, name: str) -> None:
        self.query(f'CREATE DATABASE "{name}"', method="POST")

    def drop_database(self, name: str) -> None:
        self.query(f'DROP DATABASE "{name}"', method="POST")

    def write_lines(self, db: str, lines: Iterable[str]) -> None:
        """Load points through the 1.x /write endpoint (precision ns)."""
        body = "\n".join(lines).encode()
        url = f"{self.url}/write?{urllib.parse.urlencode({'db': db, 'precision': 'ns'})}"
        status, resp = http("POST", url, data=body)
        if status != 204:
            raise RuntimeError(f"influxd /write {status}: {resp[:300]!r}")

    def write_samples(self, db: str, samples: Iterable[GpuSample]) -> None:
        self.write_lines(db, LineEncoder().encode_many(samples))


class VictoriaMetricsServer(_Server):
    """Debian's victoria-metrics: accepts /api/v2/write; ``stop()``/``start()`` keep port and data.

    Duplicate points (a spool replaying what already arrived) collapse into one
    (``-dedup.minScrapeInterval=1ms``). Timestamps are kept to the millisecond.
    """

    binary = VICTORIA_METRICS
    ready_path = "/health"

    def __init__(self) -> None:
        super().__init__()
        self.data_dir = self.tmp / "data"

    def _argv(self) -> list[str]:
        return [
            VICTORIA_METRICS,
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.data_dir}",
            "-retentionPeriod=100y",
            "-search.latencyOffset=0s",
            "-dedup.minScrapeInterval=1ms",
            "-loggerLevel=WARN",
        ]

    def force_flush(self) -> None:
        status, body = http("GET", f"{self.url}/internal/force_flush")
        if status != 200:
            raise RuntimeError(f"force_flush {status}: {body[:200]!r}")

    def export(self, match: str = '{__name__=~".+"}') -> list[dict[str, Any]]:
        """Every series matching ``match`` after a flush: dicts with ``metric`` (labels,
        ``__name__`` = ``<measurement>_<field>``), ``values`` and ``timestamps`` (ms)."""
        self.force_flush()
        query = urllib.parse.urlencode({"match[]": match, "start": "0"})
        status, body = http("GET", f"{self.url}/api/v1/export?{query}")
        if status != 200:
            raise RuntimeError(f"export {status}: {body[:200]!r}")
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    def wipe(self) -> None:
        """Start again on an empty data directory, same port (isolates tests sharing one
        server; ~0.1 s). Not ``delete_series``, which VictoriaMetrics means for one-off removals:
        after many tests had deleted and written the same series again, a CI run read a
        5-minute rollup built without its first minute (the cause not found; an empty
        directory rules the deletions out)."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()
