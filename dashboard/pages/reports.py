"""Reports: CSV per GPU, node or job for the chosen range, and series exports (streamed)."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
import numpy as np
import pandas as pd
from dash import html

from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.components import data_table, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.csv_export import GROUPINGS, build_report, report_by_job
from gpuwatt.dashboard.timerange import to_search

PAGE = "reports"
PATH = "/reports"
NAME = "Reports"
#: The content is drawn from the view's window, range and query and from the job-step source's
#: results for the window (``render_cache``).
RENDERS_FROM_WINDOW = RENDERS_FROM_WORK = True
ORDER = 5
PREVIEW_ROWS = 20


def layout(**query: str) -> Any:
    by = query.get("by") if query.get("by") in GROUPINGS else "gpu"
    picker = dmc.SegmentedControl(id="report-by", data=list(GROUPINGS), value=by, mb="sm")
    return page_frame(PAGE, NAME, query, dmc.Group([dmc.Text("group by", size="sm"), picker]))


def _download_query(ctx: PageContext, **extra: str) -> str:
    keep = {k: v for k, v in ctx.query.items() if k in ("range", "from", "to", "end")}
    keep.update(extra)
    return to_search(keep)


def preview_frame(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The preview's columns: those with a value in some row (an empty column, e.g.
    ``alerts_count`` with no alert history, is named under the table instead), UUIDs
    shortened to their first group (the CSV has them whole)."""
    empty = [str(c) for c in table.columns if table[c].isna().all() or (table[c] == "").all()]
    shown = table.drop(columns=empty)
    if "uuid" in shown.columns:
        shown = shown.assign(uuid=shown["uuid"].astype(str).str.slice(0, 12) + "…")
    return shown, empty


def _cell(value: Any) -> str:
    if isinstance(value, float | np.floating):
        return fmt.plain(value, 4)
    return "" if value is None else str(value)


def render(ctx: PageContext) -> list[Any]:
    asked = ctx.query.get("by") or "gpu"
    by = asked if asked in GROUPINGS else "gpu"
    # the preview is the download's table (by job: with the jobs page's columns)
    table = report_by_job(ctx.win, ctx.work) if by == "job" else build_report(ctx.win.summary, by)
    shown, left_out = preview_frame(table.head(PREVIEW_ROWS))
    preview = data_table(
        shown.columns,
        ([_cell(v) for v in row] for row in shown.itertuples(index=False, name=None)),
        id_="report-preview",
        fz="xs",
        striped=True,
        className="gw-nowrap",
    )
    links = dmc.Group(
        [
            html.A(
                f"report by {by} (CSV)",
                href="/download/report.csv" + _download_query(ctx, by=by),
                id="download-report",
                download="",
            ),
            html.A(
                "series, 1-minute means (CSV)",
                href="/download/series.csv" + _download_query(ctx, step="60"),
                id="download-series",
                download="",
            ),
            html.A(
                "series, raw samples (CSV)",
                href="/download/series.csv" + _download_query(ctx, step="raw"),
                id="download-raw",
                download="",
            ),
        ],
        gap="lg",
        mb="sm",
    )
    note = (
        f"{len(table)} rows; showing {min(len(table), PREVIEW_ROWS)}. Units are in the column "
        "names; text cells that a spreadsheet would run as a formula are prefixed with '."
    )
    if left_out:
        note += f" Columns empty in this range, in the CSV only: {', '.join(left_out)}."
    return [
        section("Download", links, dmc.Text(note, size="xs", c="dimmed")),
        section(
            f"Preview, by {by}",
            dmc.ScrollArea(preview),
        ),
    ]
