"""VictoriaMetrics' export read as text (``promql_frames.exported_text``): the same series as
the JSON reading, and the JSON reading wherever a line is not in the shape it expects."""

from __future__ import annotations

import json

import numpy as np

from gpuwatt.store import promql_frames as frames

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


def test_text_reading_equals_the_json_reading() -> None:
    text = frames.exported_text(body(LINES))
    assert text is not None
    expected = frames.exported(LINES)
    assert text.labels == expected.labels
    assert text.lengths.tolist() == [4, 1, 0]
    assert np.array_equal(text.lengths, expected.lengths)
    assert np.array_equal(text.t_ms, expected.t_ms)
    assert text.values.tolist() == [350.25, 1e-7, 0.0, -3.0, 60.0]


def test_other_shapes_are_left_to_the_json_reading() -> None:
    with_null = [{**LINES[0], "values": [1.0, None, 2.0, 3.0]}]
    assert frames.exported_text(body(with_null)) is None
    assert np.isnan(frames.exported(with_null).values[1])
    reordered = [{"values": [1.0], "timestamps": [1], "metric": {"host": "x"}}]
    assert frames.exported_text(body(reordered)) is None
    assert frames.exported_text(b"") is not None  # no series: nothing to read
