"""``gpuwatt dashboard`` and ``gpuwatt report``: the web dashboard and CSV reports.

The core's CLI (``gpuwatt.cli``) registers these with ``add_dashboard_parser(sub)`` and
``add_report_parser(sub)``; ``dashboard`` is imported lazily, so a collector-only install (no
dash) still runs every other command.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuwatt.config import load_config
from gpuwatt.errors import GpuwattError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config file")
    p.add_argument(
        "--store",
        metavar="URL",
        help="sqlite:///path.db or influxdb://host:8086/BUCKET?org=ORG (token from "
        "INFLUXDB_V2_TOKEN or INFLUXDB_V2_TOKEN_FILE); default: $GPUWATT_STORE, the config, "
        "else the embedded store",
    )


def add_dashboard_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("dashboard", help="serve the web dashboard")
    _common(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.set_defaults(func=cmd_dashboard)
    return p


def add_report_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="write a CSV report per GPU, node, job or model")
    _common(p)
    p.add_argument(
        "--from",
        dest="start",
        default="24h",
        metavar="TIME",
        help="ISO 8601 time (UTC unless an offset is given), epoch seconds, or a duration "
        "before --to such as 24h or 7d (default 24h)",
    )
    p.add_argument("--to", dest="end", default="", metavar="TIME", help="default: now")
    p.add_argument("--by", choices=("gpu", "node", "job", "model"), default="gpu")
    p.add_argument("--out", required=True, metavar="FILE.csv", help="output file, - for stdout")
    p.set_defaults(func=cmd_report)
    return p


def add_job_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "job", help="one job's summary (energy, cost, efficiency, stragglers) for a ticket"
    )
    p.add_argument("job_id", metavar="ID")
    _common(p)
    p.add_argument(
        "--from", dest="start", default="24h", metavar="TIME",
        help="ISO 8601 time, epoch seconds, or a duration such as 24h (default 24h)",
    )  # fmt: skip
    p.add_argument("--to", dest="end", default="", metavar="TIME", help="default: now")
    p.set_defaults(func=cmd_job)
    return p


def _store_url(args: argparse.Namespace) -> str:
    from gpuwatt.store import default_store_url

    config = load_config(args.config)
    return str(args.store or config.store_url or default_store_url())


def _job_figures(args: argparse.Namespace, now: int) -> tuple[Any, list[Any], dict[str, Any]]:
    """The range, the jobs' rows and what inference jobs served, as the jobs page has them."""
    from gpuwatt.dashboard.app import tariff_from
    from gpuwatt.dashboard.data import DashboardData, DataError
    from gpuwatt.dashboard.jobs import job_rows
    from gpuwatt.dashboard.timerange import parse_range
    from gpuwatt.dashboard.work_data import JobWorkSource
    from gpuwatt.store.job_steps import open_job_step_store

    tr, problem = parse_range(report_query(args.start, args.end), now)
    if problem:
        raise GpuwattError(f"{args.command}: {problem.split(';')[0]}")
    store, config = _open(args)
    steps = open_job_step_store(_store_url(args))
    try:
        data = DashboardData(store, clock_ns=lambda: now, tariff=tariff_from(config))
        try:
            win = data.window(tr)
        except DataError as exc:
            raise GpuwattError(f"{args.command}: {exc.message}") from None
        precision = config.collector.tensor_precision if config is not None else "bf16"
        work = JobWorkSource(steps, tensor_precision=precision)
        rows = job_rows(win.summary, win.stragglers, work.work(win))
        return (tr, win), rows, work.served(win)
    finally:
        steps.close()
        store.close()


def cmd_job(args: argparse.Namespace) -> int:
    from gpuwatt.dashboard.job_report import job_text

    (tr, win), rows, served = _job_figures(args, time.time_ns())
    row = next((r for r in rows if r.job_id == args.job_id), None)
    if row is None:
        known = ", ".join(r.job_id for r in rows[:10]) or "none"
        raise GpuwattError(f"job: no job {args.job_id!r} in {tr.label} (jobs seen: {known})")
    currency = win.summary.tariff.currency or ""
    print(job_text(row, served.get(row.job_id), range_label=tr.label, currency=currency))
    return 0


