"""Writing spooled points to a store so that one bad point never holds back those behind it.

``deliver_lines`` writes a batch of lines (``deliver_samples`` a batch of samples, from a binary
spool); when the store refuses the batch's *data* (a line it cannot parse, a field type it
rejects), it splits the batch in halves and writes each, down to the single points that are
refused, which it returns with the reason (a refused sample as its line). Stores are idempotent,
so points written twice on the way store once. A store that is down, and one that refuses who we
are or does not know the database (HTTP 401, 403, 404: an expired token, a bucket not created
yet), is an outage: ``StoreUnavailable`` goes up, the batch stays in the spool, and it is retried
with back-off. Only the data itself is ever set aside (``SetAside``), in a bounded folder, with
its reason, where ``gpuwatt spool replay`` picks it up again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpuwatt.errors import StoreUnavailable
from gpuwatt.line_protocol import LineEncoder
from gpuwatt.model import GpuSample
from gpuwatt.private_files import private_dir
from gpuwatt.sample_rows import SampleRows
from gpuwatt.store import StoreRejected
from gpuwatt.store.base import Store

log = logging.getLogger(__name__)

#: HTTP statuses that say "not you, not now" rather than "not this data".
OUTAGE_STATUSES = frozenset({401, 403, 404})


class StoreRefusesUs(StoreUnavailable):
    """The store refused our credentials or does not know the database: retried like an outage,
    and said loudly (an operator has to act)."""


@dataclass
class Outcome:
    delivered: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)  # (line, reason)


def deliver_lines(store: Store, lines: Sequence[str]) -> Outcome:
    """Write ``lines``; refused lines come back with their reason. Raises ``StoreUnavailable``
    (or ``StoreRefusesUs``) when nothing can be written now."""
    return _deliver(store.write_lines, lines, lambda line: line)


def deliver_samples(store: Store, samples: Sequence[GpuSample]) -> Outcome:
    """``deliver_lines`` for samples (``store.write_samples``); a refused sample comes back as
    its line, to be set aside and replayed like any refused line."""
    return _deliver(store.write_samples, samples, LineEncoder().encode)


def deliver_rows(store: Store, rows: SampleRows) -> Outcome:
    """``deliver_samples`` for samples decoded as rows, written by the store's ``write_rows``
    (a spool replay into the embedded store). Where the store refuses the batch, it is written
    again as samples (``deliver_samples``), which finds the samples refused and why."""
    write_rows = getattr(store, "write_rows", None)
    if write_rows is not None:
        try:
            write_rows(rows)
            return Outcome(len(rows))
        except StoreUnavailable:
            raise
        except Exception:  # the samples' write says which samples, and why
            log.debug("store refused a batch of %d rows; writing them as samples", len(rows))
    return deliver_samples(store, rows.samples())


_Point = TypeVar("_Point")


def _deliver(
    write: Callable[[Sequence[_Point]], None],
    points: Sequence[_Point],
    as_line: Callable[[_Point], str],
) -> Outcome:
    try:
        write(points)
        return Outcome(len(points))
    except StoreUnavailable:
        raise
    except StoreRejected as exc:
        if exc.status in OUTAGE_STATUSES:
            raise StoreRefusesUs(str(exc)) from exc
        error: Exception = exc
    except Exception as exc:
        error = exc
    if len(points) == 1:
        return Outcome(0, [(as_line(points[0]), f"{type(error).__name__}: {error}"[:500])])
    mid = len(points) // 2
    first = _deliver(write, points[:mid], as_line)
    second = _deliver(write, points[mid:], as_line)
    return Outcome(first.delivered + second.delivered, first.refused + second.refused)


class SetAside:
    """Refused lines on disk, ``<seq>.lp`` files of ``# reason`` comments and lines, oldest first,
    within ``max_bytes`` (past it the oldest files go, counted and logged)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.dropped_lines = 0

    def files(self) -> list[Path]:
        if not self.directory.exists():
            return []
        return sorted(self.directory.glob("*.lp"))

    def add(self, refused: Sequence[tuple[str, str]], name: str) -> Path:
        private_dir(self.directory)
        path = self.directory / f"{name}.lp"
        text = "".join(f"# {reason}\n{line}\n" for line, reason in refused)
        with path.open("a", encoding="utf-8") as f:
            f.write(text)
        path.chmod(0o600)
        self._enforce_bound()
        return path

    def lines(self, path: Path) -> list[tuple[str, str]]:
        """(line, reason) pairs of a file."""
        out, reason = [], ""
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.startswith("# "):
                reason = raw[2:]
            elif raw.strip():
                out.append((raw, reason))
        return out

    def pending_lines(self) -> int:
        return sum(len(self.lines(p)) for p in self.files())

    def _enforce_bound(self) -> None:
        files = self.files()
        total = sum(p.stat().st_size for p in files)
        while total > self.max_bytes and len(files) > 1:
            oldest = files.pop(0)
            lost = len(self.lines(oldest))
            total -= oldest.stat().st_size
            oldest.unlink()
            self.dropped_lines += lost
            log.error(
                "set-aside samples over their bound of %d bytes: dropped %d oldest refused "
                "samples (%s)",
                self.max_bytes,
                lost,
                oldest.name,
            )

    def replay(self, store: Store) -> tuple[int, int]:
        """Write every set-aside line again; keep only those refused again. (delivered, kept)."""
        delivered = kept = 0
        for path in self.files():
            pairs = self.lines(path)
            outcome = deliver_lines(store, [line for line, _ in pairs])
            delivered += outcome.delivered
            kept += len(outcome.refused)
            if outcome.refused:
                path.write_text(
                    "".join(f"# {reason}\n{line}\n" for line, reason in outcome.refused),
                    encoding="utf-8",
                )
            else:
                path.unlink()
        return delivered, kept
