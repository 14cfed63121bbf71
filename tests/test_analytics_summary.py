"""analyze() as a whole: purity, range, empty input, text rendering."""

from __future__ import annotations

import pandas as pd
from test_analytics_support import NS, T0_NS, cluster_frame, straggle

from gpuwatt.analytics import analyze, find_stragglers_in, render_text


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


def test_stragglers_alone_are_those_of_the_whole_analysis() -> None:
    f = _frame()
    for kwargs in (
        {"now_ns": T0_NS + 900 * NS},
        {"now_ns": T0_NS + 900 * NS, "start_ns": T0_NS + 300 * NS, "window_s": 120.0},
        {"now_ns": T0_NS + 900 * NS, "job": "train", "jobs": {"GPU-00-02": "other"}},
    ):
        whole = analyze(f, **kwargs)
        alone = find_stragglers_in(f, **kwargs)
        assert alone.stragglers == whole.stragglers
        pd.testing.assert_frame_equal(alone.straggler_windows, whole.straggler_windows)
    assert [s.uuid for s in find_stragglers_in(f, now_ns=T0_NS + 900 * NS).stragglers] == [
        "GPU-00-02"
    ]
    nothing = find_stragglers_in(f, now_ns=T0_NS)
    assert nothing.stragglers == [] and nothing.straggler_windows.empty


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


def test_a_range_where_every_gpu_was_lost_gives_the_empty_summary() -> None:
    f = _frame()
    f["lost"] = True
    s = analyze(f, now_ns=T0_NS + 900 * NS)
    assert s.windows == [] and s.stragglers == [] and s.energy_by_gpu.empty
    assert "every GPU was lost" in render_text(s)


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


def test_per_gpu_identity_is_groupby_last() -> None:
    """The per-GPU identity and job are each column's newest non-missing value, exactly as
    ``groupby.last()`` gives them: a missing newest value, a column missing throughout for one
    GPU (str: NaN; object: None), and GPU codes with gaps."""
    import numpy as np

    from gpuwatt.analytics.group_figures import per_gpu_figures

    codes = np.array([0, 2, 5, 0, 2, 5, 0, 2, 5])  # by window, then GPU
    gw = pd.DataFrame(
        {
            "window_start_ns": np.repeat([0, 60, 120], 3),
            "gpu_code": codes,
            "gpu": pd.array(["a", "b", "c"] * 3, dtype="str"),
            "host": pd.array(["h0", None, "h1", "h0", None, None, "h0", None, None], dtype="str"),
            "gpu_index": [0, 1, 2] * 3,
            "uuid": pd.array(["u0", "u1", None, "u0", None, None, None, "u1", None], dtype="str"),
            "name": pd.array(["H100"] * 9, dtype="str"),
            "job_id": pd.Series(
                ["j", None, "k", None, None, None, None, None, np.nan], dtype=object
            ),
            "energy_delta_j": [1.0, np.nan, 2.0, 3.0, np.nan, 4.0, np.nan, np.nan, 5.0],
            "idle_energy_j": 0.0,
            "idle": [False, True, False] * 3,
            "power_w": [100.0, np.nan, 300.0] * 3,
            "tflops_gpm": np.nan,
        }
    )
    ident = ["gpu", "host", "gpu_index", "uuid", "name", "job_id"]
    got = per_gpu_figures(gw)
    want = gw.groupby("gpu_code", sort=True)[ident].last()
    pd.testing.assert_frame_equal(got[ident], want, check_exact=True)
    assert [type(j) for j in got["job_id"]] == [type(j) for j in want["job_id"]]
    g = gw.groupby("gpu_code", sort=True)
    pd.testing.assert_series_equal(
        got["energy_j"], g["energy_delta_j"].sum(min_count=1), check_names=False
    )
    pd.testing.assert_series_equal(got["power_mean_w"], g["power_w"].mean(), check_names=False)
    assert got["utilization_mean_pct"].isna().all()
    assert list(got["idle_windows"]) == [0, 3, 0]
