"""``gpuwatt alerts``: the alert evaluator and its helpers on the command line.

    gpuwatt alerts [--rules FILE] [--store URL] [--config FILE]      run the evaluator
    gpuwatt alerts test --channel NAME [--config FILE]              send a test notification
    gpuwatt alerts silence --match host=node-3 --author A --comment C --duration 2h
    gpuwatt alerts status                                           active alerts, failed sends

Channels, routes and where alert state lives come from the ``alerts:`` section of the config file
(see ``gpuwatt.alerts.settings``); secrets from environment variables or files, never from here.
Wire into ``gpuwatt.cli`` with ``add_alerts_parser(sub)``; ``validate_rules_file`` serves
``check-config``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpuwatt.alerts.rules import looks_like_rules, validate_rules_file
from gpuwatt.config import Config, gpuwatt_home, parse_config
from gpuwatt.errors import ConfigError, GpuwattError
from gpuwatt.yamlfile import Located, load_file

__all__ = ["add_alerts_parser", "looks_like_rules", "main", "validate_rules_file"]

EXIT_OK = 0
EXIT_ERROR = 2
log = logging.getLogger("gpuwatt.alerts")


def add_alerts_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("alerts", help="evaluate alert rules and notify (email, Slack)")
    _common(p, suppress=False)
    p.set_defaults(func=cmd_run, alerts_cmd="run")
    sub = p.add_subparsers(dest="alerts_cmd")
    t = sub.add_parser("test", help="send a test notification to one channel")
    _common(t, suppress=True)
    t.add_argument("--channel", required=True, metavar="NAME")
    t.set_defaults(func=cmd_test)
    s = sub.add_parser("silence", help="silence alerts matching labels (or plan maintenance)")
    _common(s, suppress=True)
    s.add_argument("--match", action="append", required=True, metavar="LABEL=VALUE",
                   help="repeatable; VALUE may be ~REGEX")  # fmt: skip
    s.add_argument("--author", required=True)
    s.add_argument("--comment", required=True)
    s.add_argument("--duration", required=True, metavar="DURATION", help="e.g. 2h")
    s.add_argument("--starts-in", default="0s", metavar="DURATION", help="maintenance window")
    s.set_defaults(func=cmd_silence)
    st = sub.add_parser("status", help="active alerts, silences and failed notifications")
    _common(st, suppress=True)
    st.set_defaults(func=cmd_status)
    return p


def _common(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    p.add_argument("--config", metavar="FILE", default=default, help="gpuwatt config (alerts:)")
    p.add_argument("--rules", metavar="FILE", default=default, help="rules (default: shipped)")
    p.add_argument("--store", metavar="URL", default=default, help="store URL")


# --- loading ------------------------------------------------------------------------------


def load_settings(config_path: str | None, environ: dict[str, str] | None = None):
    """The gpuwatt config and its ``alerts:`` section, both validated."""
    from gpuwatt.alerts.settings import parse_alert_settings

    env = dict(os.environ if environ is None else environ)
    if config_path is None:
        return Config(), parse_alert_settings(None, env)
    doc = load_file(config_path)
    mapping = dict(doc.mapping())
    alerts_node = mapping.pop("alerts", None)
    config = parse_config(Located(mapping, doc.path, doc.line))
    if env.get("GPUWATT_STORE"):
        config = dataclasses.replace(config, store_url=env["GPUWATT_STORE"])
    return config, parse_alert_settings(alerts_node, env)


def _build(args: argparse.Namespace, clock=None):
    from gpuwatt.alerts.clock import SystemClock
    from gpuwatt.alerts.db import open_db
    from gpuwatt.alerts.rules import load_rules
    from gpuwatt.alerts.service import Evaluator
    from gpuwatt.store import default_store_url, open_store

    rules = load_rules(getattr(args, "rules", None))
    config, settings = load_settings(getattr(args, "config", None))
    db_path = settings.state_db or gpuwatt_home(os.environ) / "alerts.db"
    db_path.parent.mkdir(parents=True, exist_ok=True)
    store = open_store(
        getattr(args, "store", None) or config.store_url or default_store_url(),
        timeout_s=config.store_timeout_s,
    )
    con = open_db(db_path)
    evaluator = Evaluator(
        rules, store, con, channels=settings.channels, routes=settings.routes,
        clock=clock or SystemClock(), cluster=settings.cluster, retry=settings.retry,
        external_url=settings.external_url,
    )  # fmt: skip
    return evaluator, settings, store, con, db_path


# --- commands -----------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from gpuwatt.alerts.service import run

    evaluator, settings, store, con, db_path = _build(args)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    print(
        f"gpuwatt alerts: {len(evaluator.rules)} rules, channels "
        f"{', '.join(sorted(settings.channels)) or '(none: alerts are only recorded)'}, "
        f"every {settings.evaluation_interval_s:g} s; state in {db_path}"
    )
    try:
        evaluator.evaluate()
        run(evaluator, evaluation_interval_s=settings.evaluation_interval_s, stop=stop)
    finally:
        store.close()
        con.close()
    return EXIT_OK


def cmd_test(args: argparse.Namespace) -> int:
    evaluator, settings, store, con, _ = _build(args)
    try:
        if args.channel not in settings.channels:
            known = ", ".join(sorted(settings.channels)) or "none configured"
            raise GpuwattError(f"no channel named {args.channel!r} ({known})")
        result = evaluator.send_test(args.channel)
    finally:
        store.close()
        con.close()
    print(f"{args.channel}: {result}")
    return EXIT_OK if result.startswith("Delivered") else EXIT_ERROR


def cmd_silence(args: argparse.Namespace) -> int:
    from gpuwatt.alerts.db import open_db, transaction
    from gpuwatt.alerts.silences import MAINTENANCE, SILENCE, SilenceTable
    from gpuwatt.yamlfile import parse_duration_s

    _, settings = load_settings(getattr(args, "config", None))
    matchers = {}
    for m in args.match:
        name, sep, value = m.partition("=")
        if not sep or not name:
            raise GpuwattError(f"--match {m!r}: use LABEL=VALUE")
        matchers[name] = value
    duration_s, starts_in_s = parse_duration_s(args.duration), parse_duration_s(args.starts_in)
    if not duration_s or starts_in_s is None:
        raise GpuwattError("--duration and --starts-in take durations like 30m, 2h")
    now_ns = time.time_ns()
    start_ns = now_ns + round(starts_in_s * 1e9)
    db_path = settings.state_db or gpuwatt_home(os.environ) / "alerts.db"
    db_path.parent.mkdir(parents=True, exist_ok=True)
    con = open_db(db_path)
    try:
        with transaction(con):
            s = SilenceTable(con).add(
                matchers, author=args.author, comment=args.comment, starts_ns=start_ns,
                ends_ns=start_ns + round(duration_s * 1e9), now_ns=now_ns,
                kind=MAINTENANCE if starts_in_s > 0 else SILENCE,
            )  # fmt: skip
    except ValueError as exc:
        raise GpuwattError(str(exc)) from None
    finally:
        con.close()
    print(f"{s.kind} {s.id} created")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from gpuwatt.alerts.db import open_db
    from gpuwatt.alerts.outbox import FAILED, PENDING, Outbox
    from gpuwatt.alerts.silences import SilenceTable
    from gpuwatt.alerts.state import AlertTable

    _, settings = load_settings(getattr(args, "config", None))
    db_path = settings.state_db or gpuwatt_home(os.environ) / "alerts.db"
    if not Path(db_path).exists():
        print(f"no alert state yet ({db_path})")
        return EXIT_OK
    con = open_db(db_path)
    try:
        for a in AlertTable(con).active():
            flag = f" [{a.suppressed}]" if a.suppressed else ""
            print(f"{a.state:8} {a.rule}: {a.annotations.get('summary', '')}{flag}")
        for s in SilenceTable(con).current_and_future(time.time_ns()):
            print(f"{s.kind} {s.id} by {s.author}: {s.matchers} ({s.comment})")
        outbox = Outbox(con)
        for e in outbox.entries(PENDING):
            if e.last_error:  # owed and being retried: say why
                print(f"RETRYING notification {e.id} to {e.channel} after {e.attempts} "
                      f"attempt(s): {e.last_error}")  # fmt: skip
        for e in outbox.entries(FAILED):
            print(f"FAILED notification {e.id} to {e.channel}: {e.last_error}")
    finally:
        con.close()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (tests, ``python -m``); ``gpuwatt alerts`` goes through ``gpuwatt.cli``."""
    parser = argparse.ArgumentParser(prog="gpuwatt")
    add_alerts_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"gpuwatt: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except GpuwattError as exc:
        print(f"gpuwatt: {exc}", file=sys.stderr)
        return EXIT_ERROR
