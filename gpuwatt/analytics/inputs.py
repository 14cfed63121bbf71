"""The analysis input of a range, built one way for every reader (docs/accounting.md, "One
computation"): the CLI's ``analyze``, the dashboard's data layer, the CSV reports and the alert
evaluator read the same rows at the same level and attribute the same jobs. The one module of
``gpuwatt.analytics`` that reads: through the store it is given, never a clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from gpuwatt.analytics.summary import ANALYSIS_FIELDS
from gpuwatt.model import GpuSample
from gpuwatt.store.base import Store

#: Ranges at least this long are read from 1-minute rollups (fast at 1,000 GPUs); shorter
#: ones from raw samples. Either gives the same figures (docs/accounting.md, rule 1).
ROLLUP_FROM_S = 1800


@dataclass(frozen=True, slots=True)
class AnalysisInput:
    frame: pd.DataFrame
    jobs: dict[str, str]  # uuid -> job id of every GPU that held a job in the range
    step_s: int | None


def analysis_step_s(span_s: float) -> int | None:
    """The read step for a range of ``span_s`` seconds (None: raw samples)."""
    return 60 if span_s >= ROLLUP_FROM_S else None


def jobs_in_range(store: Store, start_ns: int) -> dict[str, str]:
    """uuid -> job id for the GPUs seen holding a job since ``start_ns`` (their newest job in
    it), whether or not the GPU still runs it: a GPU idle under a job for the whole range is
    attributed to it, as a GPU that finished its job before the end of the range."""
    return jobs_of(store.latest(since_ns=start_ns), start_ns)


def jobs_of(latest: Sequence[GpuSample], start_ns: int) -> dict[str, str]:
    """``jobs_in_range`` from newest samples already read (the dashboard keeps them cached)."""
    return {s.uuid: s.job_id for s in latest if s.job_id and s.time_ns >= start_ns}


def read_analysis_input(
    store: Store, start_ns: int, end_ns: int, *, step_s: int | None = None
) -> AnalysisInput:
    """The rows, job mapping and read step of ``[start_ns, end_ns)``; ``step_s`` defaults to
    ``analysis_step_s`` of the range."""
    if step_s is None:
        step_s = analysis_step_s((end_ns - start_ns) / 1e9)
    frame = store.series(start_ns, end_ns, ANALYSIS_FIELDS, step_s=step_s)
    return AnalysisInput(frame, jobs_in_range(store, start_ns), step_s)
