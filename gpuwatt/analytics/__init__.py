"""Analytics: pure functions that turn sample frames into load balance, stragglers and efficiency.

No I/O and no clock reads: the dashboard, the alert evaluator and the CLI all call ``analyze``.
"""

from gpuwatt.analytics.balance import IdleGpu
from gpuwatt.analytics.energy import Tariff
from gpuwatt.analytics.gpu_windows import LostGpu, StragglerFindings, find_stragglers_in
from gpuwatt.analytics.quality import Figure, Quality
from gpuwatt.analytics.render import render_text
from gpuwatt.analytics.reported import JobWork, reported_work
from gpuwatt.analytics.stragglers import Straggler, StragglerConfig
from gpuwatt.analytics.summary import ANALYSIS_FIELDS, AnalysisSummary, analyze

__all__ = [
    "ANALYSIS_FIELDS",
    "AnalysisSummary",
    "Figure",
    "IdleGpu",
    "JobWork",
    "LostGpu",
    "Quality",
    "Straggler",
    "StragglerConfig",
    "StragglerFindings",
    "Tariff",
    "analyze",
    "find_stragglers_in",
    "render_text",
    "reported_work",
]
