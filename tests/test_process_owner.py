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


def test_the_collector_source_fills_in_each_process_user(tmp_path: Path, make_sample) -> None:
    from gpuwatt.collector.jobs import JobAttributingSource, default_resolver

    (tmp_path / "4242").mkdir()
    sample = make_sample(
        1_700_000_000 * 10**9,
        "node1",
        0,
        processes=(ProcessSample(4242, 2**30), ProcessSample(4243, 2**20)),
    )

    class OneSample:
        def sample(self, *, include_slow: bool) -> list:
            return [sample]

    source = JobAttributingSource(
        OneSample(), default_resolver(proc_root=tmp_path), proc_root=tmp_path
    )
    (got,) = source.sample(include_slow=False)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert got.processes == (ProcessSample(4242, 2**30, me), ProcessSample(4243, 2**20, None))


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


def test_the_simulated_cluster_s_processes_run_as_their_job_s_user() -> None:
    from gpuwatt.collector.sim.scenario import load_scenario
    from gpuwatt.collector.sim.source import SIMULATED_USERS, SimulatedClusterSource

    t0 = 1_767_225_600 * 10**9
    src = SimulatedClusterSource(load_scenario("demo"), start_ns=t0, clock_ns=lambda: t0)
    src.open()
    try:
        samples = src.sample_at(t0 + 60 * 10**9, include_slow=True)
    finally:
        src.close()
    users_of_job: dict[str, set[str | None]] = {}
    for s in samples:
        for p in s.processes or ():
            users_of_job.setdefault(str(s.job_id), set()).add(p.user)
    busy = {job: users for job, users in users_of_job.items() if job != "None"}
    assert busy, "the demo runs jobs with processes"
    for users in busy.values():  # one user per job, one of the cluster's
        assert len(users) == 1 and users <= set(SIMULATED_USERS)


def test_the_embedded_store_keeps_the_process_user(tmp_path: Path) -> None:
    from gpuwatt.collector.sim.scenario import load_scenario
    from gpuwatt.collector.sim.source import SimulatedClusterSource
    from gpuwatt.store.sqlite import SqliteStore

    t0 = 1_767_225_600 * 10**9
    src = SimulatedClusterSource(load_scenario("demo"), start_ns=t0, clock_ns=lambda: t0)
    src.open()
    written: dict[str, set[str | None]] = {}
    with SqliteStore(tmp_path / "s.db") as store:
        try:
            for batch in src.backfill(t0 + 30 * 10**9, interval_s=1.0, slow_interval_s=10.0):
                store.write_samples(batch)
                for s in batch:
                    written[s.uuid] = {p.user for p in s.processes or ()}
        finally:
            src.close()
        read = {s.uuid: {p.user for p in s.processes or ()} for s in store.latest()}
    assert read == written and any(u - {None} for u in read.values())
