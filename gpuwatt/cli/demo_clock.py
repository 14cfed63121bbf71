"""Where a demo's scenario stands, so that ``gpuwatt demo`` started again on the same store
carries the scenario on (its jobs running, its fault in force) instead of playing it again from
its start over the stored history: the training job missing, the straggler cooled and gone for
minutes.

The file, ``demo-scenario.json`` beside the demo's spool directory (0600), is JSON::

    {"version": 1, "store": "<sha-256 of the store URL, 16 hex digits>",
     "scenario": "<name>", "seed": <int>, "zero_ns": <wall time of scenario time 0, ns>}

It is written at every start. A file of another store, scenario or seed, another version, or one
that cannot be read is not used: the scenario then starts from 0, as on a first start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatt.private_files import private_file

if TYPE_CHECKING:
    from gpuwatt.collector.sim.scenario import Scenario

log = logging.getLogger("gpuwatt")
VERSION = 1
FILE_NAME = "demo-scenario.json"


def clock_path(spool_dir: Path) -> Path:
    return spool_dir.parent / FILE_NAME


def _store_key(store_url: str) -> str:
    """The store, not its URL: a URL may hold a token or a password."""
    return hashlib.sha256(store_url.encode()).hexdigest()[:16]


def scenario_time_s(path: Path, store_url: str, scenario: Scenario, at_ns: int) -> float:
    """Where the scenario stood at ``at_ns`` by the file at ``path``; 0 where the file is
    absent, unreadable or of another store, scenario or seed."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0.0
    if not isinstance(kept, dict):
        return 0.0
    same = (
        kept.get("version") == VERSION
        and kept.get("store") == _store_key(store_url)
        and kept.get("scenario") == scenario.name
        and kept.get("seed") == scenario.seed
    )
    zero_ns = kept.get("zero_ns")
    if not same or not isinstance(zero_ns, int) or isinstance(zero_ns, bool) or zero_ns > at_ns:
        return 0.0
    return (at_ns - zero_ns) / 1e9


def save(path: Path, store_url: str, scenario: Scenario, zero_ns: int) -> None:
    """Write the file (replaced whole: a demo stopped mid-write leaves the old one). One that
    cannot be written is said in the log: the demo runs on, and starts its scenario from 0
    next time."""
    try:
        _write(path, store_url, scenario, zero_ns)
    except OSError as exc:
        log.warning("where the demo's scenario stands is not kept (%s): %s", path, exc)


def _write(path: Path, store_url: str, scenario: Scenario, zero_ns: int) -> None:
    kept = {
        "version": VERSION,
        "store": _store_key(store_url),
        "scenario": scenario.name,
        "seed": scenario.seed,
        "zero_ns": int(zero_ns),
    }
    tmp = private_file(path.with_name(path.name + ".tmp"))
    tmp.write_text(json.dumps(kept) + "\n", encoding="utf-8")
    os.replace(tmp, path)
