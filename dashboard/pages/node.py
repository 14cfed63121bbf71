"""Node and GPU drill-down: every metric of one node's GPUs over time, throttle onsets and XID
events marked,
hardware health (fan, power limit, PCIe/NVLink, ECC, remapped rows, clock-event reasons as bands)
and the processes of the newest samples. A GPU picker highlights one GPU."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
import numpy as np
import pandas as pd

from gpuwatt.analytics.reasons import BITS, FAULT_FRACTIONS, LABELS, add_bit_columns
from gpuwatt.dashboard import format as fmt
from gpuwatt.dashboard.components import data_table, graph, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.data import DashboardData
from gpuwatt.dashboard.figures import band_rows, natural_sorted, node_lines
from gpuwatt.dashboard.timerange import TimeRange, fmt_ns
from gpuwatt.mig import is_mig_device, mig_profile
from gpuwatt.model import GpuSample
from gpuwatt.store.base import xid_codes

PAGE = "node"
PATH = "/node"
NAME = "Node / GPU"
ORDER = 4
METRICS: tuple[str, ...] = (
    "utilization_gpu_pct",
    "sm_clock_mhz",
    "temperature_gpu_c",
    "power_w",
    "memory_used_bytes",
    "tensor_active_pct",
)
HEALTH_FIELDS: tuple[str, ...] = (
    "fan_speed_pct",
    "power_limit_w",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "ecc_sbe_volatile_count",
    "ecc_dbe_volatile_count",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
)
HEALTH_METRICS: tuple[str, ...] = (
    "fan_speed_pct",
    "power_limit_w",
    "pcie_bytes_per_s",
    "nvlink_bytes_per_s",
    "ecc_sbe_volatile_count",
    "ecc_dbe_volatile_count",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
)
READ_FIELDS: tuple[str, ...] = (*METRICS, "clock_event_reasons", *HEALTH_FIELDS)


def layout(**query: str) -> Any:
    return page_frame(PAGE, NAME, query)


def throttle_onsets(frame: pd.DataFrame) -> pd.DataFrame:
    """Buckets where a hardware fault reason (thermal, power brake, HW slowdown) switches on.

    Uses the analytics engine's decoding; a bucket whose reason mask changed inside it (a
    non-integer rollup mean) cannot be decoded and marks nothing.
    """
    cols = ["time_ns", "gpu_index", "label"]
    if frame.empty or "clock_event_reasons" not in frame.columns:
        return pd.DataFrame(columns=cols)
    rows = add_bit_columns(frame.sort_values(["gpu_index", "time_ns"]).copy())
    faults = rows[list(FAULT_FRACTIONS)].fillna(0).to_numpy() > 0
    active = faults.any(axis=1)
    gpu = rows["gpu_index"].to_numpy()
    prev = np.zeros_like(active)
    prev[1:] = active[:-1] & (gpu[1:] == gpu[:-1])
    onset = active & ~prev
    labels = [
        ", ".join(LABELS[f] for f, on in zip(FAULT_FRACTIONS, row, strict=True) if on)
        for row in faults[onset]
    ]
    return pd.DataFrame(
        {
            "time_ns": rows["time_ns"].to_numpy()[onset],
            "gpu_index": gpu[onset],
            "label": labels,
        },
        columns=cols,
    )


def reason_bands(frame: pd.DataFrame, gpu: int | None) -> list[tuple[str, Any, Any]]:
    """Clock-event reasons as bands: for one GPU a row per reason, for the whole node a row per
    (GPU, reason) that was active at some time in the range (each bucket: share of its
    decoded samples with the reason set)."""
    if frame.empty or "clock_event_reasons" not in frame.columns:
        return []
    rows = add_bit_columns(frame.loc[:, ["time_ns", "gpu_index", "clock_event_reasons"]].copy())
    if gpu is not None:
        rows = rows.loc[rows["gpu_index"] == gpu]
    out: list[tuple[str, Any, Any]] = []
    for idx, part in rows.groupby("gpu_index", sort=True):
        part = part.sort_values("time_ns")
        for col in BITS:
            v = part[col].to_numpy(dtype=float)
            if gpu is None and not np.nansum(v) > 0:
                continue
            label = LABELS[col] if gpu is not None else f"GPU {idx}: {LABELS[col]}"
            out.append((label, part["time_ns"].to_numpy(), v))
    return out


def processes_table(samples: list[GpuSample], gpu: int | None) -> Any:
    """The compute processes of the node's GPUs in their newest sample (pid, user, GPU memory)."""
    rows = []
    for s in samples:
        if (gpu is not None and s.gpu_index != gpu) or s.mig_enabled:
            continue  # a GPU in MIG mode: its processes are listed under its MIG devices
        for proc in s.processes or ():
            rows.append(
                (
                    f"GPU {s.gpu_index}"
                    + (f" MIG {mig_profile(s.name)}" if is_mig_device(s) else ""),
                    str(proc.pid),
                    proc.user or "",
                    fmt.byte_size(proc.used_memory_bytes),
                    s.job_id or "",
                    fmt_ns(s.time_ns) + " UTC",
                )
            )
    if not rows:
        return dmc.Text("no compute process in the newest samples", c="dimmed", size="sm")
    head = ("GPU", "pid", "user", "GPU memory", "job", "as of")
    return data_table(head, rows, fz="xs", striped=True, id_="processes", className="gw-nowrap")


