"""InfluxStore writes: /api/v2/write through influxdb_client into victoria-metrics (exported points
must match exactly), errors classified for the spool, and the token kept out of sight."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from servers import VictoriaMetricsServer, free_port

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import LineEncoder, parse_line
from gpuwatt.store import StoreRejected
from gpuwatt.store.influx import InfluxStore

S = 1_000_000_000
MS = 1_000_000
TOKEN = "s3cr3t-T0KEN-value"


def now_ms_ns() -> int:
    """Now, to the millisecond (victoria-metrics keeps ms; its retention is relative to now)."""
    return time.time_ns() // MS * MS - 600 * S


def expected_points(lines: list[str]) -> dict[tuple[str, tuple], dict[int, float]]:
    """{(metric name, labels): {timestamp_ms: value}} for every numeric or boolean field."""
    out: dict[tuple[str, tuple], dict[int, float]] = {}
    for line in lines:
        measurement, tags, fields, t_ns = parse_line(line)
        for name, value in fields.items():
            if isinstance(value, str):
                continue
            key = (f"{measurement}_{name}", tuple(sorted(tags.items())))
            out.setdefault(key, {})[t_ns // MS] = float(value)
    return out


def exported_points(vm: VictoriaMetricsServer) -> dict[tuple[str, tuple], dict[int, float]]:
    out: dict[tuple[str, tuple], dict[int, float]] = {}
    for series in vm.export('{__name__=~"nvidia_smi_.+"}'):
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        key = (name, tuple(sorted(labels.items())))
        points = out.setdefault(key, {})
        for ts, v in zip(series["timestamps"], series["values"], strict=True):
            assert ts not in points, f"duplicate point {key} @ {ts}"
            points[ts] = float(v)
    return out


@pytest.mark.servers
def test_writes_arrive_exactly(victoria_metrics: VictoriaMetricsServer, make_sample) -> None:
    t0 = now_ms_ns()
    samples = [
        make_sample(t0 + i * S, f"node{h}", g) for i in range(5) for h in range(3) for g in range(4)
    ]
    lines = LineEncoder().encode_many(samples)
    with InfluxStore(victoria_metrics.url, "org", "gpuwatt", TOKEN, timeout_s=5) as store:
        store.write_samples(samples)
        want = expected_points(lines)
        got = exported_points(victoria_metrics)
        assert {k: v for k, v in got.items() if k in want} == want
        # Everything else is a string field, which victoria-metrics does not keep as a number.
        strings = {"energy_method", "tflops_method", "processes", "job_id"}
        assert {k[0].removeprefix("nvidia_smi_") for k in got if k not in want} <= strings
        n_fields = len(parse_line(lines[0])[2]) - len(strings)
        assert sum(len(want[k]) for k in want) == len(samples) * n_fields
        # A spool replaying the same batch (and write_lines, its path) stores nothing twice.
        store.write_lines(lines)
        store.write_samples(samples[:12])
        assert exported_points(victoria_metrics) == got


@pytest.mark.servers
def test_server_restart_mid_stream(victoria_metrics: VictoriaMetricsServer, make_sample) -> None:
    t0 = now_ms_ns()
    with InfluxStore(victoria_metrics.url, "org", "gpuwatt", timeout_s=2) as store:
        store.write_samples([make_sample(t0)])
        victoria_metrics.force_flush()
        victoria_metrics.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.write_samples([make_sample(t0 + S)])
        assert time.monotonic() - started < 2.0
        victoria_metrics.start()
        store.write_samples([make_sample(t0 + S)])
        power = [
            s for s in victoria_metrics.export() if s["metric"]["__name__"].endswith("power_draw")
        ]
        assert power[0]["timestamps"] == [t0 // MS, (t0 + S) // MS]


def test_connection_refused_is_unavailable_fast(make_sample) -> None:
    port = free_port()  # nothing listens there
    with InfluxStore(f"http://127.0.0.1:{port}", "org", "b", TOKEN, timeout_s=5) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.write_samples([make_sample(time.time_ns())])
        assert time.monotonic() - started < 1.0
        with pytest.raises(StoreUnavailable):
            store.latest()
    assert TOKEN not in str(info.value)


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A server that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_a_server_that_never_answers_times_out(make_sample) -> None:
    with (
        silent_server() as port,
        InfluxStore(f"http://127.0.0.1:{port}", "o", "b", TOKEN, timeout_s=0.5) as store,
    ):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.write_samples([make_sample(time.time_ns())])
        with pytest.raises(StoreUnavailable):
            store.count_samples(0, 1)
        assert time.monotonic() - started < 3.0


class Stub:
    """An HTTP server answering every request with ``status`` and recording what it got."""

    def __init__(self) -> None:
        self.status = 204
        self.body = b""
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                stub.requests.append((self.command, self.path, dict(self.headers), body))
                self.send_response(stub.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(stub.body)))
                self.end_headers()
                self.wfile.write(stub.body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Stub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, StoreRejected),
        (401, StoreRejected),
        (404, StoreRejected),
        (429, StoreUnavailable),
        (500, StoreUnavailable),
        (503, StoreUnavailable),
    ],
)
def test_http_errors_are_classified(status: int, error: type, make_sample) -> None:
    with Stub() as stub, InfluxStore(stub.url, "o", "b", TOKEN, timeout_s=5) as store:
        stub.status, stub.body = status, b'{"code":"x","message":"nope"}'
        with pytest.raises(error, match="nope") as write_info:
            store.write_samples([make_sample(time.time_ns())])
        with pytest.raises(error) as query_info:
            store.latest()
    for info in (write_info, query_info):
        assert TOKEN not in str(info.value)
        assert info.value.__cause__ is None or TOKEN not in str(info.value.__cause__)


def test_token_only_in_the_authorization_header(make_sample, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with Stub() as stub, InfluxStore(stub.url, "myorg", "mybucket", TOKEN, timeout_s=5) as store:
        stub.status = 204
        store.write_samples([make_sample(time.time_ns())])
        stub.status, stub.body = 200, b'{"results":[{"statement_id":0}]}'
        assert store.latest() == []
        assert TOKEN not in repr(store) and TOKEN not in str(vars(store))
    # The first request asks /ping which write endpoint the server takes; it carries no token.
    (ping, *requests) = stub.requests
    assert ping[1] == "/ping" and "Authorization" not in ping[2]
    # then the write, then the queries of latest (it may ask in parts: several)
    (w_method, w_path, w_headers, w_body), *queries = requests
    assert w_method == "POST" and queries
    assert (
        w_path.startswith("/api/v2/write?")
        and "precision=ns" in w_path
        and "bucket=mybucket" in w_path
    )
    for q_method, q_path, _, _ in queries:
        assert q_method == "GET"
        assert q_path.startswith("/query?") and "db=mybucket" in q_path and "epoch=ns" in q_path
    for headers in (w_headers, *(q[2] for q in queries)):
        assert headers["Authorization"] == f"Token {TOKEN}"
    assert TOKEN not in w_path + "".join(q[1] for q in queries) and TOKEN.encode() not in w_body
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_no_token_sends_no_authorization(make_sample) -> None:
    with Stub() as stub, InfluxStore(stub.url, "o", "b", None, timeout_s=5) as store:
        store.write_samples([make_sample(time.time_ns())])
        stub.status, stub.body = (
            200,
            b'{"results":[{"statement_id":0,"error":"database not found: b"}]}',
        )
        with pytest.raises(StoreRejected, match="database not found"):
            store.latest()
    assert all("Authorization" not in headers for _, _, headers, _ in stub.requests)
