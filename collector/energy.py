"""One GPU's cumulative energy, from NVML's energy counter or from power integrated over time.

Pure: no NVML here. The sampler feeds it the counter's readings (``from_counter``) while the
GPU has a counter, tells it when the counter is refused for good (``counter_refused``), and from
then on feeds it power readings (``from_power``). What it returns never steps down:

- a counter reading below the previous one means the counter restarted (driver reload, GPU
  reset): what was counted before is kept as an offset;
- integration continues from what the counter had counted;
- a tick without a power reading is a gap that is not integrated (nothing is invented).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuwatt.model import EnergyMethod


class EnergyAccumulator:
    """Cumulative joules of one GPU, and the method they come from (``method``)."""

    __slots__ = (
        "_counted_j",
        "_integrated_j",
        "_last_mono_s",
        "_last_power_w",
        "_offset_j",
        "_on_reset",
    )

    def __init__(self, on_reset: Callable[[float, float], object] | None = None) -> None:
        self._on_reset = on_reset  # called (previous_j, new_j) when the counter restarts
        self._offset_j = 0.0  # what earlier runs of the counter had counted before a reset
        self._counted_j: float | None = None  # the counter's last reading
        self._integrated_j: float | None = None  # None while the counter is used
        self._last_mono_s: float | None = None
        self._last_power_w: float | None = None

    @property
    def method(self) -> EnergyMethod:
        """How the figures are obtained now."""
        return EnergyMethod.COUNTER if self._integrated_j is None else EnergyMethod.INTEGRATED

    def from_counter(self, counter_j: float) -> float:
        """The cumulative energy given the counter's reading ``counter_j``.

        A reading below the previous one is a counter reset: what was counted is kept, and
        ``on_reset(previous_j, counter_j)`` is told.
        """
        last_j = self._counted_j
        if last_j is not None and counter_j < last_j:
            self._offset_j += last_j
            if self._on_reset is not None:
                self._on_reset(last_j, counter_j)
        self._counted_j = counter_j
        return self._offset_j + counter_j

    def counter_refused(self) -> None:
        """The counter is gone for good: integrate power from here on, continuing its total."""
        if self._integrated_j is None:
            self._integrated_j = self._offset_j + (self._counted_j or 0.0)

    def from_power(self, mono_s: float, power_w: float | None) -> float | None:
        """The cumulative energy with power ``power_w`` read at monotonic time ``mono_s``.

        Trapezoids between consecutive readings; None (and a gap) without a power reading.
        """
        if self._integrated_j is None:
            self.counter_refused()
        if power_w is None:
            self._last_mono_s = None  # an unknown gap is not integrated
            return None
        total_j = self._integrated_j or 0.0
        last_s, last_w = self._last_mono_s, self._last_power_w
        if last_s is not None and last_w is not None and mono_s > last_s:
            total_j += (last_w + power_w) / 2.0 * (mono_s - last_s)
        self._integrated_j = total_j
        self._last_mono_s = mono_s
        self._last_power_w = power_w
        return total_j
