"""sync_summary: where the host blocks on the GPU, inside which NVTX range, and what it costs.

Host-blocking calls are classified from the CUDA runtime API name and, for copies and memsets, from the
memory they touched (joined on correlationId and process). The rules for synchronous copies and memsets
follow Nsight Systems' own expert rules so that counts can be compared: a cudaMemcpy of at most 64 kB
host-to-device or within one device returns before the copy ends, and a cudaMemset blocks only on
pinned or managed memory.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..gpu import PAGEABLE, gpu_intervals
from ..gpu import call_key as _call_key
from ..intervals import split_into_windows, union_length
from ..iterations import closed_ranges
from ..nvtx import innermost

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime"}
SMALL_HTOD_BYTES = 64000
HOST_MEMSET_KINDS = (1, 4)  # pinned, managed
SHORT_SYNC_NS = 1_000_000
MANY_SYNCS = 10
IDLE_SYNC_NS = 1_000_000
SUGGESTIONS = {
    "memcpy_pageable": "copy from pinned host memory (cudaMallocHost; in PyTorch DataLoader(pin_memory=True) and "
                       ".to(device, non_blocking=True)) so the copy is truly asynchronous",
    "short_syncs": "look for host reads of GPU values in this range (loss.item(), .cpu(), print of a tensor, "
                   "Python control flow on a GPU value) and move them out of the loop or batch them",
    "idle_sync": "the host waited while the GPU had nothing to do: launch the next work before synchronizing, "
                 "or remove the synchronization",
}


SYNC_API_KINDS = [(r"^(cudaDeviceSynchronize|cudaThreadSynchronize|cuCtxSynchronize)", "device"),
                  (r"^(cudaStreamSynchronize|cuStreamSynchronize)", "stream"),
                  (r"^(cudaEventSynchronize|cuEventSynchronize)", "event"),
                  (r"^(cudaStreamWaitEvent|cuStreamWaitEvent)", "stream_wait")]


def _flag(frame: pd.DataFrame, col: str, test) -> np.ndarray:
    """A nullable column tested row by row; a missing column or value tests False."""
    if col not in frame:
        return np.zeros(len(frame), bool)
    values = frame[col]
    return test(values.to_numpy(dtype=float, na_value=np.nan))


def _classify(rt: pd.DataFrame, mem: pd.DataFrame, mset: pd.DataFrame) -> np.ndarray:
    """Kind of each runtime call (object array, None when it is not a host-blocking call)."""
    # string tests on the few distinct API names, then spread to every call by its name's code
    codes, uniques = pd.factorize(rt["name"].fillna("").to_numpy(object))
    names = [str(u) for u in uniques]
    labels = np.array([next((label for pattern, label in SYNC_API_KINDS if re.match(pattern, n)), None)
                       for n in names] + [None], dtype=object)
    kind = labels[codes]
    is_memcpy = np.array([n.startswith("cudaMemcpy") for n in names] + [False])[codes]
    is_async = np.array(["async" in n.lower() for n in names] + [False])[codes]
    is_memset = np.array([n.startswith("cudaMemset") for n in names] + [False])[codes]
    key = _call_key(rt)
    # "any copy of this call has the property" = the call's key is among the keys of copies that have it
    if len(mem):
        mkey = _call_key(mem)
        nbytes = mem["bytes"].to_numpy(dtype=float, na_value=0.0)
        small_htod = (nbytes <= SMALL_HTOD_BYTES) & _flag(mem, "copy_kind", lambda v: v == 1)
        if "src_device" in mem:
            src = mem["src_device"].to_numpy(dtype=float, na_value=np.nan)
            dst = mem["dst_device"].to_numpy(dtype=float, na_value=np.nan)
            same_device = ~np.isnan(src) & (src == dst)
        else:
            same_device = np.zeros(len(mem), bool)
        pageable = _flag(mem, "src_kind", lambda v: v == PAGEABLE) | _flag(mem, "dst_kind", lambda v: v == PAGEABLE)
        returns_early = np.isin(key, mkey[small_htod | same_device])
        has_copy = np.isin(key, mkey)
        kind[is_memcpy & ~is_async & has_copy & ~returns_early] = "memcpy_sync"
        kind[is_memcpy & is_async & np.isin(key, mkey[pageable])] = "memcpy_pageable"
    if len(mset):
        host = _flag(mset, "mem_kind", lambda v: np.isin(v, HOST_MEMSET_KINDS))
        kind[is_memset & ~is_async & np.isin(key, _call_key(mset)[host])] = "memset_sync"
    return kind


def map_rank(rd, options: dict) -> dict:
    rd.require("runtime", "sync_summary")
    rt = rd.runtime if rd.runtime is not None else pd.DataFrame(columns=["start_ns", "end_ns", "tid", "pid",
                                                                          "correlation_id", "name"])
    empty = pd.DataFrame(columns=[*map_columns()])
    if rt.empty:
        return {"calls": empty, "wall_ns": 0, "findings": _findings(empty, 0)}
    mem = rd.memcpy if rd.memcpy is not None else pd.DataFrame()
    mset = rd.memset if rd.memset is not None else pd.DataFrame()
    kind = _classify(rt, mem, mset)
    blocking = pd.notna(kind)
    calls = rt[blocking].assign(kind=kind[blocking]).reset_index(drop=True)
    ranges = closed_ranges(rd.nvtx).reset_index(drop=True)
    pos = innermost(ranges, calls["tid"].to_numpy(np.int64), calls["start_ns"].to_numpy(np.int64),
                    calls["end_ns"].to_numpy(np.int64))
    names = ranges["name"].to_numpy(object) if len(ranges) else np.array([], object)
    calls["nvtx_range"] = np.where(pos >= 0, names[np.maximum(pos, 0)] if len(names) else None, None)
    # GPU time left idle while the host was blocked: the call's duration minus the union of GPU work in it
    op_start, op_end = gpu_intervals(rd)
    busy = np.zeros(len(calls), np.int64)
    if len(op_start) and len(calls):
        call_start, call_end = calls["start_ns"].to_numpy(np.int64), calls["end_ns"].to_numpy(np.int64)
        # calls of one thread never overlap, so each thread's calls are a valid set of windows
        for idx in calls.groupby("tid").indices.values():  # a pass per thread, vectorised inside
            o = idx[np.argsort(call_start[idx], kind="mergesort")]
            ev, win, cs, ce = split_into_windows(op_start, op_end, call_start[o], call_end[o])
            u = union_length(win, cs, ce)
            busy[o[u.index.to_numpy()]] = u.to_numpy()
    calls["duration_ns"] = calls["end_ns"] - calls["start_ns"]
    calls["gpu_idle_ns"] = calls["duration_ns"] - busy
    calls = calls.rename(columns={"name": "api"})[map_columns()]
    wall = int(rt["end_ns"].max() - rt["start_ns"].min())
    return {"calls": calls, "wall_ns": wall, "findings": _findings(calls, wall)}


def map_columns() -> list[str]:
    return ["pid", "tid", "api", "kind", "start_ns", "end_ns", "duration_ns", "nvtx_range", "gpu_idle_ns"]


FINDING_COLUMNS = ["severity", "finding", "suggestion", "evidence"]


def _findings(c: pd.DataFrame, wall_ns: int) -> pd.DataFrame:
    """One rank's findings from its blocking calls (computed in the map step, where the rank's calls are)."""
    rows = []
    w = max(int(wall_ns), 1)
    pg = c[c["kind"] == "memcpy_pageable"]
    if len(pg):
        share = pg["duration_ns"].sum() / w
        rows.append(("high" if share > 0.01 else "medium", "pageable memcpy", SUGGESTIONS["memcpy_pageable"],
                     f"{len(pg)} async copies touched pageable host memory and blocked the host for "
                     f"{pg['duration_ns'].sum() / 1e6:.2f} ms ({100 * share:.2f} % of the CUDA wall time)"))
    host_syncs = c[c["kind"].isin(["device", "stream", "event", "memcpy_sync"]) & c["nvtx_range"].notna()]
    per_range = host_syncs.groupby("nvtx_range")["duration_ns"].agg(["size", "median", "sum"])
    frequent = per_range[(per_range["size"] >= MANY_SYNCS) & (per_range["median"] < SHORT_SYNC_NS)]
    for rng, r in frequent.sort_values("size", ascending=False).head(5).iterrows():  # at most 5 rows
        rows.append(("medium", f"frequent short syncs in {rng!r}", SUGGESTIONS["short_syncs"],
                     f"{int(r['size'])} host syncs inside {rng!r}, median {r['median'] / 1e3:.1f} us, "
                     f"total {r['sum'] / 1e6:.2f} ms"))
    idle = c[(c["kind"] != "stream_wait") & (c["duration_ns"] >= IDLE_SYNC_NS)
             & (c["gpu_idle_ns"] > 0.5 * c["duration_ns"])]
    if len(idle):
        worst = idle.loc[idle["gpu_idle_ns"].idxmax()]
        rows.append(("high" if idle["gpu_idle_ns"].sum() > 0.01 * w else "low",
                     "sync that leaves the GPU idle", SUGGESTIONS["idle_sync"],
                     f"{len(idle)} syncs of at least {IDLE_SYNC_NS / 1e6:g} ms with the GPU idle for most of "
                     f"them, {idle['gpu_idle_ns'].sum() / 1e6:.2f} ms idle in all; worst: {worst['api']} at "
                     f"{int(worst['start_ns'])} ns in {worst['nvtx_range']!r}, "
                     f"{worst['gpu_idle_ns'] / 1e6:.2f} of {worst['duration_ns'] / 1e6:.2f} ms idle"))
    return pd.DataFrame(rows, columns=FINDING_COLUMNS)


def reduce(per_rank: list[dict], options: dict) -> dict:
    calls = pd.concat([r["calls"].assign(rank=r["rank"]) for r in per_rank], ignore_index=True)
    wall = pd.Series({r["rank"]: r["wall_ns"] for r in per_rank})
    for c in ("pid", "tid", "start_ns", "end_ns", "duration_ns", "gpu_idle_ns"):
        calls[c] = calls[c].astype("int64")
    calls = calls[["rank", *map_columns()]].sort_values(["rank", "start_ns"], kind="mergesort").reset_index(drop=True)
    summary = calls.groupby(["rank", "kind", "api"], as_index=False)["duration_ns"].agg(
        count="size", total_ns="sum", mean_ns="mean", max_ns="max")
    summary["pct_of_wall"] = 100.0 * summary["total_ns"] / summary["rank"].map(wall).clip(lower=1)
    summary = summary.sort_values(["rank", "total_ns"], ascending=[True, False]).reset_index(drop=True)
    found = [r["findings"].assign(rank=r["rank"]) for r in per_rank if len(r["findings"])]
    findings = (pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=["rank", *FINDING_COLUMNS]))
    findings = findings[["rank", *FINDING_COLUMNS]].sort_values("rank", kind="mergesort").reset_index(drop=True)
    return {"sync_calls": calls, "summary": summary, "findings": findings}
