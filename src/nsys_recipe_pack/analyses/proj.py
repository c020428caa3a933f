"""nvtx_gpu_proj: what each NVTX range costs on the GPU.

A GPU op (kernel, memcpy, memset) belongs to a range when the CUDA runtime call that launched it (joined
on correlationId and process) lies inside the range on the same thread; it then belongs to every
enclosing range too. A range's projection spans its ops' first start to last end; `gpu_busy_ns` is the
union of its ops, so kernels overlapping on two streams are not counted twice.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..gpu import call_key as _call_key
from ..gpu import gpu_frames, gpu_intervals
from ..intervals import union_length
from ..iterations import closed_ranges
from ..nvtx import innermost, parents, stack_levels

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime"}


def map_rank(rd, options: dict) -> dict:
    rd.require("nvtx", "nvtx_gpu_proj")
    rd.require("runtime", "nvtx_gpu_proj")
    r = closed_ranges(rd.nvtx).sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="mergesort")
    r = r.reset_index(drop=True)
    n = len(r)
    levels = stack_levels(r).to_numpy() if n else np.zeros(0, np.int64)
    parent = parents(r, levels)
    op_start, op_end = gpu_intervals(rd)
    op_key = np.concatenate([_call_key(f) for f in gpu_frames(rd)]) if len(op_start) else np.zeros(0, np.int64)
    rt = rd.runtime if rd.runtime is not None else pd.DataFrame(columns=["pid", "correlation_id", "tid",
                                                                          "start_ns", "end_ns"])
    launched = _launches(op_start, op_end, op_key, rt)
    pos = innermost(r, launched["tid"].to_numpy(np.int64), launched["call_start"].to_numpy(np.int64),
                    launched["call_end"].to_numpy(np.int64))
    # every (op, enclosing range) pair: walk up the parent chain, one vectorised step per nesting level
    op_idx, rng_idx = [], []
    cur = pos.copy()
    ids = np.arange(len(launched))
    while True:
        live = cur >= 0
        if not live.any():
            break
        op_idx.append(ids[live])
        rng_idx.append(cur[live])
        cur = np.where(live, parent[np.maximum(cur, 0)] if n else -1, -1)
    ranges = pd.DataFrame({
        "name": r["name"].to_numpy(object), "domain": r["domain"].to_numpy(object), "pid": r["pid"].to_numpy(np.int64),
        "tid": r["tid"].to_numpy(np.int64), "range_id": np.arange(n, dtype=np.int64),
        "parent_id": pd.array(np.where(parent >= 0, parent, 0), dtype="Int64"), "stack_level": levels,
        "cpu_start_ns": r["start_ns"].to_numpy(np.int64), "cpu_end_ns": r["end_ns"].to_numpy(np.int64),
    })
    ranges.loc[parent < 0, "parent_id"] = pd.NA
    gpu_start = pd.array([pd.NA] * n, dtype="Int64")
    gpu_end = pd.array([pd.NA] * n, dtype="Int64")
    busy = pd.array([pd.NA] * n, dtype="Int64")
    count = np.zeros(n, np.int64)
    if op_idx:
        oi, ri = np.concatenate(op_idx), np.concatenate(rng_idx)
        s = launched["start_ns"].to_numpy(np.int64)[oi]
        e = launched["end_ns"].to_numpy(np.int64)[oi]
        order = np.argsort(ri, kind="stable")
        ri_sorted = ri[order]
        firsts = np.flatnonzero(np.r_[True, ri_sorted[1:] != ri_sorted[:-1]])
        idx = ri_sorted[firsts]
        gpu_start[idx] = np.minimum.reduceat(s[order], firsts)
        gpu_end[idx] = np.maximum.reduceat(e[order], firsts)
        count[idx] = np.diff(np.r_[firsts, len(ri_sorted)])
        u = union_length(ri, s, e)
        busy[u.index.to_numpy()] = u.to_numpy()
    ranges["gpu_start_ns"] = gpu_start
    ranges["gpu_end_ns"] = gpu_end
    ranges["gpu_busy_ns"] = busy
    ranges["gpu_ops"] = count
    return {"ranges": ranges, "unlinked_ops": int(len(op_start) - len(launched))}


def _launches(op_start, op_end, op_key, rt: pd.DataFrame) -> pd.DataFrame:
    """Each GPU op with the thread and times of the runtime call that launched it (ops without one dropped)."""
    rt_key = _call_key(rt) if len(rt) else np.zeros(0, np.int64)
    index = pd.Index(rt_key)
    if index.is_unique:
        at = index.get_indexer(op_key)
        ok = at >= 0
        at = at[ok]
        return pd.DataFrame({"start_ns": op_start[ok], "end_ns": op_end[ok],
                             "tid": rt["tid"].to_numpy(np.int64)[at], "call_start": rt["start_ns"].to_numpy(np.int64)[at],
                             "call_end": rt["end_ns"].to_numpy(np.int64)[at]})
    ops = pd.DataFrame({"start_ns": op_start, "end_ns": op_end, "key": op_key})
    calls = pd.DataFrame({"key": rt_key, "tid": rt["tid"].to_numpy(np.int64), "call_start": rt["start_ns"].to_numpy(np.int64),
                          "call_end": rt["end_ns"].to_numpy(np.int64)})
    return ops.merge(calls, on="key", how="inner")[["start_ns", "end_ns", "tid", "call_start", "call_end"]]


def reduce(per_rank: list[dict], options: dict) -> dict:
    ranges = pd.concat([r["ranges"].assign(rank=r["rank"]) for r in per_rank], ignore_index=True)
    cols = ["rank", "name", "domain", "pid", "tid", "range_id", "parent_id", "stack_level", "cpu_start_ns",
            "cpu_end_ns", "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns", "gpu_ops"]
    ranges = ranges[cols]
    g = ranges.assign(cpu=ranges["cpu_end_ns"] - ranges["cpu_start_ns"],
                      proj=(ranges["gpu_end_ns"] - ranges["gpu_start_ns"]).astype("Int64"))
    summary = g.groupby(["rank", "name", "domain"], as_index=False).agg(
        count=("cpu", "size"), cpu_total_ns=("cpu", "sum"), gpu_proj_total_ns=("proj", lambda s: s.sum()),
        gpu_busy_total_ns=("gpu_busy_ns", lambda s: s.sum()), gpu_ops=("gpu_ops", "sum"))
    busy = summary["gpu_busy_total_ns"].astype("float64")
    summary["launch_ratio"] = np.where(busy > 0, summary["cpu_total_ns"] / busy.where(busy > 0, 1), np.nan)
    summary = summary.sort_values(["rank", "gpu_busy_total_ns"], ascending=[True, False]).reset_index(drop=True)
    return {"ranges": ranges, "summary": summary,
            "settings": {"unlinked_gpu_ops": int(sum(r["unlinked_ops"] for r in per_rank))}}
