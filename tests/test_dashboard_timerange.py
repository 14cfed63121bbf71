"""The time range in the URL: parsed, corrected with a message, never an exception."""

from __future__ import annotations

import pytest

from gpuwatt.dashboard.timerange import (
    MAX_BUCKETS,
    NS_PER_S,
    choose_step_s,
    parse_instant_ns,
    parse_range,
    query_dict,
    to_search,
)

NOW = 1_767_225_600 * NS_PER_S  # 2026-01-01 00:00 UTC


def test_default_is_last_hour() -> None:
    tr, problem = parse_range({}, NOW)
    assert problem is None
    assert (tr.start_ns, tr.end_ns, tr.step_s, tr.preset, tr.live) == (
        NOW - 3600 * NS_PER_S,
        NOW,
        60,
        "1h",
        True,
    )
    assert tr.label == "last 1h"


@pytest.mark.parametrize(
    ("span", "step"),
    [("15m", 60), ("1h", 60), ("2h", 60), ("6h", 300), ("24h", 3600), ("7d", 3600)],
)
def test_presets_pick_buckets_within_budget(span: str, step: int) -> None:
    tr, problem = parse_range({"range": span}, NOW)
    assert problem is None and tr.step_s == step
    assert tr.span_s / tr.step_s <= MAX_BUCKETS


def test_explicit_range_iso_and_epoch() -> None:
    tr, problem = parse_range({"from": "2025-12-31T22:00:00Z", "to": "1767222000"}, NOW)
    assert problem is None
    assert tr.start_ns == NOW - 7200 * NS_PER_S
    assert tr.end_ns == NOW - 3600 * NS_PER_S
    assert not tr.live and tr.preset is None
    assert "UTC" in tr.label


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ({"range": "banana"}, "not understood"),
        ({"range": "%%%\x00"}, "not understood"),
        ({"range": "9999999d"}, "longer than 31 days"),
        ({"range": "10s"}, "shorter than"),
        ({"from": "2026-01-01T00:10:00", "to": "2026-01-01T00:00:00"}, "ends before it starts"),
        ({"from": "yesterday-ish"}, "not understood"),
        ({"from": "1e400"}, "not understood"),
        ({"range": "1h", "end": "0000-00-00"}, "not understood"),
        ({"from": "3000-01-01T00:00:00"}, "not understood"),
    ],
)
def test_bad_ranges_fall_back_with_a_message(query: dict[str, str], words: str) -> None:
    tr, problem = parse_range(query, NOW)
    assert problem is not None and words in problem
    assert "showing the last 1h instead" in problem
    assert (tr.end_ns - tr.start_ns) == 3600 * NS_PER_S


def test_query_round_trip() -> None:
    q = query_dict("?range=6h&by=node&by=job")
    assert q == {"range": "6h", "by": "job"}
    assert query_dict(to_search(q)) == q
    assert isinstance(query_dict("%%%&&=="), dict)
    assert to_search({}) == ""


def test_instants() -> None:
    assert parse_instant_ns("2026-01-01T00:00:00+01:00") == NOW - 3600 * NS_PER_S
    assert parse_instant_ns("nan") is None
    assert parse_instant_ns("") is None


def test_step_grows_with_span() -> None:
    assert choose_step_s(60) == 60
    assert choose_step_s(31 * 86_400) == 21_600
    assert choose_step_s(10 * 3600) % 3600 == 0  # beyond 6 h: whole hours (1-hour rollups)
