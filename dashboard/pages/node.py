"""Node and GPU drill-down: every metric of one node's GPUs over time, throttle onsets marked."""

from __future__ import annotations

from typing import Any

import dash_mantine_components as dmc
import numpy as np
import pandas as pd

from gpuwatt.analytics.reasons import FAULT_FRACTIONS, LABELS, add_bit_columns
from gpuwatt.dashboard.components import graph, page_frame, section
from gpuwatt.dashboard.context import PageContext
from gpuwatt.dashboard.figures import node_lines

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
READ_FIELDS: tuple[str, ...] = (*METRICS, "clock_event_reasons")


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


def render(ctx: PageContext) -> list[Any]:
    hosts = sorted({s.host for s in ctx.win.latest})
    host = ctx.query.get("host")
    picker = dmc.Select(
        id="host-picker",
        label="node",
        data=hosts,
        value=host if host in hosts else None,
        searchable=True,
        w=240,
        mb="sm",
    )
    if host not in hosts:
        msg = "Pick a node." if not host else f"No node named '{host[:60]}' in this store."
        return [picker, dmc.Alert(msg, color="gray" if not host else "yellow", id="node-missing")]
    gpu_text = ctx.query.get("gpu", "")
    gpu = int(gpu_text) if gpu_text.isdigit() else None
    frame = ctx.data.host_series(ctx.range, host, READ_FIELDS)
    if frame.empty:
        return [picker, dmc.Alert(f"{host} has no data in this range", color="gray")]
    events = throttle_onsets(frame)
    figs = [graph(node_lines(frame, m, highlight=gpu, events=events)) for m in METRICS]
    gpus = ctx.win.latest
    facts = [
        dmc.Text(
            f"GPU {s.gpu_index}: {s.name} · {s.uuid}" + (" · LOST" if s.lost else ""),
            size="xs",
            c="red" if s.lost else "dimmed",
        )
        for s in gpus
        if s.host == host
    ]
    title = f"{host}" + (f", GPU {gpu} highlighted" if gpu is not None else "")
    marks = f"{len(events)} throttle onsets marked (▲)" if len(events) else "no throttle onsets"
    return [
        picker,
        section(title, *facts, dmc.Text(marks, size="sm", mt="xs", id="throttle-marks")),
        dmc.SimpleGrid(figs, cols={"base": 1, "lg": 2}, spacing="xs"),
    ]
