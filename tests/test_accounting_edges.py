"""Accounting rule 4 (docs/accounting.md): a range that starts or ends inside a rollup bucket
reads the part of that bucket inside the range from the level below, instead of dropping the
first bucket or counting the last one whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sqlite_rounds import ATTRS, T0, S, cluster, reference

from gpuwatt.store.sqlite import SqliteStore


@pytest.mark.parametrize("step_s", [60, 120, 3600])
@pytest.mark.parametrize(
    ("lo_s", "hi_s"),
    [(29, 29 + 40 * 60), (0, 61 * 60 + 17), (61, 3 * 3600 + 59), (3599, 3600 + 1)],
    ids=["start-inside", "end-inside", "both-inside", "across-an-hour"],
)
def test_a_range_with_edges_inside_rolled_buckets_equals_the_samples_in_it(
    tmp_path: Path, make_sample, step_s: int, lo_s: int, hi_s: int
) -> None:
    batches = cluster(make_sample, 4 * 3600 + 120, shuffle=False)
    with SqliteStore(tmp_path / "e.db") as store:
        for b in batches:
            store.write_samples(b)
        store.flush_rollups()  # every minute and hour rolled: edges fall inside rolled buckets
        lo, hi = T0 + lo_s * S, T0 + hi_s * S
        got = store.series(lo, hi, ATTRS, step_s=step_s)
        whole = store.series(lo, hi, ["power_w"])
    want = reference(batches, lo, hi, step_s, None)
    assert len(whole) == sum(lo <= s.time_ns < hi for b in batches for s in b)
    assert len(got) == len(want) > 0
    for row in got.itertuples(index=False):
        expected = want[(row.time_ns, row.host, row.gpu_index)]
        actual = [getattr(row, a) for a in ATTRS]
        assert actual == pytest.approx(expected, rel=1e-12, nan_ok=True), (row, expected)
