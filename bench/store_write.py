"""Bytes the embedded store's writer causes to be written to disk, against the bytes it keeps.

    .venv/bin/python bench/store_write.py [--case demo|big] [--minutes 60] [--writeback-s 30]

A child process writes the demo scenario (32 GPUs, 1-s rounds; ``--case big``: 1,024 GPUs over
10 minutes, ``bench/storage.py``'s big case) through
``SqliteStore.write_samples``, one call per collector round, as the collector does. The bytes it
caused to be written (the SQLite file, its WAL and the segment files beside it: format 3) are
read from its ``/proc/self/io`` (``write_bytes`` less
``cancelled_write_bytes``: the kernel counts a page-cache page once each time it goes from clean
to dirty, so what matters is how many distinct pages are dirtied between two writebacks). The
writes run faster than real time, so the kernel's periodic writeback (a dirty page is written
back once it is ~30 s old) is reproduced by ``fsync`` of the store's files (the open segment
included) every ``--writeback-s`` rounds (simulated seconds). What the WAL still holds at the end is
checkpointed into the file and counted (a later checkpoint would write it), and so is the end of
the open segment (``compact``: its zstd frame ended, fsync'd). Bytes kept are the files' size at
rest (WAL checkpointed, every segment closed; ``bench/storage.py``). Target (issue 16): written
<= 2x kept per GPU-sample.

Then the SIGKILL check: a child writes rounds and kills itself with SIGKILL right after a
``write_samples`` call returns; everything written before must be read back (nothing beyond
one collector interval may be lost).
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NS = 1_000_000_000

CHILD = """
import json, os, signal, sqlite3, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
from storage import END_NS, NS, rounds
from gpuwatt.collector.sim.scenario import load_scenario
from gpuwatt.collector.sim.source import SimulatedClusterSource
from gpuwatt.store.sqlite import SqliteStore

minutes, writeback_s, kill_after, case = {minutes}, {writeback_s}, {kill_after}, {case!r}
if case == "big":
    batches = list(rounds("big"))
else:
    source = SimulatedClusterSource(
        load_scenario("demo"), start_ns=END_NS - minutes * 60 * NS, clock_ns=lambda: END_NS
    )
    source.open()
    batches = list(source.backfill(END_NS, interval_s=1.0, slow_interval_s=60.0))
    source.close()


def io():
    with open("/proc/self/io") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return int(d["write_bytes"]) - int(d["cancelled_write_bytes"])


path = {path!r}
store = SqliteStore(path)
before = io()
n = 0
for i, batch in enumerate(batches):
    store.write_samples(batch)
    n += len(batch)
    if kill_after is not None and i + 1 == kill_after:
        print(json.dumps({{"samples": n}}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if (i + 1) % writeback_s == 0:  # the kernel's writeback of pages dirty for ~30 s
        segments = sorted(Path(path + "-segments").glob("*.seg"))
        for file in [path, path + "-wal", *segments[-1:]]:
            fd = os.open(file, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
store.compact()  # the open segment ended as a closed one would be: counted
# what is still in the WAL is written into the file by a later checkpoint: counted now
checkpoint = sqlite3.connect(path)
checkpoint.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
checkpoint.close()
written = io() - before
store.close()
print(json.dumps({{"samples": n, "written": written}}))
"""


def child(
    path: Path, minutes: int, writeback_s: int, kill_after: int | None, case: str = "demo"
) -> dict:
    code = CHILD.format(
        case=case,
        bench=str(ROOT / "bench"),
        path=str(path),
        minutes=minutes,
        writeback_s=writeback_s,
        kill_after=kill_after,
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=3600, check=False
    )
    if kill_after is None and proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    if kill_after is not None and proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"expected SIGKILL, got {proc.returncode}: {proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def at_rest_bytes(path: Path) -> int:
    from gpuwatt.store.sqlite import SqliteStore

    with SqliteStore(path) as store:
        store.compact()
    con = sqlite3.connect(path)
    con.execute("VACUUM")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return sum(p.stat().st_size for p in path.parent.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("demo", "big"), default="demo")
    ap.add_argument("--minutes", type=int, default=60, help="demo only")
    ap.add_argument("--writeback-s", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.db"
        got = child(path, args.minutes, args.writeback_s, None, args.case)
        n, written = got["samples"], got["written"]
        kept = at_rest_bytes(path)
        ratio = written / kept
        what = "1,024 GPUs, 10 min" if args.case == "big" else f"demo, {args.minutes} min"
        print(f"{what} at 1 s: {n:,} GPU-samples, writeback every {args.writeback_s} s")
        print(f"  written to disk: {written:>12,} B  {written / n:7.1f} B/GPU-sample")
        print(f"  kept at rest:    {kept:>12,} B  {kept / n:7.1f} B/GPU-sample")
        print(f"  written / kept:  {ratio:.2f}x (target <= 2x: {'ok' if ratio <= 2 else 'MISSED'})")
    with tempfile.TemporaryDirectory() as tmp:
        from gpuwatt.store.sqlite import SqliteStore

        path = Path(tmp) / "k.db"
        got = child(path, 3, args.writeback_s, kill_after=150)
        with SqliteStore(path) as store:
            kept_n = store.count_samples(0, 2**62)
        lost = got["samples"] - kept_n
        print(f"SIGKILL after {got['samples']:,} samples written: {kept_n:,} read back, "
              f"{lost} lost ({'ok' if lost == 0 else 'MISSED'})")  # fmt: skip


if __name__ == "__main__":
    main()
