"""``gpuwatt collect`` (the collector service, composed here) and ``gpuwatt spool``."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatt.cli.common import EXIT_ERROR, EXIT_OK, load_scenario, log, spool_dir_of, store_url_of
from gpuwatt.config import Config, load_config
from gpuwatt.errors import GpuwattError
from gpuwatt.model import GpuSample

if TYPE_CHECKING:
    from gpuwatt.collector.runtime import SampleSource


def cmd_collect(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    interval_s = args.interval or config.collector.interval_s
    if interval_s <= 0:
        raise GpuwattError("--interval must be positive")
    scenario = load_scenario(args.simulate) if args.simulate else None
    store_url = store_url_of(args, config)
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
        sources = [JobAttributingSource(sampler, resolver, proc_root=config.collector.proc_root)]
    store = open_store(store_url, timeout_s=config.store_timeout_s)
    if getattr(store, "read_only", False):
        store.close()
        raise GpuwattError(
            f"{redact_url(store_url)} takes no writes: Prometheus scrapes instead; run "
            "`gpuwatt collect --metrics-port PORT` and add it to Prometheus' scrape targets"
        )
    spool_dir = spool_dir_of(args, config, "spool")
    return run_collector(
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


def run_collector(
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


def cmd_spool(args: argparse.Namespace) -> int:
    """``gpuwatt spool status|replay``: lines the store refused are kept aside with their reason
    (``collector.delivery``); replay sends them again and keeps only those refused again."""
    config = load_config(args.config)
    from gpuwatt.collector.delivery import SetAside
    from gpuwatt.collector.runtime import REJECTED_DIR
    from gpuwatt.collector.spool import Spool

    spool_dir = spool_dir_of(args, config, "spool")
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

        store = open_store(store_url_of(args, config), timeout_s=config.store_timeout_s)
        try:
            delivered, kept = aside.replay(store)
        finally:
            store.close()
        print(f"replayed {delivered} samples; {kept} refused again, kept in {aside.directory}")
        return EXIT_OK if kept == 0 else EXIT_ERROR
    finally:
        spool.close()
