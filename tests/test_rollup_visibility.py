"""An hour (and a 5-minute bucket) is built from its minutes read back from the engine.
VictoriaMetrics makes points it took searchable a moment later, so an hour rolled at once could
miss its newest minutes: the backfill (``engine_rollups.roll_range``) waits until the engine
answers with them, and the collector's ``RollupWriter`` rolls an hour ``settle_s`` after its
last minute. An engine whose
writes become readable only after a delay stands in for VictoriaMetrics here (the servers' tests
flush it before each read, which hides the delay)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpuwatt.collector.rollup_writer import RollupWriter
from gpuwatt.line_protocol import LineEncoder
from gpuwatt.store import engine_rollups
from gpuwatt.store.engine_rollups import (
    FIVE_MINUTES_NS,
    HOUR_NS,
    LEVELS,
    Ident,
    Scope,
    empty_level,
)
from gpuwatt.store.rollup_rule import as_level

S = 1_000_000_000
T0 = 1_699_999_200 * S  # a whole hour
IDENT: Ident = ("node1", 0, "GPU-0", "H100")


class DelayedEngine:
    """A ``RollupSource`` over one GPU's samples every 10 s, whose rollup writes are readable
    once ``visible_after`` reads have been answered since (a clock that only reads move)."""

    def __init__(
        self, samples_end_ns: int, visible_after: int, first_visible_after: int | None = None
    ) -> None:
        self.t = np.arange(T0, samples_end_ns, 10 * S, dtype=np.int64)
        self.visible_after = visible_after
        #: the first write (a new series' first points) readable later than the rest
        self.first_visible_after = first_visible_after
        self.reads = 0
        self.points: dict[int, list[tuple[int, dict[str, np.ndarray]]]] = {
            level: [] for level in LEVELS
        }

    def raw_level(self, start_ns: int, end_ns: int, scope: Scope) -> dict[str, np.ndarray]:
        t = self.t[(self.t >= start_ns) & (self.t < end_ns)]
        gid = np.full(len(t), scope.ids.of(IDENT), dtype=np.int64)
        values = {a: np.full(len(t), 100.0) for a in scope.attrs}
        return as_level(t, gid, np.zeros(len(t), dtype=bool), values)

    def raw_in(self, start_ns: int, end_ns: int) -> bool:
        return True

    def rollup_points(
        self, level_ns: int, start_ns: int, end_ns: int, scope: Scope, *, lean: bool = False
    ) -> dict[str, np.ndarray]:
        self.reads += 1
        parts = [
            cols
            for readable_at, cols in self.points[level_ns]
            if readable_at <= self.reads
            and len(cols["time_ns"])
            and start_ns <= int(cols["time_ns"][0]) < end_ns
        ]
        if not parts:
            return empty_level(scope.attrs)
        ids = [scope.ids.of(IDENT) for _ in parts]
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        out["gpu_id"] = np.asarray(ids, dtype=np.int64)
        return out

    def rollup_span(self, level_ns: int) -> tuple[int, int] | None:
        times = [int(c["time_ns"][0]) for _, c in self.points[level_ns]]
        return (min(times), max(times)) if times else None

    def rollup_lines(
        self, level_ns: int, cols: dict[str, np.ndarray], idents: Sequence[Ident]
    ) -> list[Any]:
        return [(level_ns, cols)]

    def write_lines(self, lines: Sequence[Any]) -> None:
        for level_ns, cols in lines:
            after = self.visible_after
            if self.first_visible_after is not None and not any(self.points.values()):
                after = self.first_visible_after
            self.points[level_ns].append((self.reads + after, cols))

    def hour_n(self, hour_ns: int, level_ns: int = HOUR_NS) -> int:
        """Samples the newest point of the ``level_ns`` bucket at ``hour_ns`` counts."""
        points = [c for _, c in self.points[level_ns] if int(c["time_ns"][0]) == hour_ns]
        return int(points[-1]["n"][0]) if points else 0

    def fives_n(self, hour_ns: int) -> list[int]:
        """Samples each 5-minute bucket of the hour at ``hour_ns`` counts."""
        fives = range(hour_ns, hour_ns + HOUR_NS, FIVE_MINUTES_NS)
        return [self.hour_n(t, FIVE_MINUTES_NS) for t in fives]


def test_a_backfill_rolls_each_hour_from_all_its_minutes_on_an_engine_slow_to_show_them() -> None:
    engine = DelayedEngine(T0 + HOUR_NS, visible_after=3)
    assert engine_rollups.roll_range(engine, T0, T0 + HOUR_NS, attrs=("power_w",)) > 0
    assert engine.hour_n(T0) == 360  # every 10-s sample of the hour, the last minute's too
    assert engine.fives_n(T0) == [30] * 12


def test_a_backfill_waits_for_its_first_minute_shown_later_than_the_newest() -> None:
    engine = DelayedEngine(T0 + HOUR_NS, visible_after=2, first_visible_after=20)
    assert engine_rollups.roll_range(engine, T0, T0 + HOUR_NS, attrs=("power_w",)) > 0
    assert engine.fives_n(T0) == [30] * 12  # the first 5 minutes with their first minute
    assert engine.hour_n(T0) == 360


def test_the_collector_rolls_an_hour_only_once_its_last_minute_has_settled(
    tmp_path: Path, make_sample: Any
) -> None:
    engine = DelayedEngine(T0 + HOUR_NS + 31 * S, visible_after=2)
    clock = [0.0]
    writer = RollupWriter(
        engine, tmp_path, grace_s=30.0, settle_s=5.0, monotonic_s=lambda: clock[0]
    )
    encode = LineEncoder().encode_many
    for t_ns in range(T0, T0 + HOUR_NS + 31 * S, 10 * S):  # the last one makes minute 59 due
        writer.delivered(encode([make_sample(t_ns)]))
        clock[0] += 10.0
        engine.reads += 1  # and the engine shows what it took meanwhile
    # the hour's last minute was rolled on the last delivery, less than settle_s ago
    assert engine.hour_n(T0) == 0
    assert engine.fives_n(T0)[-1] == 0
    clock[0] += 5.0
    engine.reads += 1  # the engine shows what it took meanwhile
    writer.roll_due()
    assert engine.hour_n(T0) == 360
    assert engine.fives_n(T0) == [30] * 12
