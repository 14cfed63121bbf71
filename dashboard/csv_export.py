"""CSV reports and series exports: built from the analytics summary, streamed by a server route.

Reports (``build_report``) have one row per GPU, node or job with units in the column names
(``energy_kwh``, ``utilization_mean_pct``, ``cost_EUR``...). Every text cell that a spreadsheet
would run as a formula (starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return) is
prefixed with ``'`` (OWASP's CSV-injection advice). Numbers are written as numbers: a negative
number is data, not a formula.

Exports stream from a Flask route (``/download/report.csv``, ``/download/series.csv``), chunk by
chunk, instead of travelling inside one Dash callback response (``dcc.Download`` holds the whole
file in the browser's memory and breaks past ~512 MB).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from gpuwatt.analytics import AnalysisSummary
from gpuwatt.analytics import Quality as Q
from gpuwatt.analytics.by_model import by_model
from gpuwatt.analytics.findings import Finding, findings
from gpuwatt.analytics.quality import worst
from gpuwatt.dashboard.data import DashboardData, DataError, WindowData
from gpuwatt.dashboard.job_report import extra_columns, with_extra_columns
from gpuwatt.dashboard.jobs import job_rows
from gpuwatt.dashboard.timerange import NS_PER_S, TimeRange, parse_range, query_dict
from gpuwatt.dashboard.work_data import JobWorkSource
from gpuwatt.precision import settled
from gpuwatt.schema import FIELD_BY_ATTR

GROUPINGS: tuple[str, ...] = ("gpu", "node", "job", "model")
NA = Q.NOT_AVAILABLE.value
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
SERIES_CHUNK_S = 3600
#: Fields of the series export (model attribute names: the unit is in the name).
SERIES_FIELDS: tuple[str, ...] = (
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "memory_used_bytes",
    "temperature_gpu_c",
    "power_w",
    "energy_j",
    "sm_clock_mhz",
    "clock_event_reasons",
    "tensor_active_pct",
    "tflops_estimate",
)


def neutralise(value: Any) -> Any:
    """A text cell that would start a formula gets a leading apostrophe; others pass through."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float | np.floating):
        # settled as every figure is (``gpuwatt.precision``): the page's digits, on any store
        return "" if not math.isfinite(value) else settled(float(value))
    if isinstance(value, np.integer):
        return int(value)
    return neutralise(str(value)) if not isinstance(value, int | float) else value


def _window_counts(summary: AnalysisSummary) -> tuple[pd.Series, pd.Series]:
    """Per GPU: seconds seen, and seconds in windows where it was a (persistent) straggler
    (docs/accounting.md: seen time, to the second, clipped to the range)."""
    g = summary.energy_by_gpu
    if g.empty or "seen_s" not in g.columns:
        return pd.Series(dtype=float), pd.Series(dtype=float)
    key = _gpu_key(g)
    return (
        pd.Series(g["seen_s"].to_numpy(dtype=float), index=key),
        pd.Series(g["straggler_s"].to_numpy(dtype=float), index=key),
    )


def _gpu_key(table: pd.DataFrame) -> pd.Series:
    return table["gpu"] if "gpu" in table.columns else table["uuid"]


