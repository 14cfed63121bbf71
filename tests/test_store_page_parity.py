"""One truth on any store: the same samples in the embedded store, in InfluxDB and in
VictoriaMetrics (each with its rollups, rolled as collectors roll them; Debian's servers on
127.0.0.1) give the very same dashboard pages, every page, every preset range and a fixed range
with its edges inside buckets: figures, charts, tables, stragglers and jobs.

The samples are the demo cluster's (32 GPUs, a thermal straggler), 90 minutes of 10-s samples,
as the line protocol keeps them (``decode_line(encode(...))``: what every engine holds). What an
engine cannot keep is left out of all of them alike: per-process details (Prometheus-compatible
engines keep numbers and labels only)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from test_dashboard_support import content_body

from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.dashboard.app import PAGES, create_app
from gpuwatt.line_protocol import LineEncoder, decode_line
from gpuwatt.model import GpuSample
from gpuwatt.store import engine_rollups, open_store
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
MINUTES = 90
END_NS = 1_767_225_600 * NS + 3 * 3600 * NS  # a whole hour: the 6 h view's buckets are whole
START_NS = END_NS - MINUTES * 60 * NS
RANGES = ("15m", "1h", "6h", "24h", "7d")
#: a fixed range whose edges fall inside minutes and 5-minute buckets
FIXED = {"from": str(START_NS // NS + 7 * 60 + 30), "to": str(END_NS // NS - 13 * 60 - 15)}

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def samples() -> list[GpuSample]:
    source = SimulatedClusterSource(
        load_scenario("demo"), start_ns=START_NS, clock_ns=lambda: END_NS
    )
    source.open()
    try:
        batches = list(source.backfill(END_NS, interval_s=10.0, slow_interval_s=60.0))
    finally:
        source.close()
    encode = LineEncoder().encode
    return [replace(decode_line(encode(s)), processes=None) for b in batches for s in b]


def pages(store: Any) -> dict[str, Any]:
    """Every page's content for each range: the node page on the straggler's GPU, the jobs page
    with the training job opened."""
    app = create_app(store, now_ns=END_NS)
    client = app.server.test_client()
    out = {}
    try:
        for view in [*({"range": r} for r in RANGES), FIXED]:
            for page in PAGES:
                queries = [view]
                if page.PAGE == "node":
                    queries = [{**view, "host": "node-2", "gpu": "5"}]
                if page.PAGE == "jobs":
                    queries.append({**view, "job": "llm-train"})
                for q in queries:
                    resp = client.post("/_dash-update-component", json=content_body(page.PAGE, q))
                    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
                    out[f"{page.PAGE} {q}"] = resp.get_json()
    finally:
        app.server.config["GPUWATT_DATA"].close()
    return out


@pytest.fixture(scope="module")
def embedded(samples: list[GpuSample], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with SqliteStore(tmp_path_factory.mktemp("parity") / "p.db") as store:
        store.write_samples(samples)
        store.flush_rollups()
        return pages(store)


def _rolled(store: Any, samples: list[GpuSample]) -> None:
    """Every minute, 5 minutes and hour rolled, as the collectors of these GPUs roll them."""
    engine_rollups.roll_range(store.rollups, START_NS, END_NS)


@pytest.fixture(params=["influxdb", "victoriametrics"])
def engine(request: pytest.FixtureRequest, samples: list[GpuSample]) -> Iterator[dict[str, Any]]:
    if request.param == "influxdb":
        server, db = request.getfixturevalue("influx_db")
        store: Any = InfluxStore(server.url, "", db, timeout_s=30)
        server.write_samples(db, samples)
    else:
        vm = request.getfixturevalue("victoria_metrics")
        store = open_store(vm.url.replace("http://", "victoriametrics://") + "?rollups=on")
        store.write_samples(samples)
        vm.force_flush()
    _rolled(store, samples)
    if request.param == "victoriametrics":
        vm.force_flush()
    # "now" for the engine's own newest-sample reads (its clock; the dashboard's is injected)
    store.clock_ns = lambda: END_NS
    try:
        yield pages(store)
    finally:
        store.close()


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two answers differ. Floats within 1e-9 relative are the same (a sum taken in
    another order); two that a page rounded apart by one unit in their last place (54.61 and
    54.62 from 54.615 +- 1e-12: the stores' precisions) differ: figures are settled to 10
    significant digits before a page rounds them (``gpuwatt.precision``)."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, int | float) and isinstance(b, int | float)
        if numbers and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9):
            return []
        return [f"{path}: {a!r} != {b!r}"]
    if path.endswith("/id/name") and isinstance(a, str) and isinstance(b, str):
        a, b = (re.sub(r"-\d+$", "", x) for x in (a, b))  # each drawing numbers its graphs
    if type(a) is not type(b):
        return [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += differences(a.get(k), b.get(k), f"{path}/{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {str(a)[:120]!r} != {str(b)[:120]!r}"]


def test_every_page_is_the_same_on_every_store(
    embedded: dict[str, Any], engine: dict[str, Any]
) -> None:
    assert sorted(engine) == sorted(embedded)
    found = {k: differences(embedded[k], engine[k]) for k in embedded}
    found = {k: v for k, v in found.items() if v}
    assert not found, "\n".join(f"{k}:\n  " + "\n  ".join(v[:6]) for k, v in found.items())
