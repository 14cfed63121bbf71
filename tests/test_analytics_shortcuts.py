"""The analysis's shortcuts give what the plain computation gives: the range's per (window, GPU)
table taken from the context's table, and label codes worked out per GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_analytics_support import A100, H100, NS, T0_NS, cluster_frame

from gpuwatt.analytics.gpu_windows import _windows_in_range, gpu_windows
from gpuwatt.analytics.windows import label_codes, model_codes, per_gpu_window, prepare


def _windows(start_ns: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per (window, GPU) table of ``gpu_windows``, and the same table aggregated anew from
    the rows it analysed."""
    frame = cluster_frame(duration_s=900, step_s=10, util_pct=[95, 95, 95, 60, 95, 95, 95, 3])
    w = gpu_windows(
        frame, now_ns=T0_NS + 900 * NS, window_s=60.0, start_ns=start_ns, jobs=None, job=None,
        tensor_precision="bf16", idle_util_pct=5.0,
    )  # fmt: skip
    assert not isinstance(w, str)
    sums, means = ("energy_delta_j", "seen_s"), ("tflops", "tflops_gpm")
    anew = per_gpu_window(w.rows(), sums=sums, means=means)
    return w.gw, anew


@pytest.mark.parametrize("start_s", [300, 330])  # on a window's start; inside a window
def test_the_ranges_table_is_the_one_aggregated_from_its_rows(start_s: int) -> None:
    gw, anew = _windows(T0_NS + start_s * NS)
    assert len(gw) == len(anew) > 0
    pd.testing.assert_frame_equal(gw[anew.columns], anew, check_exact=True)


def test_a_window_with_rows_on_both_sides_of_the_start_is_not_taken_from_the_context() -> None:
    rows = prepare(cluster_frame(duration_s=180, step_s=10), now_ns=T0_NS + 180 * NS, window_s=60.0)
    t = rows["time_ns"].to_numpy()
    assert _windows_in_range(rows, t >= T0_NS + 90 * NS) is None  # 90 s: inside a window
    inside = _windows_in_range(rows, t >= T0_NS + 60 * NS)
    assert inside is not None
    windows = per_gpu_window(rows)["window_start_ns"].to_numpy()
    assert np.array_equal(inside, windows >= T0_NS + 60 * NS)


def test_label_codes_per_gpu_are_those_of_factorizing_every_row() -> None:
    frame = pd.concat(
        [cluster_frame(duration_s=60, name=A100), cluster_frame(duration_s=60, hosts=1, seed=1)]
    )
    frame["host"] = np.where(frame["name"] == A100, frame["host"] + "-a", frame["host"])
    rows = prepare(frame, now_ns=T0_NS + 60 * NS, window_s=60.0)
    codes, labels = label_codes(rows, "name")
    want_codes, want_labels = pd.factorize(rows["name"], sort=True)
    assert list(labels) == list(want_labels) == [A100, H100]
    assert np.array_equal(codes, want_codes)
    # a GPU whose rows name two models, or none: every row factorised, as before
    rows.loc[rows.index[:3], "name"] = "renamed"
    rows.loc[rows.index[5], "name"] = np.nan
    codes, labels = label_codes(rows, "name")
    want_codes, want_labels = pd.factorize(rows["name"], sort=True)
    assert list(labels) == list(want_labels) and np.array_equal(codes, want_codes)
    assert codes[5] == -1


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from([A100, H100, "", None, np.nan, 7])),
        min_size=1,
        max_size=40,
    )
)
def test_model_codes_name_each_row_as_factorizing_every_rows_name_as_text(
    rows_of: list[tuple[int, object]],
) -> None:
    """``model_codes`` (one name per GPU where each GPU has one) gives every row the model
    name that ``pd.factorize(rows["name"].astype(str))`` gives it, and none where that does."""
    rows = pd.DataFrame(
        {
            "gpu_code": [g for g, _ in rows_of],
            "name": pd.Series([n for _, n in rows_of], dtype=object),
        }
    )
    codes, names = model_codes(rows)
    want_codes, want_names = pd.factorize(rows["name"].astype(str).to_numpy())
    named = [names[c] if c >= 0 else None for c in codes]
    assert named == [want_names[c] if c >= 0 else None for c in want_codes]
    assert sorted(names) == sorted(want_names)  # each name once
