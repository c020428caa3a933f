"""SYNTHETIC Nsight Systems exports with known stragglers, for tests with exact answers and scale runs.

Everything written here is labelled synthetic: a README.md and truth.json beside the exports and a
`SYNTHETIC` row in each export's META_DATA_EXPORT. Table and column names, column order and types are
those of a real Nsight Systems 2023.4 export: `data/nsys_2023_4_schema.json` (made by
scripts/dump_export_schema.py) plus `synth_export.EXTRA_TABLES`; tests/test_synth.py checks every table written
against the record of a real export in tests/data/nsys_2023_4_schema.json.

The model, per rank (one process, one GPU, one main thread):
- every iteration is an NVTX push/pop range `step` with the children dataloader, forward, backward,
  allreduce, optimizer, back to back on the main thread;
- forward and backward launch compute kernels (`cudaLaunchKernel_v7000` on the main thread, the kernel on
  stream 7 shortly after); the allreduce range launches one NCCL kernel on stream 13 that starts when
  this rank arrives and ends when the slowest rank has arrived plus a fixed transfer time, the same
  instant on the common clock for every rank; the host range ends 10 us after the kernel (it syncs on it);
- fixed extra GPU work (copies of every kind, a memset, a CUDA graph, a synchronous `.item()` with a
  stream sync, a kernel overlapping another stream) and nested ranges on a data-loading worker thread.
Each rank's session starts at its own instant (a few ms apart) and its timestamps are relative to it, so
only `TARGET_INFO_SESSION_START_TIME.utcEpochNs + start` lines the ranks up.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from . import progress
from .errors import UsageError
from .lazy import pd
from .staging import staged_output
from .synth_export import (
    check_output,
    export_writer,
    schema_of,
    shared_tables,
    typed,
)
from .synth_memory import MemoryPlan, memory_events, memory_truth, parse_memory

MS = 1_000_000
US = 1_000
BASE_UTC_NS = 1_700_000_000_000_000_000  # the common clock's zero, 2023-11-14T22:13:20Z
CHILDREN = ["dataloader", "forward", "backward", "allreduce", "optimizer"]
NOMINAL_MS = {"dataloader": 3.0, "forward": 30.0, "backward": 50.0, "optimizer": 5.0}
JITTER = 0.03  # each child range's duration is nominal x U(1 - JITTER, 1 + JITTER), per rank and iteration
TRANSFER_MS = 4.0
STEP_GAP_NS = 200 * US  # host time between one step's end and the next step's start
FIRST_STEP_NS = 1_000 * MS  # the first step starts this long after the latest session start
NCCL_SYNC_NS = 10 * US  # the allreduce range ends this long after its NCCL kernel
FWD_KERNELS = ["sgemm_128x64_nn", "relu_fwd", "layer_norm_fwd", "softmax_fwd"]
BWD_KERNELS = ["sgemm_128x64_nt", "sgemm_64x64_tn", "relu_bwd", "layer_norm_bwd", "softmax_bwd", "adam_update"]
NCCL_SHORT = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
NCCL_FULL = NCCL_SHORT + "(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_MANGLED = f"_Z{len(NCCL_SHORT)}{NCCL_SHORT}P11ncclDevCommmP8ncclWork"
COMPUTE_STREAM, NCCL_STREAM, OVERLAP_STREAM = 7, 13, 9
LAUNCH_API = "cudaLaunchKernel_v7000"
TEXT_ID_NAMES = {"dataloader", "backward", "optimizer"}  # NVTX names stored via textId; all others in `text`
GRAPH_KERNELS = ["graph_fused_add", "graph_scale", "graph_copy"]
OVERLAP_KERNEL = "bucket_reduce"
EXTRA_APIS = ["cudaMemcpyAsync_v3020", "cudaMemsetAsync_v3020", "cudaMemcpy_v3020", "cudaStreamSynchronize_v3020",
              "cudaGraphLaunch_v10000"]
WORKER_RANGES = ["prefetch", "decode"]
MAIN_THREAD_NAME, WORKER_THREAD_NAME = "python3", "dataloader_worker"
# Fixed GPU work per iteration, in ns after the start of the range named (exact, never jittered), so tests
# can state expected values by hand. (name, range, start, end, kind)
EXTRA_OPS = [
    ("htod_pinned", "dataloader", 100 * US, 300 * US, "memcpy"),      # 4 MB from pinned memory
    ("htod_pageable", "dataloader", 400 * US, 550 * US, "memcpy"),    # 1 MB from pageable memory, blocks the host
    ("memset", "dataloader", 600 * US, 650 * US, "memset"),
    ("dtod", "optimizer", 100 * US, 200 * US, "memcpy"),
    ("peer", "optimizer", 300 * US, 380 * US, "memcpy"),
    ("graph_fused_add", "optimizer", 500 * US, 600 * US, "graph"),
    ("graph_scale", "optimizer", 600 * US, 700 * US, "graph"),
    ("graph_copy", "optimizer", 700 * US, 800 * US, "graph"),
    ("dtoh_item", "optimizer", 950 * US, 960 * US, "memcpy"),         # loss.item(): 4 bytes, synchronous
]
OVERLAP_BEFORE_ARRIVAL = (3 * MS, 2 * MS)  # bucket_reduce on stream 9, inside the last backward kernel
JOBS = ("nccl", "mpi")
# The `mpi` job's names and times (synth_mpi.py)
MPI_KERNEL, MPI_KERNEL_MS = "jacobi_kernel", 5.0
MPI_SYNC_API, MPI_CALL = "cudaDeviceSynchronize_v3020", "MPI_Allreduce"
MPI_TRANSFER_NS = 500 * US
CAUSES = ("dataloader", "compute", "gpu")
ACCEPTABLE_CAUSES = {"dataloader": ["dataloader"], "compute": ["forward", "backward", "gpu_compute"],
                     "gpu": ["backward", "gpu_compute"]}

# globalTid = VM id (1 in the high 16 bits) | pid << 24 | tid, as Nsight Systems encodes it; globalPid has tid 0.
GLOBAL_VM = 1 << 48
PID_BASE = 4000
NO_ID = 0xFFFFFFFF  # what CUPTI records where an id does not apply (e.g. eventId of a stream sync)
NAME_ENUM = {"DeviceEnvironment": 610, "Hostname": 619}  # TARGET_INFO_SYSTEM_ENV.nameEnum in 2023.4
BLOCK_ITERATIONS = 20_000  # a rank's events are made and written this many iterations at a time: a long capture
# (millions of kernels) in bounded memory, the same export whatever the block
KERNELS_PER_STEP = len(FWD_KERNELS) + len(BWD_KERNELS) + 1  # and the NCCL kernel: one correlation id each
EXTRA_IDS = 10  # correlation ids per iteration of the extra GPU work (_gpu_extras)


@dataclass(frozen=True)
class Straggler:
    """Rank `rank` is slow in iterations first..last (inclusive; last = -1: to the end).

    slowdown multiplies the rank's own busy time (step minus allreduce) in those iterations: with cause
    `dataloader` the extra is a host stall inside the dataloader range; with `compute` forward and backward
    (ranges and their kernels) stretch by the same total; with `gpu` only backward's kernels do (the GPU is
    slow, its host range keeps its length), so the rank's NCCL kernel starts that much later on its GPU.
    In a `mpi` job only `gpu` applies: the rank's kernel runs that much longer."""
    rank: int
    first: int
    last: int
    cause: str = "dataloader"
    slowdown: float = 1.5


