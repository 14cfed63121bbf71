"""The newest sample of every GPU on a Prometheus-compatible engine (``PromStore.latest``):
each metric's newest value within the lookback, and each GPU's newest sample time."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from gpuwatt.model import GpuSample, GpuSeen
from gpuwatt.store import promql_frames as frames
from gpuwatt.store.promql_dialects import NS_PER_MS, promql_string, regex_alternatives

if TYPE_CHECKING:
    from gpuwatt.store.promql import PromStore


def latest(
    store: PromStore,
    *,
    since_ns: int | None = None,
    now_ns: int | None = None,
    hosts: Sequence[str] | None = None,
    attrs: Sequence[str] | None = None,
) -> list[GpuSample]:
    """``PromStore.latest``: the newest value of each metric (of ``attrs``; None: all) of every
    GPU (of ``hosts``; None: every host) seen since ``since_ns`` (default: the store's last
    ``latest_lookback_s``). Lost GPUs are marked whatever ``attrs``."""
    now = store.clock_ns() if now_ns is None else now_ns
    lookback_ns = round(store.latest_lookback_s * 1e9)
    since = now - lookback_ns if since_ns is None else since_ns
    window = f"[{max(1, (now - since) // NS_PER_MS)}ms]"
    names = store.dialect.by_attr()
    asked = None if attrs is None else [*attrs, "lost"]
    presence = store._selector(store.dialect.presence, hosts)
    info = _info_of(store, window, now - since, hosts, now)
    if store.engine == "victoriametrics" and not any("|" in s.metric for s in names.values()):
        # the newest values of the last minutes first (a reporting GPU's are there), then
        # those older than that, asked only where the first answer lacks them
        narrow = f"[{max(1, min(now - since, LATEST_NARROW_NS) // NS_PER_MS)}ms]"
        pending = store._pool.submit(_latest_at_once, store, narrow, now, attrs=asked, hosts=hosts)
        times = store.query(_sample_times(store, window, now - since, hosts), now)
        results = pending.result()
        if narrow != window:
            _latest_older(store, results, times, window, now, hosts)
        return frames.latest_samples(store.dialect, times, results, _answer(info))
    times = store.query(_sample_times(store, window, now - since, hosts), now)
    queries = [(a, f"last_over_time({store._selector(s.metric, hosts)}{window})")
               for a, s in names.items() if attrs is None or a in attrs]  # fmt: skip
    if store.dialect.lost_metric and store.dialect.lost_metric != store.dialect.presence:
        queries.append(
            (
                "lost",
                f"last_over_time({store._selector(store.dialect.lost_metric, hosts)}{window})",
            )
        )
    results = dict(store._pool.map(lambda q: (q[0], store.query(q[1], now)), queries))
    if store.dialect.lost_metric is not None:  # the presence metric itself marks lost GPUs
        results["lost"] = store.query(f"last_over_time({presence}{window})", now)
    return frames.latest_samples(store.dialect, times, results, _answer(info))


def _info_of(
    store: PromStore, window: str, lookback_ns: int, hosts: Sequence[str] | None, now_ns: int
) -> Future[list[dict[str, Any]]] | None:
    """The newest time of each series of the dialect's info metric (None: it has none), asked
    beside the other queries: its labels name each GPU's job at its newest sample."""
    info = store.dialect.info
    if info is None:
        return None
    return store._pool.submit(
        store.query, _sample_times(store, window, lookback_ns, hosts, metric=info), now_ns
    )


def _answer(pending: Future[list[dict[str, Any]]] | None) -> list[dict[str, Any]] | None:
    return None if pending is None else pending.result()


def gpus_seen(
    store: PromStore, *, since_ns: int | None = None, now_ns: int | None = None
) -> list[GpuSeen]:
    """``PromStore.gpus_seen``: the GPUs ``latest`` gives, from its sample-times query alone
    (one series per GPU; at 1,024 GPUs on VictoriaMetrics ~20 against ~180 ms of the engine's
    CPU for every metric's newest value, ``bench/dashboard.py --store victoriametrics``)."""
    now = store.clock_ns() if now_ns is None else now_ns
    since = now - round(store.latest_lookback_s * 1e9) if since_ns is None else since_ns
    window = f"[{max(1, (now - since) // NS_PER_MS)}ms]"
    info = _info_of(store, window, now - since, None, now)
    times = store.query(_sample_times(store, window, now - since, None), now)
    return frames.seen_gpus(store.dialect, times, _answer(info))


def _latest_metrics(store: PromStore) -> dict[str, str]:
    """``latest``'s metric per attribute (and ``lost``: the lost-GPU marker's)."""
    out = {a: s.metric for a, s in store.dialect.by_attr().items()}
    if store.dialect.lost_metric:
        out["lost"] = store.dialect.lost_metric
    return out


