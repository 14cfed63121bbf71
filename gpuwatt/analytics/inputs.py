"""The analysis input of a range, built one way for every reader (docs/accounting.md, "One
computation"): the CLI's ``analyze``, the dashboard's data layer, the CSV reports and the alert
evaluator read the same rows at the same level and attribute the same jobs. The one module of
``gpuwatt.analytics`` that reads: through the store it is given, never a clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.analytics.stragglers import StragglerConfig
from gpuwatt.analytics.summary import ANALYSIS_FIELDS
from gpuwatt.model import EnergyMethod, GpuSample, GpuSeen
from gpuwatt.store.base import SeriesRead, Store, series_many

#: Ranges at least this long are read from 1-minute rollups (fast at 1,000 GPUs); shorter
#: ones from raw samples. Either gives the same figures (docs/accounting.md, rule 1).
ROLLUP_FROM_S = 1800


@dataclass(frozen=True, slots=True)
class AnalysisInput:
    #: rows of the range and, before ``start_ns``, the context rows (``context_reads``)
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


def jobs_of(latest: Sequence[GpuSample | GpuSeen], start_ns: int) -> dict[str, str]:
    """``jobs_in_range`` from newest samples (or the GPUs seen) already read (the dashboard
    keeps them cached)."""
    return {s.uuid: s.job_id for s in latest if s.job_id and s.time_ns >= start_ns}


def integrated_of(latest: Sequence[GpuSample | GpuSeen]) -> frozenset[str]:
    """The GPUs (uuids) whose newest sample says the collector integrated their power into
    ``energy_j`` (no NVML energy counter: pre-Volta GPUs)."""
    return frozenset(s.uuid for s in latest if s.energy_method is EnergyMethod.INTEGRATED)


def with_energy_methods(frame: pd.DataFrame, integrated: frozenset[str]) -> pd.DataFrame:
    """``frame`` with the rows of the GPUs ``integrated`` marked so (``energy_method``): their
    ``energy_j`` is power the collector integrated, which the analysis labels as such, not as
    a counter's measurement. A store's series carry no method (a bucket has none): it is the
    GPU's, from its newest sample, as its job is. No column where no GPU is integrated."""
    if not integrated or frame.empty:
        return frame
    marked = frame["uuid"].isin(integrated).to_numpy()
    if not marked.any():
        return frame
    method = np.full(len(frame), None, dtype=object)
    method[marked] = EnergyMethod.INTEGRATED.value
    return frame.assign(energy_method=method)


def context_s(window_s: float = 60.0) -> float:
    """How far before a range the reader looks: the straggler persistence (``persist_of``
    windows), so a straggler found at the range's start keeps its onset, and the newest row
    of each GPU, whose counter value starts the range's energy (docs/accounting.md)."""
    return StragglerConfig().window_n * window_s


def context_reads(
    start_ns: int, end_ns: int, step_s: int | None, window_s: float = 60.0
) -> list[SeriesRead]:
    """The two reads of an analysis input: the context before ``start_ns``, then the range."""
    before_ns = start_ns - round(context_s(window_s) * 1e9)
    return [
        SeriesRead(before_ns, start_ns, ANALYSIS_FIELDS, step_s),
        SeriesRead(start_ns, end_ns, ANALYSIS_FIELDS, step_s),
    ]


def joined(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The context and range frames as one (context rows first)."""
    frames = [f for f in frames if len(f)] or list(frames[-1:])
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def read_analysis_input(
    store: Store,
    start_ns: int,
    end_ns: int,
    *,
    step_s: int | None = None,
    window_s: float = 60.0,
) -> AnalysisInput:
    """The rows, job mapping and read step of ``[start_ns, end_ns)``; ``step_s`` defaults to
    ``analysis_step_s`` of the range. The frame also holds the context rows before
    ``start_ns`` (``analyze`` counts them in nothing)."""
    if step_s is None:
        step_s = analysis_step_s((end_ns - start_ns) / 1e9)
    frames = series_many(store, context_reads(start_ns, end_ns, step_s, window_s))
    latest = store.latest(since_ns=start_ns)
    frame = with_energy_methods(joined(frames), integrated_of(latest))
    return AnalysisInput(frame, jobs_of(latest, start_ns), step_s)
