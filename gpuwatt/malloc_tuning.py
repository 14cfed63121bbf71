"""glibc's allocator tuned for a process that reads large engine answers again and again.

A cold dashboard view of 1,024 GPUs allocates and frees tens of MB in large blocks (an export's
text, its numbers, the frames built from them), in threads started for each read. With glibc's
defaults those blocks go back to the kernel when freed and new threads spread over arenas of
their own, so the next view faults the same pages in again: 15,000-25,000 minor faults and
50-95 ms of system CPU per cold 1 h view on VictoriaMetrics. Tuned (two arenas, blocks up to
32 MiB from the heap, up to 256 MiB of free heap kept), cold 1 h views took 5-10 % less wall
time and 10-15 % less CPU, and the process held ~320 instead of ~340-400 MB (four pages, five
cold views each, alternated runs; ``bench/dashboard.py --store`` times the server's path, which
is tuned as ``dashboard.server.start`` tunes it).
"""

from __future__ import annotations

import ctypes
import platform

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

ARENAS = 2
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest on 64-bit systems
TRIM_THRESHOLD_BYTES = 256 << 20


def tune_for_large_reads() -> bool:
    """Tune this process's allocator where its C library is glibc; whether it was. Other C
    libraries (musl) are left as they are."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = [
        mallopt(M_ARENA_MAX, ARENAS),
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    ]
    return all(done)
