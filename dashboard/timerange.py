"""The time range a view shows, parsed from (and written back to) the URL's query string.

``?range=1h`` (the last hour up to now), ``?range=6h&end=2024-05-01T12:00:00Z`` (six hours up to a
fixed end), or ``?from=...&to=...`` (ISO 8601, UTC when no offset is given, or epoch seconds).
Nothing here raises on a bad URL: ``parse_range`` always returns a usable range, plus a message
saying what was wrong and what is shown instead, so a garbled link never becomes an error page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlencode

NS_PER_S = 1_000_000_000
PRESETS: tuple[str, ...] = ("15m", "1h", "6h", "24h", "7d")
DEFAULT_RANGE = "1h"
DEFAULT_SPAN_S = 3600
MIN_SPAN_S = 60
MAX_SPAN_S = 31 * 86_400
#: Bucket sizes. Up to 6 h the buckets come from the store's 1-minute rollups (60 s up to 2 h,
#: 5 minutes up to 6 h); beyond, whole hours, served from the 1-hour rollups. A bucket size that
#: is not a whole number of hours makes the store aggregate minute rows: reading 24 h of 1,024
#: GPUs in 5-minute buckets scans 1.5 M rows (measured ~11 s) where hourly buckets take ~0.4 s.
MINUTE_STEPS_S: tuple[tuple[int, int], ...] = ((2 * 3600, 60), (6 * 3600, 300))
HOUR_STEPS_S: tuple[int, ...] = (3600, 7200, 21_600, 86_400)
MAX_BUCKETS = 360
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"^\s*(\d{1,7})\s*([smhdw])\s*$")


@dataclass(frozen=True, slots=True)
class TimeRange:
    start_ns: int
    end_ns: int
    step_s: int  # bucket size of the store reads and of the analysis windows
    label: str  # "last 1h", or "2024-05-01 10:00 -> 12:00 UTC"
    preset: str | None  # the preset shown in the picker (None for an explicit range)
    live: bool  # True when the range ends "now" (moves with the clock)

    @property
    def span_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S


def parse_duration_s(text: str) -> int | None:
    m = _DURATION.match(text or "")
    return int(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_instant_ns(text: str) -> int | None:
    """ISO 8601 (UTC unless an offset is given) or epoch seconds; None when not understood."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or not 0 <= value < 4e9:
            return None
        return round(value * NS_PER_S)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T", 1))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    if not 1970 <= dt.year < 2100:
        return None
    return round(dt.timestamp() * NS_PER_S)


def choose_step_s(span_s: float) -> int:
    for max_span, step in MINUTE_STEPS_S:
        if span_s <= max_span:
            return step
    for step in HOUR_STEPS_S:
        if span_s / step <= MAX_BUCKETS:
            return step
    return HOUR_STEPS_S[-1]


def iso_s(ns: int) -> str:
    """Epoch ns -> "2026-01-01T00:10:00Z" (whole seconds; for the URL)."""
    return datetime.fromtimestamp(ns // NS_PER_S, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_ns(ns: int) -> str:
    return datetime.fromtimestamp(ns / NS_PER_S, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _make(start_ns: int, end_ns: int, preset: str | None, live: bool) -> TimeRange:
    span = (end_ns - start_ns) / NS_PER_S
    step = choose_step_s(span)
    if preset is not None and live:
        label = f"last {preset}"
    else:
        label = f"{fmt_ns(start_ns)} -> {fmt_ns(end_ns)} UTC"
    return TimeRange(start_ns, end_ns, step, label, preset, live)


def query_dict(search: str | None) -> dict[str, str]:
    """``?a=1&b=2`` -> {"a": "1", "b": "2"} (last value wins; never raises)."""
    text = (search or "").lstrip("?")
    try:
        parsed = parse_qs(text, keep_blank_values=False, max_num_fields=50)
    except ValueError:
        return {}
    return {k: v[-1] for k, v in parsed.items() if v}


def to_search(query: Mapping[str, str | None]) -> str:
    items = {k: v for k, v in query.items() if v not in (None, "")}
    return "?" + urlencode(items) if items else ""


def parse_range(query: Mapping[str, str], now_ns: int) -> tuple[TimeRange, str | None]:
    """The range a query asks for, and a message when it had to be corrected (else None)."""
    default = _make(now_ns - DEFAULT_SPAN_S * NS_PER_S, now_ns, DEFAULT_RANGE, True)
    fallback = f"showing the {default.label} instead"
    if "from" in query or "to" in query:
        start = parse_instant_ns(query.get("from", ""))
        end = parse_instant_ns(query.get("to", "")) if query.get("to") else now_ns
        if start is None or end is None:
            bad = "from" if start is None else "to"
            return default, f"the time '{query.get(bad, '')[:40]}' is not understood; {fallback}"
        return _checked(start, end, None, end == now_ns, default, fallback)
    text = query.get("range", DEFAULT_RANGE)
    span = parse_duration_s(text)
    if span is None:
        return default, f"the range '{text[:40]}' is not understood (e.g. 1h, 24h, 7d); {fallback}"
    end = now_ns
    if query.get("end"):
        end_ns = parse_instant_ns(query["end"])
        if end_ns is None:
            return default, f"the end time '{query['end'][:40]}' is not understood; {fallback}"
        end = end_ns
    preset = text.strip() if end == now_ns else None
    return _checked(end - span * NS_PER_S, end, preset, end == now_ns, default, fallback)


def _checked(
    start: int, end: int, preset: str | None, live: bool, default: TimeRange, fallback: str
) -> tuple[TimeRange, str | None]:
    span = (end - start) / NS_PER_S
    if span <= 0:
        return default, f"the range ends before it starts; {fallback}"
    if span < MIN_SPAN_S:
        return default, f"the range is shorter than {MIN_SPAN_S} s; {fallback}"
    if span > MAX_SPAN_S:
        return default, f"the range is longer than {MAX_SPAN_S // 86_400} days; {fallback}"
    return _make(start, end, preset, live), None
