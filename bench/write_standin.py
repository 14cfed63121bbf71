"""A stand-in for InfluxDB 1.x's write endpoint, for ``spool_replay.py``: gpuwatt's side alone.

Run as its own process (``python bench/write_standin.py``): it serves 127.0.0.1 on a free port
and prints that port on its first line of output. It answers

- ``GET /ping`` with 204 and ``X-Influxdb-Version: 1.6.7`` (so ``InfluxStore`` picks ``/write``);
- ``POST /write?db=...&precision=ns``: the body must be UTF-8 line protocol whose every line
  is an ``nvidia_smi`` point with a timestamp; its lines are counted and 204 comes back (400 and
  nothing counted otherwise), with no storing;
- ``GET /count``: ``{"lines": N, "cpu_s": S}``, the lines counted since the last ``DELETE
  /count`` and this process's CPU time (what accepting them cost the stand-in);
- ``DELETE /count``: counts from zero again.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Counts:
    def __init__(self) -> None:
        self.lines = 0
        self.lock = threading.Lock()


COUNTS = _Counts()


def count_lines(body: bytes) -> int:
    """The points of a /write body; ``ValueError`` for one that is not line protocol."""
    text = body.decode("utf-8")  # UnicodeDecodeError is a ValueError
    lines = [line for line in text.split("\n") if line]
    for line in lines:
        # measurement,tags fields timestamp: three parts at least, the last all digits
        if not line.startswith("nvidia_smi,") or not line.rpartition(" ")[2].isdigit():
            raise ValueError(f"not an nvidia_smi point with a timestamp: {line[:80]!r}")
    return len(lines)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as InfluxDB

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ping":
            self._answer(204, X_Influxdb_Version="1.6.7")
        elif self.path == "/count":
            with COUNTS.lock:
                body = {"lines": COUNTS.lines, "cpu_s": time.process_time()}
            self._answer(200, json.dumps(body).encode(), Content_Type="application/json")
        else:
            self._answer(404)

    def do_DELETE(self) -> None:
        with COUNTS.lock:
            COUNTS.lines = 0
        self._answer(204)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not self.path.startswith("/write?"):
            self._answer(404)
            return
        try:
            n = count_lines(body)
        except ValueError as exc:
            self._answer(400, json.dumps({"error": str(exc)}).encode())
            return
        with COUNTS.lock:
            COUNTS.lines += n
        self._answer(204)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
