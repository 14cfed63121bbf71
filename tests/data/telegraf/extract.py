"""Regenerate ``nvidia_smi_expected.json`` from Telegraf's own test expectations.

    python tests/data/telegraf/extract.py TELEGRAF_GIT_DIR [COMMIT]

reads ``plugins/inputs/nvidia_smi/nvidia_smi_test.go`` at COMMIT (default HEAD) and writes every
``metric.New(measurement, tags, fields, time)`` of ``TestGatherValidXML`` with each field's
line-protocol type as Telegraf's metric model gives it (Go ``int`` and ``int64(..)`` -> "int",
a float literal -> "float", a string -> "str").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

TEST = "plugins/inputs/nvidia_smi/nvidia_smi_test.go"
HERE = Path(__file__).parent


def _value(expr: str) -> tuple[str, object]:
    expr = expr.strip()
    if expr.startswith('"'):
        parts = re.findall(r'"((?:[^"\\]|\\.)*)"', expr)
        return "str", "".join(json.loads(f'"{p}"') for p in parts)
    m = re.fullmatch(r"u?int(?:64)?\((-?\d+)\)", expr)
    if m:
        return "int", int(m.group(1))
    if re.fullmatch(r"-?\d+", expr):
        return "int", int(expr)
    return "float", float(expr)


def _map(body: str) -> dict[str, str]:
    """``"key": value,`` pairs of a Go map literal body (values may span lines with ``+``)."""
    out: dict[str, str] = {}
    for m in re.finditer(r'"([^"]+)":\s*((?:"(?:[^"\\]|\\.)*"\s*\+?\s*)+|[^,\n]+),', body):
        out[m.group(1)] = m.group(2)
    return out


def extract(source: str) -> list[dict[str, object]]:
    body = source[source.index("func TestGatherValidXML") :]
    end = body.find("\nfunc ", 10)
    body = body if end < 0 else body[:end]
    cases = []
    for case in re.split(r"\n\t\t\{\n\t\t\tname:", body)[1:]:
        name = re.match(r'\s*"([^"]+)"', case).group(1)  # type: ignore[union-attr]
        filename = re.search(r'filename:\s*"([^"]+)"', case).group(1)  # type: ignore[union-attr]
        metrics = []
        pattern = (
            r'metric\.New\(\s*"(\w+)",\s*map\[string\]string\{(.*?)\n\t+\},\s*'
            r"map\[string\]interface\{\}\{(.*?)\n\t+\},\s*time\.Unix\((\d+),\s*0\)"
        )
        for m in re.finditer(pattern, case, re.S):
            tags = {k: _value(v)[1] for k, v in _map(m.group(2)).items()}
            fields = {k: list(_value(v)) for k, v in _map(m.group(3)).items()}
            metrics.append(
                {
                    "measurement": m.group(1),
                    "tags": tags,
                    "fields": fields,
                    "time_s": int(m.group(4)),
                }
            )
        cases.append({"name": name, "testdata": filename, "metrics": metrics})
    return cases


def main() -> None:
    git_dir, commit = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    sha = subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-parse", commit], capture_output=True, text=True
    ).stdout.strip()
    source = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{sha}:{TEST}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    doc = {
        "source": f"https://github.com/influxdata/telegraf/blob/{sha}/{TEST}",
        "cases": extract(source),
    }
    (HERE / "nvidia_smi_expected.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
