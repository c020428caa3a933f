"""SYNTHETIC Nsight Systems exports with known stragglers, for tests with exact answers and scale runs.

Everything written here is labelled synthetic: a README and truth.json beside the exports and a
`SYNTHETIC` row in each export's META_DATA_EXPORT. Table and column names and types come from a real
Nsight Systems 2023.4 export (`data/nsys_2023_4_schema.json`, made by scripts/dump_export_schema.py).

The model: every rank runs `step` iterations with children dataloader, forward, backward, allreduce,
optimizer on its main thread. Forward and backward launch compute kernels; allreduce launches an NCCL
kernel. All ranks leave the allreduce together when the slowest has arrived (plus a transfer time),
so a slow rank shortens the others' busy time not at all and lengthens their wait.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import UsageError

SCHEMA_FILE = Path(__file__).with_name("data") / "nsys_2023_4_schema.json"
MS = 1_000_000
US = 1_000
BASE_UTC_NS = 1_700_000_000_000_000_000
CHILDREN = ["dataloader", "forward", "backward", "allreduce", "optimizer"]
NOMINAL_MS = {"dataloader": 3.0, "forward": 30.0, "backward": 50.0, "optimizer": 5.0}
TRANSFER_MS = 4.0
FWD_KERNELS = ["sgemm_128x64_nn", "relu_fwd", "layer_norm_fwd", "softmax_fwd"]
BWD_KERNELS = ["sgemm_128x64_nt", "sgemm_64x64_tn", "relu_bwd", "layer_norm_bwd", "softmax_bwd", "adam_update"]
NCCL_SHORT = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
NCCL_FULL = NCCL_SHORT + "(ncclDevComm*, unsigned long, ncclWork*)"
LAUNCH_API = "cudaLaunchKernel_v7000"
TEXT_ID_NAMES = {"dataloader", "backward", "optimizer"}  # the others are stored as plain text
GRAPH_KERNELS = ["graph_fused_add", "graph_scale", "graph_copy"]
OVERLAP_KERNEL = "bucket_reduce"
EXTRA_APIS = ["cudaMemcpyAsync_v3020", "cudaMemsetAsync_v3020", "cudaMemcpy_v3020", "cudaStreamSynchronize_v3020",
              "cudaGraphLaunch_v10000"]
WORKER_RANGES = ["prefetch", "decode"]
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
SYNTHETIC_LABEL = "nsys-recipe-pack synthetic export (not a real profile)"
CAUSES = ("dataloader", "compute")


@dataclass(frozen=True)
class Straggler:
    rank: int
    first: int
    last: int
    cause: str = "dataloader"
    slowdown: float = 1.5


def parse_straggler(text: str) -> Straggler:
    """`rank=R,iterations=A-B,cause=dataloader|compute,slowdown=X`."""
    fields = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"--straggler {text!r}: expected KEY=VALUE pairs separated by commas")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"rank", "iterations", "cause", "slowdown"}
    if unknown or "rank" not in fields or "iterations" not in fields:
        raise ValueError(f"--straggler {text!r}: give rank=R,iterations=A-B[,cause=dataloader|compute][,slowdown=X]")
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", fields["iterations"])
    if not m:
        raise ValueError(f"--straggler {text!r}: iterations must be A-B or A")
    first = int(m.group(1))
    last = int(m.group(2) or first)
    cause = fields.get("cause", "dataloader")
    if cause not in CAUSES:
        raise ValueError(f"--straggler {text!r}: cause must be one of {', '.join(CAUSES)}")
    slowdown = float(fields.get("slowdown", 1.5))
    if slowdown <= 1.0 or last < first:
        raise ValueError(f"--straggler {text!r}: need slowdown > 1 and A <= B")
    return Straggler(int(fields["rank"]), first, last, cause, slowdown)


NEWER_SCHEMA_VERSION = "3.25.0"
# What newer exports (schema 3.16 to 3.25) add over 2023.4's, as seen in real ones: extra columns on existing
# tables and a new table. Readers must ignore what they do not know.
NEWER_COLUMNS = {
    "NVTX_EVENTS": [{"name": "eventId", "sqlite": "INTEGER", "arrow": "uint64", "nullable": True},
                    {"name": "binaryData", "sqlite": "BLOB", "arrow": "binary", "nullable": True}],
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": [{"name": "eventSyncId", "sqlite": "INTEGER", "arrow": "uint64",
                                             "nullable": True}],
}
NEWER_TABLES = {
    "TARGET_INFO_CUDA_DEVICE": [{"name": "cudaId", "sqlite": "INTEGER", "arrow": "int32", "nullable": False},
                                {"name": "pid", "sqlite": "INTEGER", "arrow": "int64", "nullable": True},
                                {"name": "uuid", "sqlite": "TEXT", "arrow": "string", "nullable": True},
                                {"name": "name", "sqlite": "TEXT", "arrow": "string", "nullable": True}],
}


def _schema(shape: str = "2023.4") -> dict:
    schema = json.loads(SCHEMA_FILE.read_text())
    if shape == "newer":
        for table, cols in NEWER_COLUMNS.items():
            schema["tables"][table] = schema["tables"][table] + cols
        schema["tables"].update(NEWER_TABLES)
        schema["schema_version"] = NEWER_SCHEMA_VERSION
    elif shape != "2023.4":
        raise UsageError(f"--schema {shape}: use 2023.4 or newer")
    return schema


def _global_pid(pid: int) -> int:
    return (1 << 48) | (pid << 24)


def _timeline(ranks: int, iterations: int, stragglers, rng) -> dict:
    """Per (rank, iteration) child durations and start times on the common clock (ns since BASE)."""
    dur = {c: NOMINAL_MS[c] * MS * rng.uniform(0.97, 1.03, size=(ranks, iterations)) for c in NOMINAL_MS}
    for s in stragglers:
        if not 0 <= s.rank < ranks or s.first >= iterations:
            raise UsageError(f"straggler {s}: outside {ranks} ranks x {iterations} iterations")
        it = slice(s.first, min(s.last, iterations - 1) + 1)
        busy = sum(dur[c][s.rank, it] for c in NOMINAL_MS)
        extra = (s.slowdown - 1.0) * busy
        if s.cause == "dataloader":
            dur["dataloader"][s.rank, it] += extra
        else:
            compute = dur["forward"][s.rank, it] + dur["backward"][s.rank, it]
            for c in ("forward", "backward"):
                dur[c][s.rank, it] *= 1.0 + extra / compute
    dur = {c: np.round(v).astype(np.int64) for c, v in dur.items()}
    step_start = np.zeros((ranks, iterations), np.int64)
    arrival = np.zeros((ranks, iterations), np.int64)
    release = np.zeros(iterations, np.int64)
    gap = 200 * US
    t = np.full(ranks, 1_000 * MS, np.int64)  # one second after the session start
    for i in range(iterations):  # a loop over iterations, vectorised over ranks
        step_start[:, i] = t
        arrival[:, i] = t + dur["dataloader"][:, i] + dur["forward"][:, i] + dur["backward"][:, i]
        release[i] = arrival[:, i].max() + int(TRANSFER_MS * MS)
        t = release[i] + dur["optimizer"][:, i] + gap
    return {"dur": dur, "step_start": step_start, "arrival": arrival, "release": release}


def _rank_tables(r: int, tl: dict, iterations: int, offset: int, session_utc: int, world: int,
                 gpus_per_node: int, strings: dict) -> dict:
    """All tables of one rank, timestamps on the rank's own clock (common clock minus offset)."""
    pid = 4000 + r
    gpid = _global_pid(pid)
    gtid = gpid | pid
    d = {c: v[r] for c, v in tl["dur"].items()}
    s0 = tl["step_start"][r] - offset
    arr = tl["arrival"][r] - offset
    rel = tl["release"] - offset
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
        "textId": np.where(by_id, [strings.get(n, -1) for n in names], None),
        "domainId": np.uint64(0),
    })
    nvtx["textId"] = nvtx["textId"].astype("Int64")

    # compute kernels, evenly spread over forward and backward, plus one NCCL kernel per iteration
    def spread(r_start, r_end, kernels):
        k = len(kernels)
        slot = (r_end - r_start) / k
        idx = np.arange(k)
        launch = (r_start[:, None] + (idx[None, :] * slot[:, None]) + 50 * US).astype(np.int64)
        k_start = launch + 20 * US
        k_end = (r_start[:, None] + ((idx[None, :] + 0.9) * slot[:, None])).astype(np.int64)
        name = np.tile(np.array(kernels, dtype=object), len(r_start))
        return launch.ravel(), k_start.ravel(), k_end.ravel(), name

    parts = [spread(*spans["forward"], FWD_KERNELS), spread(*spans["backward"], BWD_KERNELS)]
    nccl_launch = arr + 10 * US
    parts.append((nccl_launch, nccl_launch + 20 * US, rel - 10 * US, np.full(iterations, NCCL_FULL, dtype=object)))
    launch = np.concatenate([p[0] for p in parts])
    k_start = np.concatenate([p[1] for p in parts])
    k_end = np.concatenate([p[2] for p in parts])
    k_name = np.concatenate([p[3] for p in parts])
    order_k = np.argsort(launch, kind="mergesort")
    launch, k_start, k_end, k_name = launch[order_k], k_start[order_k], k_end[order_k], k_name[order_k]
    corr = np.arange(1, len(launch) + 1, dtype=np.int64) + 100
    is_nccl = k_name == NCCL_FULL
    short = np.where(is_nccl, NCCL_SHORT, k_name)
    device = r % gpus_per_node
    kernels = pd.DataFrame({
        "start": k_start, "end": k_end, "deviceId": device, "contextId": np.uint64(1),
        "streamId": np.where(is_nccl, 13, 7).astype(np.uint64), "correlationId": corr, "globalPid": np.uint64(gpid),
        "demangledName": np.array([strings[n] for n in k_name], dtype=np.uint64),
        "shortName": np.array([strings[n] for n in short], dtype=np.uint64),
        "mangledName": None, "launchType": 0, "cacheConfig": 0, "registersPerThread": 32,
        "gridX": 128, "gridY": 1, "gridZ": 1, "blockX": 256, "blockY": 1, "blockZ": 1,
        "staticSharedMemory": 0, "dynamicSharedMemory": 0, "localMemoryPerThread": 0, "localMemoryTotal": 0,
        "gridId": corr, "sharedMemoryExecuted": 0, "graphNodeId": None, "sharedMemoryLimitConfig": None,
    })
    runtime = pd.DataFrame({
        "start": launch, "end": launch + 8 * US, "eventClass": 1, "globalTid": np.uint64(gtid),
        "correlationId": corr, "nameId": np.uint64(strings[LAUNCH_API]), "returnValue": 0, "callchainId": None,
    })
    extra = _gpu_extras(spans, iterations, gtid, gpid, pid, device, int(corr[-1]) + 1, strings)
    kernels = pd.concat([kernels, extra["kernels"]], ignore_index=True)
    runtime = pd.concat([runtime, extra["runtime"]], ignore_index=True)
    nvtx = pd.concat([nvtx, extra["nvtx"]], ignore_index=True)
    env = {
        "RANK": r, "LOCAL_RANK": r % gpus_per_node, "WORLD_SIZE": world,
        "HOSTNAME": f"synth-node{r // gpus_per_node:03d}", "NSYS_RECIPE_PACK_SYNTHETIC": 1,
    }
    utc = pd.Timestamp(session_utc, unit="ns").strftime("%Y-%m-%dT%H:%M:%S")
    return {
        "NVTX_EVENTS": nvtx,
        "CUPTI_ACTIVITY_KIND_KERNEL": kernels,
        "CUPTI_ACTIVITY_KIND_RUNTIME": runtime,
        "CUPTI_ACTIVITY_KIND_MEMCPY": extra["memcpy"],
        "CUPTI_ACTIVITY_KIND_MEMSET": extra["memset"],
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": extra["sync"],
        "TARGET_INFO_SESSION_START_TIME": pd.DataFrame({"utcEpochNs": [session_utc], "utcTime": [utc],
                                                        "localTime": [utc]}),
        "TARGET_INFO_SYSTEM_ENV": pd.DataFrame({
            "globalVid": [np.uint64(1 << 48)], "devStateName": ["synthetic"], "name": ["DeviceEnvironment"],
            "nameEnum": [18], "value": [";".join(f"{k}={v}" for k, v in env.items())]}),
        "PROCESSES": pd.DataFrame({"globalPid": [np.uint64(gpid)], "pid": [pid], "name": ["python3"]}),
        "ThreadNames": pd.DataFrame({"nameId": [np.uint64(strings["python3"])], "priority": [0],
                                     "globalTid": [np.uint64(gtid)]}),
    }


