"""VictoriaMetrics' export read as text (``promql_frames.exported_text``): the same series as
the JSON reading, and the JSON reading wherever a line is not in the shape it expects."""

from __future__ import annotations

import json

import numpy as np

from gpuwatt.store import engine_rollups
from gpuwatt.store import promql_frames as frames
from gpuwatt.store.promql_dialects import INFLUX

LINES = [
    {
        "metric": {"__name__": "gpuwatt_rollup_1m_power_w", "host": "node-1", "index": "0"},
        "values": [350.25, 1e-7, 0, -3],
        "timestamps": [1767225540006, 1767225600006, 1767225660006, 1767225720006],
    },
    {
        "metric": {"__name__": "gpuwatt_rollup_1m_n", "host": 'a "quoted", "values":[ host'},
        "values": [60],
        "timestamps": [1767225540060],
    },
    {
        "metric": {"__name__": "gpuwatt_rollup_1m_n", "host": "node-2"},
        "values": [],
        "timestamps": [],
    },
]


def body(lines: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)


def labels(e: frames.Exported) -> list[dict[str, str]]:
    """Each series' labels, its name among them."""
    return [
        {**e.label_sets[k], "__name__": n}
        for n, k in zip(e.names, e.label_set.tolist(), strict=True)
    ]


def test_text_reading_equals_the_json_reading() -> None:
    text = frames.exported_text(body(LINES))
    assert text is not None
    expected = frames.exported(LINES)
    assert labels(text) == labels(expected) == [x["metric"] for x in LINES]
    assert text.lengths.tolist() == [4, 1, 0]
    assert np.array_equal(text.lengths, expected.lengths)
    assert np.array_equal(text.t_ms, expected.t_ms)
    assert text.values.tolist() == [350.25, 1e-7, 0.0, -3.0, 60.0]


def test_series_sharing_their_times_read_as_the_json_reading() -> None:
    """Most series of an export share their timestamps text (every GPU's minute rollups), which
    is parsed once; a series whose values and times differ in count is still refused."""
    times = [1767225540000 + 60_000 * k for k in range(5)]
    lines = [
        {"metric": {"__name__": f"m{f}", "host": f"node-{g}"}, "values": [g + f + k / 8 for k in
         range(5)], "timestamps": times}
        for g in range(40) for f in range(3)
    ] + [LINES[1], LINES[2], {**LINES[0], "timestamps": times[1:]}]  # fmt: skip
    text = frames.exported_text(body(lines))
    expected = frames.exported(lines)
    assert text is not None
    assert labels(text) == labels(expected) == [x["metric"] for x in lines]
    assert len(text.label_sets) == 40 + 2  # a GPU's series share their labels but the name
    assert np.array_equal(text.lengths, expected.lengths)
    assert np.array_equal(text.t_ms, expected.t_ms)
    assert np.array_equal(text.values, expected.values)
    short = {**lines[0], "timestamps": times[:4]}  # five values, four times: not this shape
    assert frames.exported_text(body([*lines, short])) is None


def test_every_double_is_read_as_python_reads_it() -> None:
    """The numbers of an export are read by pandas' C reader (``promql_frames._numbers``): the
    same doubles as ``float()``, in shortest and in 17-digit form, over the whole range."""
    rng = np.random.default_rng(7)
    bits = np.frombuffer(rng.bytes(8 * 20_000), dtype=np.float64)
    doubles = np.concatenate(
        [bits[np.isfinite(bits)], rng.random(20_000) * 100, rng.standard_normal(20_000) * 1e12]
    )
    for form in (repr, "{:.17g}".format):  # as VictoriaMetrics writes them, and longer
        lines = []
        for i in range(50):
            part = doubles[i::50]
            values = ",".join(form(float(x)) for x in part)
            times = ",".join(str(t) for t in range(len(part)))
            lines.append(
                f'{{"metric":{{"__name__":"m","k":"{i}"}},"values":[{values}],'
                f'"timestamps":[{times}]}}\n'
            )
        text = frames.exported_text("".join(lines).encode())
        assert text is not None
        want = np.concatenate([doubles[i::50] for i in range(50)])
        assert np.array_equal(text.values, want)


