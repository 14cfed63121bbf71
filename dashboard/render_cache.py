"""Page content kept per cached view: a served request is not drawn again.

A page whose content is a function of its view's window (``WindowData``), range step and query,
and of the job-step source's cached results where it says so (``RENDERS_FROM_WINDOW``,
``RENDERS_FROM_WORK``; ``dashboard.app.render_inputs``: balance, stragglers, efficiency; jobs and
reports), draws the same content each time the caches serve it the same objects. Drawing was most
of a served request's time at 1,024 GPUs (the balance page: ~80-110 ms of its heatmaps and per-job
grid, ``bench/served_render.py``), so the content is kept, keyed by the page, those objects and
the query, for as long as the caches serve the same objects. A refreshed window is a new object:
the warmer draws the pages visitors asked for on its range in the last 10 minutes from it as soon
as it has computed it (``app.redraw_viewed``), and any other first request draws it.

An entry holds its window weakly (an old window must not stay in memory for its drawing: at
1,024 GPUs a window is tens of MB, its drawing a few), so a window freed and another one given its
``id`` is not taken for it; the job-step source's results, which take no weak reference, are held
(they are small).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Held = Callable[[], object]
#: How many distinct (page, query) views are remembered for the warmer to draw ahead.
MAX_VIEWS = 256


def _held(x: object) -> Held:
    """``x`` weakly where it takes a weak reference (a window), else strongly."""
    try:
        return weakref.ref(x)
    except TypeError:
        return lambda: x


def _freed(held: tuple[Held, ...]) -> bool:
    return any(h() is None for h in held)


class RenderCache:
    """The newest ``max_entries`` renders (least recently used dropped first); thread-safe."""

    def __init__(self, max_entries: int = 32) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[Any, ...], tuple[tuple[Held, ...], list[Any]]]
        self._entries = OrderedDict()
        #: (page, query) -> when a visitor last asked for it (``note_view``)
        self._views: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()

    def note_view(self, page: str, query: dict[str, str]) -> None:
        """A visitor asked for ``page`` with ``query`` (not a drawing in advance). The newest
        ``MAX_VIEWS`` distinct ones are kept (any URL can make a new one)."""
        key = (page, tuple(sorted(query.items())))
        with self._lock:
            self._views.pop(key, None)
            self._views[key] = time.monotonic()
            while len(self._views) > MAX_VIEWS:
                del self._views[next(iter(self._views))]

    def viewed(self, max_age_s: float) -> list[tuple[str, dict[str, str]]]:
        """The (page, query) pairs visitors asked for in the last ``max_age_s``."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, t in self._views.items() if now - t > max_age_s]:
                del self._views[key]
            return [(page, dict(query)) for page, query in self._views]

    def get(
        self,
        page: str,
        inputs: tuple[object, ...],
        query: dict[str, str],
        render: Callable[[], list[Any]],
    ) -> list[Any]:
        """The content ``render()`` draws for ``page`` from ``inputs`` (the view's window, and
        what else the page draws from) and ``query``, rendered at most once per set of input
        objects (two requests at once may both render; one is kept)."""
        key = (page, tuple(id(x) for x in inputs), tuple(sorted(query.items())))
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and all(h() is x for h, x in zip(hit[0], inputs, strict=True)):
                self._entries.move_to_end(key)
                return hit[1]
        content = render()
        with self._lock:
            self._entries[key] = (tuple(_held(x) for x in inputs), content)
            self._entries.move_to_end(key)
            for gone in [k for k, (held, _) in self._entries.items() if _freed(held)]:
                del self._entries[gone]  # drawn from a window no longer in memory
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return content

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._views.clear()
