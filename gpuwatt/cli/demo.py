"""``gpuwatt demo``: a simulated cluster, its backfill, the alert evaluator and the dashboard in
one command."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

from gpuwatt.cli import demo_clock
from gpuwatt.cli.collect import run_collector
from gpuwatt.cli.common import display_url, load_scenario, log, spool_dir_of, store_url_of
from gpuwatt.config import Config, load_config
from gpuwatt.errors import GpuwattError


def cmd_demo(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    scenario = load_scenario(args.scenario)
    store_url = store_url_of(args, config)
    from gpuwatt.collector.sim.source import SimulatedClusterSource
    from gpuwatt.store import open_store

    interval_s = config.collector.interval_s
    now_ns = time.time_ns()
    store = open_store(store_url, timeout_s=config.store_timeout_s)
    start_ns = now_ns - round(args.backfill * 1e9)
    # A store that already holds recent data (a demo stopped and started again) is carried on
    # from its newest sample: backfilling over it would store two histories of the same GPUs.
    newest = store.latest(since_ns=start_ns)
    newest_ns = max((s.time_ns for s in newest), default=None)
    carried_on = newest_ns is not None
    if newest_ns is not None:
        start_ns = min(now_ns, newest_ns + round(interval_s * 1e9))
    # ... and so is the scenario (its jobs and faults), and the GPUs' energy counters, as real
    # ones go on
    spool_dir = spool_dir_of(args, config, "demo-spool")
    clock = demo_clock.clock_path(spool_dir)
    source = SimulatedClusterSource(
        scenario,
        start_ns=start_ns,
        tensor_precision=config.collector.tensor_precision,
        scenario_time_s=(
            demo_clock.scenario_time_s(clock, store_url, scenario, start_ns) if carried_on else 0.0
        ),
    )
    if carried_on:
        source.carry_on_from(newest)
    demo_clock.save(clock, store_url, scenario, source.scenario_zero_ns)
    _report_simulated_work(source, store_url, config)
    source.open()
    print(
        f"gpuwatt demo: scenario {scenario.name!r}, {source.gpu_count} simulated GPUs, "
        f"store {display_url(store_url)}"
    )
    if carried_on:
        print(
            f"the store already holds data up to {(now_ns - start_ns) / 1e9:.0f} s ago: "
            "carrying on from there instead of backfilling over it (the scenario at "
            f"{source.scenario_start_s:.0f} s)"
        )
    if start_ns < now_ns:
        started = time.monotonic()
        n = 0
        for samples in source.backfill(
            now_ns, interval_s=interval_s, slow_interval_s=config.collector.slow_interval_s
        ):
            store.write_samples(samples)
            n += len(samples)
        print(
            f"backfilled {(now_ns - start_ns) / 1e9:.0f} s of history ({n} GPU samples) "
            f"in {time.monotonic() - started:.1f} s"
        )
    services = _DemoServices()
    try:
        if not args.no_alerts:
            services.start_alerts(args, store_url)
        if not args.no_dashboard:
            services.start_dashboard(store, args, config, store_url)
        print("sampling live; run `gpuwatt status` in another terminal. Ctrl-C stops.")
        return run_collector(
            [source],
            store,
            spool_dir,
            config,
            interval_s,
            duration_s=args.duration,
            quiet=True,
            summary_every_s=args.summary_every,
        )
    finally:
        services.stop()


class _DemoServices:
    """The demo's alert evaluator (its own process, as in production) and dashboard."""

    def __init__(self) -> None:
        self.alerts: subprocess.Popen[bytes] | None = None
        self.dashboard: object | None = None

    def start_alerts(self, args: argparse.Namespace, store_url: str) -> None:
        argv = [sys.executable, "-m", "gpuwatt", "alerts", "--store", store_url]
        if args.config:
            argv += ["--config", args.config]
        self.alerts = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        print("alert evaluator: running (alerts are recorded; add channels in the config)")

    def start_dashboard(
        self, store: object, args: argparse.Namespace, config: Config, store_url: str
    ) -> None:
        try:
            from gpuwatt.dashboard.server import start
        except ImportError:
            print("dashboard: not installed (pip install 'gpuwatt[dashboard]'); skipping it")
            return
        from gpuwatt.cli.compose import AlertsDbView, alerts_db_path
        from gpuwatt.store.job_steps import open_job_step_store

        try:
            self.dashboard = start(
                store,  # type: ignore[arg-type]
                "127.0.0.1",
                args.port,
                config=config,
                alerts=AlertsDbView(alerts_db_path(args.config)),
                # the simulated jobs' reports: MFU of the training job, requests of the inference
                job_steps=open_job_step_store(store_url),
            )
        except OSError as exc:
            raise GpuwattError(
                f"cannot serve the dashboard on 127.0.0.1:{args.port} ({exc.strerror}); "
                "pass --port PORT or --no-dashboard"
            ) from None
        print(f"dashboard: {self.dashboard.url}")

    def stop(self) -> None:
        if self.dashboard is not None:
            self.dashboard.stop()  # type: ignore[attr-defined]
        if self.alerts is not None and self.alerts.poll() is None:
            self.alerts.terminate()
            try:
                self.alerts.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.alerts.kill()
                self.alerts.wait()


def _newest_steps(steps_store: Any, since_ns: int, job_ids: list[str]) -> dict[str, int]:
    """Each job's newest step number recorded since ``since_ns`` (the scenario's start)."""
    steps = steps_store.job_steps(since_ns, 2**62, job_ids=job_ids)
    if steps.empty:
        return {}
    return {str(k): int(v) for k, v in steps.groupby("job_id")["step"].max().items()}


def _report_simulated_work(source: object, store_url: str, config: Config) -> None:
    """The demo's training jobs report their steps and its inference jobs their requests, as
    real ones do with gpuwatt.work."""
    from gpuwatt.collector.sim.serving import SimulatedServingReporter
    from gpuwatt.collector.sim.work import SimulatedWorkReporter
    from gpuwatt.store.job_steps import open_job_step_store

    steps_store = open_job_step_store(store_url)
    work = SimulatedWorkReporter(
        source.simulator,  # type: ignore[attr-defined]
        start_ns=source.scenario_zero_ns,  # type: ignore[attr-defined]
        precision=config.collector.tensor_precision,
    )
    serving = SimulatedServingReporter(
        source.simulator,  # type: ignore[attr-defined]
        start_ns=source.scenario_zero_ns,  # type: ignore[attr-defined]
    )
    try:  # a scenario carried on: its jobs' step numbers too
        zero_ns = source.scenario_zero_ns  # type: ignore[attr-defined]
        work.carry_on_after(_newest_steps(steps_store, zero_ns, work.job_ids))
    except GpuwattError as exc:
        log.warning("earlier simulated job steps not read (numbered from 0): %s", exc)
    failed = False

    def report() -> None:
        nonlocal failed
        try:
            steps_store.write_job_steps(work.poll() + serving.poll())
        except GpuwattError as exc:  # the samples matter more than the job steps
            if not failed:
                log.warning("simulated job steps not written: %s", exc)
            failed = True

    source.after_sample = report  # type: ignore[attr-defined]
