"""The energy accumulator alone, without NVML: counter resets, fallback to integrated power."""

from __future__ import annotations

import pytest

from gpuwatt.collector.energy import EnergyAccumulator
from gpuwatt.model import EnergyMethod


def test_counter_readings_are_the_energy_and_say_counter() -> None:
    acc = EnergyAccumulator()
    assert acc.method is EnergyMethod.COUNTER
    assert [acc.from_counter(j) for j in (100.0, 150.0, 150.0, 400.0)] == [100, 150, 150, 400]
    assert acc.method is EnergyMethod.COUNTER


def test_a_counter_reset_keeps_what_was_counted_and_is_told() -> None:
    resets: list[tuple[float, float]] = []
    acc = EnergyAccumulator(on_reset=lambda last_j, new_j: resets.append((last_j, new_j)))
    acc.from_counter(100.0)
    acc.from_counter(150.0)
    assert acc.from_counter(20.0) == 170.0  # restarted from 0 and counted 20 J since
    assert acc.from_counter(50.0) == 200.0
    assert acc.from_counter(5.0) == 205.0  # a second reset
    assert resets == [(150.0, 20.0), (50.0, 5.0)]


def test_a_counter_going_backwards_never_makes_energy_decrease() -> None:
    acc = EnergyAccumulator()
    readings = [1000.0, 999.5, 1200.0, 0.0, 0.0, 10.0]
    energies = [acc.from_counter(j) for j in readings]
    assert energies == sorted(energies)
    assert energies[-1] == 1000.0 + 1200.0 + 10.0


def test_after_the_counter_is_refused_power_is_integrated_from_its_total() -> None:
    acc = EnergyAccumulator()
    acc.from_counter(80.0)
    acc.from_counter(20.0)  # a reset: 100 J counted so far
    acc.counter_refused()
    assert acc.method is EnergyMethod.INTEGRATED
    assert acc.from_power(10.0, 50.0) == 100.0  # the first power reading: no interval yet
    assert acc.from_power(12.0, 50.0) == 200.0  # 2 s at 50 W
    assert acc.from_power(13.0, 150.0) == 300.0  # trapezoid: 1 s at (50 + 150) / 2 W


def test_a_gap_without_power_is_not_integrated() -> None:
    acc = EnergyAccumulator()
    acc.counter_refused()
    assert acc.from_power(0.0, 100.0) == 0.0
    assert acc.from_power(1.0, 100.0) == 100.0
    assert acc.from_power(2.0, None) is None
    assert acc.from_power(30.0, 100.0) == 100.0  # nothing invented for the 28 s unknown
    assert acc.from_power(31.0, 300.0) == 300.0
    assert acc.from_power(31.0, 300.0) == 300.0  # no time passed: nothing added


def test_without_a_counter_integration_starts_at_zero() -> None:
    acc = EnergyAccumulator()
    assert acc.from_power(5.0, 200.0) == 0.0  # never had a counter: integrates on its own
    assert acc.method is EnergyMethod.INTEGRATED
    assert acc.from_power(5.5, 200.0) == pytest.approx(100.0)


def test_refusing_the_counter_twice_changes_nothing() -> None:
    acc = EnergyAccumulator()
    acc.from_counter(42.0)
    acc.counter_refused()
    acc.from_power(0.0, 10.0)
    acc.from_power(1.0, 10.0)
    acc.counter_refused()
    assert acc.from_power(2.0, 10.0) == 62.0
