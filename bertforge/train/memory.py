"""Hand freed heap memory back to the operating system during long runs.

Training allocates tensors whose sizes change every step (unpadded tokens, masked
positions). glibc's malloc keeps what such tensors leave behind as fragmented free
space inside its heaps, so a process's resident memory climbs for as long as it
trains although nothing leaks: measured on the Austen BERT-mini recipe, 1.25 GB ->
2.7 GB in the first 200 steps and ~4.9 GB by step 1,090. `malloc_trim` returns
those free pages; called every few dozen steps it held the same run at 1.3-2.0 GB
with no change in step time (forcing big tensors onto mmap instead cost ~50%).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

TRIM_EVERY = 25  # optimizer steps between trims: a trim takes milliseconds, a step ~1 s on CPU


@functools.cache
def _glibc():
    """The C library when it is glibc (which has malloc_trim), else None (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the OS; True when there was a glibc to ask."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
