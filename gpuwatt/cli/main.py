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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatt import __version__
from gpuwatt.config import Config, gpuwatt_home, load_config
from gpuwatt.errors import ConfigError, GpuwattError, NvmlUnavailable
from gpuwatt.model import GpuSample

if TYPE_CHECKING:
    from gpuwatt.collector.runtime import SampleSource

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
    # A missed or skipped run (an evaluation that could not start in time) is worth a line; the
    # scheduler's per-run INFO chatter is not.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
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
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"gpuwatt: this command needs the {extra!r} extra, which is not installed "
            f"(no module {exc.name!r}): pip install 'gpuwatt[{extra}]'",
            file=sys.stderr,
        )
        return EXIT_ERROR


#: Modules that only an optional extra installs, and that extra's name (a compute node installs
#: the collector alone; the web stack comes with ``gpuwatt[dashboard]``).
EXTRA_OF_MODULE: dict[str, str] = {
    "dash": "dashboard",
    "dash_mantine_components": "dashboard",
    "plotly": "dashboard",
    "flask": "dashboard",
    "werkzeug": "dashboard",
}


# --- commands -----------------------------------------------------------------------------------


def cmd_collect(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    interval_s = args.interval or config.collector.interval_s
    if interval_s <= 0:
        raise GpuwattError("--interval must be positive")
    scenario = _load_scenario(args.simulate) if args.simulate else None
    store_url = _store_url(args, config)
    from gpuwatt.store import open_store
    from gpuwatt.store.url import redact_url

    sources: list[SampleSource]
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
        resolver = default_resolver(
            proc_root=config.collector.proc_root, mapping_dir=config.collector.job_mapping_dir
        )
        sources = [JobAttributingSource(sampler, resolver)]
    store = open_store(store_url)
    if getattr(store, "read_only", False):
        store.close()
        raise GpuwattError(
            f"{redact_url(store_url)} takes no writes: Prometheus scrapes instead; run "
            "`gpuwatt collect --metrics-port PORT` and add it to Prometheus' scrape targets"
        )
    spool_dir = _spool_dir(args, config, "spool")
    return _run_collector(
        sources,
        store,
        spool_dir,
        config,
        interval_s,
        duration_s=args.duration,
        quiet=False,
        metrics_port=args.metrics_port,
        metrics_bind=args.metrics_bind,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    scenario = _load_scenario(args.scenario)
    store_url = _store_url(args, config)
    from gpuwatt.collector.sim.source import SimulatedClusterSource
    from gpuwatt.store import open_store

    interval_s = config.collector.interval_s
    now_ns = time.time_ns()
    store = open_store(store_url)
    start_ns = now_ns - round(args.backfill * 1e9)
    # A store that already holds recent data (a demo stopped and started again) is carried on
    # from its newest sample: backfilling over it would store two histories of the same GPUs.
    newest_ns = max((s.time_ns for s in store.latest(since_ns=start_ns)), default=None)
    carried_on = newest_ns is not None
    if newest_ns is not None:
        start_ns = min(now_ns, newest_ns + round(interval_s * 1e9))
    source = SimulatedClusterSource(
        scenario, start_ns=start_ns, tensor_precision=config.collector.tensor_precision
    )
    _report_simulated_work(source, store_url, config)
    source.open()
    print(
        f"gpuwatt demo: scenario {scenario.name!r}, {source.gpu_count} simulated GPUs, "
        f"store {_display_url(store_url)}"
    )
    if carried_on:
        print(
            f"the store already holds data up to {(now_ns - start_ns) / 1e9:.0f} s ago: "
            "carrying on from there instead of backfilling over it"
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


def _report_simulated_work(source: object, store_url: str, config: Config) -> None:
    """The demo's training jobs report their steps and its inference jobs their requests, as
    real ones do with gpuwatt.work."""
    from gpuwatt.collector.sim.serving import SimulatedServingReporter
    from gpuwatt.collector.sim.work import SimulatedWorkReporter
    from gpuwatt.store.job_steps import open_job_step_store

    steps_store = open_job_step_store(store_url)
    work = SimulatedWorkReporter(
        source.simulator,  # type: ignore[attr-defined]
        start_ns=source.start_ns,  # type: ignore[attr-defined]
        precision=config.collector.tensor_precision,
    )
    serving = SimulatedServingReporter(
        source.simulator,  # type: ignore[attr-defined]
        start_ns=source.start_ns,  # type: ignore[attr-defined]
    )
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


def cmd_status(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from gpuwatt.status import render_status, select_samples, watch
    from gpuwatt.store import open_store

    store = open_store(_store_url(args, config))

    def frame() -> str:
        samples = store.latest()
        if not samples:
            return "no samples in the store yet"
        now_ns = time.time_ns()
        chosen = select_samples(
            samples, now_ns=now_ns, host=args.host, job=args.job, problems=args.problems
        )
        text = render_status(chosen, now_ns=now_ns, total=len(samples))
        shared = getattr(store, "shared_writers", None)  # InfluxDB: GPUs Telegraf also writes
        if shared:
            writers = " and ".join(sorted({w for ws in shared.values() for w in ws}))
            text += f"\n{len(shared)} GPUs written by {writers}: each counted once"
        return text

    try:
        if args.watch is not None:
            watch(frame, every_s=args.watch)
            return EXIT_OK
        text = frame()
    finally:
        store.close()
    print(text)
    return EXIT_ERROR if text == "no samples in the store yet" else EXIT_OK


def cmd_spool(args: argparse.Namespace) -> int:
    """``gpuwatt spool status|replay``: lines the store refused are kept aside with their reason
    (``collector.delivery``); replay sends them again and keeps only those refused again."""
    config = load_config(args.config)
    from gpuwatt.collector.delivery import SetAside
    from gpuwatt.collector.runtime import REJECTED_DIR
    from gpuwatt.collector.spool import Spool

    spool_dir = _spool_dir(args, config, "spool")
    if not spool_dir.exists():
        print(f"no spool at {spool_dir}")
        return EXIT_OK
    spool = Spool(spool_dir, max_bytes=config.collector.spool_max_bytes)
    aside = SetAside(spool_dir / REJECTED_DIR, max(1, spool.max_bytes // 4))
    try:
        if args.action == "status":
            print(f"{spool.pending_lines()} samples waiting in {spool_dir}")
            print(f"{aside.pending_lines()} samples set aside in {aside.directory}")
            for path in aside.files():
                pairs = aside.lines(path)
                print(f"  {path.name}: {len(pairs)} ({pairs[0][1] if pairs else ''})")
            return EXIT_OK
        from gpuwatt.store import open_store

        store = open_store(_store_url(args, config))
        try:
            delivered, kept = aside.replay(store)
        finally:
            store.close()
        print(f"replayed {delivered} samples; {kept} refused again, kept in {aside.directory}")
        return EXIT_OK if kept == 0 else EXIT_ERROR
    finally:
        spool.close()


def cmd_analyze(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from gpuwatt.analytics import analyze, render_text
    from gpuwatt.analytics.inputs import read_analysis_input
    from gpuwatt.store import open_store

    store = open_store(_store_url(args, config))
    now_ns = time.time_ns()
    start_ns = now_ns - round(args.since * 1e9)
    try:
        data = read_analysis_input(store, start_ns, now_ns, window_s=args.window)
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
        step_s=data.step_s,
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
    metrics_port: int | None = None,
    metrics_bind: str = "127.0.0.1",
) -> int:
    from gpuwatt.collector.rollup_writer import open_rollup_writer
    from gpuwatt.collector.runtime import Flusher, Sampler, run, spool_for
    from gpuwatt.status import LiveSummary

    stop = threading.Event()
    _install_signal_handlers(stop)
    for source in sources:
        source.open()
    spool = spool_for(store, spool_dir, max_bytes=config.collector.spool_max_bytes)
    summary = LiveSummary(every_s=summary_every_s) if quiet else None
    hooks: list[Callable[[list[GpuSample]], None]] = [summary.update] if summary else []
    endpoint = None
    if metrics_port is not None:
        from gpuwatt.collector.exposition import LatestSamples, MetricsEndpoint

        latest = LatestSamples()
        endpoint = MetricsEndpoint(latest, port=metrics_port, bind=metrics_bind)
        hooks.append(latest.update)
        log.info("serving /metrics on http://%s:%d/metrics", metrics_bind, endpoint.port)

    def on_samples(samples: list[GpuSample]) -> None:
        for hook in hooks:
            hook(samples)

    sampler = Sampler(
        sources,
        spool,
        slow_interval_s=config.collector.slow_interval_s,
        on_samples=on_samples if hooks else None,
    )
    rollups = open_rollup_writer(store, spool_dir)  # the engine's rollups of our GPUs
    on_delivered = rollups.delivered if rollups else None
    flusher = Flusher(spool, store, on_delivered=on_delivered)  # type: ignore[arg-type]
    try:
        run(sampler, flusher, interval_s=interval_s, stop=stop, duration_s=duration_s)
        pending = spool.pending_lines()
        if rollups:
            rollups.close()
    finally:
        if endpoint is not None:
            endpoint.close()
        for source in sources:
            source.close()
        spool.close()
        store.close()  # type: ignore[attr-defined]
    log.info(
        "stopped after %d ticks: %d GPU samples taken, %d delivered, %d kept in the spool %s, "
        "%d set aside as refused by the store, %d dropped by the spool's size bound",
        sampler.stats.ticks,
        sampler.stats.samples,
        flusher.delivered_lines,
        pending,
        spool_dir,
        flusher.rejected_lines,
        spool.dropped_lines + flusher.set_aside.dropped_lines,
    )
    if sampler.stats.samples and not flusher.delivered_lines:
        log.error(
            "delivered nothing to the store: %d samples are kept in the spool %s (or set aside "
            "under its rejected/ folder; see the errors above)",
            pending,
            spool_dir,
        )
        return EXIT_ERROR
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
    c.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve the latest samples at /metrics for Prometheus (off unless given; 0 = any)",
    )
    c.add_argument(
        "--metrics-bind",
        default="127.0.0.1",
        metavar="ADDR",
        help="address /metrics listens on (default 127.0.0.1)",
    )
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
    s.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_positive_float,
        metavar="S",
        help="redraw every S seconds (default 2) until Ctrl-C",
    )
    s.add_argument("--host", metavar="PATTERN", help="only hosts matching this shell pattern")
    s.add_argument("--job", metavar="ID", help="only GPUs of this job")
    s.add_argument(
        "--problems", action="store_true", help="only GPUs that are lost, stale, throttled or hot"
    )
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
    from gpuwatt.cli.dashboard import add_dashboard_parser, add_job_parser, add_report_parser

    add_alerts_parser(sub)
    add_dashboard_parser(sub)
    add_report_parser(sub)
    add_job_parser(sub)

    sp = sub.add_parser("spool", help="the collector's spool: what waits, what was set aside")
    common(sp)
    sp.add_argument("--spool", metavar="DIR", help="the spool directory (default: the config's)")
    sp.add_argument(
        "action",
        choices=("status", "replay"),
        help="status: lines waiting and set aside; replay: send the set-aside lines again",
    )
    sp.set_defaults(func=cmd_spool)

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


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r} (0-65535)")
    return int(text)


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
