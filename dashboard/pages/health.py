"""Hardware health of the cluster now: every GPU's newest sample checked for what needs a person
(lost or silent, uncorrectable ECC, row remapping pending or failed, a hardware throttle reason,
hot) and the XIDs it raised in the range (from every sample: a collector puts an XID in the one
sample after it), a temperature map of node x GPU, and a table of the GPUs with a problem first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dash_mantine_components as dmc
import pandas as pd

from gpuwatt.analytics.reasons import BITS, FAULT_FRACTIONS, LABELS
from gpuwatt.dashboard.components import graph, kpi, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.figures import node_gpu_heatmap
from gpuwatt.dashboard.grid import (
    link_column,
    md_link,
    number_column,
    si_column,
    sortable_table,
    text_column,
)
from gpuwatt.dashboard.timerange import NS_PER_S, TimeRange
from gpuwatt.dashboard.window_data import SILENT_AFTER_S
from gpuwatt.model import GpuSample
from gpuwatt.status import natural_key
from gpuwatt.store.base import XID_ATTR, xid_codes

PAGE = "health"
PATH = "/health"
NAME = "Health"
ORDER = 5
#: A GPU at or above this temperature is "hot" (H100/A100 slow down from about 85-87 °C).
HOT_C = 85
#: Rows of the table: every GPU with a problem, then the hottest others up to this many.
MAX_ROWS = 64


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


@dataclass(frozen=True)
class GpuHealth:
    sample: GpuSample
    problems: list[str]
    xids: tuple[int, ...] = ()  # the codes raised in the range, in time order (0: not kept)

    @property
    def last_xid(self) -> int | None:
        return self.xids[-1] if self.xids and self.xids[-1] else None

    @property
    def severity(self) -> int:
        """0 ok, 1 warning, 2 needs action now."""
        if not self.problems:
            return 0
        urgent = ("lost", "silent", "XID", "uncorrectable ECC", "row remapping failed")
        return 2 if any(p.startswith(urgent) for p in self.problems) else 1


def throttle_now(reasons: int | None) -> list[str]:
    """The hardware (fault) clock-event reasons set in a bitmask."""
    if reasons is None:
        return []
    return [LABELS[f] for f in FAULT_FRACTIONS if int(reasons) & BITS[f]]


def check(s: GpuSample, now_ns: int, xids: list[int] | None = None) -> GpuHealth:
    """``s``'s problems; ``xids``: the codes the GPU raised in the range (None: the store keeps
    no XID events, the newest sample's)."""
    problems: list[str] = []
    if s.lost:
        problems.append("lost (fell off the bus)")
    elif (now_ns - s.time_ns) / NS_PER_S > SILENT_AFTER_S:
        problems.append("silent (no recent sample)")
    raised = tuple(s.xid_errors) if xids is None else tuple(xids)
    if raised:
        codes = (str(c) if c else "? (code not kept)" for c in dict.fromkeys(raised))
        problems.append(f"XID {', '.join(codes)}")
    if s.ecc_dbe_volatile_count:
        problems.append(f"uncorrectable ECC errors: {s.ecc_dbe_volatile_count}")
    if s.remapped_rows_failure:
        problems.append("row remapping failed")
    if s.remapped_rows_pending:
        problems.append("row remapping pending (reset)")
    problems += [f"throttled: {r}" for r in throttle_now(s.clock_event_reasons)]
    if s.temperature_gpu_c is not None and s.temperature_gpu_c >= HOT_C:
        problems.append(f"hot ({s.temperature_gpu_c} °C)")
    return GpuHealth(s, problems, raised)


def health_table(ctx: PageContext, checked: list[GpuHealth]) -> Any:
    def temp(h: GpuHealth) -> float:
        t = h.sample.temperature_gpu_c
        return float(t) if t is not None else -1.0

    bad = sorted((h for h in checked if h.problems), key=lambda h: (-h.severity, -temp(h)))
    rest = sorted((h for h in checked if not h.problems), key=lambda h: -temp(h))
    shown = (bad + rest)[: max(MAX_ROWS, len(bad))]
    rows = []
    for h in shown:
        s = h.sample
        rows.append(
            {
                "gpu": md_link(
                    f"{s.host} GPU {s.gpu_index}",
                    ctx.link("/node", host=s.host, gpu=str(s.gpu_index)),
                ),
                "state": "; ".join(h.problems) or "ok",
                "temp": s.temperature_gpu_c,
                "fan": s.fan_speed_pct,
                "power": s.power_w,
                "limit": s.power_limit_w,
                "sbe": s.ecc_sbe_volatile_count,
                "dbe": s.ecc_dbe_volatile_count,
                "sbe_life": s.ecc_sbe_aggregate_count,
                "dbe_life": s.ecc_dbe_aggregate_count,
                "remap_c": s.remapped_rows_correctable,
                "remap_u": s.remapped_rows_uncorrectable,
                "xid": h.last_xid,
                "job": s.job_id or "",
            }
        )
    columns = [
        link_column("gpu", "GPU"),
        text_column("state", "state"),
        number_column("temp", "temp. °C", "d"),
        number_column("fan", "fan %", "d"),
        si_column("power", "power", "W"),
        si_column("limit", "limit", "W"),
        number_column("sbe", "ECC SBE", "d"),
        number_column("dbe", "ECC DBE", "d"),
        number_column("sbe_life", "ECC SBE (lifetime)", "d"),
        number_column("dbe_life", "ECC DBE (lifetime)", "d"),
        number_column("remap_c", "remapped (corr.)", "d"),
        number_column("remap_u", "remapped (uncorr.)", "d"),
        number_column("xid", "last XID", "d"),
        text_column("job", "job"),
    ]
    note = (
        f"{len(bad)} GPUs with a problem"
        + (f", then the hottest others: {len(shown)} of {len(checked)} GPUs." if rest else ".")
        + " ECC counts: volatile (since the last driver load) and lifetime (NVML's aggregate "
        "counts); both sampled once a minute."
    )
    return dmc.Stack(
        [
            dmc.Text(note, size="xs", c="dimmed"),
            sortable_table(columns, rows, "health-table"),
        ],
        gap=4,
    )


