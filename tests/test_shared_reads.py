"""Which reads of a view are asked of an engine as one (``shared_reads.abutting``): the runs of
reads that abut at a bucket boundary with the same fields, step and hosts."""

from __future__ import annotations

from gpuwatt.store.base import SeriesRead
from gpuwatt.store.shared_reads import abutting

S = 1_000_000_000
M = 60 * S
T = 1_700_000_000 // 3600 * 3600 * S  # a whole hour
F = ("power_w", "energy_j")


def runs(reads: list[SeriesRead]) -> list[tuple[int, int, list[int]]]:
    return [(r.start_ns, r.end_ns, members) for r, members in abutting(reads)]


def test_a_context_and_its_range_meeting_at_a_bucket_boundary_are_one_read() -> None:
    reads = [SeriesRead(T - 5 * M, T, F, 60), SeriesRead(T, T + 60 * M, F, 60)]
    assert runs(reads) == [(T - 5 * M, T + 60 * M, [0, 1])]
    hourly = [SeriesRead(T - 5 * 60 * M, T, F, 3600), SeriesRead(T, T + 24 * 60 * M, F, 3600)]
    assert runs(hourly) == [(T - 5 * 60 * M, T + 24 * 60 * M, [0, 1])]
    three = [*reads, SeriesRead(T + 60 * M, T + 61 * M + 7 * S, F, 60)]
    assert runs(three) == [(T - 5 * M, T + 61 * M + 7 * S, [0, 1, 2])]


def test_reads_that_do_not_abut_at_a_boundary_or_differ_are_read_apart() -> None:
    inside = T + 30 * S  # inside a minute: its bucket would be one, not two
    apart = [
        [SeriesRead(inside - 5 * M, inside, F, 60), SeriesRead(inside, inside + M, F, 60)],
        [SeriesRead(T - M, T, F, 60), SeriesRead(T + S, T + M, F, 60)],  # a gap
        [SeriesRead(T - M, T, F, 60), SeriesRead(T, T + M, F[:1], 60)],  # other fields
        [SeriesRead(T - M, T, F, 60), SeriesRead(T, T + M, F, 120)],  # another step
        [SeriesRead(T - M, T, F, 60), SeriesRead(T, T + M, F, 60, hosts=["a"])],
        [SeriesRead(T - M, T, F), SeriesRead(T, T + M, F)],  # raw samples
        [SeriesRead(T - 30 * 60 * M, T - 30 * M, F, 3600), SeriesRead(T - 30 * M, T, F, 3600)],
        [SeriesRead(T, T, F, 60), SeriesRead(T, T + M, F, 60)],  # an empty range
    ]
    for reads in apart:
        assert [m for _, _, m in runs(reads)] == [[0], [1]], reads
