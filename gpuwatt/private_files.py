"""Files that hold data or state are the owner's alone: 0600 files in 0700 directories.

Samples name hosts, jobs and users' processes; the alert database holds who silenced what. They
are created private whatever the process umask, and a directory gpuwatt creates is 0700 (one that
already exists is left as the operator set it). SQLite creates a database's ``-wal`` and ``-shm``
files with the database file's own permissions, so creating the main file 0600 covers them.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (and missing parents) 0700 where it does not exist yet."""
    p = Path(path)
    missing = [d for d in (p, *p.parents) if not d.exists()]
    for d in reversed(missing):
        d.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask
    return p


def private_file(path: str | Path) -> Path:
    """Create ``path`` empty and 0600 if it does not exist (its directory 0700 if created)."""
    p = Path(path)
    private_dir(p.parent)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    os.close(fd)
    return p