def _gpu_extras(spans: dict, iterations: int, gtid: int, gpid: int, pid: int, device: int, first_corr: int,
                strings: dict) -> dict:
    """Copies of every kind (pinned and pageable), a memset, a CUDA graph, a synchronous `.item()` with its
    stream sync, a kernel overlapping another stream, and nested NVTX ranges on a second thread."""
    n = iterations
    corr = first_corr + np.arange(n)[:, None] * 10 + np.arange(10)[None, :]  # ten ids per iteration
    base = {name: spans[rng][0] for name, rng, *_ in EXTRA_OPS}
    at = {name: (base[name] + s0, base[name] + e0) for name, _, s0, e0, _ in EXTRA_OPS}
    rows_rt = []

    def call(api, start, end, c):
        rows_rt.append(pd.DataFrame({"start": start, "end": end, "eventClass": 1, "globalTid": np.uint64(gtid),
                                     "correlationId": c, "nameId": np.uint64(strings[api]), "returnValue": 0,
                                     "callchainId": None}))

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
    call("cudaLaunchKernel_v7000", arrival - OVERLAP_BEFORE_ARRIVAL[0] - 30 * US,
         arrival - OVERLAP_BEFORE_ARRIVAL[0] - 22 * US, corr[:, 8])

    def copies(names, kind, src, dst, nbytes, c, src_dev, dst_dev):
        return pd.DataFrame({"start": at[names][0], "end": at[names][1], "deviceId": device, "contextId": np.uint64(1),
                             "streamId": np.uint64(7), "correlationId": c, "globalPid": np.uint64(gpid),
                             "bytes": nbytes, "copyKind": kind, "srcKind": src, "dstKind": dst,
                             "srcDeviceId": src_dev, "dstDeviceId": dst_dev})

    memcpy = pd.concat([
        copies("htod_pinned", 1, 1, 2, 4 << 20, corr[:, 0], None, device),
        copies("htod_pageable", 1, 0, 2, 1 << 20, corr[:, 1], None, device),
        copies("dtod", 8, 2, 2, 8 << 20, corr[:, 3], device, device),
        copies("peer", 10, 2, 2, 2 << 20, corr[:, 4], device, device + 1),
        copies("dtoh_item", 2, 2, 0, 4, corr[:, 6], device, None),
    ], ignore_index=True)
    memset = pd.DataFrame({"start": at["memset"][0], "end": at["memset"][1], "deviceId": device,
                           "contextId": np.uint64(1), "streamId": np.uint64(7), "correlationId": corr[:, 2],
                           "globalPid": np.uint64(gpid), "value": 0, "bytes": 16 << 20, "graphNodeId": None,
                           "memKind": 2})
    graph = [pd.DataFrame({"start": at[k][0], "end": at[k][1], "shortName": np.uint64(strings[k]),
                           "demangledName": np.uint64(strings[k]), "graphNodeId": np.uint64(i + 1),
                           "streamId": np.uint64(7), "correlationId": corr[:, 5]})
             for i, k in enumerate(GRAPH_KERNELS)]
    overlap = pd.DataFrame({"start": arrival - OVERLAP_BEFORE_ARRIVAL[0], "end": arrival - OVERLAP_BEFORE_ARRIVAL[1],
                            "shortName": np.uint64(strings[OVERLAP_KERNEL]),
                            "demangledName": np.uint64(strings[OVERLAP_KERNEL]), "graphNodeId": None,
                            "streamId": np.uint64(9), "correlationId": corr[:, 8]})
    kernels = pd.concat([*graph, overlap], ignore_index=True).assign(
        deviceId=device, contextId=np.uint64(1), globalPid=np.uint64(gpid), launchType=0, cacheConfig=0,
        registersPerThread=32, gridX=64, gridY=1, gridZ=1, blockX=256, blockY=1, blockZ=1, staticSharedMemory=0,
        dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=0, sharedMemoryExecuted=0)
    sync = pd.DataFrame({"start": sync_start + 5 * US, "end": sync_start + 195 * US, "deviceId": device,
                         "contextId": np.uint64(1), "streamId": np.uint64(7), "correlationId": corr[:, 7],
                         "globalPid": np.uint64(gpid), "syncType": 3, "eventId": None})
    # a data-loading worker thread with nested ranges
    worker_tid = gpid | (pid + 1)
    s0 = spans["dataloader"][0]
    nvtx = pd.DataFrame({
        "start": np.concatenate([s0 + 500 * US, s0 + 1_000 * US]),
        "end": np.concatenate([s0 + 2_500 * US, s0 + 2_000 * US]),
        "eventType": 59, "text": np.repeat(np.array(WORKER_RANGES, dtype=object), n),
        "globalTid": np.uint64(worker_tid), "textId": None, "domainId": np.uint64(0)})
    nvtx["textId"] = nvtx["textId"].astype("Int64")
    return {"runtime": pd.concat(rows_rt, ignore_index=True), "memcpy": memcpy, "memset": memset,
            "kernels": kernels, "sync": sync, "nvtx": nvtx}