def parse_straggler(text: str) -> Straggler:
    """`rank=R,iterations=A-B,cause=dataloader|compute|gpu,slowdown=X` (iterations also `A`, `A-` or `all`)."""
    usage = f"--straggler {text!r}: give rank=R,iterations=A-B[,cause=dataloader|compute|gpu][,slowdown=X]"
    fields = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{usage} (KEY=VALUE pairs separated by commas)")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"rank", "iterations", "cause", "slowdown"}
    if unknown:
        raise ValueError(f"{usage}; unknown key {', '.join(sorted(unknown))}")
    if "rank" not in fields or "iterations" not in fields:
        raise ValueError(usage)
    if not fields["rank"].isdigit():
        raise ValueError(f"--straggler {text!r}: rank must be a whole number >= 0")
    span = fields["iterations"]
    m = re.fullmatch(r"(\d+)(-(\d*))?", span)
    if span == "all":
        first, last = 0, -1
    elif m:
        first = int(m.group(1))
        last = int(m.group(3)) if m.group(3) else (-1 if m.group(2) else first)
    else:
        raise ValueError(f"--straggler {text!r}: iterations must be A-B, A, A- or all")
    if last != -1 and last < first:
        raise ValueError(f"--straggler {text!r}: iterations A-B needs A <= B")
    cause = fields.get("cause", "dataloader")
    if cause not in CAUSES:
        raise ValueError(f"--straggler {text!r}: cause must be one of {', '.join(CAUSES)}")
    try:
        slowdown = float(fields.get("slowdown", 1.5))
    except ValueError:
        raise ValueError(f"--straggler {text!r}: slowdown must be a number > 1 (1.5 adds 50 %)") from None
    if not slowdown > 1.0 or not np.isfinite(slowdown):
        raise ValueError(f"--straggler {text!r}: slowdown must be a number > 1 (1.5 adds 50 %)")
    return Straggler(int(fields["rank"]), first, last, cause, slowdown)



# ---------------------------------------------------------------------------------------------------------
# the model

def _global_pid(pid: int) -> int:
    return GLOBAL_VM | (pid << 24)


def _check_stragglers(stragglers, ranks: int, iterations: int) -> list[Straggler]:
    out = []
    for s in stragglers:
        last = iterations - 1 if s.last == -1 else s.last
        if not 0 <= s.rank < ranks or not 0 <= s.first < iterations or not s.first <= last < iterations:
            raise UsageError(f"straggler rank={s.rank},iterations={s.first}-{s.last}: outside {ranks} ranks x "
                             f"{iterations} iterations (ranks 0-{ranks - 1}, iterations 0-{iterations - 1})")
        if s.cause not in CAUSES:
            raise UsageError(f"straggler cause {s.cause!r}: use one of {', '.join(CAUSES)}")
        if not s.slowdown > 1.0 or not np.isfinite(s.slowdown):
            raise UsageError(f"straggler slowdown {s.slowdown}: must be > 1 (1.5 adds 50 %)")
        out.append(replace(s, last=last, slowdown=float(s.slowdown)))
    return out


