"""Figures settled to 10 significant digits (``gpuwatt.precision``) before they are rounded for
display or compared with a threshold: the stores' precisions (float64; VictoriaMetrics' ~12
digits) then give the same digits, and the same alerts."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatt.alerts.evaluate import _holding
from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.figures.base import json_floats
from gpuwatt.precision import fixed, settled, settled_array

# a display tie computed in float64 (the embedded store) and the same one written with 12
# significant digits and read back (VictoriaMetrics): one unit apart once rounded to 2 decimals
FLOAT64_TIE = 54.61499999999999
TWELVE_DIGITS_TIE = float(f"{FLOAT64_TIE:.12g}")


def test_a_tie_from_two_stores_is_shown_and_drawn_alike() -> None:
    assert TWELVE_DIGITS_TIE != FLOAT64_TIE
    assert f"{FLOAT64_TIE:.2f}" != f"{TWELVE_DIGITS_TIE:.2f}"  # what the pages showed
    assert settled(FLOAT64_TIE) == settled(TWELVE_DIGITS_TIE) == 54.615
    assert fixed(FLOAT64_TIE, 2) == fixed(TWELVE_DIGITS_TIE, 2)
    assert fmt.plain(FLOAT64_TIE, 4) == fmt.plain(TWELVE_DIGITS_TIE, 4)
    assert json_floats(np.array([FLOAT64_TIE]), 2) == json_floats(np.array([TWELVE_DIGITS_TIE]), 2)


def test_a_value_at_a_threshold_breaches_it_alike_on_every_store() -> None:
    """5 % utilisation as a float64 mean (4.999999999999999) and as 12 digits (5.0): "below 5"
    holds for neither."""
    low = 4.999999999999999
    assert low < 5.0 and float(f"{low:.12g}") == 5.0
    assert _holding(low, "<", 5.0, None) == _holding(5.0, "<", 5.0, None) == (False, False)
    assert _holding(4.99, "<", 5.0, None) == (True, True)


def test_missing_and_special_values_pass_through() -> None:
    assert math.isnan(settled(float("nan")))
    assert settled(float("inf")) == float("inf") and settled(-0.0) == 0.0
    out = settled_array(np.array([np.nan, np.inf, -np.inf, 0.0, 1.5]))
    assert np.isnan(out[0]) and out[1:].tolist() == [np.inf, -np.inf, 0.0, 1.5]
    assert settled_array(np.zeros(0)).shape == (0,)
    assert settled(6.074071272774703e-282) == 6.074071272774703e-282  # no exact scale: as is
    assert settled(1.2345678901234e40) == 1.2345678901234e40


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 999_999_999),
    st.integers(-12, 12),
    st.floats(-1e-12, 1e-12),
    st.booleans(),
)
def test_a_number_of_up_to_9_digits_is_what_any_value_near_it_settles_to(
    mantissa: int, exponent: int, relative: float, negative: bool
) -> None:
    """Within 1e-12 (relative) of a number written with at most 9 significant digits (a tie a
    page rounds at, a threshold) every value settles to that number's double."""
    exact = Decimal(-mantissa if negative else mantissa).scaleb(exponent)
    target = float(exact)
    x = target * (1.0 + relative)
    assert settled(x) == target
    assert settled_array(np.array([x, target])).tolist() == [target, target]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), max_size=20))
def test_arrays_and_single_numbers_settle_alike_within_10_digits(values: list[float]) -> None:
    out = settled_array(np.array(values, dtype=np.float64))
    assert out.tolist() == [settled(v) for v in values]
    for v, s in zip(values, out.tolist(), strict=True):
        if 1e-12 < abs(v) < 1e30:  # the magnitudes figures have
            assert abs(s - v) <= 5e-10 * abs(v) * (1 + 1e-9)  # 10 significant digits
            assert settled(s) == s  # settled once is settled
