"""Host memory for the CPU engine: keep freed pages in the process.

A CPU forward allocates large temporaries every step (the gathered K/V of a decode batch,
tens of MB at 8 requests x 8k tokens). glibc's malloc serves allocations that large with
fresh `mmap`s and returns freed heap tops to the kernel, so every step faults in and zeroes
those pages again: about 2.6 million minor faults and a fifth of the CPU time in the kernel
over a grid of decode steps here, and a step time that grows faster than its bytes. With
`keep_freed_memory` the process serves them from its heap and keeps what it frees (what
vLLM's CPU backend gets by preloading tcmalloc): 0.3 million faults on the same grid.

`HYCACHE_KEEP_HOST_MEMORY=0` leaves malloc as it is. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt(3) parameters
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4

_TOP_PAD_BYTES = 64 << 20
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest one (2 GiB of free heap top)

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to serve every allocation from the heap (no `mmap`), grow it 64 MiB
    at a time and never trim it. Once per process; True if it is in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("HYCACHE_KEEP_HOST_MEMORY", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_MAX, 0),
            (_M_TRIM_THRESHOLD, _NEVER_TRIM),
            (_M_TOP_PAD, _TOP_PAD_BYTES),
        )
    )
    return _applied
