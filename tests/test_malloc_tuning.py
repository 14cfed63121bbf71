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

#: Run in a fresh process, tuned or not: "blocks" prints the page faults of four 20 MB blocks
#: allocated (touched, as parsed text and arrays are) and freed one after another; "arenas"
#: prints how many arenas the allocator holds while four threads hold a block each. Neither
#: depends on how the threads are scheduled. (The first version of this test ran the blocks in
#: three threads at once: how much of them was alive together, and so its fault count, varied
#: with the scheduling, and a loaded CI machine once measured the same count tuned or not.)
PROBE = """
import ctypes, os, resource, sys, tempfile, threading
from gpuwatt.malloc_tuning import tune_for_large_reads
if sys.argv[1] == "tuned":
    assert tune_for_large_reads()
if sys.argv[2] == "blocks":
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        block = bytearray(20 << 20)
        del block
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
else:
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    held, done = threading.Barrier(5), threading.Event()
    def hold():
        block = bytearray(1 << 20)
        held.wait()
        done.wait()
        del block
    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    held.wait()
    fd, path = tempfile.mkstemp()
    os.close(fd)
    out = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, out)
    libc.fclose(out)
    done.set()
    for t in threads:
        t.join()
    with open(path) as f:
        print(f.read().count("<heap nr="))
    os.unlink(path)
"""


def probe(mode: str, what: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, what], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_the_tuned_allocator_keeps_large_blocks_for_the_next_ones() -> None:
    assert tune_for_large_reads()  # takes; again in the same process too
    assert tune_for_large_reads()
    block_pages = (20 << 20) // 4096
    untuned, tuned = probe("default", "blocks"), probe("tuned", "blocks")
    # glibc's defaults map the first block and give it back, so the second is faulted in again
    # (measured: 10,230 against 5,109 page faults); tuned, the first block's pages are kept
    assert tuned < 1.5 * block_pages < untuned, (tuned, untuned)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_the_tuned_allocator_holds_two_arenas_whatever_the_threads() -> None:
    # four threads at once: an arena each and the main one by default (measured: 5), two tuned
    assert probe("tuned", "arenas") == 2 < probe("default", "arenas")


def test_another_c_library_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert tune_for_large_reads() is False
