"""Nothing stops delivery of the lines behind a bad one, and a refused token loses nothing.

Against real stores on 127.0.0.1: the embedded SQLite store and Debian's victoria-metrics (the
InfluxDB write API), the latter behind a small HTTP proxy that refuses every token but the good
one, as an InfluxDB with an expired token does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuwatt.collector.delivery import SetAside
from gpuwatt.collector.runtime import Flusher, spool_for
from gpuwatt.collector.spool import Spool
from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample
from gpuwatt.store import open_store
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
GOOD_TOKEN = "good-token-123"


def _lines(job: str = "train") -> list[str]:
    samples = [
        GpuSample(time_ns=T0 + k * NS, host="node-1", gpu_index=0, uuid="GPU-a",
                  name="NVIDIA H100 80GB HBM3", power_w=100.0 + k, job_id=job)
        for k in range(4)
    ]  # fmt: skip
    return LineEncoder().encode_many(samples)


def test_a_garbage_line_and_a_newline_job_id_do_not_stop_the_sqlite_store(tmp_path: Path) -> None:
    good = _lines()
    weird = _lines(job="job\nwith a newline")
    spool = Spool(tmp_path / "spool")
    spool.append([good[0], "this is not line protocol", good[1], weird[2], good[3]])
    with SqliteStore(tmp_path / "s.db") as store:
        flusher = Flusher(spool, store)
        try:
            flusher.flush()
        finally:
            spool.close()
        got = store.series(T0, T0 + 10 * NS, ["power_w"])
        (latest,) = store.latest()
    assert list(got["power_w"]) == [100.0, 101.0, 102.0, 103.0]
    assert latest.job_id == "train"  # the newest (T0 + 3 s) is a good line
    assert flusher.rejected_lines == 1 and flusher.delivered_lines == 4
    assert spool.pending_lines() == 0
    (kept,) = flusher.set_aside.files()
    ((line, reason),) = flusher.set_aside.lines(kept)
    assert line == "this is not line protocol" and "LineProtocolError" in reason


def test_a_sample_the_sqlite_store_refuses_is_set_aside_as_its_line(tmp_path: Path) -> None:
    """From the embedded store's binary spool: the samples around a refused one are written, the
    refused one is kept aside as line protocol, where ``gpuwatt spool replay`` reads it."""
    samples = [
        GpuSample(T0 + k * NS, "node-1", 0, "GPU-a", "H100", power_w=100.0 + k) for k in range(4)
    ]
    bad = GpuSample(T0 + 9 * NS, "node-1", 2**70, "GPU-b", "H100", power_w=1.0)  # no int64
    with SqliteStore(tmp_path / "s.db") as store:
        spool = spool_for(store, tmp_path / "spool")
        spool.append_samples([samples[0], bad, *samples[1:]])
        flusher = Flusher(spool, store)
        try:
            flusher.flush()
            assert spool.pending_lines() == 0
        finally:
            spool.close()
        got = store.series(T0, T0 + 10 * NS, ["power_w"])
    assert list(got["power_w"]) == [100.0, 101.0, 102.0, 103.0]
    assert flusher.rejected_lines == 1 and flusher.delivered_lines == 4
    (kept,) = flusher.set_aside.files()
    ((line, reason),) = flusher.set_aside.lines(kept)
    assert line == LineEncoder().encode(bad) and "OverflowError" in reason


@pytest.mark.servers
def test_a_garbage_line_does_not_stop_victoria_metrics(victoria_metrics, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    good = _lines(job="job\nwith a newline")
    spool.append([good[0], "this is not line protocol", *good[1:]])
    url = victoria_metrics.url.replace("http://", "influxdb://") + "/gpuwatt?org=o"
    try:
        with open_store(url) as store:
            flusher = Flusher(spool, store)
            flusher.flush()
        assert spool.pending_lines() == 0 and flusher.delivered_lines >= 4
    finally:
        spool.close()
    rows = victoria_metrics.export('{__name__="nvidia_smi_power_draw",host="node-1"}')
    assert sorted(v for r in rows for v in r["values"]) == [100.0, 101.0, 102.0, 103.0]


class TokenCheckingProxy:
    """Forwards to a store, answering 401 to every token but ``GOOD_TOKEN``."""

    def __init__(self, upstream: str) -> None:
        self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if (
                    self.path.startswith("/api/v2/write")
                    and self.headers.get("Authorization") != f"Token {GOOD_TOKEN}"
                ):
                    proxy.refused += 1
                    data = json.dumps({"code": "unauthorized", "message": "bad token"}).encode()
                    self.send_response(401)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command)
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, data, headers = resp.status, resp.read(), resp.headers
                except urllib.error.HTTPError as exc:
                    with exc:
                        status, data, headers = exc.code, exc.read(), exc.headers
                self.send_response(status)
                for k in ("Content-Type", "X-Influxdb-Version"):
                    if headers.get(k):
                        self.send_header(k, headers[k])
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> TokenCheckingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


REFUSED_S = 60.0


@pytest.mark.servers
def test_a_refused_token_for_a_minute_loses_nothing(victoria_metrics, tmp_path: Path) -> None:
    """The collector runs with an expired token for 60 s; the operator writes the renewed token
    into the token file; every sample taken arrives, once, and nothing is set aside."""
    token_file = tmp_path / "token"
    token_file.write_text("expired-token")
    token_file.chmod(0o600)
    with TokenCheckingProxy(victoria_metrics.url) as proxy:
        env = {
            **os.environ,
            "GPUWATT_HOME": str(tmp_path),
            "INFLUXDB_V2_TOKEN_FILE": str(token_file),
        }
        env.pop("INFLUXDB_V2_TOKEN", None)
        env.pop("GPUWATT_STORE", None)
        url = proxy.url.replace("http://", "influxdb://") + "/gpuwatt?org=o&api=v2"
        with (tmp_path / "collector.log").open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwatt", "collect", "--simulate", "healthy",
                 "--interval", "1", "--store", url, "--spool", str(tmp_path / "spool")],
                env=env, stderr=log,
            )  # fmt: skip
        try:
            time.sleep(REFUSED_S)
            assert proxy.refused > 0 and proc.poll() is None
            token_file.write_text(GOOD_TOKEN + "\n")  # the operator renews the token
            deadline = time.monotonic() + 90
            text = ""
            while time.monotonic() < deadline:
                text = (tmp_path / "collector.log").read_text()
                if "store reachable again" in text:
                    break
                time.sleep(1)
            assert "store reachable again" in text, text[-3000:]
            time.sleep(3)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    text = (tmp_path / "collector.log").read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "store refused us" in text and "bad token" in text and "expired-token" not in text
    taken = int(re.search(r"(\d+) GPU samples taken", text).group(1))  # type: ignore[union-attr]
    assert re.search(rf"{taken} GPU samples taken, {taken} delivered, 0 kept", text), text[-2000:]
    assert "0 set aside as refused by the store, 0 dropped" in text
    # an influxdb:// URL for VictoriaMetrics: rollups off, said once, no traceback
    assert "Traceback" not in text and "engine rollups off" in text, text[-3000:]
    # each sample exactly once. (Once in a full CI run, on a loaded machine, the export right
    # after the collector stopped held one round fewer: a round VictoriaMetrics had answered
    # for but not yet made visible, or a lost one. Asked again for a few seconds, the first
    # is seen and the second still fails.)
    deadline = time.monotonic() + 15
    while True:
        rows = victoria_metrics.export('{__name__="nvidia_smi_gpu_lost"}')
        stored = sum(len(r["values"]) for r in rows)
        if stored >= taken or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert stored == taken
    assert taken >= REFUSED_S * 32  # 32 GPUs sampled every second all along


BOUND = 400  # bytes: room for two of the three files below


def test_set_aside_stays_within_its_bound_and_replays(tmp_path: Path) -> None:
    aside = SetAside(tmp_path / "rejected", max_bytes=BOUND)
    good = _lines()
    aside.add([(good[0], "HTTP 400: field type conflict")], "0001")
    aside.add([(good[1], "HTTP 400: field type conflict")], "0002")
    aside.add([(good[2], "x"), ("garbage", "LineProtocolError")], "0003")
    assert aside.dropped_lines >= 1  # the oldest went to keep within the bound
    assert sum(p.stat().st_size for p in aside.files()) <= BOUND
    kept_before = aside.pending_lines()
    with SqliteStore(tmp_path / "s.db") as store:
        delivered, kept = aside.replay(store)
        n = store.count_samples(T0, T0 + 10 * NS)
    assert kept == 1 and delivered == kept_before - 1 == n
    ((line, reason),) = [pair for p in aside.files() for pair in aside.lines(p)]
    assert line == "garbage" and "LineProtocolError" in reason


def test_spool_replay_command(tmp_path: Path) -> None:
    from test_cli import gpuwatt

    spool_dir = tmp_path / "spool"
    Spool(spool_dir).close()
    aside = SetAside(spool_dir / "rejected", max_bytes=1 << 20)
    aside.add([(line, "HTTP 400") for line in _lines()], "0001")
    db = tmp_path / "s.db"
    status = gpuwatt("spool", "status", "--spool", str(spool_dir), home=tmp_path)
    assert "4 samples set aside" in status.stdout
    result = gpuwatt("spool", "replay", "--spool", str(spool_dir), "--store", f"sqlite:///{db}",
                     home=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "replayed 4 samples; 0 refused again" in result.stdout
    with SqliteStore(db) as store:
        assert store.count_samples(T0, T0 + 10 * NS) == 4
    assert aside.files() == []


def test_spool_files_are_private(tmp_path: Path) -> None:
    import stat

    old = os.umask(0o022)
    try:
        spool = Spool(tmp_path / "new" / "spool", max_bytes=2 * 4096, segment_bytes=4096)
        spool.append(_lines() * 40)  # past one segment: rotation creates another file
        spool.commit(spool.read_batch())  # writes the cursor
        spool.close()
    finally:
        os.umask(old)
    files = list((tmp_path / "new" / "spool").iterdir())
    assert len(files) >= 2 and any(f.name.endswith("2.lp") for f in files)  # a rotated segment
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}
    for d in (tmp_path / "new", tmp_path / "new" / "spool"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_dashboard_exits_0_on_sigterm(tmp_path: Path) -> None:
    from servers import free_port

    env = {**os.environ, "GPUWATT_HOME": str(tmp_path)}
    env.pop("GPUWATT_STORE", None)
    port = free_port()
    with (tmp_path / "dash.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatt", "dashboard", "--port", str(port),
             "--store", f"sqlite:///{tmp_path / 'x.db'}"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "gpuwatt dashboard:" not in (tmp_path / "dash.log").read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, (tmp_path / "dash.log").read_text()[-2000:]
    assert "Traceback" not in (tmp_path / "dash.log").read_text()


def test_a_locked_embedded_store_is_an_outage_not_bad_data(tmp_path: Path) -> None:
    import sqlite3

    spool = Spool(tmp_path / "spool")
    spool.append(_lines())
    with SqliteStore(tmp_path / "s.db", busy_timeout_s=0.1) as store:
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        flusher = Flusher(spool, store)
        try:
            flusher.flush()
            assert flusher.store_down_since_s is not None
            assert flusher.rejected_lines == 0 and spool.pending_lines() == 4  # kept, not set aside
        finally:
            other.execute("ROLLBACK")
            other.close()
        flusher._next_attempt_s = 0.0  # past the back-off
        flusher.flush()
        assert spool.pending_lines() == 0 and flusher.delivered_lines == 4
    spool.close()
