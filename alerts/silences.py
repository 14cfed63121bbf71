"""Silences and maintenance windows: label matchers with an author, a comment and an end time.

A matcher value is an exact label value, or a regular expression after ``~`` (``~node-[0-3]``),
matched in full. An alert is silenced when every matcher of one current silence matches it.
A maintenance window is a silence planned ahead (``starts_ns`` in the future) and shown as such.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SILENCE = "silence"
MAINTENANCE = "maintenance"


@dataclass(frozen=True, slots=True)
class Silence:
    id: int
    kind: str
    matchers: dict[str, str]
    author: str
    comment: str
    starts_ns: int
    ends_ns: int

    def active_at(self, now_ns: int) -> bool:
        return self.starts_ns <= now_ns < self.ends_ns

    def matches(self, labels: Mapping[str, str]) -> bool:
        for name, want in self.matchers.items():
            have = labels.get(name, "")
            if want.startswith("~"):
                if re.fullmatch(want[1:], have) is None:
                    return False
            elif have != want:
                return False
        return True


def check_matchers(matchers: Mapping[str, str]) -> dict[str, str]:
    """Validate matchers (non-empty, regexes compile); raises ValueError with the reason."""
    if not matchers:
        raise ValueError("a silence needs at least one label matcher")
    for name, value in matchers.items():
        if value.startswith("~"):
            try:
                re.compile(value[1:])
            except re.error as exc:
                raise ValueError(
                    f"matcher {name}={value!r}: bad regular expression: {exc}"
                ) from None
    return dict(matchers)


class SilenceTable:
    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con

    def add(
        self,
        matchers: Mapping[str, str],
        *,
        author: str,
        comment: str,
        starts_ns: int,
        ends_ns: int,
        now_ns: int,
        kind: str = SILENCE,
    ) -> Silence:
        if not author or not comment:
            raise ValueError("a silence needs an author and a comment")
        if ends_ns <= starts_ns:
            raise ValueError("a silence must end after it starts")
        m = check_matchers(matchers)
        cur = self._con.execute(
            "INSERT INTO silences (kind, matchers, author, comment, starts_ns, ends_ns, created_ns)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (kind, json.dumps(m, sort_keys=True), author, comment, starts_ns, ends_ns, now_ns),
        )
        return Silence(int(cur.lastrowid or 0), kind, m, author, comment, starts_ns, ends_ns)

    def expire(self, silence_id: int, now_ns: int) -> None:
        self._con.execute(
            "UPDATE silences SET ends_ns = min(ends_ns, ?) WHERE id = ?", (now_ns, silence_id)
        )

    def current_and_future(self, now_ns: int) -> list[Silence]:
        rows = self._con.execute(
            "SELECT id, kind, matchers, author, comment, starts_ns, ends_ns FROM silences "
            "WHERE ends_ns > ? ORDER BY starts_ns, id",
            (now_ns,),
        ).fetchall()
        return [Silence(r[0], r[1], json.loads(r[2]), r[3], r[4], r[5], r[6]) for r in rows]


def silenced_by(silences: Iterable[Silence], labels: Mapping[str, str], now_ns: int) -> int | None:
    for s in silences:
        if s.active_at(now_ns) and s.matches(labels):
            return s.id
    return None