def _typed(table: str, df: pd.DataFrame, schema: dict) -> pa.Table:
    cols = schema["tables"][table]
    arrays, fields = [], []
    for c in cols:
        typ = pa.type_for_alias(c["arrow"]) if c["arrow"] else pa.int64()
        values = df[c["name"]] if c["name"] in df else pd.Series([None] * len(df), dtype=object)
        if pa.types.is_integer(typ) or pa.types.is_floating(typ):
            values = pd.to_numeric(values, errors="coerce")
            mask = values.isna().to_numpy()
            arr = pa.array(values.fillna(0).to_numpy().astype(typ.to_pandas_dtype()), type=typ,
                           mask=mask if mask.any() else None)
        else:
            arr = pa.array(values.astype(object).where(values.notna(), None).tolist(), type=typ)
        arrays.append(arr)
        fields.append(pa.field(c["name"], typ, nullable=c["nullable"] or bool(arr.null_count)))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _write_sqlite(path: Path, tables: dict, schema: dict) -> None:
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    try:
        for table, df in tables.items():
            cols = schema["tables"][table]
            decl = ", ".join(f'"{c["name"]}" {c["sqlite"]}' for c in cols)
            con.execute(f'CREATE TABLE "{table}" ({decl})')
            data = _typed(table, df, schema).to_pandas(integer_object_nulls=True)
            for c in data.columns:  # sqlite stores integers up to int64: nsys ids fit
                if data[c].dtype == np.uint64:
                    data[c] = data[c].astype(np.int64)
            rows = data.astype(object).where(data.notna(), None).itertuples(index=False, name=None)
            marks = ", ".join("?" * len(cols))
            con.executemany(f'INSERT INTO "{table}" VALUES ({marks})',
                            ([int(v) if isinstance(v, np.integer) else v for v in row] for row in rows))
        con.commit()
    finally:
        con.close()


