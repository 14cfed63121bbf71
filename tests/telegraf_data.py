"""Telegraf's own ``nvidia_smi`` test expectations (vendored: tests/data/telegraf/) as points.

``EXPECTED`` holds every metric Telegraf's ``TestGatherValidXML`` expects from its testdata (real
nvidia-smi dumps of 12 GPUs); ``telegraf_line`` writes one in Telegraf's own types, as Telegraf's
InfluxDB output would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "telegraf" / "nvidia_smi_expected.json"
EXPECTED: dict[str, Any] = json.loads(DATA.read_text())
CASES: list[dict[str, Any]] = EXPECTED["cases"]


def gpu_metric(case: dict[str, Any]) -> dict[str, Any]:
    """The case's ``nvidia_smi`` metric (one GPU per testdata file)."""
    (m,) = [m for m in case["metrics"] if m["measurement"] == "nvidia_smi"]
    return m


def _tag(v: str) -> str:
    return v.replace("\\", "\\\\").replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")


def _field(kind: str, v: Any) -> str:
    if kind == "int":
        return f"{int(v)}i"
    if kind == "float":
        return repr(float(v))
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def telegraf_line(
    metric: dict[str, Any],
    host: str,
    time_ns: int,
    *,
    tags: dict[str, str] | None = None,
    fields: dict[str, tuple[str, Any]] | None = None,
) -> str:
    """One point as Telegraf writes it (its agent adds the ``host`` tag), tags sorted."""
    all_tags = {**metric["tags"], "host": host, **(tags or {})}
    all_fields = {k: tuple(v) for k, v in metric["fields"].items()} | (fields or {})
    head = ",".join(
        [metric["measurement"], *(f"{_tag(k)}={_tag(v)}" for k, v in sorted(all_tags.items()))]
    )
    body = ",".join(f"{_tag(k)}={_field(t, v)}" for k, (t, v) in sorted(all_fields.items()))
    return f"{head} {body} {time_ns}"
