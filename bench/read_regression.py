"""Reads of this checkout against a base checkout, side by side: bench/dashboard.py and
bench/analysis_speed.py run by each tree on its own database, alternating.

    git worktree add /tmp/base fa44fa2
    .venv/bin/python bench/read_regression.py --base /tmp/base [--rounds 2]
        [--gpus 1024] [--hours 24] [--interval-s 10] [--analysis-gpus 1024]

Each tree runs its own benches with its own code (``PYTHONPATH`` and working directory set to
the tree) on a database it filled itself (the first round fills them; their filling is not
compared). Then, ``--rounds`` times, alternating which tree goes first: the dashboard's content
callbacks (``bench/dashboard.py --no-browser``: the CPU median of each page with an emptied
cache, for the default 1 h and 24 h presets and the 1 h and 24 h ranges no one has viewed) and
the analysis read (``bench/analysis_speed.py``: one hour of 1,024 GPUs as 1-minute rollups plus
``latest()``, and the same hour raw). Printed: the best of the rounds for each tree and the
ratio this / base (target <= 1.2x, issue 16). CPU time is compared for the callbacks (the
machine is shared: wall time is noise); wall time for the analysis reads (what it prints).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
_PAGE = re.compile(r"^\s+(\w+)\s+.*\(\s*(\d+) ms CPU\)")
_SECTION = re.compile(r"^callbacks, (?:preset range (\w+)|a (\w+) range no one)")
_READ = re.compile(
    r"^(read 1 h as 1-min rollups \+ latest\(\)|read the same hour raw):\s+([\d.]+) s"
)


def run(tree: Path, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {' '.join(args)}\n{out.stdout[-2000:]}{out.stderr[-4000:]}")
    return out.stdout


def dashboard_cpu_ms(text: str) -> dict[str, float]:
    """Per (section, page): the cold callback's CPU median in ms."""
    out: dict[str, float] = {}
    section = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            preset = {"default": "1h"}.get(m.group(1), m.group(1))
            section = f"preset {preset}" if preset else f"unviewed {m.group(2)}"
            continue
        if line.startswith("background"):
            section = None
        p = _PAGE.match(line)
        if section and p:
            out[f"{section} {p.group(1)}"] = float(p.group(2))
    return out


def analysis_s(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = _READ.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--interval-s", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--analysis-gpus", type=int, default=1024)
    ap.add_argument("--dir", type=Path, help="keep (or reuse) the databases in this folder")
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE}
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.dir or Path(scratch)
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                tree = trees[name]
                dash = run(
                    tree,
                    [
                        "bench/dashboard.py",
                        "--no-browser",
                        f"--gpus={args.gpus}",
                        f"--hours={args.hours}",
                        f"--interval-s={args.interval_s}",
                        f"--repeat={args.repeat}",
                        f"--db={Path(tmp) / f'dash-{name}.db'}",
                    ],
                )
                speed = run(
                    tree,
                    [
                        "bench/analysis_speed.py",
                        f"--gpus={args.analysis_gpus}",
                        f"--db={Path(tmp) / f'speed-{name}.db'}",
                    ],
                )
                for key, v in {**dashboard_cpu_ms(dash), **analysis_s(speed)}.items():
                    best[name][key] = min(best[name].get(key, float("inf")), v)
                print(f"round {r + 1}: {name} done", flush=True)
    print(f"\n{'figure (best of rounds)':<44} {'base':>9} {'this':>9} {'this/base':>9}")
    worst = 0.0
    for key in best["base"]:
        b, t = best["base"][key], best["this"].get(key, float("nan"))
        unit = "s" if key.startswith("read") else "ms"
        ratio = t / b if b else float("nan")
        if b >= (0.05 if unit == "s" else 20):  # ratios of tiny figures are noise
            worst = max(worst, ratio)
        print(f"{key:<44} {b:>8.3g}{unit[0]} {t:>8.3g}{unit[0]} {ratio:>8.2f}x")
    for section in ("preset 1h", "preset 24h", "unviewed 1h", "unviewed 24h"):
        b = sum(v for k, v in best["base"].items() if k.startswith(section + " "))
        t = sum(v for k, v in best["this"].items() if k.startswith(section + " "))
        print(f"{'all pages, ' + section + ' (CPU ms)':<44} {b:>9.0f} {t:>9.0f} {t / b:>8.2f}x")
    print(f"\nworst ratio (figures >= 20 ms / 0.05 s): {worst:.2f}x "
          f"(target <= 1.2x: {'ok' if worst <= 1.2 else 'MISSED'})")  # fmt: skip


if __name__ == "__main__":
    main()
