"""Writing spooled lines to a store so that one bad line never holds back the lines behind it.

``deliver_lines`` writes a batch; when the store refuses the batch's *data* (a line it cannot
parse, a field type it rejects), it splits the batch in halves and writes each, down to the
single lines that are refused, which it returns with the reason. Stores are idempotent, so lines
written twice on the way store once. A store that is down, and one that refuses who we are or
does not know the database (HTTP 401, 403, 404: an expired token, a bucket not created yet), is
an outage: ``StoreUnavailable`` goes up, the batch stays in the spool, and it is retried with
back-off. Only the data itself is ever set aside (``SetAside``), in a bounded folder, with its
reason, where ``gpuwatt spool replay`` picks it up again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatt.errors import StoreUnavailable
from gpuwatt.private_files import private_dir
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
    try:
        store.write_lines(lines)
        return Outcome(len(lines))
    except StoreUnavailable:
        raise
    except StoreRejected as exc:
        if exc.status in OUTAGE_STATUSES:
            raise StoreRefusesUs(str(exc)) from exc
        error: Exception = exc
    except Exception as exc:
        error = exc
    if len(lines) == 1:
        return Outcome(0, [(lines[0], f"{type(error).__name__}: {error}"[:500])])
    mid = len(lines) // 2
    first = deliver_lines(store, lines[:mid])
    second = deliver_lines(store, lines[mid:])
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
