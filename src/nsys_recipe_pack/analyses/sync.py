"""sync_summary: where the host blocks on the GPU, inside which NVTX range, and what it costs.

Host-blocking calls are classified from the CUDA runtime API name and, for copies and memsets, from the
memory they touched (joined on correlationId and process). The rules for synchronous copies and memsets
follow Nsight Systems' own expert rules so that counts can be compared: a cudaMemcpy of at most 64 kB
host-to-device or within one device returns before the copy ends, and a cudaMemset blocks only on
pinned or managed memory.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..gpu import PAGEABLE, gpu_ops
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


def _classify(rt: pd.DataFrame, mem: pd.DataFrame, mset: pd.DataFrame) -> pd.Series:
    # string tests on the few distinct API names, then spread to every call by its name's code
    codes, uniques = pd.factorize(rt["name"].fillna(""))
    names = pd.Series(uniques, dtype=object)
    kinds = pd.Series(None, index=names.index, dtype=object)
    for pattern, label in SYNC_API_KINDS:
        kinds[names.str.match(pattern)] = label
    kind = pd.Series(kinds.to_numpy(object)[codes], index=rt.index, dtype=object)
    is_memcpy = pd.Series(names.str.startswith("cudaMemcpy").to_numpy(bool)[codes], index=rt.index)
    is_async = pd.Series(names.str.contains("async", case=False).to_numpy(bool)[codes], index=rt.index)
    is_memset = pd.Series(names.str.startswith("cudaMemset").to_numpy(bool)[codes], index=rt.index)
    key = ["pid", "correlation_id"]
    if len(mem):
        m = mem.assign(
            small_htod=(mem["bytes"].fillna(0) <= SMALL_HTOD_BYTES) & (mem["copy_kind"] == 1),
            same_device=mem["src_device"].notna() & (mem["src_device"] == mem["dst_device"])
            if "src_device" in mem else False,
            pageable=(mem["src_kind"] == PAGEABLE) | (mem["dst_kind"] == PAGEABLE),
        ).groupby(key, as_index=False)[["small_htod", "same_device", "pageable"]].any()
        j = rt[key].merge(m, on=key, how="left").set_index(rt.index)
        returns_early = j["small_htod"].fillna(False).astype(bool) | j["same_device"].fillna(False).astype(bool)
        has_copy = j["pageable"].notna()
        kind[is_memcpy & ~is_async & has_copy & ~returns_early] = "memcpy_sync"
        kind[is_memcpy & is_async & j["pageable"].fillna(False).astype(bool)] = "memcpy_pageable"
    if len(mset):
        s = mset.assign(host=mset["mem_kind"].isin(HOST_MEMSET_KINDS) if "mem_kind" in mset else False)
        s = s.groupby(key, as_index=False)["host"].any()
        j = rt[key].merge(s, on=key, how="left").set_index(rt.index)
        kind[is_memset & ~is_async & j["host"].fillna(False).astype(bool)] = "memset_sync"
    return kind


def map_rank(rd, options: dict) -> dict:
    rd.require("runtime", "sync_summary")
    rt = rd.runtime if rd.runtime is not None else pd.DataFrame(columns=["start_ns", "end_ns", "tid", "pid",
                                                                          "correlation_id", "name"])
    empty = pd.DataFrame(columns=[*map_columns()])
    if rt.empty:
        return {"calls": empty, "wall_ns": 0}
    mem = rd.memcpy if rd.memcpy is not None else pd.DataFrame()
    mset = rd.memset if rd.memset is not None else pd.DataFrame()
    kind = _classify(rt, mem, mset)
    calls = rt[kind.notna()].assign(kind=kind[kind.notna()]).reset_index(drop=True)
    ranges = closed_ranges(rd.nvtx).reset_index(drop=True)
    pos = innermost(ranges, calls["tid"].to_numpy(np.int64), calls["start_ns"].to_numpy(np.int64),
                    calls["end_ns"].to_numpy(np.int64))
    names = ranges["name"].to_numpy(object) if len(ranges) else np.array([], object)
    calls["nvtx_range"] = np.where(pos >= 0, names[np.maximum(pos, 0)] if len(names) else None, None)
    # GPU time left idle while the host was blocked: the call's duration minus the union of GPU work in it
    ops = gpu_ops(rd)
    busy = np.zeros(len(calls), np.int64)
    if len(ops) and len(calls):
        # calls of one thread never overlap, so each thread's calls are a valid set of windows
        for idx in calls.groupby("tid").indices.values():  # a pass per thread, vectorised inside
            o = idx[np.argsort(calls["start_ns"].to_numpy()[idx], kind="mergesort")]
            ev, win, cs, ce = split_into_windows(ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy(),
                                                 calls["start_ns"].to_numpy()[o], calls["end_ns"].to_numpy()[o])
            u = union_length(win, cs, ce)
            busy[o[u.index.to_numpy()]] = u.to_numpy()
    calls["duration_ns"] = calls["end_ns"] - calls["start_ns"]
    calls["gpu_idle_ns"] = calls["duration_ns"] - busy
    calls = calls.rename(columns={"name": "api"})[map_columns()]
    wall = int(rt["end_ns"].max() - rt["start_ns"].min())
    return {"calls": calls, "wall_ns": wall}


def map_columns() -> list[str]:
    return ["pid", "tid", "api", "kind", "start_ns", "end_ns", "duration_ns", "nvtx_range", "gpu_idle_ns"]


def _findings(calls: pd.DataFrame, wall: pd.Series) -> pd.DataFrame:
    rows = []
    for rank, c in calls.groupby("rank"):  # a pass per rank over its (few) aggregated rows
        w = max(int(wall.get(rank, 0)), 1)
        pg = c[c["kind"] == "memcpy_pageable"]
        if len(pg):
            share = pg["duration_ns"].sum() / w
            rows.append((rank, "high" if share > 0.01 else "medium", "pageable memcpy",
                         SUGGESTIONS["memcpy_pageable"],
                         f"{len(pg)} async copies touched pageable host memory and blocked the host for "
                         f"{pg['duration_ns'].sum() / 1e6:.2f} ms ({100 * share:.2f} % of the CUDA wall time)"))
        host_syncs = c[c["kind"].isin(["device", "stream", "event", "memcpy_sync"]) & c["nvtx_range"].notna()]
        per_range = host_syncs.groupby("nvtx_range")["duration_ns"].agg(["size", "median", "sum"])
        frequent = per_range[(per_range["size"] >= MANY_SYNCS) & (per_range["median"] < SHORT_SYNC_NS)]
        for rng, r in frequent.sort_values("size", ascending=False).head(5).iterrows():
            rows.append((rank, "medium", f"frequent short syncs in {rng!r}", SUGGESTIONS["short_syncs"],
                         f"{int(r['size'])} host syncs inside {rng!r}, median {r['median'] / 1e3:.1f} us, "
                         f"total {r['sum'] / 1e6:.2f} ms"))
        idle = c[(c["kind"] != "stream_wait") & (c["duration_ns"] >= IDLE_SYNC_NS)
                 & (c["gpu_idle_ns"] > 0.5 * c["duration_ns"])]
        if len(idle):
            worst = idle.loc[idle["gpu_idle_ns"].idxmax()]
            rows.append((rank, "high" if idle["gpu_idle_ns"].sum() > 0.01 * w else "low",
                         "sync that leaves the GPU idle", SUGGESTIONS["idle_sync"],
                         f"{len(idle)} syncs of at least {IDLE_SYNC_NS / 1e6:g} ms with the GPU idle for most of "
                         f"them, {idle['gpu_idle_ns'].sum() / 1e6:.2f} ms idle in all; worst: {worst['api']} at "
                         f"{int(worst['start_ns'])} ns in {worst['nvtx_range']!r}, "
                         f"{worst['gpu_idle_ns'] / 1e6:.2f} of {worst['duration_ns'] / 1e6:.2f} ms idle"))
    return pd.DataFrame(rows, columns=["rank", "severity", "finding", "suggestion", "evidence"])


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
    return {"sync_calls": calls, "summary": summary, "findings": _findings(calls, wall)}