def _latest_at_once(
    store: PromStore, window: str, now_ns: int, *, attrs: Sequence[str] | None = None,
    hosts: Sequence[str] | None = None
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """``latest``'s newest value of every metric (of ``attrs``; None: all) in one query
    (VictoriaMetrics keeps the metric names with ``keep_metric_names``), split per attribute
    as ``latest_samples`` takes them: one answer instead of a query per metric (~45, most
    for metrics no GPU has)."""
    by_attr = _latest_metrics(store)
    if attrs is not None:
        by_attr = {a: m for a, m in by_attr.items() if a in attrs}
    metrics = sorted(set(by_attr.values()))
    if not metrics:
        return {}
    matchers = ["__name__=~" + promql_string(regex_alternatives(metrics))]
    if hosts is not None:
        pattern = regex_alternatives(hosts) if hosts else "$^"
        matchers.append(f"{store.dialect.host}=~{promql_string(pattern)}")
    sel = "{" + ", ".join(matchers) + "}"
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for r in store.query(f"last_over_time({sel}{window}) keep_metric_names", now_ns):
        by_metric.setdefault(r["metric"].get("__name__", ""), []).append(r)
    return {a: by_metric.get(m, []) for a, m in by_attr.items()}


def _latest_older(
    store: PromStore,
    results: dict[str, list[dict[str, Any]]],
    times: list[dict[str, Any]],
    window: str,
    now_ns: int,
    scope: Sequence[str] | None = None,
) -> None:
    """Complete ``results`` (newest values within the last minutes) with the newest values
    within ``window`` where they lack a GPU's (of ``times``: every GPU seen in it): a GPU
    silent for longer (a lost node), a metric measured less often. A metric no GPU has in
    the last minutes is asked for every GPU (of the hosts ``scope``: None, all); the others
    only for the hosts of the GPUs that lack them. Each value kept is the one a single query
    over ``window`` gives."""
    host, index, uuid, model = (
        store.dialect.host, store.dialect.index, store.dialect.uuid, store.dialect.model
    )  # fmt: skip

    def key(r: dict[str, Any]) -> tuple[str | None, ...]:
        m = r["metric"]
        return (m.get(host), m.get(index), m.get(uuid), m.get(model))

    gpus = {key(r): r["metric"].get(store.dialect.host, "") for r in times}
    if not gpus:
        return
    lacking = {a: set(gpus) - {key(r) for r in rs} for a, rs in results.items()}
    absent = [a for a, rs in results.items() if not rs]
    partial = [a for a, rs in results.items() if rs and lacking[a]]
    asks: list[tuple[list[str], list[str] | None]] = []
    if absent:
        asks.append((absent, None if scope is None else list(scope)))
    if partial:
        hosts = sorted({gpus[g] for a in partial for g in lacking[a]})
        asks.append((partial, hosts))
    for ask_attrs, ask_hosts in asks:
        older = _latest_at_once(store, window, now_ns, attrs=ask_attrs, hosts=ask_hosts)
        for a, rs in older.items():
            results[a] = results[a] + [r for r in rs if key(r) in lacking[a]]


def _sample_times(
    store: PromStore,
    window: str,
    lookback_ns: int,
    hosts: Sequence[str] | None,
    *,
    metric: str | None = None,
) -> str:
    """PromQL for each GPU's (of ``hosts``; None: all) newest sample time (Unix seconds)
    within ``window``, per series of the presence metric (or of ``metric``)."""
    if store.dialect.sample_time is not None and metric is None:
        sel = store._selector(store.dialect.sample_time, hosts)
        return f"last_over_time({sel}{window})"
    presence = store._selector(metric or store.dialect.presence, hosts)
    if store.engine == "victoriametrics":
        return f"tlast_over_time({presence}{window})"
    # Prometheus: the newest timestamp() seen by a subquery. Its resolution stays within the
    # 5-minute lookback for up to ~1.7 days; beyond that a GPU silent for that long may be
    # missed, which only drops GPUs that are long gone.
    resolution_s = max(15, -(-lookback_ns // (10_000 * 1_000_000_000)))
    return f"last_over_time(timestamp({presence})[{window[1:-1]}:{resolution_s}s])"


#: ``latest`` on VictoriaMetrics asks for the newest values of this last span first: a
#: reporting GPU's are there. Its cost is mostly the series it answers (1,024 GPUs: ~12,000),
#: but a window of an hour costs ~1.4x one of a few minutes (``bench/dashboard.py --store
#: victoriametrics``); a GPU silent for longer, or a metric measured less often, is asked again
#: over the whole lookback, for the hosts that lack it (``_latest_older``).
LATEST_NARROW_NS = 300 * 1_000_000_000
