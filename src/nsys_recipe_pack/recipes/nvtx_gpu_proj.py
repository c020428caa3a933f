"""nvtx_gpu_proj: what each NVTX range costs on the GPU.

A GPU op (kernel, memcpy, memset) belongs to a range when the CUDA runtime call that launched it (joined
on correlationId and process) lies inside the range on the same thread; it then belongs to every
enclosing range too. By default (`--attribution process`) an op launched by a thread that has no NVTX
range open at the launch belongs to the ranges open on the other threads of its process then: PyTorch
launches backward kernels from its autograd thread, data loaders copy from pin-memory threads, and
without this `backward` would show almost no GPU time. `--attribution thread` keeps the launching
thread only, as Nsight Systems' `nvtx_gpu_proj_trace` does. A range's projection spans its ops' first
start to last end; `gpu_busy_ns` is the union of its ops, so kernels overlapping on two streams are not
counted twice.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..gpu import launched_ops
from ..groups import SortedGroups, distinct
from ..inputs import Frame, arrow_of, dictionary_column, ranked_tables
from ..intervals import union_lengths
from ..iterations import closed_range_mask, closed_ranges
from ..lazy import pd
from ..nvtx import innermost_of, op_name, parents_of, stack_levels_of
from . import Metric, Recipe, indented, ms, ms_cell

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime"}
ATTRIBUTIONS = ("process", "thread")
# the per-range table's columns and their pandas dtypes (nullable where a range may have no parent or no GPU op)
RANGE_DTYPES = {"name": "object", "domain": "object", "pid": "int64", "tid": "int64", "range_id": "int64",
                "parent_id": "Int64", "stack_level": "int64", "cpu_start_ns": "int64", "cpu_end_ns": "int64",
                "gpu_start_ns": "Int64", "gpu_end_ns": "Int64", "gpu_busy_ns": "Int64", "gpu_ops": "int64"}


def launch_ranges(r_tid, r_pid, r_start, r_end, tid, pid, call_start, call_end, attribution: str = "process"):
    """(launch, range) pairs: the innermost range around each launching call on its own thread; with
    attribution "process", for a call that no range of its own thread encloses, the innermost range
    enclosing it on each other thread of its process. Positions into the given arrays."""
    pos = innermost_of(r_tid, r_start, r_end, tid, call_start, call_end)
    launch = [np.flatnonzero(pos >= 0)]
    rng = [pos[launch[0]]]
    if attribution == "process":
        orphan = np.flatnonzero(pos < 0)
        threads, first = np.unique(r_tid, return_index=True)
        for thread, thread_pid in zip(threads, np.asarray(r_pid)[first], strict=True):  # threads with ranges: few
            q = orphan[(pid[orphan] == thread_pid) & (tid[orphan] != thread)]
            if len(q):
                hit = innermost_of(r_tid, r_start, r_end, np.full(len(q), thread), call_start[q], call_end[q])
                launch.append(q[hit >= 0])
                rng.append(hit[hit >= 0])
    return np.concatenate(launch), np.concatenate(rng)


def map_rank(rank_data, options: dict) -> dict:
    rank_data.require("nvtx", "nvtx_gpu_proj")
    rank_data.require("runtime", "nvtx_gpu_proj")
    nvtx_events = rank_data.frame("nvtx")
    start_all, end_all = nvtx_events.values("start_ns"), nvtx_events.values("end_ns")
    closed = np.flatnonzero(closed_range_mask(nvtx_events))
    r = closed[np.lexsort((-end_all[closed], start_all[closed]))]  # by start, longer first; stable
    start, end, tid, pid = start_all[r], end_all[r], nvtx_events.values("tid")[r], nvtx_events.values("pid")[r]
    n = len(r)
    levels = stack_levels_of(tid, start, end)
    parent = parents_of(tid, start, levels)
    ops = launched_ops(rank_data)
    op_of, pos = launch_ranges(tid, pid, start, end, ops.tid, ops.pid, ops.call_start_ns, ops.call_end_ns,
                               options.get("attribution") or "process")
    # every (op, enclosing range) pair: walk up the parent chain, one vectorised step per nesting level
    op_idx, rng_idx = [], []
    cur = pos.copy()
    while True:
        live = cur >= 0
        if not live.any():
            break
        op_idx.append(op_of[live])
        rng_idx.append(cur[live])
        cur = np.where(live, parent[np.maximum(cur, 0)] if n else -1, -1)
    op_start, op_end = ops.start_ns, ops.end_ns
    gpu_start, gpu_end, busy = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    count = np.zeros(n, np.int64)
    if op_idx:
        op_index, range_index = np.concatenate(op_idx), np.concatenate(rng_idx)
        # once per (range, op), also for an op with several paths
        pairs = distinct(range_index * len(op_start) + op_index)
        range_index, op_index = np.divmod(pairs, max(len(op_start), 1))
        s, e = op_start[op_index], op_end[op_index]
        per_range = SortedGroups(range_index)
        idx = per_range.keys
        gpu_start[idx], gpu_end[idx] = per_range.min(s), per_range.max(e)
        count[idx] = per_range.size
        in_range, length = union_lengths(range_index, s, e)
        busy[in_range] = length
    name_codes, name_words = nvtx_events.codes("name")
    domain_codes, domain_words = nvtx_events.codes("domain")
    has_op = count > 0
    ranges = pa.Table.from_arrays([
        dictionary_column(name_codes[r], name_words[:-1]), dictionary_column(domain_codes[r], domain_words[:-1]),
        arrow_of(nvtx_events.values("pid")[r]), arrow_of(tid), arrow_of(np.arange(n, dtype=np.int64)),
        arrow_of(np.maximum(parent, 0), valid=parent >= 0), arrow_of(levels), arrow_of(start), arrow_of(end),
        arrow_of(gpu_start, valid=has_op), arrow_of(gpu_end, valid=has_op), arrow_of(busy, valid=has_op),
        arrow_of(count),
    ], names=["name", "domain", "pid", "tid", "range_id", "parent_id", "stack_level", "cpu_start_ns", "cpu_end_ns",
              "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns", "gpu_ops"])
    return {"ranges": ranges, "unlinked_ops": ops.unlinked}


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
            "settings": {"unlinked_gpu_ops": int(sum(r["unlinked_ops"] for r in per_rank)),
                         "attribution": options.get("attribution") or "process"}}


def add_options(add, framework: bool = False) -> None:
    add("--attribution", choices=ATTRIBUTIONS, default="process",
        help="process (default): GPU work launched by a thread with no NVTX range open counts for the ranges open "
             "on the other threads of its process (PyTorch's autograd thread); thread: the launching thread "
             "only, as Nsight Systems' nvtx_gpu_proj_trace")


def summary(out, top: int = 8) -> list[str]:
    s = pd.read_parquet(out / "summary.parquet")
    t = s.groupby("name")[["count", "cpu_total_ns", "gpu_busy_total_ns"]].sum()
    t = t.sort_values("gpu_busy_total_ns", ascending=False).head(top)
    table = pd.DataFrame({"count": t["count"], "cpu ms": t["cpu_total_ns"].map(ms_cell),
                          "gpu busy ms": t["gpu_busy_total_ns"].map(ms_cell),
                          "cpu/gpu": (t["cpu_total_ns"] / t["gpu_busy_total_ns"].where(t["gpu_busy_total_ns"] > 0))
                          .map(lambda v: "" if pd.isna(v) else f"{v:.2f}")})
    table.index = [str(i)[:40] for i in table.index]
    return indented("ranges with the most GPU time, all ranks:", table.to_string())


def headline(out) -> str:
    s = pd.read_parquet(out / "summary.parquet")
    t = s.groupby("name")["gpu_busy_total_ns"].sum().sort_values(ascending=False)
    t = t[t > 0]
    return f"most GPU time: {t.index[0]!s} ({ms(t.iloc[0])})" if len(t) else "no GPU work inside NVTX ranges"


def diff_metrics(ranks) -> pd.DataFrame | None:
    """Time inside NVTX ranges by name over a run, per op for PyTorch's per-instance names (nvtx.op_name)."""
    ranges = pd.concat([closed_ranges(rank_data.nvtx) for rank_data in ranks], ignore_index=True)
    if not len(ranges):
        return None
    t = (ranges["end_ns"] - ranges["start_ns"]).groupby(op_name(ranges["name"])).sum()
    return pd.DataFrame({"metric": "nvtx_total_ns", "key": t.index, "value": t.to_numpy(np.float64)})


RECIPE = Recipe(
    name="nvtx_gpu_proj",
    display_name="NVTX GPU projection",
    description="What each NVTX range costs on the GPU: its GPU ops projected onto it (start, end, busy "
                "union), and whether the GPU or the CPU launch path bounds it.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    bytes_per_row=450,  # 3.82 GB over 10.1 M rows
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.nvtx_gpu_proj",
    diff_metrics=diff_metrics,
    diff_needs=frozenset({"nvtx"}),
    metrics=(Metric("nvtx_total_ns", "NVTX time"),),
)
