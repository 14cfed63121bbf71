"""Malformed config, scenario and rules files: rejected with file, line and reason, in bounded
work and memory.

Over 200 files are made from valid seeds (a full config, the demo scenario, the shipped rules):
truncated at random points, values swapped for other types, non-finite and huge numbers, huge
host ranges and template widths, alias bombs, 1,000 levels of nesting, unknown tags, binary
data, NUL bytes and a 50 MB file. ``gpuwatt check-config`` (the command's own code, in process)
must answer each one without a traceback, either "ok" or one line ``file:line: reason``, within
a bounded amount of work and 100 MiB (tracemalloc's peak of the Python heap, which holds whatever
the loader builds). A file it accepts must then start its command: the collector for a config,
the simulator for a scenario, one evaluation for rules.

Bounded time is shown by counting work, not by a clock (a test must not depend on the machine's
speed): the Python steps a check takes (``sys.settrace``: every call and every line run, so each
turn of a loop counts), at most ``MAX_STEPS``, with every C call on data no larger than what the
loader reads, which a FIFO shows stops at ``MAX_FILE_BYTES`` + 1 whatever the file's size.
PyYAML's loader is pure Python, so a loader that went quadratic would show as millions of steps:
without the flow-depth check, 1,000 levels of ``[`` cost PyYAML's scanner 11 million steps, and
the check itself, when it was a loop over characters, cost 9 million on the 1,000-level block
file (measured with this counter; the largest valid seed takes about 0.55 million).
"""

from __future__ import annotations

import io
import os
import random
import re
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from gpuwatt.cli.main import main as gpuwatt_main
from gpuwatt.yamlfile import MAX_FILE_BYTES

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

#: Python steps one check may take (calls and lines run): the largest valid seed takes ~0.55 M.
MAX_STEPS = 2_000_000

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


def _check_config(path: Path) -> tuple[int, str, str, int, int]:
    """``gpuwatt check-config PATH`` in process: (exit, stdout, stderr, steps, peak bytes).

    Run once counting the Python steps it takes, then again under tracemalloc for the peak of
    the heap."""
    out, err = io.StringIO(), io.StringIO()
    steps = 0

    def count(frame: FrameType, event: str, arg: object) -> Callable[[FrameType, str, object], Any]:
        nonlocal steps
        steps += 1  # a call, then every line it runs (each turn of a loop counts)
        return count

    previous = sys.gettrace()  # a coverage or debugger's tracer, put back after
    sys.settrace(count)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = gpuwatt_main(["check-config", str(path)])
    finally:
        sys.settrace(previous)
    tracemalloc.start()
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            gpuwatt_main(["check-config", str(path)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return code, out.getvalue(), err.getvalue(), steps, peak


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


def test_every_malformed_file_is_rejected_clearly_in_bounded_work_and_heap(tmp_path: Path) -> None:
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
    # Warm up: the first check imports the loaders, which would count as its work.
    warm = tmp_path / "valid.yaml"
    warm.write_text(_seeds(tmp_path)["config"])
    assert _check_config(warm)[0] == 0
    for name, text in _seeds(tmp_path).items():  # a valid seed's work: well inside the bound
        (tmp_path / f"{name}.yaml").write_text(text)
        code, _, err, steps, _ = _check_config(tmp_path / f"{name}.yaml")
        assert code == 0, err
        assert steps <= MAX_STEPS / 3, (name, steps)
    accepted, rejected = [], 0
    for kind, path, _ in files:
        code, out, err, steps, peak = _check_config(path)
        assert "Traceback" not in out + err, (path.name, err)
        assert steps <= MAX_STEPS, (path.name, steps)
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


def test_the_loader_reads_no_more_than_its_bound_of_a_huge_file(tmp_path: Path) -> None:
    """A FIFO counts what the loader takes: a writer offering 64 MiB blocks once the reader stops,
    so what it got rid of is what was read plus the pipe's buffer."""
    fifo = tmp_path / "huge.yaml"
    os.mkfifo(fifo)
    offered = 64 * 1024 * 1024
    written = 0
    chunk = b"k: [1, 2, 3]\n" * 4096

    def feed() -> None:
        nonlocal written
        fd = os.open(fifo, os.O_WRONLY)
        try:
            while written < offered:
                written += os.write(fd, chunk)
        except BrokenPipeError:
            pass  # the reader closed its end: it read all it will
        finally:
            os.close(fd)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = gpuwatt_main(["check-config", str(fifo)])
    writer.join(timeout=60)
    assert not writer.is_alive()
    assert code == 1 and "file larger than 4 MiB" in err.getvalue(), err.getvalue()
    pipe_buffer = 1024 * 1024  # Linux's pipe buffer is 64 KiB by default, at most 1 MiB
    assert MAX_FILE_BYTES < written <= MAX_FILE_BYTES + 1 + pipe_buffer + len(chunk)


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("collector:\n  interval: &a [*a]\n", 2, "an alias refers to a collection that holds it"),
        ("a: &a {b: *a}\n", 1, "an alias refers to a collection that holds it"),
        (  # 60 levels written, then 30 more around an alias to them: 90 levels expanded
            "a: &a " + "[" * 60 + "1" + "]" * 60 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n",
            1,
            "nested deeper than 64 levels (aliases expanded)",
        ),
    ],
)
def test_aliases_that_nest_too_deep_or_hold_themselves_are_refused_with_their_line(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    """Refused by the converter's own bound, never by Python's recursion limit: nothing else is
    written to stderr (no "Exception ignored" from a RecursionError under the tracer)."""
    path = tmp_path / "aliases.yaml"
    path.write_text(text)
    code, out, err, _steps, _peak = _check_config(path)
    assert code == 1 and out == ""
    assert err.splitlines() == [f"gpuwatt: {path}:{line}: {reason}"]
