"""Malformed config, scenario and rules files: rejected with file, line and reason, fast and small.

Over 200 files are made from valid seeds (a full config, the demo scenario, the shipped rules):
truncated at random points, values swapped for other types, non-finite and huge numbers, huge
host ranges and template widths, alias bombs, 1,000 levels of nesting, unknown tags, binary
data, NUL bytes and a 50 MB file. ``gpuwatt check-config`` (the command's own code, in process)
must answer each one without a traceback, either "ok" or one line ``file:line: reason``, within
2 s and 100 MiB (tracemalloc's peak of the Python heap, which holds whatever the loader builds).
A file it accepts must then start its command: the collector for a config, the simulator for a
scenario, one evaluation for rules.
"""

from __future__ import annotations

import io
import random
import re
import time
import tracemalloc
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from gpuwatt.cli.main import main as gpuwatt_main

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261124

CONFIG = """\
store:
  url: sqlite:///{tmp}/store.db
collector:
  interval: 1s
  slow_interval: 60s
  spool_dir: {tmp}/spool
  spool_max_mib: 64
  hostname: node-1
  tensor_precision: bf16
energy:
  price_per_kwh: 0.25
  currency: EUR
  carbon_g_per_kwh: 350
alerts:
  cluster: fuzz
  evaluation_interval: 15s
  state_db: {tmp}/alerts.db
  channels:
    mail:
      type: email
      host: 127.0.0.1
      port: 2525
      security: none
      from: gpuwatt@example.org
      to: [oncall@example.org]
    hook: {{type: webhook, url: "http://127.0.0.1:9/hook"}}
  routes:
    - match: {{severity: critical}}
      channels: [mail]
      repeat_interval: 4h
    - channels: [hook]
"""

SWAPS = (
    "[1, 2]", "{a: 1}", "yes", "-1", "0", ".nan", ".inf", "-.inf", "1e999",
    "99999999999999999999999", "''", "null", '"node-[0-999999999]:*"', "!foo x", "!!float abc",
    "!!binary aGVsbG8=", "*undefined_alias", "&a [*a]", "\"\\x00\"", "'{value:>50000000}'",
)  # fmt: skip

LINE = re.compile(r"^gpuwatt: (?P<path>\S+?):(?P<line>\d+): (?P<reason>\S.*)$")


def _seeds(tmp: Path) -> dict[str, str]:
    return {
        "config": CONFIG.format(tmp=tmp),
        "scenario": (ROOT / "collector/sim/scenarios/demo.yaml").read_text(),
        "rules": (ROOT / "alerts/default_rules.yaml").read_text(),
    }


def _mutants(tmp: Path) -> list[tuple[str, str, bytes]]:
    """(kind, name, content) of every malformed file."""
    rng = random.Random(SEED)
    out: list[tuple[str, str, bytes]] = []
    for kind, text in _seeds(tmp).items():
        for k in range(40):  # truncated anywhere
            cut = rng.randrange(1, len(text))
            out.append((kind, f"{kind}-truncated-{k}", text[:cut].encode()))
        value_lines = [i for i, line in enumerate(text.splitlines()) if re.search(r":\s+\S", line)]
        for k, swap in enumerate(SWAPS * 2):  # one value swapped for another type or a hostile one
            lines = text.splitlines()
            i = rng.choice(value_lines)
            key, _, _ = lines[i].partition(":")
            lines[i] = f"{key}: {swap}"
            out.append((kind, f"{kind}-swap-{k}", "\n".join(lines).encode()))
    bomb = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
    )
    hostile = {
        "alias-bomb": bomb,
        "alias-bomb-in-rules": "rules:\n" + bomb.replace("\n", "\n  ").replace("a: &a", "  - &a"),
        "deep-flow": "a: " + "[" * 1000 + "]" * 1000,
        "deep-block": "".join("  " * i + f"k{i}:\n" for i in range(1000)),
        "deep-map-flow": "a: " + "{b: " * 1000 + "1" + "}" * 1000,
        "unknown-tag": "collector: !foo {interval: 1s}",
        "python-tag": "collector: !!python/object/apply:os.system ['true']",
        "float-abc": "collector: {interval: !!float abc}",
        "nan-interval": "collector: {interval: .nan}",
        "inf-interval": "alerts: {evaluation_interval: .inf}",
        "nan-scenario": _seeds(tmp)["scenario"].replace("intensity: 0.8", "intensity: .nan"),
        "huge-range": _seeds(tmp)["scenario"].replace('"*:*"', '"node-[0-999999999]:*"'),
        "huge-template": _seeds(tmp)["rules"].replace("{value:.0f}", "{value:>50000000}", 1),
        "match-list": CONFIG.format(tmp=tmp).replace("{severity: critical}", "{severity: [a, b]}"),
        "spool-under-a-file": CONFIG.format(tmp=tmp).replace(f"{tmp}/spool", "/etc/hostname/spool"),
        "tabs": "collector:\n\tinterval: 1s\n",
        "duplicate-key": "collector: {interval: 1s}\ncollector: {interval: 2s}\n",
        "nul": "collector:\n  hostname: a\x00b\n",
        "list-root": "- 1\n- 2\n",
        "scalar-root": "42\n",
    }
    out += [("hostile", name, text.encode()) for name, text in hostile.items()]
    out.append(("hostile", "binary", bytes(rng.randrange(256) for _ in range(4096))))
    out.append(("hostile", "png", b"\x89PNG\r\n\x1a\n" + bytes(200)))
    out.append(("hostile", "utf16", "collector: {interval: 1s}".encode("utf-16")))
    return out