def build_report(
    summary: AnalysisSummary,
    by: str,
    *,
    alert_counts: Callable[[str, str], int | None] | None = None,
    job_work_windows: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per GPU, node or job over the summary's range. Units are in the column names.

    Energy, cost and CO2 are the analytics engine's own per-GPU/node/job figures; GPU-hours
    are the time each GPU was seen in the range; straggler minutes the seen time in windows in
    which the GPU was flagged as a persistent straggler. ``alert_counts(by, key)`` fills
    ``alerts_count`` once an alert history exists (empty cells until then). Every figure has
    a ``..._quality`` column saying how it was obtained (``report_qualities``).
    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}")
    if by == "model":  # heterogeneous clusters: gpuwatt.analytics.by_model
        return by_model(summary, job_work_windows=job_work_windows)
    cur = summary.tariff.currency or "currency"
    cost_col = f"cost_{cur}"
    per_gpu = summary.energy_by_gpu
    if per_gpu.empty:
        return pd.DataFrame(columns=_columns(by, cost_col))
    seen, flagged = _window_counts(summary)
    g = per_gpu.copy()
    key = _gpu_key(g)
    g["gpu_hours_h"] = key.map(seen).fillna(0).to_numpy() / 3600.0
    if "gpu_share" in g.columns:  # a MIG device: its share of the GPU's time (accounting.md)
        g["gpu_hours_h"] *= g["gpu_share"].fillna(1.0).to_numpy(dtype=float)
    g["straggler_minutes_min"] = key.map(flagged).fillna(0).to_numpy() / 60.0
    g["tf_power_w"] = np.where(g["tflops_mean"].notna(), g["power_mean_w"], np.nan)
    if by == "gpu":
        out = g.sort_values(["host", "gpu_index"], kind="stable")
        # the GPU's findings, as the CLI, the dashboard and the alerts have them
        found: dict[str, list[Finding]] = {}
        for f in findings(summary):
            found.setdefault(f.uuid, []).append(f)
        for col in ("finding", "cause", "severity"):
            out[col] = [
                "; ".join(getattr(f, col) for f in found.get(str(u), [])) for u in out["uuid"]
            ]
    else:
        gkey = "host" if by == "node" else "job_id"
        src = summary.energy_by_node if by == "node" else summary.energy_by_job
        if by == "job":
            g = g.loc[g["job_id"].notna()]
        elif "mig" in g.columns:  # a node's GPU time is its whole GPUs': devices are inside
            g = g.loc[~g["mig"].to_numpy(dtype=bool)]
        if g.empty or src.empty:
            return pd.DataFrame(columns=_columns(by, cost_col))
        grp = g.groupby(gkey, sort=True)
        agg = pd.DataFrame(
            {
                "gpu_hours_h": grp["gpu_hours_h"].sum(),
                "straggler_minutes_min": grp["straggler_minutes_min"].sum(),
                "tflops_sum": grp["tflops_mean"].sum(min_count=1),
                "tf_power_w": grp["tf_power_w"].sum(min_count=1),
            }
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            agg["tflops_per_w"] = agg["tflops_sum"] / agg["tf_power_w"].where(agg["tf_power_w"] > 0)
        # a group's TFLOPS/W is the sum over the members with an estimate: their labels
        agg["tflops_quality"] = grp["tflops_quality"].agg(
            lambda s: worst([Q(q) for q in s if q != NA]).value
        )
        out = src.set_index(gkey).join(agg, how="left").reset_index()
    out = out.assign(
        energy_kwh=out["energy_j"] / 3.6e6,
        idle_energy_kwh=out["idle_energy_j"] / 3.6e6,
        utilization_mean_pct=out["utilization_mean_pct"],
    )
    out[cost_col] = out["cost"] if "cost" in out.columns else np.nan
    if alert_counts is not None:
        keycol = {"gpu": "uuid", "node": "host", "job": "job_id"}[by]
        out["alerts_count"] = [alert_counts(by, str(k)) for k in out[keycol]]
    else:
        out["alerts_count"] = None
    for column, quality in report_qualities(out, summary, cost_col).items():
        out[column] = quality
    for column, label in QUALITY_COLUMNS.items():  # no figure, no label but "not available"
        column = cost_col if column == "cost" else column
        if column in out.columns and label in out.columns:
            empty = pd.to_numeric(out[column], errors="coerce").isna().to_numpy()
            out.loc[empty, label] = NA
    return out[_columns(by, cost_col)].reset_index(drop=True)


def report_by_job(win: WindowData, work: JobWorkSource | None = None) -> pd.DataFrame:
    """The report by job with the jobs page's columns after its own (reported TFLOPS, MFU,
    stragglers, idle GPU-hours, requests served, verdict): what ``gpuwatt report --by job``
    writes and the dashboard's ``/download/report.csv?by=job`` serves."""
    table = build_report(win.summary, "job")
    rows = job_rows(win.summary, win.stragglers, work.work(win) if work else ())
    return with_extra_columns(table, extra_columns(rows, work.served(win) if work else {}))


#: Each figure column of a report and the column holding its quality label.
QUALITY_COLUMNS: dict[str, str] = {
    "gpu_hours_h": "gpu_hours_quality",
    "utilization_mean_pct": "utilization_quality",
    "energy_kwh": "energy_quality",
    "idle_energy_kwh": "idle_energy_quality",
    "cost": "cost_quality",
    "co2_kg": "co2_quality",
    "tflops_per_w": "tflops_quality",
    "straggler_minutes_min": "straggler_minutes_quality",
    "alerts_count": "alerts_quality",
}


def report_qualities(
    out: pd.DataFrame, summary: AnalysisSummary, cost_col: str
) -> dict[str, object]:
    """The quality label of every figure column not labelled yet, from how it is computed:
    seen time and utilisation are read as measured; idle energy, cost and CO2 inherit
    energy's label (cost and CO2 are not available without a price or intensity); straggler
    minutes are a detector's verdict over measured inputs (a model estimate); alert counts
    come from the alert history when there is one."""
    n = len(out)
    energy = out["energy_quality"] if "energy_quality" in out else pd.Series([NA] * n)
    measured = np.where(out["gpu_hours_h"].to_numpy(dtype=float) > 0, Q.MEASURED.value, NA)
    util = out["utilization_mean_pct"].to_numpy(dtype=float)
    tariff = summary.tariff

    def priced(available: bool) -> np.ndarray:
        return energy.to_numpy(dtype=object) if available else np.full(n, NA, dtype=object)

    alerts = out["alerts_count"].to_numpy(dtype=object)
    return {
        "gpu_hours_quality": measured,
        "utilization_quality": np.where(np.isfinite(util), Q.MEASURED.value, NA),
        "idle_energy_quality": energy.to_numpy(dtype=object),
        "cost_quality": priced(tariff.price_per_kwh is not None),
        "co2_quality": priced(tariff.carbon_g_per_kwh is not None),
        "straggler_minutes_quality": np.where(
            out["gpu_hours_h"].to_numpy(dtype=float) > 0, Q.MODEL_ESTIMATE.value, NA
        ),
        "alerts_quality": np.array(
            [NA if a is None or pd.isna(a) else Q.MEASURED.value for a in alerts], dtype=object
        ),
    }


def _columns(by: str, cost_col: str) -> list[str]:
    ident = {
        "gpu": ["host", "gpu_index", "uuid", "name", "job_id", "finding", "cause", "severity"],
        "node": ["host", "gpus"],
        "job": ["job_id", "gpus"],
    }[by]
    return [
        *ident,
        "gpu_hours_h",
        "gpu_hours_quality",
        "utilization_mean_pct",
        "utilization_quality",
        "energy_kwh",
        "energy_quality",
        "idle_energy_kwh",
        "idle_energy_quality",
        cost_col,
        "cost_quality",
        "co2_kg",
        "co2_quality",
        "tflops_per_w",
        "tflops_quality",
        "straggler_minutes_min",
        "straggler_minutes_quality",
        "alerts_count",
        "alerts_quality",
        # last, so the columns before keep their places: MIG devices beside ``gpus`` (whole GPUs)
        *([] if by == "gpu" else ["mig_devices"]),
    ]


def csv_lines(
    header: Sequence[str], rows: Iterable[Sequence[Any]], chunk: int = 500
) -> Iterator[str]:
    """CSV text in chunks: the header, then ``chunk`` rows at a time (cells neutralised)."""
    buf = io.StringIO()
    # CRLF, as RFC 4180 has it: the writer then also quotes a cell holding a lone CR (a name
    # with one would otherwise split its row for every reader)
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow([neutralise(h) for h in header])
    for n, row in enumerate(rows, start=1):
        w.writerow([_cell(v) for v in row])
        if n % chunk == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def report_csv(table: pd.DataFrame) -> Iterator[str]:
    return csv_lines(list(table.columns), table.itertuples(index=False, name=None))


def series_header(fields: Sequence[str]) -> list[str]:
    return ["time_utc", "time_ns", "host", "gpu_index", "uuid", "name", *fields]


def series_rows(
    data: DashboardData, tr: TimeRange, step_s: int | None, fields: Sequence[str]
) -> Iterator[tuple[Any, ...]]:
    """Rows of the store's series over the range, read one hour at a time."""
    chunk_ns = SERIES_CHUNK_S * NS_PER_S
    t = tr.start_ns
    while t < tr.end_ns:
        hi = min(t + chunk_ns, tr.end_ns)
        lo = t
        frame = data.store.series(lo, hi, fields, step_s=step_s)
        times = frame["time_ns"].to_numpy(dtype="int64")
        iso = np.datetime_as_string(times.astype("datetime64[ns]"), unit="s")
        cols = [frame[f].to_numpy() for f in fields]
        for i in range(len(frame)):
            yield (
                str(iso[i]) + "Z",
                int(times[i]),
                frame["host"].iat[i],
                int(frame["gpu_index"].iat[i]),
                frame["uuid"].iat[i],
                frame["name"].iat[i],
                *(c[i] for c in cols),
            )
        t = hi


def filename(kind: str, tr: TimeRange) -> str:
    def stamp(ns: int) -> str:
        return datetime.fromtimestamp(ns / NS_PER_S, tz=UTC).strftime("%Y%m%dT%H%M")

    return f"gpuwatt-{kind}-{stamp(tr.start_ns)}-{stamp(tr.end_ns)}.csv"


def register_routes(server: Any, data: DashboardData, work: JobWorkSource | None = None) -> None:
    """``/download/report.csv?range=..&by=gpu|node|job`` and ``/download/series.csv?..&step=``;
    ``work``: the jobs' own reports, for the report by job."""
    from flask import Response, request, stream_with_context

    def bad(message: str, status: int = 400) -> Response:
        return Response(message + "\n", status=status, mimetype="text/plain")

    def parsed() -> tuple[TimeRange | None, str | None, dict[str, str]]:
        query = query_dict(request.query_string.decode("latin-1"))
        tr, problem = parse_range(query, data.now_ns())
        return (None if problem else tr), problem, query

    def attachment(chunks: Iterator[str], name: str) -> Response:
        resp = Response(stream_with_context(chunks), mimetype="text/csv")
        resp.headers["Content-Disposition"] = f'attachment; filename="{name}"'
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @server.route("/download/report.csv")
    def _report() -> Response:
        tr, problem, query = parsed()
        if tr is None:
            return bad(f"bad time range: {problem}")
        by = query.get("by", "gpu")
        if by not in GROUPINGS:
            return bad(f"by must be one of {', '.join(GROUPINGS)}")
        try:
            win = data.window(tr)
            table = report_by_job(win, work) if by == "job" else build_report(win.summary, by)
        except DataError as exc:
            return bad(exc.message, 503 if exc.unreachable else 500)
        return attachment(report_csv(table), filename(f"report-by-{by}", tr))

    @server.route("/download/series.csv")
    def _series() -> Response:
        tr, problem, query = parsed()
        if tr is None:
            return bad(f"bad time range: {problem}")
        step = query.get("step", "60")
        if step == "raw":
            step_s = None
        elif step.isdigit() and int(step) >= 60 and int(step) % 60 == 0:
            step_s = int(step)
        else:
            return bad("step must be raw or a multiple of 60 seconds")
        try:
            data.latest()  # fail with a clear status before the stream starts
        except DataError as exc:
            return bad(exc.message, 503 if exc.unreachable else 500)
        fields = [f for f in SERIES_FIELDS if f in FIELD_BY_ATTR]
        rows = series_rows(data, tr, step_s, fields)
        return attachment(csv_lines(series_header(fields), rows), filename(f"series-{step}", tr))
