"""The ``gpuwatt`` command line: the only place that composes the services.

Every input (config, scenario, store URL) is validated before anything starts or is written; a
problem is one line on stderr naming the file, the line and what is wrong, and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gpuwatt import __version__
from gpuwatt.cli.collect import cmd_collect, cmd_spool
from gpuwatt.cli.common import EXIT_ERROR
from gpuwatt.cli.demo import cmd_demo
from gpuwatt.cli.queries import cmd_analyze, cmd_check_config, cmd_status
from gpuwatt.errors import GpuwattError, NvmlUnavailable


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
