"""Findings: what the analysis says about a GPU, as (GPU, finding, cause, severity).

One list for every reader (docs/accounting.md, "One computation"): ``gpuwatt analyze``, the
dashboard's data layer, the CSV report by GPU and the alert evaluator (its labels) all take
their findings from here, so a straggler or an idle GPU reads the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwatt.analytics.summary import AnalysisSummary

#: How serious an idle GPU is, by class (gpuwatt.analytics.idle): capacity held and unused is
#: a warning; a free GPU is information.
IDLE_SEVERITY: dict[str, str] = {
    "allocated_idle": "warning",
    "held_no_job": "warning",
    "free": "info",
}


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    host: str
    gpu_index: int
    uuid: str
    finding: str  # "straggler" | "idle"
    cause: str  # a straggler cause (stragglers.CAUSES) or an idle class (idle.IDLE_CLASSES)
    severity: str  # "critical" | "warning" | "info"


def findings(summary: AnalysisSummary) -> list[Finding]:
    """The active stragglers and the idle GPUs of an analysis, sorted."""
    out = [
        Finding(s.host, s.gpu_index, s.uuid, "straggler", s.cause, s.severity)
        for s in summary.active_stragglers
    ]
    out += [
        Finding(i.host, i.gpu_index, i.uuid, "idle", i.idle_class, IDLE_SEVERITY[i.idle_class])
        for i in summary.idle
    ]
    return sorted(out)
