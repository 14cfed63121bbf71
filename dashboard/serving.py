"""What an inference job served (requests, tokens, latency) from its reported requests, and the
"cost per inference" figures built on it (pure; no Dash, no I/O).

A served request is reported as a job step with no model FLOPs (``gpuwatt.work.WorkReporter.
request``): a job whose steps all lack model FLOPs and carry tokens is a serving job; its steps
are its requests, their ``step_time_s`` the latencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwatt.job_step_format import (
    FIELD_MODEL_FLOPS_PER_STEP,
    FIELD_STEP_TIME_S,
    FIELD_TOKENS_PER_STEP,
)


@dataclass(frozen=True)
class Served:
    job_id: str
    requests: int
    tokens: float
    latency_p50_s: float
    latency_p95_s: float
    latency_p99_s: float

    def per_thousand_requests(self, amount: float) -> float:
        """``amount`` (energy, cost) over the range per 1,000 requests; NaN without requests."""
        return amount / self.requests * 1000.0 if self.requests else math.nan

    def per_million_tokens(self, amount: float) -> float:
        return amount / self.tokens * 1e6 if self.tokens > 0 else math.nan


def served_by_job(steps: pd.DataFrame) -> dict[str, Served]:
    """Per serving job, what it served in the steps given (already restricted to the range).

    A request reported twice (same job, rank and time) counts once."""
    if steps is None or steps.empty:
        return {}
    cols = ["time_ns", "job_id", "rank"]
    ds = steps.drop_duplicates(cols)
    out: dict[str, Served] = {}
    for job, part in ds.groupby("job_id", sort=True):
        flops = part[FIELD_MODEL_FLOPS_PER_STEP].to_numpy(dtype=float)
        tokens = part[FIELD_TOKENS_PER_STEP].to_numpy(dtype=float)
        if np.isfinite(flops).any() or not np.isfinite(tokens).any():
            continue  # a training job (or one reporting neither)
        lat = part[FIELD_STEP_TIME_S].to_numpy(dtype=float)
        lat = lat[np.isfinite(lat)]
        p50, p95, p99 = (
            (float(v) for v in np.percentile(lat, [50, 95, 99])) if lat.size else (math.nan,) * 3
        )
        out[str(job)] = Served(str(job), len(part), float(np.nansum(tokens)), p50, p95, p99)
    return out
