"""An inference job's requests: reported through gpuwatt.work, read back from the real job-step
store, and turned into requests, tokens and latency percentiles per job."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gpuwatt.dashboard.serving import served_by_job
from gpuwatt.store.job_steps import SqliteJobStepStore
from gpuwatt.work import WorkReporter

NS = 1_000_000_000
T0 = 1_767_225_600 * NS


def test_requests_reported_come_back_as_served_work(tmp_path: Path) -> None:
    db = tmp_path / "steps.db"
    clock = iter(range(T0, T0 + 10_000 * NS, NS))
    latencies = [0.2 + 0.01 * i for i in range(100)]
    with WorkReporter(
        "chat", rank=3, store=SqliteJobStepStore(db), clock_ns=lambda: next(clock), environ={}
    ) as r:
        for i, lat in enumerate(latencies):
            r.request(lat, tokens=100 + i)
        r.request(float("nan"), tokens=5)  # not a latency: not recorded
        assert r.flush(30)
    with WorkReporter(
        "train", store=SqliteJobStepStore(db), model_flops_per_step=1e15, environ={},
        clock_ns=lambda: next(clock),
    ) as t:  # fmt: skip
        t.step(1.0, tokens_per_step=4096)
        assert t.flush(30)
    steps = SqliteJobStepStore(db).job_steps(T0, T0 + 10_000 * NS)
    served = served_by_job(steps)
    assert set(served) == {"chat"}  # a training job reporting tokens is not a serving job
    s = served["chat"]
    assert s.requests == 100
    assert s.tokens == sum(100 + i for i in range(100))
    assert math.isclose(s.latency_p50_s, float(np.percentile(latencies, 50)))
    assert math.isclose(s.latency_p99_s, float(np.percentile(latencies, 99)))
    assert math.isclose(s.per_thousand_requests(50.0), 500.0)
    assert math.isclose(s.per_million_tokens(s.tokens), 1e6)


def test_a_request_written_twice_counts_once(tmp_path: Path) -> None:
    steps = SqliteJobStepStore(tmp_path / "s.db")
    with WorkReporter("chat", store=steps, clock_ns=lambda: T0, environ={}) as r:
        r.request(0.5, tokens=10)
        assert r.flush(30)
    frame = SqliteJobStepStore(tmp_path / "s.db").job_steps(T0, T0 + NS)
    import pandas as pd

    doubled = pd.concat([frame, frame], ignore_index=True)
    assert served_by_job(doubled)["chat"].requests == 1
