"""Stragglers: ranked, explained, and plotted against their peers on the convicting signals."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
import numpy as np
import pandas as pd
from dash import dcc

from gpuwatt.analytics import Straggler
from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.components import data_table, graph, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.figures import LABELS, band_figure
from gpuwatt.dashboard.timerange import fmt_ns
from gpuwatt.precision import fixed

PAGE = "stragglers"
PATH = "/stragglers"
NAME = "Stragglers"
#: The content is drawn from the view's window, range and query alone (``render_cache``).
RENDERS_FROM_WINDOW = True
ORDER = 2
STRAGGLER_BANNER = False  # the page lists them
MAX_PLOTTED = 5
#: The signals a straggler is judged on, plotted against its peers.
SIGNALS: tuple[str, ...] = ("sm_clock_mhz", "temperature_gpu_c", "utilization_gpu_pct", "power_w")


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


Band = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def peer_bands(sw: pd.DataFrame, s: Straggler, metrics: list[str]) -> dict[str, Band]:
    """Per metric: the windows, the GPU's own values, and its peers' median, p10 and p90 per
    window. The peer group is selected and grouped once for all the metrics (one at a time,
    the 4 plots of a straggler cost ~80 ms of a cold 6 h page at 1,024 GPUs)."""
    group = sw.loc[sw["peer_group"] == s.peer_group]
    mine = (group["uuid"] == s.uuid).to_numpy()
    own = group.loc[mine].set_index("window_start_ns")[metrics]
    peers = group.loc[~mine].groupby("window_start_ns")[metrics]
    median, p10, p90 = peers.median(), peers.quantile(0.1), peers.quantile(0.9)
    out: dict[str, Band] = {}
    for metric in metrics:
        stats = pd.DataFrame({"median": median[metric], "p10": p10[metric], "p90": p90[metric]})
        stats = stats.join(own[metric].rename("own"), how="outer").sort_index()
        out[metric] = (
            stats.index.to_numpy(),
            stats["own"].to_numpy(dtype=float),
            stats["median"].to_numpy(dtype=float),
            stats["p10"].to_numpy(dtype=float),
            stats["p90"].to_numpy(dtype=float),
        )
    return out


def evidence_table(s: Straggler) -> Any:
    rows = [
        (key.replace("_", " "), fmt.plain(value))
        for key, value in s.evidence.items()
        if value is not None and np.isfinite(value)
    ]
    return data_table((), rows, fz="xs", striped=True, withTableBorder=True)


def straggler_block(s: Straggler, ctx: PageContext, plot: bool) -> Any:
    cause = s.cause.replace("_", " ") + (
        " (inferred from temperature/power)" if s.cause_inferred else ""
    )
    head = dmc.Group(
        [
            dmc.Badge(s.severity, color="red" if s.severity == "critical" else "orange"),
            dmc.Title(f"{s.host} GPU {s.gpu_index}", order=4, className="straggler-name"),
            dmc.Text(
                f"{cause} · score {fixed(s.score, 2)} · {s.signature} · "
                f"{'active' if s.active else 'ended'} · since {fmt_ns(s.onset_ns)} UTC · "
                f"{s.windows_anomalous} windows · peers: {s.peer_group}",
                size="sm",
                c="dimmed",
            ),
            dcc.Link("drill down", href=ctx.link("/node", host=s.host, gpu=str(s.gpu_index))),
        ],
        gap="sm",
    )
    children: list[Any] = [
        head,
        dmc.Text(s.explanation, className="straggler-explanation", my="xs"),
    ]
    if s.peers_waiting_energy_j:
        children.append(
            dmc.Text(
                "Energy its peers spent waiting for it: "
                f"{fmt.energy_kwh(s.peers_waiting_energy_j / 3.6e6)} (estimate)",
                size="sm",
            )
        )
    if plot:
        sw = ctx.win.straggler_windows(s)
        figs = []
        bands = peer_bands(sw, s, [m for m in SIGNALS if m in sw.columns])
        for metric, (x, own, med, lo, hi) in bands.items():
            name, unit = LABELS[metric]
            band = band_figure(
                x,
                own,
                med,
                lo,
                hi,
                title=name,
                own_name=f"GPU {s.gpu_index}",
                unit=unit,
                step_s=ctx.range.step_s,
            )
            figs.append(graph(band, zoom=True))
        children.append(dmc.SimpleGrid(figs, cols={"base": 1, "md": 2}, spacing="xs"))
    children.append(
        dmc.Accordion(
            dmc.AccordionItem(
                [dmc.AccordionControl("evidence"), dmc.AccordionPanel(evidence_table(s))],
                value="evidence",
            )
        )
    )
    return section("", *children)


def render(ctx: PageContext) -> list[Any]:
    found = ctx.win.stragglers
    if not found:
        return [
            dmc.Alert(
                "Every busy GPU kept pace with its peers in this range.",
                title="No straggler in this range",
                color="green",
                id="no-stragglers",
            )
        ]
    out: list[Any] = [
        dmc.Text(
            f"{len(ctx.win.active_stragglers)} active, {len(found)} in range. A GPU is flagged "
            "after several consecutive windows clearly slower than the median of its peers.",
            size="sm",
            mb="sm",
        )
    ]
    for i, st in enumerate(found):
        out.append(straggler_block(st, ctx, plot=i < MAX_PLOTTED))
    return out
