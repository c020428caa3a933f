"""The `mpi` job of SYNTHETIC exports (`nsys-recipe synth --job mpi`, synth.py): no NVTX; per iteration each rank
launches one kernel, waits for it in cudaDeviceSynchronize, then meets the others in MPI_Allreduce (released
together, after the last arrives)."""

from __future__ import annotations

import numpy as np

from .lazy import pd
from .synth import (
    COMPUTE_STREAM,
    JITTER,
    LAUNCH_API,
    MPI_CALL,
    MPI_KERNEL,
    MPI_KERNEL_MS,
    MPI_SYNC_API,
    MPI_TRANSFER_NS,
    MS,
    PID_BASE,
    STEP_GAP_NS,
    US,
    _by_start,
    _global_pid,
)


def timeline(ranks: int, iterations: int, stragglers: list, rng) -> dict:
    """Kernel durations per (rank, iteration) and each rank's kernel start on the common clock. A rank arrives
    at MPI_Allreduce once its kernel is done; all leave at the last arrival plus the transfer, and launch
    the next kernel a fixed host time later."""
    kernel = np.round(MPI_KERNEL_MS * MS * rng.uniform(1 - JITTER, 1 + JITTER, size=(ranks, iterations))
                      ).astype(np.int64)
    extra = np.zeros((ranks, iterations), np.int64)
    for s in stragglers:
        it = slice(s.first, s.last + 1)
        extra[s.rank, it] = np.round((s.slowdown - 1.0) * kernel[s.rank, it]).astype(np.int64)
    kernel += extra
    # launch at t, the kernel runs [t + 20 us, + kernel], the sync returns 5 us later, MPI starts 2 us after
    arrive = 20 * US + kernel + 7 * US
    step = arrive.max(axis=0) + MPI_TRANSFER_NS + STEP_GAP_NS
    launch = np.zeros(iterations, np.int64)
    launch[1:] = np.cumsum(step)[:-1]
    return {"kernel": kernel, "launch": launch, "release": launch + arrive.max(axis=0) + MPI_TRANSFER_NS,
            "extra": extra}


def rank_tables(r: int, tl: dict, iterations: int, shift: int, gpus_per_node: int, strings: dict, first: int = 0,
                     total: int | None = None) -> dict:
    pid = PID_BASE + r
    gpid = _global_pid(pid)
    gtid = gpid | pid
    launch = tl["launch"] + shift
    k_start = launch + 20 * US
    k_end = k_start + tl["kernel"][r]
    release = tl["release"] + shift
    corr = (first + np.arange(iterations, dtype=np.int64)) * 2 + 101
    kernels = pd.DataFrame({
        "start": k_start, "end": k_end, "deviceId": r % gpus_per_node, "contextId": np.uint64(1),
        "streamId": np.uint64(COMPUTE_STREAM), "correlationId": corr, "globalPid": np.uint64(gpid),
        "demangledName": np.uint64(strings[MPI_KERNEL]), "shortName": np.uint64(strings[MPI_KERNEL]),
        "mangledName": np.uint64(strings[MPI_KERNEL]), "launchType": 1, "cacheConfig": 0, "registersPerThread": 32,
        "gridX": 512, "gridY": 1, "gridZ": 1, "blockX": 256, "blockY": 1, "blockZ": 1, "staticSharedMemory": 0,
        "dynamicSharedMemory": 0, "localMemoryPerThread": 0, "localMemoryTotal": 0, "gridId": corr,
        "sharedMemoryExecuted": 0, "sharedMemoryLimitConfig": 0})
    runtime = pd.DataFrame({
        "start": np.concatenate([launch, launch + 10 * US]), "end": np.concatenate([launch + 8 * US, k_end + 5 * US]),
        "eventClass": 0, "globalTid": np.uint64(gtid), "correlationId": np.concatenate([corr, corr + 1]),
        "nameId": np.repeat(np.array([strings[LAUNCH_API], strings[MPI_SYNC_API]], np.uint64), iterations),
        "returnValue": 0})
    mpi = pd.DataFrame({"start": k_end + 7 * US, "end": release, "globalTid": np.uint64(gtid),
                        "textId": strings[MPI_CALL]})
    return {"CUPTI_ACTIVITY_KIND_KERNEL": kernels, "CUPTI_ACTIVITY_KIND_RUNTIME": _by_start(runtime),
            "MPI_OTHER_EVENTS": mpi}