def _check_config(path: Path) -> tuple[int, str, str, float, int]:
    """``gpuwatt check-config PATH`` in process: (exit, stdout, stderr, seconds, peak bytes).

    Timed on its own, then run again under tracemalloc for the peak of the heap (tracemalloc
    slows Python several times over, so one run cannot measure both)."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with redirect_stdout(out), redirect_stderr(err):
        code = gpuwatt_main(["check-config", str(path)])
    elapsed = time.perf_counter() - started
    tracemalloc.start()
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            gpuwatt_main(["check-config", str(path)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return code, out.getvalue(), err.getvalue(), elapsed, peak


def _starts(kind: str, path: Path, tmp: Path) -> None:
    """The command a file is for starts with it (and is stopped at once)."""
    if kind == "config":
        code = gpuwatt_main([
            *("collect", "--simulate", "healthy", "--config", str(path)),
            *("--duration", "0.3", "--interval", "0.1", "--store", f"sqlite:///{tmp}/start.db"),
            *("--spool", str(tmp / "sp")),
        ])  # fmt: skip
        assert code == 0
        from gpuwatt.cli.alerts import load_settings

        load_settings(str(path))
    elif kind == "scenario":
        from gpuwatt.collector.sim.scenario import load_scenario
        from gpuwatt.collector.sim.source import SimulatedClusterSource

        source = SimulatedClusterSource(load_scenario(path), start_ns=time.time_ns())
        source.open()
        try:
            assert source.sample(include_slow=True)
        finally:
            source.close()
    elif kind == "rules":
        from gpuwatt.alerts.clock import ManualClock
        from gpuwatt.alerts.db import open_db
        from gpuwatt.alerts.rules import load_rules
        from gpuwatt.alerts.service import Evaluator
        from gpuwatt.store.sqlite import SqliteStore

        con = open_db(tmp / "start-alerts.db")
        with SqliteStore(tmp / "start-rules.db") as store:
            ev = Evaluator(load_rules(path), store, con, channels={}, routes=[],
                           clock=ManualClock(1_700_000_000 * 10**9))  # fmt: skip
            report = ev.evaluate()
            assert not report.errors, report.errors
        con.close()


def test_every_malformed_file_is_rejected_clearly_fast_and_small(tmp_path: Path) -> None:
    mutants = _mutants(tmp_path)
    big = tmp_path / "hostile-50mb.yaml"
    with big.open("wb") as f:  # 50 MB: one long document of small mappings
        chunk = b"".join(b"k%07d: {a: 1, b: [1, 2, 3]}\n" % i for i in range(20_000))
        while f.tell() < 50 * 1024 * 1024:
            f.write(chunk)
    files = [(kind, tmp_path / f"{name}.yaml", content) for kind, name, content in mutants]
    for _, path, content in files:
        path.write_bytes(content)
    files.append(("hostile", big, b""))
    assert len(files) >= 200
    # Warm up: the first check imports the loaders, which tracemalloc would make look slow.
    warm = tmp_path / "valid.yaml"
    warm.write_text(_seeds(tmp_path)["config"])
    assert _check_config(warm)[0] == 0
    accepted, rejected = [], 0
    for kind, path, _ in files:
        code, out, err, seconds, peak = _check_config(path)
        assert "Traceback" not in out + err, (path.name, err)
        assert seconds < 2.0, (path.name, seconds)
        assert peak < 100 * 1024 * 1024, (path.name, peak)
        if code == 0:
            assert out.startswith(f"{path}: ok ("), out
            # what check-config took the file for (an empty file is a valid empty config)
            taken_for = out.split("ok (", 1)[1]
            kind = "config" if taken_for.startswith("config") else (
                "scenario" if taken_for.startswith("scenario") else "rules"
            )  # fmt: skip
            accepted.append((kind, path))
            continue
        rejected += 1
        assert code == 1, (path.name, code, err)  # check-config: 1 = invalid file
        lines = err.strip().splitlines()
        assert len(lines) == 1, (path.name, err)
        (line,) = lines
        m = LINE.match(line)
        assert m is not None, (path.name, line)
        assert m["path"] == str(path) and int(m["line"]) >= 1, (path.name, line)
    assert rejected >= 150  # nearly every mutant is malformed
    for kind, path in accepted:  # accepted means the command starts
        try:
            _starts(kind, path, tmp_path)
        except Exception as exc:
            pytest.fail(f"{path.name} passed check-config but its command failed: {exc!r}")
