"""nvtx_gpu_proj: what each NVTX range costs on the GPU.

A GPU op (kernel, memcpy, memset) belongs to a range when the CUDA runtime call that launched it (joined
on correlationId and process) lies inside the range on the same thread; it then belongs to every
enclosing range too. A range's projection spans its ops' first start to last end; `gpu_busy_ns` is the
union of its ops, so kernels overlapping on two streams are not counted twice.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..gpu import call_key, gpu_frames, gpu_intervals
from ..intervals import union_lengths
from ..iterations import closed_range_mask
from ..loader import Frame, arrow_of, dictionary_column, ranked_tables
from ..nvtx import innermost_of, parents_of, stack_levels_of

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime"}
# the per-range table's columns and their pandas dtypes (nullable where a range may have no parent or no GPU op)
RANGE_DTYPES = {"name": "object", "domain": "object", "pid": "int64", "tid": "int64", "range_id": "int64",
                "parent_id": "Int64", "stack_level": "int64", "cpu_start_ns": "int64", "cpu_end_ns": "int64",
                "gpu_start_ns": "Int64", "gpu_end_ns": "Int64", "gpu_busy_ns": "Int64", "gpu_ops": "int64"}


def map_rank(rd, options: dict) -> dict:
    rd.require("nvtx", "nvtx_gpu_proj")
    rd.require("runtime", "nvtx_gpu_proj")
    nv = rd.frame("nvtx")
    start_all, end_all = nv.values("start_ns"), nv.values("end_ns")
    closed = np.flatnonzero(closed_range_mask(nv))
    r = closed[np.lexsort((-end_all[closed], start_all[closed]))]  # by start, longer first; stable
    start, end, tid = start_all[r], end_all[r], nv.values("tid")[r]
    n = len(r)
    levels = stack_levels_of(tid, start, end)
    parent = parents_of(tid, start, levels)
    op_start, op_end = gpu_intervals(rd)
    frames = gpu_frames(rd)
    op_key = np.concatenate([call_key(f) for f in frames]) if frames else np.zeros(0, np.int64)
    rt = rd.frame("runtime")
    op, call = _launches(op_key, call_key(rt))
    op_start, op_end = op_start[op], op_end[op]
    pos = innermost_of(tid, start, end, rt.values("tid")[call], rt.values("start_ns")[call], rt.values("end_ns")[call])
    # every (op, enclosing range) pair: walk up the parent chain, one vectorised step per nesting level
    op_idx, rng_idx = [], []
    cur = pos.copy()
    ids = np.arange(len(op))
    while True:
        live = cur >= 0
        if not live.any():
            break
        op_idx.append(ids[live])
        rng_idx.append(cur[live])
        cur = np.where(live, parent[np.maximum(cur, 0)] if n else -1, -1)
    gpu_start, gpu_end, busy = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    count = np.zeros(n, np.int64)
    if op_idx:
        oi, ri = np.concatenate(op_idx), np.concatenate(rng_idx)
        s, e = op_start[oi], op_end[oi]
        order = np.argsort(ri, kind="stable")
        ri_sorted = ri[order]
        firsts = np.flatnonzero(np.r_[True, ri_sorted[1:] != ri_sorted[:-1]])
        idx = ri_sorted[firsts]
        gpu_start[idx] = np.minimum.reduceat(s[order], firsts)
        gpu_end[idx] = np.maximum.reduceat(e[order], firsts)
        count[idx] = np.diff(np.r_[firsts, len(ri_sorted)])
        in_range, length = union_lengths(ri, s, e)
        busy[in_range] = length
    name_codes, name_words = nv.codes("name")
    domain_codes, domain_words = nv.codes("domain")
    has_op = count > 0
    ranges = pa.Table.from_arrays([
        dictionary_column(name_codes[r], name_words[:-1]), dictionary_column(domain_codes[r], domain_words[:-1]),
        arrow_of(nv.values("pid")[r]), arrow_of(tid), arrow_of(np.arange(n, dtype=np.int64)),
        arrow_of(np.maximum(parent, 0), valid=parent >= 0), arrow_of(levels), arrow_of(start), arrow_of(end),
        arrow_of(gpu_start, valid=has_op), arrow_of(gpu_end, valid=has_op), arrow_of(busy, valid=has_op),
        arrow_of(count),
    ], names=["name", "domain", "pid", "tid", "range_id", "parent_id", "stack_level", "cpu_start_ns", "cpu_end_ns",
              "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns", "gpu_ops"])
    return {"ranges": ranges, "unlinked_ops": int(len(op_key) - len(op))}


def _launches(op_key: np.ndarray, call_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(op, call) index pairs of each GPU op and the runtime call(s) with its key, in op order (ops without
    a call dropped; a key held by several calls pairs the op with each, in call order)."""
    by_key = np.argsort(call_keys, kind="stable")
    sorted_keys = call_keys[by_key]
    lo = np.searchsorted(sorted_keys, op_key, side="left")
    hits = np.searchsorted(sorted_keys, op_key, side="right") - lo
    op = np.repeat(np.arange(len(op_key)), hits)
    within = np.arange(len(op)) - np.repeat(np.cumsum(hits) - hits, hits)
    return op, by_key[np.repeat(lo, hits) + within]


def reduce(per_rank: list[dict], options: dict) -> dict:
    table = ranked_tables(per_rank, "ranges")
    ranges = Frame(table, {"rank": "int64", **RANGE_DTYPES}).to_pandas()
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