def test_other_shapes_are_left_to_the_json_reading() -> None:
    with_null = [{**LINES[0], "values": [1.0, None, 2.0, 3.0]}]
    assert frames.exported_text(body(with_null)) is None
    with_nan = body([LINES[0]]).replace(b"350.25", b"NaN")
    assert frames.exported_text(with_nan) is None
    assert np.isnan(frames.exported(with_null).values[1])
    reordered = [{"values": [1.0], "timestamps": [1], "metric": {"host": "x"}}]
    assert frames.exported_text(body(reordered)) is None
    name_not_first = [{**LINES[0], "metric": {"host": "x", "__name__": "m"}}]
    assert frames.exported_text(body(name_not_first)) is None
    quoted_name = [{**LINES[0], "metric": {"__name__": 'm"1', "host": "x"}}]
    assert frames.exported_text(body(quoted_name)) is None
    assert labels(frames.exported(quoted_name))[0]["__name__"] == 'm"1'
    assert frames.exported_text(b"") is not None  # no series: nothing to read


def _rows(pivot: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[tuple[object, ...]]:
    t, gid, matrix = pivot
    return sorted((int(a), int(b), *(None if np.isnan(v) else v for v in row))
                  for a, b, row in zip(t, gid, matrix, strict=True))  # fmt: skip


def test_a_pivot_gives_a_row_per_time_and_gpu_whether_or_not_their_times_align() -> None:
    names = ["m_n", "m_power_w"]

    def series(name: str, host: str, times: list[int], values: list[float]) -> dict[str, object]:
        labels = {"__name__": name, "host": host, "index": "0", "uuid": f"GPU-{host}"}
        return {"metric": labels, "values": values, "timestamps": times}

    aligned = [
        series("m_power_w", "b", [1000, 2000], [1.5, 2.5]),
        series("m_n", "a", [1000, 3000], [6.0, 5.0]),
        series("other", "a", [7000], [9.0]),  # not asked for
        series("m_n", "b", [1000, 2000], [6.0, 4.0]),
        series("m_power_w", "a", [1000, 3000], [0.5, 3.5]),
    ]
    want = [  # GPU 0: host b, 1: host a
        (1_000_000_000, 0, 6.0, 1.5),
        (1_000_000_000, 1, 6.0, 0.5),
        (2_000_000_000, 0, 4.0, 2.5),
        (3_000_000_000, 1, 5.0, 3.5),
    ]
    ids = engine_rollups.GpuIds()
    got = frames.pivot_exported(frames.exported(aligned), INFLUX, names, ids)
    assert [i[0] for i in ids.idents] == ["b", "a"]  # ids as the series come: b first
    assert _rows(got) == want
    # a GPU whose metrics have points at different times: rows of each time, NaN where missing
    ragged = [*aligned[:4], series("m_power_w", "a", [3000, 4000], [3.5, 4.5])]
    ids = engine_rollups.GpuIds()
    got = frames.pivot_exported(frames.exported(ragged), INFLUX, names, ids)
    assert _rows(got) == [
        (1_000_000_000, 0, 6.0, 1.5),
        (1_000_000_000, 1, 6.0, None),
        (2_000_000_000, 0, 4.0, 2.5),
        (3_000_000_000, 1, 5.0, 3.5),
        (4_000_000_000, 1, None, 4.5),
    ]


def test_exports_joined_pivot_as_one_export_of_all_their_series() -> None:
    """A read's metrics asked for in several exports (``PromStore.export_at_once``): joined,
    each series keeps its own labels, and the pivot is that of one export of all of them."""
    times = [1767225540000 + 10_000 * k for k in range(6)]
    metrics = ["m_n", "m_power_w", "m_temp"]
    lines = [
        {"metric": {"__name__": m, "host": f"node-{g}", "index": str(g % 2), "uuid": f"GPU-{g}"},
         "values": [g * 10 + f + k / 4 for k in range(6)], "timestamps": times}
        for g in range(5) for f, m in enumerate(metrics)
    ]  # fmt: skip
    whole = frames.exported_text(body(lines))
    parts = [frames.exported_text(body(lines[i::2])) for i in range(2)]
    assert whole is not None and all(p is not None for p in parts)
    joined = frames.joined_exports(parts)  # type: ignore[arg-type]
    assert labels(joined) == [x["metric"] for x in lines[0::2] + lines[1::2]]
    one, two = engine_rollups.GpuIds(), engine_rollups.GpuIds()
    want = frames.pivot_exported(whole, INFLUX, metrics, one)
    got = frames.pivot_exported(joined, INFLUX, metrics, two)
    as_hosts = lambda ids, rows: [(r[0], ids.idents[r[1]][0], *r[2:]) for r in rows]  # noqa: E731
    assert sorted(as_hosts(two, _rows(got))) == sorted(as_hosts(one, _rows(want)))
    assert len(_rows(got)) == 5 * 6