def facts(samples: list[GpuSample], gpu: int | None, xids: pd.DataFrame | None = None) -> list[Any]:
    """A line per GPU of its newest sample; its last XID in the range (``xids``: the node's
    events; None: the store keeps none, the newest sample's)."""
    codes = xid_codes(xids)
    out = []
    for s in samples:
        if gpu is not None and s.gpu_index != gpu:
            continue
        bits = [f"GPU {s.gpu_index}: {s.name}", s.uuid]
        if s.job_id:
            bits.append(f"job {s.job_id}")
        if s.power_limit_w is not None:
            bits.append(f"power limit {fmt.watts(s.power_limit_w)}")
        raised = list(s.xid_errors) if codes is None else codes.get((s.host, s.gpu_index), [])
        xid = raised[-1] if raised else None
        if xid is not None:
            bits.append(f"last XID {xid or '(code not kept)'} in the range")
        if s.remapped_rows_pending:
            bits.append("row remapping pending (reset the GPU)")
        if s.remapped_rows_failure:
            bits.append("row remapping FAILED (replace the GPU)")
        if s.lost:
            bits.append("LOST")
        bad = s.lost or xid is not None or bool(s.remapped_rows_failure)
        out.append(
            dmc.Text(" · ".join(bits), size="xs", c="red" if bad else "dimmed", className="gw-mono")
        )
    return out


def xid_line(xids: pd.DataFrame | None) -> str:
    """What the charts mark of XIDs, or why they mark none."""
    if xids is None:
        return "XID events: this store does not keep them"
    if xids.empty:
        return "no XID events"
    gpus = ", ".join(f"GPU {g}" for g in sorted(set(xids["gpu_index"].tolist())))
    return f"{len(xids)} XID events marked (✕) on {gpus}"


def health_figures(
    frame: pd.DataFrame, gpu: int | None, step_s: int, xids: pd.DataFrame | None = None
) -> list[Any]:
    """Fan, power against its limit, PCIe and NVLink throughput (transmit + receive), ECC and
    remapped rows; a panel that the GPUs do not report says so instead of staying blank."""
    f = frame.copy()
    for link in ("pcie", "nvlink"):
        tx, rx = f"{link}_tx_bytes_per_s", f"{link}_rx_bytes_per_s"
        if tx in f.columns and rx in f.columns:
            f[f"{link}_bytes_per_s"] = f[tx].add(f[rx], fill_value=np.nan)
    names = {
        "pcie_bytes_per_s": ("PCIe throughput (transmit + receive)", "B/s"),
        "nvlink_bytes_per_s": ("NVLink throughput (transmit + receive)", "B/s"),
    }
    figs = []
    for metric in HEALTH_METRICS:
        fig = node_lines(
            f, metric, highlight=gpu, xids=xids, step_s=step_s, label=names.get(metric)
        )
        figs.append(graph(fig, zoom=True))
    return figs


