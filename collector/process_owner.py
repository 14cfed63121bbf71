"""The user a GPU process runs as, read from the host's ``/proc`` (the collector's proc_root).
``collector.jobs.JobAttributingSource`` fills it in for every sample of the real collector."""

from __future__ import annotations

import os
import pwd
from pathlib import Path


def process_user(proc_root: str | Path, pid: int) -> str | None:
    """The login name owning ``<proc_root>/<pid>``; its numeric uid as a string where the
    collector's passwd has no such user (a container); None when the process is gone."""
    try:
        uid = os.stat(Path(proc_root) / str(pid)).st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
