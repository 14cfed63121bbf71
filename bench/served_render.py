"""Served callbacks with and without the render cache, side by side (1,024 GPUs x 24 h).

    .venv/bin/python bench/served_render.py [--gpus 1024] [--hours 24] [--interval-s 10]
                                            [--db FILE] [--repeat 15] [--presets 1h,6h,24h]

What a visitor of a preset range waits for once the server has it computed (the warmer keeps
every preset so): the page's content callback (a real POST to ``/_dash-update-component`` through
Flask and Dash, as ``bench/callback_times.py``) with the view's window in the data cache. Timed
two ways in one process, alternating request by request: as served now (``render_cache``: the
content drawn once per window object) and with every request drawing the page again (a render
cache that keeps nothing, as before it). Prints per page and preset the median and
p95 of each and the ratio of the p95s. The data: ``bench/backfill.py``'s cluster in the embedded
store (``--db`` keeps it; the interval only thins the raw samples: the windows are read from
rollups at every preset but 15m). The figures do not depend on the store: a served request reads
nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backfill import Cluster, backfill, cluster_arguments
from callback_times import END_NS, bench_pages, open_embedded

from gpuwatt.dashboard.app import create_app
from gpuwatt.dashboard.render_cache import RenderCache


def _ms(values: list[float]) -> tuple[float, float]:
    return statistics.median(values) * 1000, float(np.percentile(values, 95)) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cluster_arguments(ap, interval_s=10.0)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--presets", default="1h,6h,24h")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "bench.db"
        if not db.exists():
            print(f"backfill: {args.gpus} GPUs x {args.hours} h every {args.interval_s} s")
            store = open_embedded(db)
            backfill(store, Cluster(args.gpus, args.hours, args.interval_s, END_NS))
            store.close()
        app = create_app(open_embedded(db), now_ns=END_NS, cache_ttl_s=3600.0)
        client = app.server.test_client()
        data = app.server.config["GPUWATT_DATA"]
        kept, off = data.rendered, RenderCache(max_entries=0)  # keeps nothing: draws every time
        print(f"\nserved callbacks, {args.gpus} GPUs: median / p95 ms (repeat {args.repeat})")
        print(f"  {'page':12s} {'preset':6s} {'render cache':>16s} {'drawn each time':>18s}  ratio")
        for preset in args.presets.split(","):
            for label, body_of in bench_pages():
                body = body_of({"range": preset})
                assert client.post("/_dash-update-component", json=body).status_code == 200
                times: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(args.repeat):
                    for cached in (True, False):
                        data.rendered = kept if cached else off
                        t = time.perf_counter()
                        resp = client.post("/_dash-update-component", json=body)
                        times[cached].append(time.perf_counter() - t)
                        assert resp.status_code == 200
                data.rendered = kept
                (cm, cp), (dm, dp) = _ms(times[True]), _ms(times[False])
                print(
                    f"  {label:12s} {preset:6s} {cm:7.0f} / {cp:5.0f}  {dm:9.0f} / {dp:5.0f}"
                    f"   x{dp / max(cp, 1e-3):.1f}"
                )


if __name__ == "__main__":
    main()
