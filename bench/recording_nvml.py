"""The fake NVML with its ``nvml*`` calls logged, so that the same calls can be replayed against
the fake alone: what the fake itself costs is then taken out of a collector's figure
(``collector_cost.py``, ``collector_process.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pynvml

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class RecordingNvml:
    """The fake, with every ``nvml*`` call the sampler makes logged (function, args, kwargs) while
    ``log`` is not None, so that the same calls can be replayed against the fake alone."""

    def __init__(self, fake: Any) -> None:
        self._fake = fake
        self.log: list[Call] | None = None

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fake, name)
        if not name.startswith("nvml") or not callable(value) or isinstance(value, type):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.log is not None:
                self.log.append((value, args, kwargs))
            return value(*args, **kwargs)

        return call

    def fake_share_s(self, tick: Callable[[], object]) -> float:
        """CPU seconds the fake itself spent in the NVML calls ``tick()`` made (``tick`` is not
        timed): the calls replayed against the fake, less the same replay against a do-nothing
        function (the loop and the call, which the caller's own call sites also pay)."""
        self.log = []
        tick()
        log, self.log = self.log, None
        return _replay_s(log) - _replay_s([(_noop, a, k) for _fn, a, k in log])


def _replay_s(log: list[Call]) -> float:
    clock = time.process_time
    t0 = clock()
    for fn, args, kwargs in log:
        with suppress(pynvml.NVMLError):
            fn(*args, **kwargs)
    return clock() - t0


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None
