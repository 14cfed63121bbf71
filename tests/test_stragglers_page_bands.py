"""The stragglers page's peer bands (``pages.stragglers.peer_bands``): per signal, the
straggler's own values and its peer group's median, p10 and p90 in each window, its own rows
and other peer groups left out, for random windows, groups and gaps."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuwatt.dashboard.pages.stragglers import SIGNALS, peer_bands

W_NS = 60_000_000_000


def _windows(seed: int, n_gpus: int, n_windows: int, present: float) -> pd.DataFrame:
    """Per (window, GPU) rows of two peer groups; each row kept with probability ``present``,
    values random (NaN now and then)."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in range(n_windows):
        for g in range(n_gpus):
            if rng.random() > present:
                continue
            row: dict[str, Any] = {
                "window_start_ns": w * W_NS,
                "uuid": f"GPU-{g}",
                "peer_group": "job:a" if g % 3 else "job:b",
            }
            for m in SIGNALS:
                row[m] = float("nan") if rng.random() < 0.1 else float(rng.normal(100, 20))
            rows.append(row)
    return pd.DataFrame(rows)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_gpus=st.integers(2, 12),
    n_windows=st.integers(1, 8),
    present=st.floats(0.3, 1.0),
)
def test_bands_are_each_windows_own_value_and_peer_quantiles(
    seed: int, n_gpus: int, n_windows: int, present: float
) -> None:
    sw = _windows(seed, n_gpus, n_windows, present)
    assume(len(sw) > 0)
    mine = sw.iloc[len(sw) // 2]
    s: Any = SimpleNamespace(peer_group=mine["peer_group"], uuid=mine["uuid"])
    bands = peer_bands(sw, s, list(SIGNALS))
    assert list(bands) == list(SIGNALS)
    group = sw[sw["peer_group"] == s.peer_group]
    for metric, (x, own, med, lo, hi) in bands.items():
        assert list(x) == sorted(group["window_start_ns"].unique())  # every window of the group
        for i, w in enumerate(x):
            at = group[group["window_start_ns"] == w]
            own_rows = at.loc[at["uuid"] == s.uuid, metric].to_numpy(dtype=float)
            peers = at.loc[at["uuid"] != s.uuid, metric].dropna().to_numpy(dtype=float)
            np.testing.assert_equal(own[i], own_rows[0] if len(own_rows) else np.nan)
            want = (np.median(peers), *np.quantile(peers, [0.1, 0.9])) if len(peers) else (
                np.nan, np.nan, np.nan)  # fmt: skip
            np.testing.assert_allclose([med[i], lo[i], hi[i]], want, rtol=1e-12)


def test_a_signal_missing_from_the_windows_is_not_asked_for() -> None:
    sw = _windows(7, 6, 4, 1.0).drop(columns=["power_w"])
    s: Any = SimpleNamespace(peer_group="job:a", uuid="GPU-1")
    present = [m for m in SIGNALS if m in sw.columns]
    assert list(peer_bands(sw, s, present)) == present
