"""Freed heap memory goes back to the OS during training (glibc otherwise keeps it as RSS)."""
import os

import pytest

from bertforge.train.memory import _glibc, release_freed_memory

# Asks the module itself, so musl Linux skips as macOS and Windows do.
glibc_only = pytest.mark.skipif(_glibc() is None, reason="malloc_trim is glibc's")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@glibc_only
def test_release_returns_the_holes_a_fragmented_heap_keeps():
    # 100 KB blocks sit below glibc's mmap threshold, so they live in the heap; freeing every
    # other one leaves ~100 MB of holes that free() alone does not hand back.
    blocks = [bytearray(100_000) for _ in range(2_000)]
    del blocks[::2]
    before = resident_bytes()
    assert release_freed_memory()
    assert before - resident_bytes() > 50_000_000
    del blocks

