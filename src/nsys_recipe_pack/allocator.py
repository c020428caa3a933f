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
    """Called by the command line only (cli.py), whose map workers fork from it: the Python API leaves the allocator
    of a user's process (a JupyterLab kernel) as it was.

    Let glibc hand the arrays a map frees (up to 4 MB each) on to the next ones, keeping up to 32 MB of free heap,
    where by default it maps most of them fresh from the system and faults their pages in again: a long capture's
    span-by-span map makes thousands. A larger free heap is quicker still but raises the peak, as each read-ahead
    thread's arena keeps its own.

    Arrow's buffers come from its jemalloc pool where pyarrow has one and ARROW_DEFAULT_MEMORY_POOL chooses none:
    mimalloc, pyarrow's default of late, gives freed pages back sooner and faults them in again, which costs a long
    capture's map system time."""
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


def worker_env(env: dict) -> dict:
    """The environment of a worker process the command line starts without forking (`nsys-recipe dask-worker`): the
    same allocator settings as reuse_freed_memory's, through glibc's tunables and Arrow's pool variable, where the
    user set none of their own."""
    env = dict(env)
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    for name, value in (("glibc.malloc.mmap_threshold", MMAP_THRESHOLD_BYTES),
                        ("glibc.malloc.trim_threshold", TRIM_THRESHOLD_BYTES)):
        if not any(t.startswith(name + "=") for t in tunables):
            tunables.append(f"{name}={value}")
    env["GLIBC_TUNABLES"] = ":".join(tunables)
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    return env


def give_back_freed_memory() -> None:
    """Hands the pages freed back to the system: glibc keeps what the read-ahead threads freed in their own arenas,
    where others cannot reuse it. Before the reduce, and between a long capture's read ahead of its spans and the
    spans (inputs.rank_data), where it lowers the peak by about a fifth."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    pa.default_memory_pool().release_unused()