def prefetch(data: DashboardData, tr: TimeRange, query: dict[str, str], now_ns: int) -> None:
    """Start the reads the page makes after the window (``app.render_page``): the node's
    newest samples, its samples and its XID events."""
    host = query.get("host")
    if host:
        data.prefetch(lambda: data.latest_of(host))
        data.prefetch(lambda: data.host_series(tr, host, READ_FIELDS))
        data.prefetch(lambda: data.host_xids(tr, host))


def render(ctx: PageContext) -> list[Any]:
    hosts = natural_sorted({s.host for s in ctx.win.gpus})
    host = ctx.query.get("host")
    host_picker = dmc.Select(
        id="host-picker",
        label="node",
        data=hosts,
        value=host if host in hosts else None,
        searchable=True,
        w=220,
    )
    if host not in hosts:
        msg = "Pick a node." if not host else f"No node named '{host[:60]}' in this store."
        return [
            host_picker,
            dmc.Alert(msg, color="gray" if not host else "yellow", id="node-missing", mt="sm"),
        ]
    mine = sorted(ctx.data.latest_of(host), key=lambda s: s.gpu_index)
    gpu_text = ctx.query.get("gpu", "")
    gpu = int(gpu_text) if gpu_text.isdigit() else None
    indexes = [s.gpu_index for s in mine]
    if gpu not in indexes:
        gpu = None
    gpu_picker = dmc.Select(
        id="gpu-picker",
        label="GPU",
        data=[{"value": "all", "label": "all GPUs"}]
        + [{"value": str(i), "label": f"GPU {i}"} for i in indexes],
        value=str(gpu) if gpu is not None else "all",
        allowDeselect=False,
        w=140,
    )
    pickers = dmc.Group([host_picker, gpu_picker], gap="sm", mb="sm", align="end")
    frame = ctx.data.host_series(ctx.range, host, READ_FIELDS)
    if frame.empty:
        return [pickers, dmc.Alert(f"{host} has no data in this range", color="gray")]
    step = ctx.range.step_s
    events = throttle_onsets(frame)
    xids = ctx.data.host_xids(ctx.range, host)
    figs = [
        graph(node_lines(frame, m, highlight=gpu, events=events, xids=xids, step_s=step), zoom=True)
        for m in METRICS
    ]
    title = f"{host}" + (f", GPU {gpu} highlighted" if gpu is not None else "")
    marks = f"{len(events)} throttle onsets marked (▲)" if len(events) else "no throttle onsets"
    bands = reason_bands(frame, gpu)
    band_title = "clock-event reasons" + (f", GPU {gpu}" if gpu is not None else "")
    return [
        pickers,
        section(
            title,
            *facts(mine, gpu, xids),
            dmc.Text(marks, size="sm", mt="xs", id="throttle-marks"),
            dmc.Text(xid_line(xids), size="sm", id="xid-marks"),
        ),
        dmc.SimpleGrid(figs, cols={"base": 1, "lg": 2}, spacing="xs"),
        section(
            "Hardware health",
            graph(
                band_rows(bands, title=band_title, x_range=(ctx.range.start_ns, ctx.range.end_ns)),
                "reason-bands",
                zoom=True,
            ),
            dmc.SimpleGrid(health_figures(frame, gpu, step, xids), cols={"base": 1, "lg": 2}),
            help_text="Red bands: the share of each bucket in which a clock-event (throttle) "
            "reason was set. Hardware slowdown, thermal slowdown and power brake are faults; "
            "the software power cap is a GPU at full load.",
        ),
        section(
            "Processes now",
            processes_table(mine, gpu),
            help_text="Compute processes in each GPU's newest sample. NVML gives the pid and "
            "GPU memory; the user is read from the node's /proc (blank where it could not be).",
        ),
    ]
