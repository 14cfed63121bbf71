"""A GPU process's user: read from a real proc_root owned by this test's uid, and carried
in the line protocol's processes field."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from gpuwatt.collector.process_owner import process_user
from gpuwatt.line_protocol import format_processes, parse_processes
from gpuwatt.model import ProcessSample


def test_the_owner_of_the_pid_directory_is_the_user(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    assert process_user(tmp_path, 4242) == pwd.getpwuid(os.getuid()).pw_name


def test_a_process_that_is_gone_has_no_user(tmp_path: Path) -> None:
    assert process_user(tmp_path, 4243) is None


def test_processes_with_users_round_trip_and_old_strings_still_parse() -> None:
    procs = (
        ProcessSample(1, 2048, "alice"),
        ProcessSample(2, None, "we:ird;name %"),
        ProcessSample(3, 5, None),
    )
    assert parse_processes(format_processes(procs)) == procs
    assert parse_processes("7:100;8:") == (ProcessSample(7, 100), ProcessSample(8, None))


def test_the_node_page_processes_table_shows_the_user(make_sample) -> None:
    import json

    import plotly.utils

    from gpuwatt.dashboard.pages.node import processes_table

    sample = make_sample(
        1_700_000_000 * 10**9, "node1", 0, processes=(ProcessSample(4242, 2**30, "alice"),)
    )
    text = json.dumps(processes_table([sample], None), cls=plotly.utils.PlotlyJSONEncoder)
    assert '"user"' in text and '"alice"' in text and '"4242"' in text
