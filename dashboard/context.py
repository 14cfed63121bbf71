"""What a page's ``render`` gets: the data for the range plus the request's query."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatt.dashboard.alerts_hook import AlertsSource
from gpuwatt.dashboard.data import DashboardData, WindowData
from gpuwatt.dashboard.timerange import TimeRange
from gpuwatt.dashboard.work_data import JobWorkSource


@dataclass(frozen=True)
class PageContext:
    data: DashboardData
    win: WindowData  # None only for pages with NEEDS_DATA = False
    range: TimeRange
    query: dict[str, str]
    now_ns: int
    alerts: AlertsSource | None = None
    work: JobWorkSource | None = None  # application-reported job steps, when connected
    can_act: bool = False  # the user is authenticated and the alerts source takes actions

    def link(self, path: str, **params: str) -> str:
        """A link to another page that keeps this view's time range."""
        from gpuwatt.dashboard.timerange import to_search

        keep = {k: v for k, v in self.query.items() if k in ("range", "from", "to", "end")}
        keep.update(params)
        return path + to_search(keep)
