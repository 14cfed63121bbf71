"""A GPU process's user from a real proc_root directory owned by this test's uid."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from gpuwatt.collector.process_owner import process_user


def test_the_owner_of_the_pid_directory_is_the_user(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    assert process_user(tmp_path, 4242) == pwd.getpwuid(os.getuid()).pw_name


def test_a_process_that_is_gone_has_no_user(tmp_path: Path) -> None:
    assert process_user(tmp_path, 4243) is None
