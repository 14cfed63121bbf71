"""The health page and the node page on the daily scenario (the demo with an XID and ECC
errors): slow counters shown from the last slow samples, XID events on the time axis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plotly.utils
import pytest
from test_dashboard_support import DEMO_END_NS, build_demo_store, daily_scenario

from gpuwatt.dashboard.app import render_page
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.pages import health, node
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
ECC_GPU = ("node-1", 4)  # HEALTH_FAULTS in test_dashboard_support


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqliteStore]:
    path: Path = tmp_path_factory.mktemp("health") / "daily.db"
    s = build_demo_store(path, minutes=6, scenario=daily_scenario(4))
    yield s
    s.close()


@pytest.fixture()
def data(store: SqliteStore) -> DashboardData:
    return DashboardData(store, clock_ns=lambda: DEMO_END_NS)


def rows_of(tree: Any, table_id: str) -> list[dict[str, Any]]:
    """The row dicts of the table component ``table_id`` in a rendered page."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("id") == table_id and isinstance(node.get("rowData"), list):
                found.extend(node["rowData"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(json.dumps(tree, cls=plotly.utils.PlotlyJSONEncoder)))
    return found


def newest_raw(store: SqliteStore, host: str, gpu: int, field: str) -> float:
    frame = store.series(DEMO_END_NS - 600 * NS, DEMO_END_NS + 1, [field], hosts=[host])
    mine = frame.loc[frame["gpu_index"] == gpu].dropna(subset=[field]).sort_values("time_ns")
    return float(mine[field].iloc[-1])


def test_the_newest_sample_lacks_the_slow_counters(store: SqliteStore) -> None:
    """The gap the health page closes: ECC and remapped rows are sampled once a minute."""
    newest = {(s.host, s.gpu_index): s for s in store.latest()}[ECC_GPU]
    assert newest.ecc_sbe_volatile_count is None


def test_health_table_shows_ecc_and_remapped_rows_of_the_last_slow_sample(
    store: SqliteStore, data: DashboardData
) -> None:
    rows = rows_of(render_page(health, {"range": "15m"}, data), "health-table")
    by_gpu = {r["gpu"].split("](")[0].strip("["): r for r in rows}
    ecc = by_gpu["node-1 GPU 4"]
    host, gpu = ECC_GPU
    assert ecc["sbe"] == newest_raw(store, host, gpu, "ecc_sbe_volatile_count") > 0
    assert ecc["dbe"] == newest_raw(store, host, gpu, "ecc_dbe_volatile_count") == 1
    assert ecc["remap_u"] == newest_raw(store, host, gpu, "remapped_rows_uncorrectable") == 1
    assert "uncorrectable ECC errors: 1" in ecc["state"]
    assert "row remapping pending" in ecc["state"]
    healthy = by_gpu["node-0 GPU 0"]
    assert healthy["sbe"] == 0 and healthy["dbe"] == 0 and healthy["remap_c"] == 0


def test_health_table_shows_lifetime_ecc_beside_the_volatile_counts(
    store: SqliteStore, data: DashboardData
) -> None:
    rows = rows_of(render_page(health, {"range": "15m"}, data), "health-table")
    by_gpu = {r["gpu"].split("](")[0].strip("["): r for r in rows}
    host, gpu = ECC_GPU
    ecc = by_gpu[f"{host} GPU {gpu}"]
    assert ecc["sbe_life"] == newest_raw(store, host, gpu, "ecc_sbe_aggregate_count")
    assert ecc["sbe_life"] >= ecc["sbe"] > 0
    assert ecc["dbe_life"] == newest_raw(store, host, gpu, "ecc_dbe_aggregate_count") >= 1


def test_health_table_shows_an_xid_raised_before_the_newest_sample(
    store: SqliteStore, data: DashboardData
) -> None:
    """The XID (79 at 2 min on node-1 GPU 2) is in one sample, minutes before the newest: the
    page shows it from the range's samples, and counts the GPU as needing action."""
    newest = {(s.host, s.gpu_index): s for s in store.latest()}[("node-1", 2)]
    assert newest.xid_errors == ()
    rows = rows_of(render_page(health, {"range": "15m"}, data), "health-table")
    by_gpu = {r["gpu"].split("](")[0].strip("["): r for r in rows}
    assert "XID 79" in by_gpu["node-1 GPU 2"]["state"]
    assert by_gpu["node-1 GPU 2"]["xid"] == 79
    assert by_gpu["node-0 GPU 0"]["xid"] is None and "XID" not in by_gpu["node-0 GPU 0"]["state"]
    # the node page says it beside the GPU, from the same events
    text = json.dumps(render_page(node, {"range": "15m", "host": "node-1"}, data), default=str)
    assert "GPU 2: NVIDIA H100 80GB HBM3" in text and "last XID 79 in the range" in text
    assert text.count("last XID") == 1
