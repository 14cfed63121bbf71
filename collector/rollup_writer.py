"""Keeps the engine's 1-minute, 5-minute and 1-hour rollups of this collector's GPUs
(``engine_rollups``).

The flusher tells it which lines the store has taken (``delivered``, before the spool's cursor
moves). A minute is rolled once lines ``grace_s`` past its end have been delivered: the spool
delivers in order, so by then the engine holds all of the minute this collector will ever send
(a VictoriaMetrics makes new samples searchable within a few seconds; the grace covers that). A
5-minute bucket or an hour is rolled from its minutes once they are, ``settle_s`` after the last
of them (it reads them back, and they too take a moment to become searchable). A replay of old
lines (an outage, ``gpuwatt spool replay``) marks their minutes again and they are rolled again,
from what the engine then holds.

The buckets still to roll are kept in a small private file beside the spool, written before the
spool's cursor moves: a collector killed at any point rolls them after its next start, and one
restarted mid-minute rolls that minute again once the rest of it is delivered (a bucket is
always computed from all the engine holds, so the second roll is the complete one). At shutdown
the open minute, 5 minutes and hour are rolled with what was delivered (the next start completes
them).

Rolling reads the bucket back: the collector's token needs read access to its bucket. Without it
(a write-only token) the first refusal is logged and rollups are off for the process; reads then
serve those GPUs' newest buckets from raw samples, still exactly.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuwatt.errors import GpuwattError, StoreUnavailable
from gpuwatt.line_protocol import decode_name
from gpuwatt.private_files import private_file
from gpuwatt.schema import MEASUREMENT
from gpuwatt.store import StoreRejected, engine_rollups
from gpuwatt.store.engine_rollups import (
    COARSE_LEVELS,
    FIVE_MINUTES_NS,
    HOUR_NS,
    MINUTE_NS,
    RollupSource,
    RollupsUnsupported,
)

log = logging.getLogger(__name__)

STATE_FILE = "rollups.json"
#: The state file's key of the buckets of each coarse level still to roll.
_STATE_KEYS = {FIVE_MINUTES_NS: "five_minutes", HOUR_NS: "hours"}
#: How far back a collector upgraded after others fills its 5-minute buckets in
#: (``_fill_five_minutes``): a week, 2,016 buckets.
FILL_FIVES_NS = 7 * 86_400 * 10**9
_HOST = re.compile(re.escape(MEASUREMENT) + r",(?:(?:[^ ,\\]|\\.)*,)*?host=((?:[^ ,\\]|\\.)*)[ ,]")
_UNESCAPE = re.compile(r"\\(.)")


def open_rollup_writer(store: object, state_dir: Path) -> RollupWriter | None:
    """A writer for the rollups ``store`` keeps in its engine; None for a store that keeps its
    own (the embedded store) or none (Prometheus)."""
    source = getattr(store, "rollups", None)
    return None if source is None else RollupWriter(source, state_dir)


class RollupWriter:
    """Rolls the buckets of the lines a flusher delivered, for the hosts those lines name."""

    def __init__(
        self,
        source: RollupSource,
        state_dir: Path,
        *,
        grace_s: float = 30.0,
        settle_s: float = 5.0,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        """``grace_s``: of data time past a minute's end before it is rolled; ``settle_s``: of
        wall time since lines of a minute were last delivered (an engine may take a moment to
        make them searchable: VictoriaMetrics about a second)."""
        self.source = source
        self.grace_ns = round(grace_s * 1e9)
        self.settle_s = settle_s
        self._monotonic_s = monotonic_s
        self.path = Path(state_dir) / STATE_FILE
        self.enabled = True
        self.rolled = 0  # GPU points written
        state = self._load()
        self._minutes: set[int] = set(state.get("minutes", []))
        #: the 5-minute buckets and hours still to roll, per level
        self._coarse: dict[int, set[int]] = {
            level: set(state.get(key, [])) for level, key in _STATE_KEYS.items()
        }
        self._hosts: set[str] = set(state.get("hosts", []))
        self._newest_ns: int = int(state.get("newest_ns", 0))
        # A state written before the 5-minute level (its hosts, no "five_minutes"): a collector
        # upgraded after others (``_fill_five_minutes``).
        self._fill_fives = bool(self._hosts) and _STATE_KEYS[FIVE_MINUTES_NS] not in state
        started = monotonic_s()
        self._touched_s: dict[int, float] = dict.fromkeys(self._minutes, started)
        # when a minute of each coarse bucket was last rolled: the bucket waits ``settle_s`` for
        # it to be searchable (it is built from its minutes read back)
        self._coarse_touched_s: dict[int, dict[int, float]] = {
            level: dict.fromkeys(buckets, started) for level, buckets in self._coarse.items()
        }
        self._down_logged = False

    def delivered(self, lines: Sequence[str]) -> None:
        """Note the buckets of delivered lines (persisted at once), then roll those now due.
        Never raises: rollups must not hold up the delivery of samples."""
        if not self.enabled:
            return
        try:
            if self._note(lines):
                self._save()
            self.roll_due()
        except Exception:  # a bug here must never stop the collector delivering samples
            self.enabled = False
            log.exception("engine rollups failed and are off; samples are still delivered")

    def close(self) -> None:
        """At shutdown: roll every noted bucket with what was delivered."""
        if not self.enabled:
            return
        try:
            self.roll_due(final=True)
        except Exception:  # as in ``delivered``: never fail the collector's shutdown
            log.exception("engine rollups failed at shutdown; the next start rolls them")

    def _note(self, lines: Sequence[str]) -> bool:
        changed = False
        now_s = self._monotonic_s()
        for line in lines:
            if not line.startswith(MEASUREMENT + ","):
                continue
            prefix, _, stamp = line.rpartition(" ")
            try:
                t_ns = int(stamp)
            except ValueError:
                continue
            m = _HOST.match(prefix)
            if m is None:
                continue
            host = decode_name(_UNESCAPE.sub(r"\1", m[1]))
            minute = t_ns // MINUTE_NS * MINUTE_NS
            self._touched_s[minute] = now_s
            if minute not in self._minutes or host not in self._hosts:
                changed = True
                self._minutes.add(minute)
                self._hosts.add(host)
            self._newest_ns = max(self._newest_ns, t_ns)
        return changed

    def roll_due(self, *, final: bool = False) -> int:
        """Roll the minutes, then the 5-minute buckets and hours, whose end is ``grace_s`` behind
        the newest line delivered (all of them when ``final``); the number of GPU points
        written."""
        frontier = 2**62 if final else self._newest_ns - self.grace_ns
        settled = 2**62 if final else self._monotonic_s() - self.settle_s
        hosts = sorted(self._hosts)
        written, last_minute = 0, None
        try:
            if self._fill_fives:
                self._fill_five_minutes()
            for minute in sorted(self._minutes):
                if minute + MINUTE_NS > frontier or self._touched_s.get(minute, 0.0) > settled:
                    break  # minutes are rolled in order: a coarse bucket never misses one
                written += engine_rollups.roll(self.source, MINUTE_NS, minute, hosts)
                self._minutes.discard(minute)
                self._touched_s.pop(minute, None)
                for level in COARSE_LEVELS:
                    bucket = minute // level * level
                    self._coarse[level].add(bucket)
                    self._coarse_touched_s[level][bucket] = self._monotonic_s()
                self._save()
                last_minute = minute
            if final and last_minute is not None:  # the buckets below are rolled at once
                engine_rollups.await_visible(self.source, MINUTE_NS, last_minute, hosts)
            # the minutes just rolled count from now
            settled = 2**62 if final else self._monotonic_s() - self.settle_s
            for level in COARSE_LEVELS:
                written += self._roll_coarse(level, frontier, settled, hosts)
            self._down_logged = False
        except RollupsUnsupported as exc:
            self.enabled = False
            log.warning("engine rollups off: %s", exc)
        except StoreRejected as exc:
            if exc.status in (401, 403):
                self.enabled = False
                log.error(
                    "engine rollups off: the store refused to be read (%s); give the collector "
                    "read access to its bucket to keep rollups",
                    exc,
                )
            else:
                log.error("engine rollups: the store refused a roll (%s); retried later", exc)
        except (StoreUnavailable, GpuwattError) as exc:
            if not self._down_logged:
                log.warning("engine rollups wait for the store (%s)", exc)
                self._down_logged = True
        self.rolled += written
        return written

    def _fill_five_minutes(self) -> None:
        """Note the 5-minute buckets of this collector's hosts from the engine's oldest one to
        the newest line delivered, to be rolled from the minutes the engine holds.

        Reads take a level's buckets from its oldest point on, for every host: where collectors
        are upgraded one after another, the 5-minute buckets written before this one's upgrade
        lack its GPUs. The first collector upgraded finds none and notes nothing; the others
        fill their GPUs in since then, at most ``FILL_FIVES_NS`` back (a day of a fleet's
        upgrade: 288 buckets, rolled at the first delivery)."""
        span = self.source.rollup_span(FIVE_MINUTES_NS)
        if span is not None:
            first = max(span[0], self._newest_ns - FILL_FIVES_NS)
            first = first // FIVE_MINUTES_NS * FIVE_MINUTES_NS
            for bucket in range(first, self._newest_ns, FIVE_MINUTES_NS):
                self._coarse[FIVE_MINUTES_NS].add(bucket)  # their minutes are settled long ago
        self._fill_fives = False
        self._save()

    def _roll_coarse(self, level_ns: int, frontier: int, settled: float, hosts: list[str]) -> int:
        """Roll the buckets of ``level_ns`` whose minutes are all rolled and searchable."""
        written = 0
        touched = self._coarse_touched_s[level_ns]
        for bucket in sorted(self._coarse[level_ns]):
            if (
                bucket + level_ns > frontier
                or touched.get(bucket, 0.0) > settled
                or any(bucket <= m < bucket + level_ns for m in self._minutes)
            ):
                continue
            written += engine_rollups.roll(self.source, level_ns, bucket, hosts)
            self._coarse[level_ns].discard(bucket)
            touched.pop(bucket, None)
            self._save()
        return written

    def _load(self) -> dict[str, Any]:
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self.path, exc)
            return {}
        return state if isinstance(state, dict) else {}

    def _save(self) -> None:
        state = {
            "minutes": sorted(self._minutes),
            **{key: sorted(self._coarse[level]) for level, key in _STATE_KEYS.items()},
            "hosts": sorted(self._hosts),
            "newest_ns": self._newest_ns,
        }
        tmp = self.path.with_suffix(".tmp")
        private_file(tmp)
        tmp.write_text(json.dumps(state), encoding="utf-8")
        tmp.replace(self.path)