def _timeline(ranks: int, iterations: int, stragglers: list[Straggler], rng) -> dict:
    """Child durations per (rank, iteration) and start times on the common clock (ns since BASE_UTC_NS,
    first step at 0). The allreduce releases everybody at max(arrival) + transfer, so
    release[i] = release[i-1] + max_r(optimizer[r, i-1] + gap + pre[r, i]) + transfer: one cumulative sum."""
    dur = {c: np.round(NOMINAL_MS[c] * MS * rng.uniform(1 - JITTER, 1 + JITTER, size=(ranks, iterations)))
           .astype(np.int64) for c in NOMINAL_MS}
    extra = np.zeros((ranks, iterations), np.int64)
    gpu_late = np.zeros((ranks, iterations), np.int64)  # how much later the GPU finishes than the host's range
    for s in stragglers:  # a handful of specs, each vectorised over its iterations
        it = slice(s.first, s.last + 1)
        busy = sum(dur[c][s.rank, it] for c in NOMINAL_MS)
        add = np.round((s.slowdown - 1.0) * busy).astype(np.int64)
        if s.cause == "dataloader":
            dur["dataloader"][s.rank, it] += add
        elif s.cause == "gpu":
            gpu_late[s.rank, it] += add
        else:
            fw, bw = dur["forward"][s.rank, it], dur["backward"][s.rank, it]
            add_fw = np.round(add * fw / (fw + bw)).astype(np.int64)
            dur["forward"][s.rank, it] = fw + add_fw
            dur["backward"][s.rank, it] = bw + add - add_fw
        extra[s.rank, it] += add
    transfer = int(TRANSFER_MS * MS)
    pre = dur["dataloader"] + dur["forward"] + dur["backward"]
    ready = pre + gpu_late  # the NCCL kernel starts once the rank's GPU work is done
    step = np.empty(iterations, np.int64)
    step[0] = ready[:, 0].max() + transfer
    step[1:] = (dur["optimizer"][:, :-1] + STEP_GAP_NS + ready[:, 1:]).max(axis=0) + transfer
    release = np.cumsum(step)
    step_start = np.zeros((ranks, iterations), np.int64)
    step_start[:, 1:] = release[None, :-1] + dur["optimizer"][:, :-1] + STEP_GAP_NS
    return {"dur": dur, "step_start": step_start, "arrival": step_start + pre, "release": release, "extra": extra,
            "gpu_late": gpu_late}


