"""The ``gpuwatt`` command line: the only place that composes the services.

Every input (config, scenario, store URL) is validated before anything starts or is written; a
problem is one line on stderr naming the file, the line and what is wrong, and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpuwatt import __version__
from gpuwatt.config import Config, gpuwatt_home, load_config
from gpuwatt.errors import ConfigError, GpuwattError, NvmlUnavailable
from gpuwatt.store.base import Store

EXIT_OK = 0
EXIT_INVALID = 1  # check-config found a problem
EXIT_ERROR = 2  # a command could not run

log = logging.getLogger("gpuwatt")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # a late or coalesced tick is expected under load and handled; only errors are worth a line
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    try:
        return int(args.func(args) or 0)
    except NvmlUnavailable as exc:
        print(
            f"gpuwatt: {exc}. To run without a GPU, sample a simulated cluster instead: "
            "gpuwatt collect --simulate demo",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except GpuwattError as exc:
        print(f"gpuwatt: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


# --- commands -----------------------------------------------------------------------------------


def cmd_collect(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    interval_s = args.interval or config.collector.interval_s
    if interval_s <= 0:
        raise GpuwattError("--interval must be positive")
    scenario = _load_scenario(args.simulate) if args.simulate else None
    store_url = _store_url(args, config)
    from gpuwatt.store import open_store

    if scenario is not None:
        from gpuwatt.collector.sim.source import SimulatedClusterSource

        sources = [
            SimulatedClusterSource(scenario, tensor_precision=config.collector.tensor_precision)
        ]
    else:
        from gpuwatt.collector.jobs import JobAttributingSource, default_resolver
        from gpuwatt.collector.nvml import init_real_nvml
        from gpuwatt.collector.nvml_source import NvmlSampler

        nvml = init_real_nvml()  # fails fast, before anything is opened or written
        sampler = NvmlSampler(
            nvml, config.collector.hostname, tensor_precision=config.collector.tensor_precision
        )
        resolver = default_resolver(mapping_dir=config.collector.job_mapping_dir)
        sources = [JobAttributingSource(sampler, resolver)]
    store = open_store(store_url)
    spool_dir = _spool_dir(args, config, "spool")
    return _run_collector(
        sources, store, spool_dir, config, interval_s, duration_s=args.duration, quiet=False
    )


def cmd_demo(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    scenario = _load_scenario(args.scenario)
    store_url = _store_url(args, config)
    from gpuwatt.collector.sim.source import SimulatedClusterSource
    from gpuwatt.store import open_store

    interval_s = config.collector.interval_s
    store = open_store(store_url)
    now_ns = time.time_ns()
    start_ns = _demo_start_ns(store, now_ns, args.backfill, interval_s)
    source = SimulatedClusterSource(
        scenario, start_ns=start_ns, tensor_precision=config.collector.tensor_precision
    )
    _report_simulated_work(source, store_url, config)
    source.open()
    print(
        f"gpuwatt demo: scenario {scenario.name!r}, {source.gpu_count} simulated GPUs, "
        f"store {_display_url(store_url)}"
    )
    backfill_s = (now_ns - start_ns) / 1e9
    if start_ns > now_ns - round(args.backfill * 1e9):
        print(f"the store holds data up to {backfill_s:.0f} s ago: carrying on from there")
    if backfill_s > 0:
        started = time.monotonic()
        n = 0
        for samples in source.backfill(
            now_ns, interval_s=interval_s, slow_interval_s=config.collector.slow_interval_s
        ):
            store.write_samples(samples)
            n += len(samples)
        print(
            f"backfilled {backfill_s:.0f} s of history ({n} GPU samples) "
            f"in {time.monotonic() - started:.1f} s"
        )
    services = _DemoServices()
    try:
        if not args.no_alerts:
            services.start_alerts(args, store_url)
        if not args.no_dashboard:
            services.start_dashboard(store, args, config)
        print("sampling live; run `gpuwatt status` in another terminal. Ctrl-C stops.")
        spool_dir = _spool_dir(args, config, "demo-spool")
        return _run_collector(
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


def _demo_start_ns(store: Store, now_ns: int, backfill_s: float, interval_s: float) -> int:
    """Where the demo's history starts: ``backfill_s`` before now, or, on a store that already
    holds newer data (a demo stopped and started again), one interval after its newest sample,
    so that no (GPU, time) already stored is written again (docs/accounting.md)."""
    start_ns = now_ns - round(backfill_s * 1e9)
    newest = max((s.time_ns for s in store.latest(since_ns=start_ns)), default=None)
    if newest is None:
        return start_ns
    return min(now_ns, max(start_ns, newest + round(interval_s * 1e9)))


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

    def start_dashboard(self, store: object, args: argparse.Namespace, config: Config) -> None:
        try:
            from gpuwatt.dashboard.server import start
        except ImportError:
            print("dashboard: not installed (pip install 'gpuwatt[dashboard]'); skipping it")
            return
        from gpuwatt.cli.compose import AlertsDbView, alerts_db_path

        try:
            self.dashboard = start(
                store,  # type: ignore[arg-type]
                "127.0.0.1",
                args.port,
                config=config,
                alerts=AlertsDbView(alerts_db_path(args.config)),
            )
        except OSError as exc:
            raise GpuwattError(
                f"cannot serve the dashboard on 127.0.0.1:{args.port} ({exc.strerror}); "
                "pass --port PORT or --no-dashboard"
            ) from None
        print(f"dashboard: {self.dashboard.url}")  # type: ignore[attr-defined]

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


def _report_simulated_work(source: object, store_url: str, config: Config) -> None:
    """The demo's training jobs report their steps, as a real job does with gpuwatt.work."""
    from gpuwatt.collector.sim.work import SimulatedWorkReporter
    from gpuwatt.store.job_steps import open_job_step_store

    steps_store = open_job_step_store(store_url)
    work = SimulatedWorkReporter(
        source.simulator,  # type: ignore[attr-defined]
        start_ns=source.start_ns,  # type: ignore[attr-defined]
        precision=config.collector.tensor_precision,
    )
    failed = False

    def report() -> None:
        nonlocal failed
        try:
            steps_store.write_job_steps(work.poll())
        except GpuwattError as exc:  # the samples matter more than the job steps
            if not failed:
                log.warning("simulated job steps not written: %s", exc)
            failed = True

    source.after_sample = report  # type: ignore[attr-defined]


