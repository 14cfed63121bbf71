"""The span of an engine's rollups as reads learn it (``store.rollup_spans.SpanCache``): asked
once per few seconds, served at once while it is asked again after a pause, asked by the read
itself when it is older than that or gone."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpuwatt.store import rollup_spans
from gpuwatt.store.rollup_spans import NEWEST_TTL_S, STALE_SERVED_S, SpanCache

LEVEL = 60 * 10**9


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s


class Engine:
    """The engine's answers: its newest point per level; ``gate`` held closed keeps an ask
    waiting (an engine slow to answer); ``fail`` makes it raise."""

    def __init__(self) -> None:
        self.newest_ns = 10 * LEVEL
        self.asked = 0
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def oldest(self, level_ns: int) -> int | None:
        return 0

    def newest(self, level_ns: int) -> int | None:
        self.asked += 1
        assert self.gate.wait(10)
        if self.fail:
            raise ConnectionError("engine gone")
        return self.newest_ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(rollup_spans, "time", c)
    return c


def settled(spans: SpanCache) -> None:
    """Wait until no level is being asked again in the background."""
    for _ in range(1000):
        if not spans._refreshing:
            return
        threading.Event().wait(0.01)
    raise AssertionError("a background ask did not end")


def test_a_span_is_asked_once_per_few_seconds(clock: Clock) -> None:
    engine = Engine()
    spans = SpanCache(engine.oldest, engine.newest)
    assert spans.get(LEVEL) == (0, 10 * LEVEL)
    engine.newest_ns = 11 * LEVEL
    clock.now_s += NEWEST_TTL_S / 2
    assert spans.get(LEVEL) == (0, 10 * LEVEL)
    assert engine.asked == 1


def test_after_a_pause_the_span_kept_is_served_at_once_and_asked_again_beside(
    clock: Clock,
) -> None:
    engine = Engine()
    spans = SpanCache(engine.oldest, engine.newest)
    spans.get(LEVEL)
    engine.newest_ns = 12 * LEVEL
    engine.gate.clear()  # the engine slow to answer
    clock.now_s += NEWEST_TTL_S + 1
    assert spans.get(LEVEL) == (0, 10 * LEVEL)  # not waiting for the engine
    assert spans.get(LEVEL) == (0, 10 * LEVEL)  # one ask in flight, not two
    engine.gate.set()
    settled(spans)
    assert engine.asked == 2
    assert spans.get(LEVEL) == (0, 12 * LEVEL)  # the new answer, kept from its arrival
    assert engine.asked == 2


def test_a_span_older_than_served_stale_is_asked_by_the_read(clock: Clock) -> None:
    engine = Engine()
    spans = SpanCache(engine.oldest, engine.newest)
    spans.get(LEVEL)
    engine.newest_ns = 30 * LEVEL
    clock.now_s += STALE_SERVED_S + 1
    assert spans.get(LEVEL) == (0, 30 * LEVEL)
    assert engine.asked == 2 and not spans._refreshing


def test_a_failed_background_ask_is_logged_and_the_next_old_read_meets_the_error(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine()
    spans = SpanCache(engine.oldest, engine.newest)
    spans.get(LEVEL)
    engine.fail = True
    clock.now_s += NEWEST_TTL_S + 1
    caplog.set_level("DEBUG", logger=rollup_spans.__name__)
    assert spans.get(LEVEL) == (0, 10 * LEVEL)
    settled(spans)
    assert "engine gone" in caplog.text
    clock.now_s += STALE_SERVED_S
    with pytest.raises(ConnectionError):
        spans.get(LEVEL)


def test_rollups_gone_from_the_engine_are_no_longer_served(clock: Clock) -> None:
    engine = Engine()
    spans = SpanCache(engine.oldest, engine.newest)
    spans.get(LEVEL)
    engine.newest_ns = None  # type: ignore[assignment]  # a database emptied
    clock.now_s += NEWEST_TTL_S + 1
    spans.get(LEVEL)  # the one kept, asked again beside
    settled(spans)
    answers: list[Any] = [spans.get(LEVEL), spans.get(LEVEL)]
    assert answers == [None, None]
    assert engine.asked == 4  # none kept: each read asks
