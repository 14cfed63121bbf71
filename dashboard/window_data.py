"""What every page of one time range shares (``WindowData``): the store's rollups of the range,
the analytics summary of them, the GPUs seen and their jobs; and the GPU counts the overview
shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd

from gpuwatt.analytics import AnalysisSummary, Straggler, StragglerFindings
from gpuwatt.analytics.by_model import by_model
from gpuwatt.dashboard.partial_reads import Partial
from gpuwatt.dashboard.timerange import NS_PER_S, TimeRange
from gpuwatt.mig import is_mig_device
from gpuwatt.model import GpuSample, GpuSeen

#: A GPU whose newest sample is older than this is "silent" (its collector or node is down).
SILENT_AFTER_S = 180.0


#: Up to this many GPU-minutes (GPUs x the range's minutes), a view in buckets coarser than a
#: minute takes its figures (energy, GPU-hours, idle time, straggler minutes, per GPU, node and
#: job) from an analysis in 1-minute windows, as every shorter view, ``gpuwatt analyze`` and
#: the alert evaluator do: idle time and straggler minutes are decided per minute
#: (docs/accounting.md). Beyond it (1,024 GPUs over 5.7 hours: the 6 h view of 1,024 GPUs),
#: from the view's own windows. The 7-day view of the 32-GPU demo is within it.
ACCOUNTING_MAX_GPU_MINUTES = 350_000


def with_accounting(view: AnalysisSummary, minutes: AnalysisSummary) -> AnalysisSummary:
    """The view's summary with the figures of the same range analysed in 1-minute windows."""
    if not minutes.windows:
        return view
    return replace(
        view,
        energy_by_gpu=minutes.energy_by_gpu,
        energy_by_node=minutes.energy_by_node,
        energy_by_job=minutes.energy_by_job,
        cluster=minutes.cluster,
        lost=minutes.lost,
        idle=minutes.idle,  # idle for 3 minutes, whatever the view's bucket size
    )


@dataclass(frozen=True)
class GpuCounts:
    total: int
    up: int
    lost: int
    silent: int
    idle: int
    mig_devices: int = 0  # MIG devices, apart from the GPUs counted above (their parents)


@dataclass(frozen=True)
class WindowData:
    range: TimeRange
    frame: pd.DataFrame  # the store's rollups, long form
    summary: AnalysisSummary
    #: every GPU seen (``DashboardData.gpus_seen``): identities, newest sample times and jobs;
    #: a page that shows their newest values reads ``DashboardData.latest``
    gpus: list[GpuSeen]
    jobs: dict[str, str]  # uuid -> job id (from each GPU's newest sample)
    #: The stragglers of the newest hour in 1-minute windows, when the range's windows are
    #: coarser: a straggler of the last minutes persists over several 1-minute windows long
    #: before it does over several hourly ones. The cached default view's summary when fresh.
    recent: AnalysisSummary | StragglerFindings | None = None
    #: ``recent`` is the whole range in 1-minute windows (its straggler windows: the newest hour)
    recent_is_range: bool = False
    #: Set when the engine answered only some parts of the range in time (``partial_reads``):
    #: the figures hold what arrived, and ``partial.label`` says what is missing.
    partial: Partial | None = None

    @property
    def empty(self) -> bool:
        return self.frame.empty

    @property
    def stragglers(self) -> list[Straggler]:
        """The range's stragglers, plus those of the newest hour the range's windows miss. Where
        the range was also analysed in 1-minute windows (``ACCOUNTING_MAX_GPU_MINUTES``), its
        stragglers are those (their onset to the minute), as in every shorter view."""
        out = list(self.summary.stragglers)
        if self.recent is not None:
            if self.recent_is_range:
                return list(self.recent.stragglers)
            seen = {s.uuid for s in out}
            extra = [s for s in self.recent.stragglers if s.uuid not in seen]
            out = [s for s in out if s.active] + extra + [s for s in out if not s.active]
        return out

    @property
    def by_model(self) -> pd.DataFrame:
        """One row per GPU model, best work per watt first (``analytics.by_model``)."""
        return by_model(self.summary)

    @property
    def active_stragglers(self) -> list[Straggler]:
        return [s for s in self.stragglers if s.active]

    def straggler_windows(self, straggler: Straggler) -> pd.DataFrame:
        """The per-window scores in which ``straggler`` was found (for the peer comparison)."""
        if self.recent is not None and straggler not in self.summary.stragglers:
            return self.recent.straggler_windows
        return self.summary.straggler_windows

    def counts(self, latest: Sequence[GpuSample], now_ns: int) -> GpuCounts:
        """The GPUs of the newest samples ``latest`` by state, with the range's idle ones."""
        gpus = [s for s in latest if not is_mig_device(s)]
        lost = sum(1 for s in gpus if s.lost)
        silent = sum(
            1 for s in gpus if not s.lost and (now_ns - s.time_ns) / NS_PER_S > SILENT_AFTER_S
        )
        total = len(gpus)
        idle = len(self.summary.idle)
        migs = len(latest) - total
        return GpuCounts(total, total - lost - silent, lost, silent, idle, migs)