#: The newest values the page shows (``check`` and ``health_table``), beside each GPU's state:
#: a third of a whole sample's metrics (on InfluxDB, ``SELECT *`` of every GPU's newest point
#: was most of the page's engine CPU).
NEWEST_SHOWN = (
    "temperature_gpu_c", "fan_speed_pct", "power_w", "power_limit_w", "clock_event_reasons",
    "ecc_sbe_volatile_count", "ecc_dbe_volatile_count", "ecc_sbe_aggregate_count",
    "ecc_dbe_aggregate_count", "remapped_rows_correctable", "remapped_rows_uncorrectable",
    "remapped_rows_pending", "remapped_rows_failure", XID_ATTR,
)  # fmt: skip


def prefetch(data: DashboardData, tr: TimeRange, query: dict[str, str], now_ns: int) -> None:
    """Start the reads the page makes after the window (``app.render_page``): the newest values
    it shows of every GPU, which the view takes the GPUs seen from
    (``DashboardData.read_newest``), then their ECC figures, and the range's XIDs."""
    data.read_newest(NEWEST_SHOWN)
    data.prefetch(lambda: data.latest_with_slow_fields(NEWEST_SHOWN))
    data.prefetch(lambda: data.host_xids(tr, None))


def render(ctx: PageContext) -> list[Any]:
    newest = ctx.data.latest_with_slow_fields(NEWEST_SHOWN)
    samples = sorted(newest, key=lambda s: (natural_key(s.host), s.gpu_index))
    raised = xid_codes(ctx.data.host_xids(ctx.range, None))
    checked = [
        check(s, ctx.now_ns, None if raised is None else raised.get((s.host, s.gpu_index), []))
        for s in samples
    ]
    count = {k: sum(1 for h in checked if h.severity == k) for k in (0, 1, 2)}
    kinds = {
        "XID": sum(1 for h in checked if any(p.startswith("XID") for p in h.problems)),
        "ECC": sum(1 for h in checked if any("ECC" in p for p in h.problems)),
        "throttled": sum(1 for h in checked if any(p.startswith("throttled") for p in h.problems)),
        "hot": sum(1 for h in checked if any(p.startswith("hot") for p in h.problems)),
    }
    kpis = dmc.SimpleGrid(
        [
            kpi("Healthy", f"{count[0]} / {len(checked)}", "GPUs with no problem now."),
            kpi(
                "Need action",
                str(count[2]),
                "Lost or silent, an XID event, uncorrectable ECC errors, or failed row "
                "remapping: drain the GPU or its node.",
                color="red" if count[2] else None,
                id_="kpi-need-action",
            ),
            kpi(
                "Warnings",
                str(count[1]),
                "A hardware throttle reason set, row remapping pending, or hot.",
                color="orange" if count[1] else None,
            ),
            kpi(
                "Throttled / hot",
                f"{kinds['throttled']} / {kinds['hot']}",
                f"Hardware slowdown, thermal slowdown or power brake now / at or above {HOT_C} °C.",
            ),
        ],
        cols={"base": 2, "sm": 4},
        spacing="sm",
        mb="md",
    )
    temps = pd.DataFrame(
        {
            "host": [s.host for s in samples],
            "gpu_index": [s.gpu_index for s in samples],
            "temperature_gpu_c": [
                float(s.temperature_gpu_c) if s.temperature_gpu_c is not None else float("nan")
                for s in samples
            ],
        }
    )
    marked = [(h.sample.host, h.sample.gpu_index) for h in checked if h.severity]
    heat = node_gpu_heatmap(temps, "temperature_gpu_c", marked, mark_label="problem")
    return [
        kpis,
        section(
            "GPUs",
            health_table(ctx, checked),
            help_text="From each GPU's newest sample; ECC and remapped rows, sampled once a "
            "minute, from its newest sample that has them; XIDs: every one raised in the range. "
            "Click a GPU for its fan, PCIe/NVLink, ECC and throttle history.",
        ),
        section(
            "Temperature now, node x GPU",
            graph(heat, "health-heatmap"),
            help_text="Red rings: GPUs with a problem.",
        ),
    ]
