"""The seam where the alert evaluator plugs in (the dashboard never imports ``alerts``).

The command line passes an object with ``active()`` (and optionally ``history(start_ns,
end_ns)``, ``silences()``, ``deliveries()``, and the actions ``silence(...)`` and
``expire(silence_id, ...)``) to ``create_app(..., alerts=...)``; until then the overview and the
alerts page say that no evaluator is connected rather than "0 alerts". A source whose evaluator
or database cannot be reached raises ``AlertsUnavailable`` (any exception is taken as such): the
page then says "not connected" and why, never "none".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class AlertsUnavailable(Exception):
    """The evaluator's state cannot be read (no database yet, unreadable, locked too long)."""


@dataclass(frozen=True, slots=True)
class AlertView:
    """One alert as the dashboard shows it."""

    name: str
    severity: str  # "critical" | "warning" | "info"
    summary: str
    state: str = "firing"  # "pending" | "firing" | "resolved"
    since_ns: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    runbook_url: str | None = None


@dataclass(frozen=True, slots=True)
class SilenceView:
    """A silence or maintenance window, current or planned."""

    matchers: dict[str, str]
    author: str
    comment: str
    starts_ns: int
    ends_ns: int
    kind: str = "silence"  # "silence" | "maintenance"
    id: int | None = None  # what ``expire`` takes; None: the source cannot expire it


@dataclass(frozen=True, slots=True)
class DeliveryView:
    """A notification that has not gone out: still retried ("retrying") or given up ("failed")."""

    channel: str
    state: str
    attempts: int
    error: str
    created_ns: int


def firing_count(source: AlertsSource | None) -> int | None:
    """How many alerts fire now; None when no evaluator is connected or it did not answer."""
    if source is None:
        return None
    try:
        return sum(1 for a in source.active() if a.state == "firing")
    except Exception:  # an alerts backend failing must not take a page down
        return None


@runtime_checkable
class AlertsSource(Protocol):
    def active(self) -> list[AlertView]:
        """Alerts pending or firing now."""
        ...

    def history(self, start_ns: int, end_ns: int) -> list[AlertView]:
        """Alerts that fired or resolved in the range, newest first."""
        ...


@runtime_checkable
class AlertActions(Protocol):
    """The writes the alerts page offers (only to an authenticated user, see ``create_app``)."""

    def silence(
        self, matchers: dict[str, str], *, duration_s: float, author: str, comment: str
    ) -> int:
        """Silence alerts matching every label of ``matchers`` from now on; the silence's id."""
        ...

    def expire(self, silence_id: int) -> None:
        """End a silence now (a planned maintenance window is ended before it starts)."""
        ...