def _rank_tables(r: int, tl: dict, iterations: int, shift: int, gpus_per_node: int, strings: dict, first: int = 0,
                 total: int | None = None, memory: MemoryPlan | None = None) -> dict:
    """The event tables of one rank; local time = common time + shift (the rank's clock). `tl` may hold a block
    of the iterations (`_block`): those from `first` on, of `total`; the ids are those the whole run gives."""
    pid = PID_BASE + r
    gpid = _global_pid(pid)
    gtid = gpid | pid
    d = {c: v[r] for c, v in tl["dur"].items()}
    s0 = tl["step_start"][r] + shift
    arr = tl["arrival"][r] + shift
    rel = tl["release"] + shift + NCCL_SYNC_NS  # the host range ends after the NCCL kernel
    dl_end = s0 + d["dataloader"]
    fw_end = dl_end + d["forward"]
    opt_end = rel + d["optimizer"]
    spans = {
        "step": (s0, opt_end), "dataloader": (s0, dl_end), "forward": (dl_end, fw_end),
        "backward": (fw_end, arr), "allreduce": (arr, rel), "optimizer": (rel, opt_end),
    }
    order = ["step", *CHILDREN]
    starts = np.stack([spans[n][0] for n in order], axis=1).ravel()
    ends = np.stack([spans[n][1] for n in order], axis=1).ravel()
    names = np.tile(np.array(order, dtype=object), iterations)
    by_id = np.isin(names, list(TEXT_ID_NAMES))
    nvtx = pd.DataFrame({
        "start": starts, "end": ends, "eventType": 59,
        "text": np.where(by_id, None, names),
        "globalTid": np.uint64(gtid),
        "textId": pd.Series(names).map(strings).where(by_id).astype("Int64"),
        "domainId": np.uint64(0),
    })

    # compute kernels, evenly spread over forward and backward, plus one NCCL kernel per iteration; a slow
    # GPU (`late` > 0) runs backward's kernels over a longer span than the host range that launched them
    def spread(r_start, r_end, kernels, late=0):
        k = len(kernels)
        slot = (r_end - r_start) / k
        gpu_slot = (r_end + late - r_start) / k
        idx = np.arange(k)
        launch = (r_start[:, None] + (idx[None, :] * slot[:, None]) + 50 * US).astype(np.int64)
        k_start = (r_start[:, None] + (idx[None, :] * gpu_slot[:, None]) + 70 * US).astype(np.int64)
        k_end = (r_start[:, None] + ((idx[None, :] + 0.9) * gpu_slot[:, None])).astype(np.int64)
        name = np.tile(np.array(kernels, dtype=object), len(r_start))
        return launch.ravel(), k_start.ravel(), k_end.ravel(), name

    late = tl["gpu_late"][r]
    parts = [spread(*spans["forward"], FWD_KERNELS), spread(*spans["backward"], BWD_KERNELS, late)]
    nccl_launch = arr + 10 * US
    nccl_end = rel - NCCL_SYNC_NS  # = max ready + transfer on the common clock, for every rank
    parts.append((nccl_launch, nccl_launch + 20 * US + late, nccl_end, np.full(iterations, NCCL_FULL, dtype=object)))
    launch = np.concatenate([p[0] for p in parts])
    k_start = np.concatenate([p[1] for p in parts])
    k_end = np.concatenate([p[2] for p in parts])
    k_name = np.concatenate([p[3] for p in parts])
    order_k = np.argsort(launch, kind="mergesort")
    launch, k_start, k_end, k_name = launch[order_k], k_start[order_k], k_end[order_k], k_name[order_k]
    # in launch order, iteration after iteration; then the extra work's, EXTRA_IDS per iteration
    corr = 101 + KERNELS_PER_STEP * first + np.arange(len(launch), dtype=np.int64)
    is_nccl = k_name == NCCL_FULL
    full_ids = pd.Series(k_name).map(strings).to_numpy(np.uint64)
    short_ids = np.where(is_nccl, strings[NCCL_SHORT], full_ids).astype(np.uint64)
    mangled_ids = np.where(is_nccl, strings[NCCL_MANGLED], full_ids).astype(np.uint64)  # extern "C" kernels
    device = r % gpus_per_node
    kernels = pd.DataFrame({
        "start": k_start, "end": k_end, "deviceId": device, "contextId": np.uint64(1),
        "streamId": np.where(is_nccl, NCCL_STREAM, COMPUTE_STREAM).astype(np.uint64), "correlationId": corr,
        "globalPid": np.uint64(gpid), "demangledName": full_ids, "shortName": short_ids,
        "mangledName": mangled_ids, "launchType": 1, "cacheConfig": 0,
        "registersPerThread": np.where(is_nccl, 96, 32), "gridX": np.where(is_nccl, 2, 128), "gridY": 1, "gridZ": 1,
        "blockX": np.where(is_nccl, 640, 256), "blockY": 1, "blockZ": 1, "staticSharedMemory": 0,
        "dynamicSharedMemory": 0, "localMemoryPerThread": 0, "localMemoryTotal": 0, "gridId": corr,
        "sharedMemoryExecuted": 0, "sharedMemoryLimitConfig": 0,
    })
    runtime = pd.DataFrame({
        "start": launch, "end": launch + 8 * US, "eventClass": 0, "globalTid": np.uint64(gtid),
        "correlationId": corr, "nameId": np.uint64(strings[LAUNCH_API]), "returnValue": 0,
    })
    first_extra = 101 + KERNELS_PER_STEP * (iterations if total is None else total) + EXTRA_IDS * first
    extra = _gpu_extras(spans, iterations, gtid, gpid, pid, device, gpus_per_node, first_extra, strings)
    memory_tables = {} if memory is None else {
        "CUDA_GPU_MEMORY_USAGE_EVENTS": memory_events(memory, r, spans, first, total or iterations, gpid, device)}
    return {
        **memory_tables,
        "NVTX_EVENTS": _by_start(nvtx, extra["nvtx"]),
        "CUPTI_ACTIVITY_KIND_KERNEL": _by_start(kernels, extra["kernels"]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": _by_start(runtime, extra["runtime"]),
        "CUPTI_ACTIVITY_KIND_MEMCPY": _by_start(extra["memcpy"]),
        "CUPTI_ACTIVITY_KIND_MEMSET": _by_start(extra["memset"]),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": _by_start(extra["sync"]),
    }


def _block(tl: dict, first: int, stop: int) -> dict:
    """The timeline of iterations first..stop-1: every array cut along its last axis (the iterations)."""
    return {k: _block(v, first, stop) if isinstance(v, dict) else v[..., first:stop] for k, v in tl.items()}


def _by_start(*frames: pd.DataFrame) -> pd.DataFrame:
    """Rows in start order, as Nsight Systems writes its event tables."""
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return df.sort_values("start", kind="mergesort", ignore_index=True)


def _gpu_extras(spans: dict, iterations: int, gtid: int, gpid: int, pid: int, device: int, gpus_per_node: int,
                first_corr: int, strings: dict) -> dict:
    """Copies of every kind (pinned and pageable), a memset, a CUDA graph, a synchronous `.item()` with its
    stream sync, a kernel overlapping another stream, and nested NVTX ranges on a second thread."""
    n = iterations
    corr = first_corr + np.arange(n)[:, None] * EXTRA_IDS + np.arange(EXTRA_IDS)[None, :]
    base = {name: spans[rng][0] for name, rng, *_ in EXTRA_OPS}
    at = {name: (base[name] + s0, base[name] + e0) for name, _, s0, e0, _ in EXTRA_OPS}
    rows_rt = []

    def call(api, start, end, c):
        rows_rt.append(pd.DataFrame({"start": start, "end": end, "eventClass": 0, "globalTid": np.uint64(gtid),
                                     "correlationId": c, "nameId": np.uint64(strings[api]), "returnValue": 0}))

    # host calls: async copies return at once, the pageable one blocks for the copy; .item() blocks on its copy
    call("cudaMemcpyAsync_v3020", at["htod_pinned"][0] - 20 * US, at["htod_pinned"][0] - 10 * US, corr[:, 0])
    call("cudaMemcpyAsync_v3020", at["htod_pageable"][0] - 20 * US, at["htod_pageable"][1] + 10 * US, corr[:, 1])
    call("cudaMemsetAsync_v3020", at["memset"][0] - 20 * US, at["memset"][0] - 10 * US, corr[:, 2])
    call("cudaMemcpyAsync_v3020", at["dtod"][0] - 20 * US, at["dtod"][0] - 10 * US, corr[:, 3])
    call("cudaMemcpyAsync_v3020", at["peer"][0] - 20 * US, at["peer"][0] - 10 * US, corr[:, 4])
    call("cudaGraphLaunch_v10000", at["graph_fused_add"][0] - 50 * US, at["graph_fused_add"][0] - 42 * US, corr[:, 5])
    call("cudaMemcpy_v3020", at["dtoh_item"][0] - 50 * US, at["dtoh_item"][1] + 40 * US, corr[:, 6])
    sync_start = base["dtoh_item"] + 1_100 * US
    call("cudaStreamSynchronize_v3020", sync_start, sync_start + 200 * US, corr[:, 7])
    arrival = spans["allreduce"][0]
    call(LAUNCH_API, arrival - OVERLAP_BEFORE_ARRIVAL[0] - 30 * US,
         arrival - OVERLAP_BEFORE_ARRIVAL[0] - 22 * US, corr[:, 8])

    def copies(names, kind, src, dst, nbytes, c, src_dev, dst_dev):
        return pd.DataFrame({"start": at[names][0], "end": at[names][1], "deviceId": device, "contextId": np.uint64(1),
                             "streamId": np.uint64(COMPUTE_STREAM), "correlationId": c, "globalPid": np.uint64(gpid),
                             "bytes": nbytes, "copyKind": kind, "srcKind": src, "dstKind": dst,
                             "srcDeviceId": src_dev, "dstDeviceId": dst_dev})

    peer = (device + 1) % gpus_per_node
    memcpy = pd.concat([  # copyKind and src/dstKind as ENUM_CUDA_MEMCPY_OPER / ENUM_CUDA_MEM_KIND number them
        copies("htod_pinned", 1, 1, 2, 4 << 20, corr[:, 0], None, None),
        copies("htod_pageable", 1, 0, 2, 1 << 20, corr[:, 1], None, None),
        copies("dtod", 8, 2, 2, 8 << 20, corr[:, 3], None, None),
        copies("peer", 10, 2, 2, 2 << 20, corr[:, 4], device, peer),
        copies("dtoh_item", 2, 2, 0, 4, corr[:, 6], None, None),
    ], ignore_index=True)
    memset = pd.DataFrame({"start": at["memset"][0], "end": at["memset"][1], "deviceId": device,
                           "contextId": np.uint64(1), "streamId": np.uint64(COMPUTE_STREAM),
                           "correlationId": corr[:, 2],
                           "globalPid": np.uint64(gpid), "value": 0, "bytes": 16 << 20, "memKind": 2})
    graph = [pd.DataFrame({"start": at[k][0], "end": at[k][1], "shortName": np.uint64(strings[k]),
                           "demangledName": np.uint64(strings[k]), "mangledName": np.uint64(strings[k]),
                           "graphNodeId": np.uint64(i + 1), "streamId": np.uint64(COMPUTE_STREAM),
                           "correlationId": corr[:, 5]})
             for i, k in enumerate(GRAPH_KERNELS)]
    overlap = pd.DataFrame({"start": arrival - OVERLAP_BEFORE_ARRIVAL[0], "end": arrival - OVERLAP_BEFORE_ARRIVAL[1],
                            "shortName": np.uint64(strings[OVERLAP_KERNEL]),
                            "demangledName": np.uint64(strings[OVERLAP_KERNEL]),
                            "mangledName": np.uint64(strings[OVERLAP_KERNEL]),
                            "streamId": np.uint64(OVERLAP_STREAM), "correlationId": corr[:, 8]})
    kernels = pd.concat([*graph, overlap], ignore_index=True).assign(
        deviceId=device, contextId=np.uint64(1), globalPid=np.uint64(gpid), launchType=1, cacheConfig=0,
        registersPerThread=32, gridX=64, gridY=1, gridZ=1, blockX=256, blockY=1, blockZ=1, staticSharedMemory=0,
        dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=0, sharedMemoryExecuted=0,
        sharedMemoryLimitConfig=0)
    kernels["gridId"] = kernels["correlationId"] + 1_000_000
    sync = pd.DataFrame({"start": sync_start + 5 * US, "end": sync_start + 195 * US, "deviceId": device,
                         "contextId": np.uint64(1), "streamId": np.uint64(COMPUTE_STREAM), "correlationId": corr[:, 7],
                         "globalPid": np.uint64(gpid), "syncType": 3, "eventId": NO_ID})
    # a data-loading worker thread with nested ranges
    worker_tid = gpid | (pid + 1)
    s0 = spans["dataloader"][0]
    nvtx = pd.DataFrame({
        "start": np.concatenate([s0 + 500 * US, s0 + 1_000 * US]),
        "end": np.concatenate([s0 + 2_500 * US, s0 + 2_000 * US]),
        "eventType": 59, "text": np.repeat(np.array(WORKER_RANGES, dtype=object), n),
        "globalTid": np.uint64(worker_tid), "domainId": np.uint64(0)})
    return {"runtime": pd.concat(rows_rt, ignore_index=True), "memcpy": memcpy, "memset": memset,
            "kernels": kernels, "sync": sync, "nvtx": nvtx}


def _rank_info_tables(r: int, session_utc: int, world: int, gpus_per_node: int, strings: dict,
                      job: str = "nccl") -> dict:
    pid = PID_BASE + r
    gpid = _global_pid(pid)
    node, local = divmod(r, gpus_per_node)
    host = f"synth-node{node:03d}"
    env = {  # what torchrun sets, or Open MPI's mpirun
        "RANK": r, "LOCAL_RANK": local, "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": min(gpus_per_node, world - node * gpus_per_node), "HOSTNAME": host,
        "MASTER_ADDR": "synth-node000", "MASTER_PORT": 29500, "NSYS_RECIPE_PACK_SYNTHETIC": 1,
    } if job == "nccl" else {
        "OMPI_COMM_WORLD_RANK": r, "OMPI_COMM_WORLD_LOCAL_RANK": local, "OMPI_COMM_WORLD_SIZE": world,
        "HOSTNAME": host, "NSYS_RECIPE_PACK_SYNTHETIC": 1,
    }
    utc = pd.Timestamp(session_utc, unit="ns").strftime("%Y-%m-%dT%H:%M:%S")
    return {
        "TARGET_INFO_SESSION_START_TIME": pd.DataFrame({"utcEpochNs": [np.uint64(session_utc)], "utcTime": [utc],
                                                        "localTime": [utc]}),
        "TARGET_INFO_SYSTEM_ENV": pd.DataFrame({
            "globalVid": np.uint64(GLOBAL_VM), "devStateName": "Local (CLI)",
            "name": ["DeviceEnvironment", "Hostname"],
            "nameEnum": [NAME_ENUM["DeviceEnvironment"], NAME_ENUM["Hostname"]],
            "value": [";".join(f"{k}={v}" for k, v in env.items()), host]}),
        "PROCESSES": pd.DataFrame({"globalPid": [np.uint64(gpid)], "pid": [pid], "name": [MAIN_THREAD_NAME]}),
        "ThreadNames": pd.DataFrame({"nameId": [strings[MAIN_THREAD_NAME], strings[WORKER_THREAD_NAME]],
                                     "priority": [20, 20], "globalTid": [gpid | pid, gpid | (pid + 1)]}),
        "TARGET_INFO_GPU": _gpus(node, gpus_per_node),
    }


def _gpus(node: int, gpus_per_node: int) -> pd.DataFrame:
    """The node's GPUs; columns not modelled stay null."""
    ids = np.arange(gpus_per_node)
    return pd.DataFrame({
        "vmId": GLOBAL_VM, "id": ids, "name": "SYNTHETIC GPU", "busLocation": [f"0000:{i + 1:02x}:00.0" for i in ids],
        "isDiscrete": True, "l2CacheSize": 40 << 20, "totalMemory": 80 << 30, "smCount": 108,
        "uuid": [f"{node:08x}-0000-4000-8000-{i:012x}" for i in ids], "chipName": "SYNTHETIC", "cuDevice": ids,
        "threadsPerWarp": 32, "maxThreadsPerBlock": 1024, "computeMajor": 8, "computeMinor": 0,
    })


# ---------------------------------------------------------------------------------------------------------
# writing

def _strings() -> dict:
    names = ["step", *CHILDREN, *FWD_KERNELS, *BWD_KERNELS, NCCL_SHORT, NCCL_FULL, LAUNCH_API, MAIN_THREAD_NAME,
             *GRAPH_KERNELS, OVERLAP_KERNEL, *EXTRA_APIS, NCCL_MANGLED, WORKER_THREAD_NAME, MPI_KERNEL,
             MPI_SYNC_API, MPI_CALL]
    return {n: i for i, n in enumerate(dict.fromkeys(names))}


def write_synthetic(output_dir, ranks: int = 4, iterations: int = 50, fmt: str = "parquetdir",
                    stragglers=(), seed: int = 0, gpus_per_node: int = 8, schema: str = "2023.4",
                    overwrite: bool = False, job: str = "nccl", memory: MemoryPlan | None = None) -> Path:
    """Write one SYNTHETIC export per rank (`rank{R}.sqlite` or `rank{R}_pqtdir/`) plus truth.json and
    README.md into output_dir; return it. The folder appears complete or not at all. `job`: "nccl" (NVTX
    phases and an NCCL all-reduce per step) or "mpi" (no NVTX: a kernel, a device sync, MPI_Allreduce).
    `memory`: CUDA memory usage events as the plan says (nccl jobs)."""
    if memory is not None and job != "nccl":
        raise UsageError("--memory goes with --job nccl: its steps have the forward, backward and optimizer ranges "
                         "the plan allocates in")
    if fmt not in ("sqlite", "parquetdir"):
        raise UsageError(f"--format {fmt}: use sqlite or parquetdir")
    if job not in JOBS:
        raise UsageError(f"--job {job}: use {' or '.join(JOBS)}")
    if job == "mpi" and any(s.cause != "gpu" for s in stragglers):
        raise UsageError("--job mpi: its ranks only run kernels, so a straggler there needs cause=gpu")
    if ranks < 1 or iterations < 1 or gpus_per_node < 1:
        raise UsageError("--ranks, --iterations and --gpus-per-node must be at least 1")
    shape = schema
    schema = schema_of(shape)
    stragglers = _check_stragglers(stragglers, ranks, iterations)
    out = Path(output_dir)
    check_output(out, overwrite)
    with staged_output(out, replace=True) as tmp:
        truth = _write_all(tmp, ranks, iterations, fmt, stragglers, seed, gpus_per_node, shape, schema, job, memory)
        (tmp / "truth.json").write_text(json.dumps(truth, indent=1))
        (tmp / "README.md").write_text(_readme(truth))
    return out


def _write_all(tmp: Path, ranks: int, iterations: int, fmt: str, stragglers: list[Straggler], seed: int,
               gpus_per_node: int, shape: str, schema: dict, job: str = "nccl",
               memory: MemoryPlan | None = None) -> dict:
    rng = np.random.default_rng(seed)
    from . import synth_mpi  # the mpi job's own events

    tl = (_timeline if job == "nccl" else synth_mpi.timeline)(ranks, iterations, stragglers, rng)
    # Session starts a few ms apart; a rank whose session started later has smaller local timestamps.
    offsets = np.round(rng.uniform(0, 5 * MS, size=ranks)).astype(np.int64) + np.arange(ranks) * 1_700 * US
    first_step = int(offsets.max()) + FIRST_STEP_NS  # on the common clock: every rank's local times are >= 1 s
    strings = _strings()
    shared = shared_tables(strings, schema)
    if memory is not None:
        shared["ENUM_CUDA_DEV_MEM_EVENT_OPER"] = typed("ENUM_CUDA_DEV_MEM_EVENT_OPER", pd.DataFrame({
            "id": [0, 1], "name": ["CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION"],
            "label": ["Allocation", "Deallocation"]}), schema)
    rank_tables = _rank_tables if job == "nccl" else synth_mpi.rank_tables
    more = {"memory": memory} if memory is not None else {}
    blocks = [(first, min(first + BLOCK_ITERATIONS, iterations)) for first in range(0, iterations, BLOCK_ITERATIONS)]
    done = progress.Counter(ranks * iterations if len(blocks) > 1 else 0, "synthetic iterations written")
    for r in range(ranks):
        shift = first_step - int(offsets[r])
        frames = _rank_info_tables(r, BASE_UTC_NS + int(offsets[r]), ranks, gpus_per_node, strings, job)
        if shape == "newer":
            frames["TARGET_INFO_CUDA_DEVICE"] = pd.DataFrame({
                "cudaId": [r % gpus_per_node], "pid": [PID_BASE + r], "uuid": [f"GPU-synthetic-{r}"],
                "name": ["SYNTHETIC GPU"]})
        path = tmp / (f"rank{r}.sqlite" if fmt == "sqlite" else f"rank{r}_pqtdir")
        with export_writer(path, fmt, schema) as write:
            write({**shared, **{t: typed(t, df, schema) for t, df in frames.items()}})
            for first, stop in blocks:
                events = rank_tables(r, _block(tl, first, stop), stop - first, shift, gpus_per_node, strings, first,
                                     iterations, **more)
                write({t: typed(t, df, schema) for t, df in events.items()})
                done.advance(stop - first)
    done.close()

    acceptable = ACCEPTABLE_CAUSES if job == "nccl" else {"gpu": ["gpu_compute"]}
    cells = [{"rank": s.rank, "iteration": i, "cause": s.cause, "acceptable_causes": acceptable[s.cause],
              "extra_ns": int(tl["extra"][s.rank, i])}
             for s in stragglers for i in range(s.first, s.last + 1)]
    earliest = int(offsets.min())
    return {
        "synthetic": True,
        "note": "SYNTHETIC data written by nsys-recipe-pack's generator; not a real profile",
        "generator": "nsys-recipe-pack synth",
        "job": job, "ranks": ranks, "iterations": iterations, "format": fmt, "seed": seed, "schema": shape,
        "gpus_per_node": gpus_per_node,
        **({"iteration_delimiter": "step", "children": CHILDREN, "nvtx_text_id_names": sorted(TEXT_ID_NAMES),
            "nominal_ms": NOMINAL_MS, "transfer_ns": int(TRANSFER_MS * MS), "nccl_kernel": NCCL_SHORT}
           if job == "nccl" else
           {"iteration_delimiter": MPI_KERNEL, "iteration_kind": "kernel", "children": [],
            "nominal_ms": {MPI_KERNEL: MPI_KERNEL_MS}, "transfer_ns": MPI_TRANSFER_NS,
            "sync_points": [MPI_SYNC_API, MPI_CALL]}),
        "jitter": JITTER,
        "stragglers": [asdict(s) for s in stragglers],
        **({"memory": memory_truth(memory, ranks, iterations)} if memory is not None else {}),
        "cells": cells,
        "session_start_utc_ns": [BASE_UTC_NS + int(o) for o in offsets],
        "session_offsets_ns": offsets.tolist(),
        # when the ranks leave the iteration's collective (the NCCL kernel's end, or MPI_Allreduce's), ns since
        # the earliest rank's session start
        ("nccl_end_aligned_ns" if job == "nccl" else "release_aligned_ns"):
            (tl["release"] + first_step - earliest).tolist(),
    }


def _readme(truth: dict) -> str:
    ext = "rank{R}.sqlite" if truth["format"] == "sqlite" else "rank{R}_pqtdir/"
    return (
        "# SYNTHETIC exports\n\n"
        "Written by nsys-recipe-pack's generator (`nsys-recipe synth`), not by a profiler: these are **not real "
        "profiles**. Each rank's export (`" + ext + "`) has Nsight Systems 2023.4's export schema and a "
        "`SYNTHETIC` row in `META_DATA_EXPORT`.\n\n"
        f"- {truth['ranks']} ranks x {truth['iterations']} iterations, seed {truth['seed']}, "
        f"{truth['gpus_per_node']} GPUs per node.\n"
        + ("- Iterations: NVTX range `step` with children " + ", ".join(f"`{c}`" for c in CHILDREN) + ". "
           "The names " + ", ".join(f"`{n}`" for n in truth["nvtx_text_id_names"]) + " are stored through "
           "`textId` (StringIds), the others in `text`.\n" if truth["job"] == "nccl" else
           f"- An MPI job without NVTX: each iteration launches `{MPI_KERNEL}`, waits for it in "
           f"`{MPI_SYNC_API}` and meets the other ranks in `{MPI_CALL}` (`MPI_OTHER_EVENTS`).\n")
        + "- The injected stragglers and every affected (rank, iteration) cell are in `truth.json`.\n"
        + ("- CUDA memory usage events (device memory) as `truth.json`'s `memory` plan says, with what each rank "
           "holds, peaks at and leaks.\n" if "memory" in truth else ""))


# ---------------------------------------------------------------------------------------------------------
# command line

def add_arguments(parser) -> None:
    parser.add_argument("--job", choices=[*JOBS, "megatron"], default="nccl",
                        help="nccl: NVTX phases and an NCCL all-reduce per step; mpi: no NVTX, a kernel, a device "
                             "sync and MPI_Allreduce per iteration; megatron: tensor, pipeline and data parallel "
                             "groups (--parallel) in a 1F1B schedule")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--format", choices=["sqlite", "parquetdir"], default="parquetdir")
    parser.add_argument("--straggler", action="append", default=[], metavar="SPEC",
                        help="rank=R,iterations=A-B,cause=dataloader|compute|gpu,slowdown=X (repeatable; "
                             "iterations=all for a rank slow throughout)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--schema", choices=["2023.4", "newer"], default="2023.4",
                        help="the export shape: Nsight Systems 2023.4's, or a newer one with extra columns and tables")
    parser.add_argument("--memory", default=None, metavar="SPEC",
                        help="also CUDA memory usage events: weights, an activation per step; leak=R,iterations=A-B "
                             "makes rank R leak in those steps, big=R gives rank R twice the activation ('' for none)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--force-overwrite", action="store_true", help="replace an existing --output folder")
    from .synth_megatron import add_arguments as megatron_arguments

    megatron_arguments(parser)


def main(args) -> int:
    if getattr(args, "job", "nccl") == "megatron":
        from .synth_megatron import main as megatron_main

        return megatron_main(args)
    try:
        stragglers = [parse_straggler(s) for s in args.straggler]
        memory = parse_memory(args.memory) if getattr(args, "memory", None) is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = write_synthetic(args.output, args.ranks, args.iterations, args.format, stragglers, args.seed,
                          args.gpus_per_node, getattr(args, "schema", "2023.4"),
                          overwrite=getattr(args, "force_overwrite", False), job=getattr(args, "job", "nccl"),
                          memory=memory)
    print(f"wrote SYNTHETIC exports ({args.ranks} ranks x {args.iterations} iterations, {args.format}) to {out} "
          f"(injected cells in {out / 'truth.json'})")
    return 0
