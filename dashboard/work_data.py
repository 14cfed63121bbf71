"""Application-reported work (job steps) for the dashboard's jobs page, cached per range.

The job steps live in their own store (``gpuwatt.store.job_steps``) beside the samples; the
dashboard reads them only when one is given to ``create_app(job_steps=...)``, and turns them into
reported TFLOPS and MFU per job with the analytics engine's ``reported_work`` over the same
windows as the rest of the view, and an inference job's reported requests into what it served
(``dashboard.serving``). A failing read is logged as one line and shows as "not
reported": the job table must not disappear because the job-step store is down.
"""

from __future__ import annotations

import logging
import threading
import time

from gpuwatt.analytics import JobWork
from gpuwatt.analytics.reported import reported_work
from gpuwatt.dashboard.serving import Served, served_by_job
from gpuwatt.dashboard.window_data import WindowData
from gpuwatt.store.job_steps import JobStepStore

log = logging.getLogger("gpuwatt.dashboard")


class JobWorkSource:
    def __init__(
        self, store: JobStepStore, *, tensor_precision: str = "bf16", ttl_s: float = 10.0
    ) -> None:
        self.store = store
        self.tensor_precision = tensor_precision
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cache: dict[
            tuple[int, int, float], tuple[float, list[JobWork], dict[str, Served]]
        ] = {}

    def work(self, win: WindowData) -> list[JobWork]:
        """Reported TFLOPS and MFU per job that reports steps."""
        return self._read(win)[0]

    def served(self, win: WindowData) -> dict[str, Served]:
        """Requests, tokens and latency per inference job that reports its requests."""
        return self._read(win)[1]

    def _read(self, win: WindowData) -> tuple[list[JobWork], dict[str, Served]]:
        s = win.summary
        key = (s.start_ns, s.now_ns, s.window_s)
        with self._lock:
            hit = self._cache.get(key)
            # a live view's results are its own (its end is in the key; computed again, a view
            # has a new end): kept while it is served, so a visitor of a served view does not
            # wait for them (~0.4 s in the demo) every ``ttl_s``; a fixed range's, ``ttl_s``
            # (steps reported late)
            if hit is not None and (win.range.live or time.monotonic() - hit[0] < self.ttl_s):
                return hit[1], hit[2]
        try:
            steps = self.store.job_steps(s.start_ns, s.now_ns)
            _, out = reported_work(
                steps,
                s.gpu_windows,
                window_s=s.window_s,
                tensor_precision=self.tensor_precision,
                start_ns=s.start_ns,
                now_ns=s.now_ns,
            )
            served = served_by_job(steps)
        except Exception as exc:  # the job table stays; reported work shows as absent
            log.warning("job steps not read: %s: %s", type(exc).__name__, str(exc)[:200])
            return [], {}
        with self._lock:
            if len(self._cache) > 16:
                self._cache.clear()
            self._cache[key] = (time.monotonic(), out, served)
        return out, served
