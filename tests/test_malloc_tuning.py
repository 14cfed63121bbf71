"""The allocator tuning a dashboard server applies at start (``gpuwatt.malloc_tuning``): on
glibc it takes, and large blocks freed by threads are kept for the next ones instead of being
faulted in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from gpuwatt.malloc_tuning import tune_for_large_reads

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: A cold view's allocation pattern in small: threads started for each round of reads, each
#: allocating and freeing blocks of a few to 20 MB (touched, as parsed text and arrays are).
ROUNDS = """
import resource, sys, threading
from gpuwatt.malloc_tuning import tune_for_large_reads
if sys.argv[1] == "tuned":
    assert tune_for_large_reads()
def reads():
    for size_mb in (20, 6, 20, 12, 20):
        block = bytearray(size_mb << 20)
        del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    threads = [threading.Thread(target=reads) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_the_tuned_allocator_keeps_large_blocks_for_the_next_threads() -> None:
    assert tune_for_large_reads()  # takes; again in the same process too
    assert tune_for_large_reads()
    block_pages = (20 << 20) // 4096
    untuned, tuned = faults("default"), faults("tuned")
    # glibc's defaults fault at least one 20 MB block more in (measured: 15,434 vs 10,311)
    assert tuned + block_pages // 2 < untuned, (tuned, untuned)


def test_another_c_library_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert tune_for_large_reads() is False