def cmd_status(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from gpuwatt.status import render_status
    from gpuwatt.store import open_store

    store = open_store(_store_url(args, config))
    try:
        samples = store.latest()
    finally:
        store.close()
    if not samples:
        print("no samples in the store yet")
        return EXIT_ERROR
    print(render_status(samples, now_ns=time.time_ns()))
    return EXIT_OK


def cmd_analyze(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from gpuwatt.analytics import analyze, render_text
    from gpuwatt.analytics.inputs import read_analysis_input
    from gpuwatt.store import open_store

    store = open_store(_store_url(args, config))
    now_ns = time.time_ns()
    start_ns = now_ns - round(args.since * 1e9)
    try:
        data = read_analysis_input(store, start_ns, now_ns)
    finally:
        store.close()
    frame, jobs = data.frame, data.jobs
    from gpuwatt.store.job_steps import open_job_step_store

    steps_store = open_job_step_store(_store_url(args, config))
    try:
        job_steps = steps_store.job_steps(
            start_ns, now_ns, job_ids=[args.job] if args.job else None
        )
    finally:
        steps_store.close()
    summary = analyze(
        frame,
        now_ns=now_ns,
        start_ns=start_ns,
        window_s=args.window,
        jobs=jobs,
        job=args.job,
        price_per_kwh=config.energy.price_per_kwh,
        carbon_g_per_kwh=config.energy.carbon_g_per_kwh,
        currency=config.energy.currency,
        tensor_precision=config.collector.tensor_precision,
        job_steps=job_steps,
    )
    print(render_text(summary))
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    from gpuwatt.yamlfile import load_file

    status = EXIT_OK
    for path in args.files:
        try:
            doc = load_file(path)
            kind = _kind_of(doc.value)
            if kind == "scenario":
                from gpuwatt.collector.sim.scenario import parse_scenario

                scenario = parse_scenario(doc)
                print(f"{path}: ok (scenario {scenario.name!r})")
            elif kind == "rules":
                from gpuwatt.cli.alerts import validate_rules_file

                print(f"{path}: ok ({validate_rules_file(path)})")
            else:
                from gpuwatt.cli.alerts import load_settings

                load_settings(path)  # the config proper and its alerts: section
                print(f"{path}: ok (config)")
        except ConfigError as exc:
            print(f"gpuwatt: {exc}", file=sys.stderr)
            status = EXIT_INVALID
    return status


def _kind_of(value: object) -> str:
    from gpuwatt.cli.alerts import looks_like_rules

    if isinstance(value, dict) and ({"cluster", "jobs", "faults"} & set(value)):
        return "scenario"
    if looks_like_rules(value):
        return "rules"
    return "config"


# --- helpers ------------------------------------------------------------------------------------


def _run_collector(
    sources: list,
    store: object,
    spool_dir: Path,
    config: Config,
    interval_s: float,
    *,
    duration_s: float | None,
    quiet: bool,
    summary_every_s: float = 5.0,
) -> int:
    from gpuwatt.collector.runtime import Flusher, Sampler, run
    from gpuwatt.collector.spool import Spool
    from gpuwatt.status import LiveSummary

    stop = threading.Event()
    _install_signal_handlers(stop)
    for source in sources:
        source.open()
    spool = Spool(spool_dir, max_bytes=config.collector.spool_max_bytes)
    summary = LiveSummary(every_s=summary_every_s) if quiet else None
    sampler = Sampler(
        sources,
        spool,
        slow_interval_s=config.collector.slow_interval_s,
        on_samples=summary.update if summary else None,
    )
    flusher = Flusher(spool, store)  # type: ignore[arg-type]
    try:
        run(sampler, flusher, interval_s=interval_s, stop=stop, duration_s=duration_s)
        pending = spool.pending_lines()
    finally:
        for source in sources:
            source.close()
        spool.close()
        store.close()  # type: ignore[attr-defined]
    log.info(
        "stopped after %d ticks: %d GPU samples taken, %d delivered, %d kept in the spool %s",
        sampler.stats.ticks,
        sampler.stats.samples,
        flusher.delivered_lines,
        pending,
        spool_dir,
    )
    return EXIT_OK


def _install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _load_scenario(name_or_path: str):
    from gpuwatt.collector.sim.scenario import load_scenario

    return load_scenario(name_or_path)


def _store_url(args: argparse.Namespace, config: Config) -> str:
    from gpuwatt.store import default_store_url

    return args.store or config.store_url or default_store_url()


def _spool_dir(args: argparse.Namespace, config: Config, name: str) -> Path:
    if getattr(args, "spool", None):
        return Path(args.spool)
    if config.collector.spool_dir is not None:
        return config.collector.spool_dir
    return gpuwatt_home(os.environ) / name


def _display_url(url: str) -> str:
    return url.split("?", 1)[0]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuwatt",
        description="GPU cluster monitoring: stragglers, TFLOPS per watt, energy, alerts.",
    )
    p.add_argument("--version", action="version", version=f"gpuwatt {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", metavar="FILE", help="YAML config file")
        sp.add_argument(
            "--store",
            metavar="URL",
            help="sqlite:///path.db or influxdb://host:8086/BUCKET?org=ORG "
            "(token from INFLUXDB_V2_TOKEN or INFLUXDB_V2_TOKEN_FILE); default: $GPUWATT_STORE, "
            "the config, else the embedded store in $GPUWATT_HOME",
        )

    c = sub.add_parser("collect", help="sample this node's GPUs (or a simulated cluster)")
    common(c)
    c.add_argument("--simulate", metavar="SCENARIO", help="a shipped scenario name or a YAML file")
    c.add_argument("--interval", type=_positive_float, metavar="S", help="seconds between samples")
    c.add_argument("--duration", type=_positive_float, metavar="S", help="stop after S seconds")
    c.add_argument("--spool", metavar="DIR", help="the durable spool directory")
    c.set_defaults(func=cmd_collect)

    d = sub.add_parser(
        "demo", help="a simulated cluster into the embedded store, with alerts and the dashboard"
    )
    common(d)
    d.add_argument("--scenario", default="demo", metavar="NAME|FILE")
    d.add_argument("--backfill", type=float, default=1800.0, metavar="S", help="history to fill")
    d.add_argument("--duration", type=_positive_float, metavar="S", help="stop after S seconds")
    d.add_argument("--summary-every", type=_positive_float, default=5.0, metavar="S")
    d.add_argument("--spool", metavar="DIR")
    d.add_argument("--port", type=int, default=8050, help="dashboard port (default 8050)")
    d.add_argument("--no-dashboard", action="store_true", help="do not serve the dashboard")
    d.add_argument("--no-alerts", action="store_true", help="do not run the alert evaluator")
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("status", help="the latest sample of every GPU")
    common(s)
    s.set_defaults(func=cmd_status)

    a = sub.add_parser("analyze", help="load balance, stragglers and efficiency for a window")
    common(a)
    a.add_argument(
        "--since", type=_duration_s, default=3600.0, metavar="DURATION", help="e.g. 15m, 1h, 1d"
    )
    a.add_argument("--window", type=_duration_s, default=60.0, metavar="DURATION")
    a.add_argument("--job", metavar="ID", help="only this job")
    a.set_defaults(func=cmd_analyze)

    from gpuwatt.cli.alerts import add_alerts_parser
    from gpuwatt.cli.dashboard import add_dashboard_parser, add_report_parser

    add_alerts_parser(sub)
    add_dashboard_parser(sub)
    add_report_parser(sub)

    k = sub.add_parser("check-config", help="validate config, scenario and alert rules files")
    k.add_argument("files", nargs="+", metavar="FILE")
    k.set_defaults(func=cmd_check_config)
    return p


def _duration_s(text: str) -> float:
    from gpuwatt.yamlfile import parse_duration_s

    value = parse_duration_s(text)
    if value is None or value <= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h)")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
