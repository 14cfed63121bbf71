"""Raw samples in the head (``gpuwatt.store.rounds``) and in compressed chunks: aggregates
against a reference computed from the samples written, rewrites of part of a round, tails and
their retention, and a value that is not a number."""

from __future__ import annotations

import contextlib
import math
import random
import sqlite3
from pathlib import Path

import pytest

from gpuwatt.model import GpuSample
from gpuwatt.store import LAST_VALUE_ATTRS
from gpuwatt.store.sqlite import SqliteStore

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour
ATTRS = ["power_w", "fan_speed_pct", "energy_j", "clock_event_reasons", "mig_enabled"]
GPUS = [(h, g) for h in ("node1", "node2") for g in range(3)]


def cluster(make_sample, seconds: int, *, shuffle: bool) -> list[list[GpuSample]]:
    """Rounds of 6 GPUs, one per 2 s: lost samples (among them the last of some buckets), a GPU
    without a fan reading, a GPU missing from two rounds, and (``shuffle``) the GPUs in a
    different order in every round."""
    rng = random.Random(7)
    batches = []
    for t in range(0, seconds, 2):
        batch = []
        for host, g in GPUS:
            if host == "node2" and g == 0 and t in (100, 102):
                continue  # not in these rounds: their buckets are not whole rounds
            s = make_sample(
                T0 + t * S,
                host,
                g,
                power_w=100.0 + (t * 7 + g * 13) % 101 + 0.125,
                fan_speed_pct=None if g == 2 else float(t % 17),
                energy_j=1000.0 * t + g,
                clock_event_reasons=(t // 10 + g) % 4,
                mig_enabled=(t // 6) % 2 == 0,
            )
            if host == "node1" and g == 1 and t % 14 in (2, 4):
                s = GpuSample(s.time_ns, s.host, s.gpu_index, s.uuid, s.name, lost=True)
            batch.append(s)
        if shuffle:
            rng.shuffle(batch)
        batches.append(batch)
    return batches


def reference(
    batches: list[list[GpuSample]], lo: int, hi: int, step_s: int, hosts: list[str] | None
) -> dict[tuple[int, str, int], list[float]]:
    """(bucket, host, GPU) -> the attributes' aggregates, computed from the samples alone."""
    groups: dict[tuple[int, str, int], list[GpuSample]] = {}
    for s in sorted((s for b in batches for s in b), key=lambda s: s.time_ns):
        if lo <= s.time_ns < hi and (hosts is None or s.host in hosts):
            bucket = s.time_ns // (step_s * S) * step_s * S
            groups.setdefault((bucket, s.host, s.gpu_index), []).append(s)
    out = {}
    for key, samples in groups.items():
        ok = [s for s in samples if not s.lost]
        row = []
        for a in ATTRS:
            if a in LAST_VALUE_ATTRS:
                v = getattr(ok[-1], a) if ok else None
                row.append(math.nan if v is None else float(v))
            else:
                vs = [getattr(s, a) for s in samples if getattr(s, a) is not None]
                row.append(sum(vs) / len(vs) if vs else math.nan)
        out[key] = row
    return out


@pytest.mark.parametrize("shuffle", [False, True], ids=["same-order", "shuffled"])
@pytest.mark.parametrize("hosts", [None, ["node2"]])
@pytest.mark.parametrize("step_s", [20, 60, 120])
@pytest.mark.parametrize("seconds", [330, 700], ids=["head", "chunks"])
def test_aggregates_equal_a_reference_from_the_samples_written(
    tmp_path: Path, make_sample, shuffle: bool, hosts: list[str] | None, step_s: int, seconds: int
) -> None:
    """Rolled minutes and the raw tail (rounds in the same GPU order and shuffled ones; in the
    head, and past 10 minutes in compressed chunks) give the means and last values computed
    from the samples."""
    batches = cluster(make_sample, seconds, shuffle=shuffle)
    with SqliteStore(tmp_path / "r.db") as store:
        for b in batches:
            store.write_samples(b)
        lo, hi = T0, T0 + seconds * S  # rolled minutes, then a raw tail
        got = store.series(lo, hi, ATTRS, step_s=step_s, hosts=hosts)
    want = reference(batches, lo, hi, step_s, hosts)
    assert len(got) == len(want) > 0
    for row in got.itertuples(index=False):
        expected = want[(row.time_ns, row.host, row.gpu_index)]
        actual = [getattr(row, a) for a in ATTRS]
        assert actual == pytest.approx(expected, rel=1e-12, nan_ok=True), (row, expected)
    assert got["fan_speed_pct"].isna().sum() == (got["gpu_index"] == 2).sum() > 0


def test_rewriting_some_gpus_of_a_round_replaces_them_and_keeps_the_others(
    tmp_path: Path, make_sample
) -> None:
    with SqliteStore(tmp_path / "w.db") as store:
        store.write_samples([make_sample(T0, "node1", g, power_w=100.0 + g) for g in range(4)])
        again = [make_sample(T0, "node1", g, power_w=500.0 + g) for g in (1, 3)]
        store.write_samples(again)
        store.write_samples(again)  # twice: still one sample per GPU
        assert store.count_samples(T0, T0 + S) == 4
        raw = store.series(T0, T0 + S, ["power_w"])
        assert raw.sort_values("gpu_index")["power_w"].tolist() == [100.0, 501.0, 102.0, 503.0]
        assert [s.power_w for s in store.latest()] == [100.0, 501.0, 102.0, 503.0]
        # one batch with two times and the same GPU twice at one of them: the last one wins
        store.write_samples(
            [
                make_sample(T0 + S, "node1", 0, power_w=1.0),
                make_sample(T0 + 2 * S, "node1", 0, power_w=2.0),
                make_sample(T0 + S, "node1", 0, power_w=3.0),
            ]
        )
        assert store.count_samples(T0 + S, T0 + 3 * S) == 2
        raw = store.series(T0 + S, T0 + 3 * S, ["power_w"])
        assert raw["power_w"].tolist() == [3.0, 2.0]


def test_a_tail_in_use_outlives_the_raw_retention_and_one_no_longer_used_goes(
    tmp_path: Path, make_sample
) -> None:
    """GPU 0 keeps job "a" from the first sample on, GPU 1 moves from job "b" to "c": after
    fifteen minutes with a two-minute raw retention (the chunk of the first ten minutes, and
    its tails, go once the whole block is past it), "a" is still read back, "b" is gone."""
    with SqliteStore(tmp_path / "t.db", retention_raw_s=120, rollup_grace_s=5) as store:
        for t in range(0, 900, 5):
            job = "b" if t < 120 else "c"
            store.write_samples(
                [
                    make_sample(T0 + t * S, "node1", 0, job_id="a"),
                    make_sample(T0 + t * S, "node1", 1, job_id=job),
                ]
            )
            assert [s.job_id for s in store.latest()] == ["a", job], t
        assert store.latest()[0] == make_sample(T0 + 895 * S, "node1", 0, job_id="a")
        with contextlib.closing(sqlite3.connect(store.path)) as con:
            jobs = {j for (j,) in con.execute("SELECT job_id FROM tails")}
        assert jobs == {"a", "c"}
        # a GPU back after its tail was deleted gets it again
        store.write_samples([make_sample(T0 + 900 * S, "node1", 1, job_id="b")])
        assert [s.job_id for s in store.latest()] == ["a", "b"]


def test_a_gpu_back_after_a_silence_longer_than_the_raw_retention_keeps_its_tail(
    tmp_path: Path, make_sample
) -> None:
    """The retention run by the write that ends the silence must not delete the tail that
    write's sample refers to (the writer still holds it as the GPU's current tail)."""
    with SqliteStore(tmp_path / "s.db", retention_raw_s=120, rollup_grace_s=5) as store:
        for t in range(0, 300, 5):
            store.write_samples([make_sample(T0 + t * S, "node1", 0, job_id="a")])
        store.write_samples([make_sample(T0 + 1000 * S, "node1", 0, job_id="a")])
        assert store.latest() == [make_sample(T0 + 1000 * S, "node1", 0, job_id="a")]
        with contextlib.closing(sqlite3.connect(store.path)) as con:
            (n_tails,) = con.execute("SELECT count(*) FROM tails").fetchone()
        assert n_tails == 1  # one job all along: one tail, never deleted and made again


def test_a_value_that_is_not_a_number_is_refused_with_its_name(tmp_path: Path, make_sample) -> None:
    with SqliteStore(tmp_path / "n.db") as store:
        with pytest.raises(TypeError, match="power_w='high' is not a number"):
            store.write_samples([make_sample(T0, power_w="high")])
        assert store.count_samples(0, 2**62) == 0
        store.write_samples([make_sample(T0)])  # the writer's state survives the refusal
        assert store.latest() == [make_sample(T0)]


def test_rounds_read_back_by_their_writer_equal_those_decoded_from_the_file(
    tmp_path: Path, make_sample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writing process reads its open segment's rounds as it appended them (its cache of
    decoded segments); a process that did not write them decodes the file: both give what was
    written."""
    from gpuwatt.store import segments

    batches = cluster(make_sample, 200, shuffle=True)
    with SqliteStore(tmp_path / "w.db") as store:
        for b in batches:
            store.write_samples(b)
        mine = store.series(T0, T0 + 200 * S, ATTRS)
        monkeypatch.setattr(segments, "_CACHE", segments._Cache())  # as another process
        theirs = [store.series(T0, T0 + 200 * S, ATTRS)]
    written = sorted(
        (s.time_ns, s.host, s.gpu_index, *(getattr(s, a) for a in ATTRS))
        for b in batches
        for s in b
    )
    for frame in (mine, theirs[0]):
        got = sorted(
            tuple(r)
            for r in frame[["time_ns", "host", "gpu_index", *ATTRS]].itertuples(index=False)
        )
        assert len(got) == len(written)
        for g, w in zip(got, written, strict=True):
            assert g[:3] == w[:3]
            assert [None if isinstance(x, float) and math.isnan(x) else x for x in g[3:]] == [
                None if x is None else pytest.approx(float(x)) for x in w[3:]
            ]


def test_rounds_of_lost_gpus_of_different_sizes_read_back_with_their_own_gpus(
    tmp_path: Path,
) -> None:
    """A round in which every GPU is lost stores each column as one word, the same bytes for
    two GPUs as for four: the writer's cache of its rounds must not hand one the other's rows
    (it did: the minute's roll failed to broadcast the lost flags against the times)."""

    def lost(t_s: int, n: int) -> list[GpuSample]:
        return [
            GpuSample(T0 + t_s * S, "node1", i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", lost=True)
            for i in range(n)
        ]

    with SqliteStore(tmp_path / "l.db", rollup_grace_s=5) as store:
        for t_s in range(0, 180, 10):
            store.write_samples(lost(t_s, 4 if t_s % 20 else 2))
        frame = store.series(T0, T0 + 180 * S, ["power_w"])
        minutes = store.series(T0, T0 + 120 * S, ["power_w"], step_s=60)
    assert len(frame) == sum(4 if t % 20 else 2 for t in range(0, 180, 10))
    assert frame["power_w"].isna().all()
    assert sorted(set(minutes["gpu_index"])) == [0, 1, 2, 3]


def test_the_writers_cache_counts_a_round_written_again_once() -> None:
    """The same round packed again (identical rounds recur: every GPU lost, constant values)
    replaces its entry and its byte count: counted twice, the count drifted past the cache's
    limit over a long run and every new round then emptied the cache."""
    import threading

    import numpy as np

    from gpuwatt.store import rounds

    def in_fresh_thread() -> tuple[int, int, int]:
        rows = np.arange(4 * 8, dtype="<f8").reshape(4, 8)
        for _ in range(1000):
            rounds.pack_vals(rows.tobytes(), 8)
        other = rounds.pack_vals((rows + 1).tobytes(), 8)
        cache = rounds._written()
        return len(cache), rounds._local.written_bytes, int(other in cache)

    out: list[tuple[int, int, int]] = []
    t = threading.Thread(target=lambda: out.append(in_fresh_thread()))
    t.start()
    t.join()
    assert out == [(2, 2 * 4 * 8 * 8, 1)]