def _write_parquetdir(path: Path, tables: dict, schema: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for table, df in tables.items():
        pq.write_table(_typed(table, df, schema), path / f"{table}.parquet")


def write_synthetic(output_dir, ranks: int = 4, iterations: int = 50, fmt: str = "parquetdir",
                    stragglers=(), seed: int = 0, gpus_per_node: int = 8, schema: str = "2023.4") -> Path:
    """Write one SYNTHETIC export per rank plus truth.json and README.md; return the folder."""
    if fmt not in ("sqlite", "parquetdir"):
        raise UsageError(f"--format {fmt}: use sqlite or parquetdir")
    if ranks < 1 or iterations < 1:
        raise UsageError("--ranks and --iterations must be at least 1")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = schema
    schema = _schema(shape)
    rng = np.random.default_rng(seed)
    stragglers = list(stragglers)
    tl = _timeline(ranks, iterations, stragglers, rng)
    offsets = np.round(rng.uniform(0, 5 * MS, size=ranks)).astype(np.int64) + np.arange(ranks) * 1_700 * US
    names = ["step", *CHILDREN, *FWD_KERNELS, *BWD_KERNELS, NCCL_SHORT, NCCL_FULL, LAUNCH_API, "python3",
             *GRAPH_KERNELS, OVERLAP_KERNEL, *EXTRA_APIS]
    strings = {n: i for i, n in enumerate(dict.fromkeys(names))}
    string_table = pd.DataFrame({"id": list(strings.values()), "value": list(strings.keys())})
    meta = pd.DataFrame({"name": ["EXPORT_PRODUCT_NAME", "EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION",
                                  "SYNTHETIC"],
                         "value": ["NVIDIA Nsight Systems", schema["nsys_version"], schema["schema_version"],
                                   SYNTHETIC_LABEL]})
    for r in range(ranks):
        # A rank whose session started later has smaller local timestamps for the same instant.
        tables = _rank_tables(r, tl, iterations, int(offsets[r]), BASE_UTC_NS + int(offsets[r]), ranks,
                              gpus_per_node, strings)
        tables["StringIds"] = string_table
        tables["META_DATA_EXPORT"] = meta
        if shape == "newer":
            tables["TARGET_INFO_CUDA_DEVICE"] = pd.DataFrame({"cudaId": [r % gpus_per_node], "pid": [4000 + r],
                                                              "uuid": [f"GPU-synthetic-{r}"], "name": ["Synthetic GPU"]})
        if fmt == "sqlite":
            _write_sqlite(out / f"rank{r}.sqlite", tables, schema)
        else:
            _write_parquetdir(out / f"rank{r}_pqtdir", tables, schema)

    cells = []
    for s in stragglers:
        causes = ["dataloader"] if s.cause == "dataloader" else ["forward", "backward", "gpu_compute"]
        for i in range(s.first, min(s.last, iterations - 1) + 1):
            cells.append({"rank": s.rank, "iteration": i, "cause": s.cause, "acceptable_causes": causes})
    truth = {
        "synthetic": True,
        "generator": "nsys-recipe-pack synth",
        "ranks": ranks, "iterations": iterations, "format": fmt, "seed": seed, "schema": shape,
        "iteration_delimiter": "step",
        "stragglers": [asdict(s) for s in stragglers],
        "cells": cells,
        "session_offsets_ns": offsets.tolist(),
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    (out / "README.md").write_text(
        "# SYNTHETIC exports\n\nWritten by nsys-recipe-pack's generator (`nsys-recipe synth`), not by a "
        "profiler: these are not real profiles. They have Nsight Systems 2023.4's export schema, "
        f"{ranks} ranks x {iterations} iterations, and the stragglers listed in `truth.json`.\n")
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--format", choices=["sqlite", "parquetdir"], default="parquetdir")
    parser.add_argument("--straggler", action="append", default=[], metavar="SPEC",
                        help="rank=R,iterations=A-B,cause=dataloader|compute,slowdown=X (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--schema", choices=["2023.4", "newer"], default="2023.4",
                        help="the export shape: Nsight Systems 2023.4's, or a newer one with extra columns and tables")
    parser.add_argument("--output", required=True)


def main(args) -> int:
    try:
        stragglers = [parse_straggler(s) for s in args.straggler]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = write_synthetic(args.output, args.ranks, args.iterations, args.format, stragglers, args.seed,
                          args.gpus_per_node, args.schema)
    print(f"wrote SYNTHETIC exports ({args.ranks} ranks x {args.iterations} iterations, {args.format}) to {out}")
    return 0