def _open(args: argparse.Namespace):
    from gpuwatt.store import default_store_url, open_store

    config = load_config(args.config)
    url = args.store or config.store_url or default_store_url()
    return open_store(url, timeout_s=config.store_timeout_s), config


def cmd_dashboard(args: argparse.Namespace) -> int:
    from gpuwatt.cli.compose import AlertsDbView, alerts_db_path
    from gpuwatt.dashboard.server import serve
    from gpuwatt.store.job_steps import open_job_step_store

    alerts = AlertsDbView(alerts_db_path(args.config))
    store, config = _open(args)
    # the jobs' own reports (reported TFLOPS, MFU, served requests) from the same store
    job_steps = open_job_step_store(_store_url(args))
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (systemd, docker stop) and Ctrl-C stop the server cleanly, exit status 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        serve(store, args.host, args.port, stop, config=config, alerts=alerts, job_steps=job_steps)
    finally:
        job_steps.close()
        store.close()
    return 0


def report_query(start: str, end: str) -> dict[str, str]:
    """``--from``/``--to`` as the dashboard's URL query (same parser, same rules)."""
    from gpuwatt.dashboard.timerange import parse_duration_s

    if parse_duration_s(start) is not None:
        return {"range": start, **({"end": end} if end else {})}
    return {"from": start, **({"to": end} if end else {})}


def _reported_windows(args: argparse.Namespace, config: Any, summary: Any) -> Any:
    """The jobs' reported work per window for ``--by model`` (work per joule by model); None
    when the job-step store cannot be read (the report is then made without it)."""
    from gpuwatt.analytics.reported import reported_work
    from gpuwatt.store import default_store_url
    from gpuwatt.store.job_steps import open_job_step_store

    try:
        steps_store = open_job_step_store(args.store or config.store_url or default_store_url())
        try:
            steps = steps_store.job_steps(summary.start_ns, summary.now_ns)
        finally:
            steps_store.close()
    except GpuwattError as exc:
        print(f"report: job steps not read ({exc}); no reported work per joule", file=sys.stderr)
        return None
    windows, _ = reported_work(
        steps,
        summary.gpu_windows,
        window_s=summary.window_s,
        tensor_precision=config.collector.tensor_precision,
        start_ns=summary.start_ns,
        now_ns=summary.now_ns,
    )
    return windows


def _report_by_job(args: argparse.Namespace, config: Any, win: Any) -> Any:
    """The report by job as the dashboard's download has it (``csv_export.report_by_job``)."""
    from gpuwatt.dashboard.csv_export import report_by_job
    from gpuwatt.dashboard.work_data import JobWorkSource
    from gpuwatt.store.job_steps import open_job_step_store

    steps = open_job_step_store(_store_url(args))
    try:
        precision = config.collector.tensor_precision if config is not None else "bf16"
        return report_by_job(win, JobWorkSource(steps, tensor_precision=precision))
    finally:
        steps.close()


def cmd_report(args: argparse.Namespace) -> int:
    from gpuwatt.dashboard.app import tariff_from
    from gpuwatt.dashboard.csv_export import build_report, report_csv
    from gpuwatt.dashboard.data import DashboardData, DataError
    from gpuwatt.dashboard.timerange import parse_range

    now = time.time_ns()
    tr, problem = parse_range(report_query(args.start, args.end), now)
    if problem:
        raise GpuwattError(f"report: {problem.split(';')[0]}")
    store, config = _open(args)
    try:
        data = DashboardData(store, clock_ns=lambda: now, tariff=tariff_from(config))
        try:
            win = data.window(tr)
            if args.by == "job":  # the jobs page's columns after the report's own
                table = _report_by_job(args, config, win)
            else:
                jw = _reported_windows(args, config, win.summary) if args.by == "model" else None
                table = build_report(win.summary, args.by, job_work_windows=jw)
        except DataError as exc:
            raise GpuwattError(f"report: {exc.message}") from None
    finally:
        store.close()
    chunks = report_csv(table)
    if args.out == "-":
        for chunk in chunks:
            sys.stdout.write(chunk)
    else:
        with Path(args.out).open("w", encoding="utf-8", newline="") as f:
            for chunk in chunks:
                f.write(chunk)
        print(f"wrote {len(table)} rows by {args.by} ({tr.label}) to {args.out}", file=sys.stderr)
    return 0
