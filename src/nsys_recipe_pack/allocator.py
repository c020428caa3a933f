"""How the pack's memory is allocated and handed back: a long capture's map makes and frees thousands of arrays, in
several threads at once."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os

import pyarrow as pa

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_BYTES = 4 << 20
TRIM_THRESHOLD_BYTES = 32 << 20


@functools.cache
def reuse_freed_memory() -> None:
    """Let glibc hand the arrays a map frees (up to 4 MB each) on to the next ones, keeping up to 32 MB of free heap,
    where by default it maps most of them fresh from the system and faults their pages in again: a long capture's
    span-by-span map makes thousands. Measured on bench/RESULTS.md's huge reports: compute_memory_share on the
    SYNTHETIC x4 Parquet export 12.5 s against 11.4 s (system time 4.8 s against 3.4 s), straggler_heatmap on the
    5.4 GB SQLite export 54.8 s against 49.2 s, its peak 1.30 GB against 1.39 GB. Keeping 64 MB was faster still
    and took that peak to 1.45 GB: each read-ahead thread's arena keeps its own.

    Arrow's buffers come from its jemalloc pool where pyarrow has one and ARROW_DEFAULT_MEMORY_POOL chooses none:
    mimalloc, pyarrow's default of late, gives freed pages back sooner and faults them in again. On the 680 MB
    Parquet export (two runs each, mimalloc against jemalloc): straggler_heatmap 5.4-5.7 s against 4.6-4.7 s (system
    time 2.5 s against 1.1 s, peak 0.90 GB against 0.82), comm_overlap 5.6-5.9 s against 4.9-5.3 s,
    compute_memory_share 3.7-3.8 s against 3.4-3.6 s."""
    libc = _glibc()
    if libc is not None:  # else: its own defaults
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        with contextlib.suppress(NotImplementedError):  # a pyarrow built without it
            pa.set_memory_pool(pa.jemalloc_memory_pool())


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, whose allocator the maps tune and the runner trims; None where the C library is another."""
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
        return libc if all(hasattr(libc, f) for f in ("mallopt", "malloc_trim")) else None
    return None


def give_back_freed_memory() -> None:
    """Hands the pages freed back to the system: glibc keeps what the read-ahead threads freed in their own arenas,
    where others cannot reuse it. Before the reduce (a long capture's map: 0.4 GB of 1.1 GB), and between a long
    capture's read ahead of its spans and the spans (inputs.rank_data: straggler_heatmap on the 5.4 GB Parquet
    export of bench/RESULTS.md peaked at 1.54 GB without, 1.20 GB with)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    pa.default_memory_pool().release_unused()
