"""analyze() as a whole: purity, range, empty input, text rendering."""

from __future__ import annotations

import pandas as pd
from test_analytics_support import NS, T0_NS, cluster_frame, straggle

from gpuwatt.analytics import analyze, render_text


def _frame() -> pd.DataFrame:
    jobs = ["train"] * 7 + [None]
    f = cluster_frame(jobs=jobs, duration_s=900, util_pct=[95] * 6 + [0, 0])
    return straggle(f, "GPU-00-02", onset_s=200, clock_mhz=1400, reasons=0x48, temperature_c=91)


def test_time_comes_in_as_an_argument() -> None:
    f = _frame()
    early = analyze(f, now_ns=T0_NS + 300 * NS)
    late = analyze(f, now_ns=T0_NS + 900 * NS)
    assert early.stragglers == []  # at 300 s the fault is only 100 s old
    assert len(late.stragglers) == 1
    assert late.windows[-1] == T0_NS + 840 * NS
    assert early.windows[-1] == T0_NS + 240 * NS


def test_same_input_same_output() -> None:
    f = _frame()
    a = analyze(f, now_ns=T0_NS + 900 * NS)
    b = analyze(f, now_ns=T0_NS + 900 * NS)
    assert a.stragglers == b.stragglers
    pd.testing.assert_frame_equal(a.energy_by_gpu, b.energy_by_gpu)


def test_input_frame_is_not_modified() -> None:
    f = _frame()
    before = f.copy()
    analyze(f, now_ns=T0_NS + 900 * NS)
    pd.testing.assert_frame_equal(f, before)


def test_empty_frame() -> None:
    s = analyze(_frame(), now_ns=T0_NS)  # nothing before now
    assert s.windows == [] and s.stragglers == [] and s.idle == []
    assert "no samples" in render_text(s)


def test_render_text_names_straggler_and_idle_gpu() -> None:
    s = analyze(_frame(), now_ns=T0_NS + 900 * NS, price_per_kwh=0.3, currency="EUR")
    text = render_text(s)
    assert "STRAGGLERS (1 active" in text
    assert "GPU 2 on node-0 runs at 1400 MHz" in text
    assert "IDLE GPUS (1 allocated to a job, 1 without a job)" in text
    assert "GPU 2 on node-1 is allocated to job train" in text
    assert "EUR" in text
    assert "LOAD BALANCE" in text and "cv" in text


def test_lost_gpu_rows_are_ignored() -> None:
    f = _frame()
    f["lost"] = False
    f.loc[f["uuid"] == "GPU-01-03", "lost"] = True
    s = analyze(f, now_ns=T0_NS + 900 * NS)
    assert "GPU-01-03" not in set(s.energy_by_gpu["uuid"])


def test_prepared_codes_match_factorizing_the_labels() -> None:
    """``prepare``'s host and job codes give what factorizing the strings gives, including a
    job filter, rows without a job, and a frame that never went through ``prepare``."""
    import numpy as np

    from gpuwatt.analytics.windows import label_codes, prepare

    frame = cluster_frame()
    hosts = sorted(frame["host"].unique())
    jobs = {
        u: ("b-job" if h == hosts[0] else "a-job")
        for u, h in zip(frame["uuid"], frame["host"], strict=True)
    }
    jobs.pop(frame["uuid"].iloc[-1])  # one GPU without a job
    now = int(frame["time_ns"].max()) + NS
    for kwargs in ({}, {"job": "b-job"}):
        rows = prepare(frame, now_ns=now, window_s=60.0, jobs=jobs, **kwargs)
        assert {"host_code", "job_id_code"} <= set(rows.columns)
        part = rows.iloc[::3]  # codes with gaps, as after dropping rows
        for column in ("host", "job_id"):
            codes, labels = label_codes(part, column)
            want_codes, want_labels = pd.factorize(part[column], sort=True)
            assert np.array_equal(codes, want_codes)
            assert list(labels) == list(want_labels)
            plain = part.drop(columns=[f"{column}_code"])
            codes2, labels2 = label_codes(plain, column)
            assert np.array_equal(codes2, want_codes) and list(labels2) == list(want_labels)
    assert (label_codes(rows, "job_id")[0] >= 0).all()  # the job filter keeps only its rows
    assert -1 in label_codes(prepare(frame, now_ns=now, window_s=60.0, jobs=jobs), "job_id")[0]
