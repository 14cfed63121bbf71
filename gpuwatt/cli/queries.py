"""``gpuwatt status``, ``gpuwatt analyze`` and ``gpuwatt check-config``: reading the store and
the files."""

from __future__ import annotations

import argparse
import sys
import time

from gpuwatt.cli.common import EXIT_ERROR, EXIT_INVALID, EXIT_OK, store_url_of
from gpuwatt.config import load_config
from gpuwatt.errors import ConfigError


def cmd_status(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from gpuwatt.status import render_status, select_samples, watch
    from gpuwatt.store import open_store

    store = open_store(store_url_of(args, config), timeout_s=config.store_timeout_s)

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


def cmd_analyze(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from gpuwatt.analytics import analyze, render_text
    from gpuwatt.analytics.inputs import read_analysis_input
    from gpuwatt.store import open_store

    store = open_store(store_url_of(args, config), timeout_s=config.store_timeout_s)
    now_ns = time.time_ns()
    start_ns = now_ns - round(args.since * 1e9)
    try:
        data = read_analysis_input(store, start_ns, now_ns, window_s=args.window)
    finally:
        store.close()
    frame, jobs = data.frame, data.jobs
    from gpuwatt.store.job_steps import open_job_step_store

    steps_store = open_job_step_store(store_url_of(args, config))
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
