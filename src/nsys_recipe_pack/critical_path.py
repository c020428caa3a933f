"""The chain of work across ranks that set each iteration's length, and what the iteration would take had its root
rank worked as its peers did: the critical_path recipe's analysis (pure functions over the reduce's tables).

Each rank's iteration is a chain of meeting points (NCCL kernels, or host collectives and MPI calls where a job has
no NCCL kernel) with its own work between them (microbatches.chains: each meeting point follows the one that ended
last before it). A meeting point ends its transfer after its last member arrived. Walking back from the rank that
ended the iteration last: its work after its last meeting point; the meeting point's transfer, charged to the member
that arrived last; that member's work before its arrival; the meeting point that work followed; and so on, until a
rank's work reaches back to its iteration's start. The root is the rank with the most work on the path; the
what-if re-times the iteration (microbatches.retimed_ends) with the root's work between meeting points at the
median of its peers' (its stage's ranks, the same meeting point's place in the chain), or of its own iterations
where its stage has no other rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .iterations import steady_rows
from .lazy import pd
from .microbatches import Chains, retimed_ends

PATH_COLUMNS = ["iteration", "order", "rank", "kind", "name", "start_aligned_ns", "end_aligned_ns", "duration_ns"]


@dataclass
class Path:
    segments: pd.DataFrame  # PATH_COLUMNS, each iteration's from its end back to its start (order 0: the last)
    duration_ns: pd.Series  # per iteration: last end less first start over its ranks


def walk(ch: Chains, cells: pd.DataFrame, instance_name: pd.Series, max_steps: int = 1_000_000) -> Path:
    """The critical path of each iteration. cells: rank, iteration per cell (ch's); instance_name: per instance, what
    to call its transfer (a collective kind, a call's name); each step of the walk is taken for every iteration at
    once."""
    rank, iteration = cells["rank"].to_numpy(np.int64), cells["iteration"].to_numpy(np.int64)
    n = len(ch.cell)
    # the member of each instance that arrived last
    matched = np.flatnonzero(ch.instance >= 0)
    last_of = pd.Series(ch.start[matched], index=matched).groupby(ch.instance[matched]).idxmax()
    last_member = np.full(n, -1, np.int64)
    last_member[matched] = last_of.reindex(ch.instance[matched]).to_numpy(np.int64)
    # where each iteration ends: the cell ending last, after the kernel that ended last in it
    ends = pd.Series(ch.cell_end).groupby(iteration)
    closing = ends.idxmax().to_numpy(np.int64)
    it_of = ends.max().index.to_numpy(np.int64)
    last_kernel = np.full(len(ch.cell_start), -1, np.int64)
    if n:
        by_end = np.lexsort((ch.end, ch.cell))
        tail = by_end[np.r_[ch.cell[by_end][1:] != ch.cell[by_end][:-1], True]]  # each cell's latest end
        last_kernel[ch.cell[tail]] = tail
    parts = []

    def add(at, seg_rank, kind, name, start, end):
        parts.append(pd.DataFrame({"iteration": it_of[at], "rank": seg_rank, "kind": kind, "name": name,
                                   "start_aligned_ns": start, "end_aligned_ns": end, "step": len(parts)}))

    node = last_kernel[closing]
    every = np.arange(len(it_of))
    tail_start = np.where(node >= 0, ch.end[np.maximum(node, 0)], ch.cell_start[closing])
    add(every, rank[closing], "work", None, tail_start, ch.cell_end[closing])
    active = every[node >= 0]
    node = node[node >= 0]
    for _ in range(max_steps):
        if not len(active):
            break
        who = np.where(last_member[node] >= 0, last_member[node], node)  # the member that arrived last
        name = instance_name.reindex(ch.instance[node]).to_numpy(object)
        add(active, rank[ch.cell[who]], "communication", name, ch.start[who], ch.end[node])
        before = ch.pred[who]
        start = np.where(before >= 0, ch.end[np.maximum(before, 0)], ch.cell_start[ch.cell[who]])
        add(active, rank[ch.cell[who]], "work", None, start, ch.start[who])
        keep = before >= 0
        active, node = active[keep], before[keep]
    segments = pd.concat(parts, ignore_index=True)
    segments = segments[segments["end_aligned_ns"] > segments["start_aligned_ns"]]
    segments = segments.sort_values(["iteration", "step"], kind="stable").drop(columns="step")
    segments["order"] = segments.groupby("iteration").cumcount()
    segments["duration_ns"] = segments["end_aligned_ns"] - segments["start_aligned_ns"]
    span = pd.DataFrame({"iteration": iteration, "start": ch.cell_start, "end": ch.cell_end}).groupby("iteration")
    return Path(segments[PATH_COLUMNS].reset_index(drop=True), span["end"].max() - span["start"].min())


def roots(path: Path) -> pd.DataFrame:
    """Per iteration, the rank with the most work on its critical path, and that work's share of the iteration."""
    work = path.segments[path.segments["kind"] != "communication"]
    per = work.groupby(["iteration", "rank"])["duration_ns"].sum().reset_index()
    top = per.loc[per.groupby("iteration")["duration_ns"].idxmax()].set_index("iteration")
    out = pd.DataFrame({"duration_ns": path.duration_ns})
    out["root_rank"] = top["rank"].reindex(out.index).astype("Int64")
    out["root_work_ns"] = top["duration_ns"].reindex(out.index).fillna(0).astype("int64")
    return out


def what_if(ch: Chains, cells: pd.DataFrame, root_rank: pd.Series) -> pd.Series:
    """Per iteration, how much shorter it would have been had its root rank's work between meeting points taken no
    longer than the median of its peers' (the other ranks of its stage) at the same place in the chain, or, with no
    peer (a stage of one rank), than its own median over the iterations (cells: rank, iteration, stage)."""
    rank, iteration = cells["rank"].to_numpy(np.int64), cells["iteration"].to_numpy(np.int64)
    stage = cells["stage"].to_numpy(np.int64)
    n_cells = len(cells)
    place = np.arange(len(ch.cell)) - np.searchsorted(ch.cell, ch.cell)  # a kernel's place in its cell's chain
    count = np.bincount(ch.cell, minlength=n_cells)
    is_root = rank == root_rank.reindex(iteration).fillna(-1).to_numpy(np.int64)
    # the peers' median leaves the root out (it is what is re-timed)
    frame = pd.DataFrame({"it": iteration[ch.cell], "stage": stage[ch.cell], "rank": rank[ch.cell],
                          "count": count[ch.cell], "place": place, "gap": ch.gap,
                          "peer": np.where(is_root[ch.cell], np.nan, ch.gap)})
    cell_frame = pd.DataFrame({"it": iteration, "stage": stage, "rank": rank, "count": count, "final": ch.final_gap,
                               "peer": np.where(is_root, np.nan, ch.final_gap)})
    gap = _matched(ch.gap, is_root[ch.cell], frame, "gap", ["place"])
    final = _matched(ch.final_gap, is_root, cell_frame, "final", [])
    as_ran = retimed_ends(ch, ch.gap, ch.final_gap)
    evened = retimed_ends(ch, gap, final)
    g = pd.DataFrame({"it": iteration, "ran": as_ran, "even": evened}).groupby("it")
    return (g["ran"].max() - g["even"].max()).clip(lower=0).astype("int64")


def _matched(value: np.ndarray, is_root: np.ndarray, frame: pd.DataFrame, column: str, place: list[str]) -> np.ndarray:
    """Each root's `value` capped at its peers' median in the same iteration, stage and place (chains of as many
    meeting points); where it has no peer, at its own median over the iterations."""
    peers = frame.groupby(["it", "stage", "count", *place])["peer"].transform("median").to_numpy()
    own = frame.groupby(["rank", "count", *place])[column].transform("median").to_numpy()
    target = np.where(np.isfinite(peers), peers, own)
    return np.where(is_root & np.isfinite(target), np.minimum(value, np.round(np.nan_to_num(target))),
                    value).astype(np.int64)


FINDING_SHARE = 0.05  # of the steady iterations' time on their critical paths: less is thin evidence, no advice
HOST_SHARE = 0.20  # host work on the path above this share: the GPU waited for the host
# the host waits on launches where its ranks launch many GPU operations an iteration, most too short to cover a launch
SHORT_OP_NS, MANY_OPS, SHORT_SHARE = 10_000, 500, 0.5
HOST_ADVICE = {
    "torch": "the GPU waits for the host's own work in the step: data loading (more loader workers, pinned memory) "
             "or Python and synchronisation between kernels (sync_summary shows where the host blocks)",
    "mpi": "the GPU waits for the host's own work in the step: host computation or MPI calls between the kernels "
           "(keep the data on the GPU and overlap the communication with GPU work; sync_summary shows where the host "
           "blocks)",
    "": "the GPU waits for the host's own work in the step: what the host runs between the kernels (sync_summary "
        "shows where the host blocks)",
}
FINDING_COLUMNS = ["kind", "evidence", "advice", "share_pct", "per_iteration_ns"]
# (kind, which path segments, what they are, what to try: Megatron-LM flags and NeMo's names for them)
ADVICE = [
    ("exposed_gradient_reduce", lambda s: s["name"].str.match(r"(all_reduce|reduce_scatter) \(dp\)"),
     "data-parallel gradient reduction",
     "overlap the gradient reduce with the backward pass: --overlap-grad-reduce (NeMo overlap_grad_reduce), with "
     "the distributed optimizer"),
    ("exposed_param_gather", lambda s: s["name"].str.match(r"all_gather \(dp\)"),
     "data-parallel parameter all-gather",
     "overlap the parameter all-gather with the forward pass: --overlap-param-gather (NeMo overlap_param_gather)"),
    ("exposed_p2p", lambda s: s["kind"] == "p2p", "pipeline sends and receives",
     "overlap the pipeline's sends and receives with compute (NeMo overlap_p2p_comm), which interleaved virtual "
     "pipeline stages allow (--num-layers-per-virtual-pipeline-stage; NeMo virtual_pipeline_model_parallel_size)"),
    ("exposed_tp", lambda s: s["name"].str.contains(r"\(tp\)", regex=True), "tensor-parallel communication",
     "overlap tensor-parallel communication with the GEMMs: --tp-comm-overlap (NeMo tp_comm_overlap), and keep each "
     "tensor-parallel group inside one node"),
]


def findings(segments: pd.DataFrame, iterations: pd.DataFrame, launches: pd.DataFrame | None = None,
             flavour: str = "") -> pd.DataFrame:
    """findings.parquet: what the steady iterations' critical paths spend enough time on (FINDING_SHARE) to be worth
    a change, each with its evidence and the option to try; host work on the path as launch-bound where the ranks
    doing it launch many short GPU operations (launches: rank, iteration, gpu_ops, short_ops), else as the host's own
    work, in the terms of the job's kind (flavour: "torch", "mpi" or "", sync_summary.flavour); the rank at the root
    where matching its peers would give back as much."""
    steady = steady_rows(iterations)
    seg = segments[segments["iteration"].isin(steady["iteration"])]
    seg = seg.assign(name=seg["name"].astype(object).where(seg["name"].notna(), "").astype(str))
    total = float(steady["duration_ns"].sum())
    rows = []

    def add(kind, ns, what, advice, detail=""):
        share = ns / max(total, 1.0)
        rows.append({"kind": kind, "share_pct": 100 * share, "per_iteration_ns": int(round(ns / max(len(steady), 1))),
                     "evidence": f"{what} on the critical path: {100 * share:.1f} % of the steady iterations' time "
                                 f"({ns / max(len(steady), 1) / 1e6:,.1f} ms per iteration){detail}",
                     "advice": advice})

    for kind, which, what, advice in ADVICE:
        ns = float(seg.loc[which(seg), "duration_ns"].sum())
        if ns >= FINDING_SHARE * total:
            add(kind, ns, what, advice)
    on_host = seg["kind"] == "host"
    host = float(seg.loc[on_host, "duration_ns"].sum())
    if host >= HOST_SHARE * total:
        ops = pd.DataFrame()
        if launches is not None:
            ops = launches.merge(seg.loc[on_host, ["rank", "iteration"]].drop_duplicates(), on=["rank", "iteration"])
        per_iteration = float(ops["gpu_ops"].median()) if len(ops) else 0.0
        short = float(ops["short_ops"].sum()) / max(float(ops["gpu_ops"].sum()), 1.0) if len(ops) else 0.0
        if per_iteration >= MANY_OPS and short >= SHORT_SHARE:
            add("launch_bound", host, "host work with the GPU idle",
                "the GPU waits for kernel launches: capture the step in CUDA graphs (--enable-cuda-graph; NeMo "
                "enable_cuda_graph) or fuse the short kernels",
                f"; its ranks launch {per_iteration:,.0f} GPU operations an iteration, {100 * short:.0f} % of them "
                f"under {SHORT_OP_NS // 1000} us")
        else:
            add("host_bound", host, "host work with the GPU idle", HOST_ADVICE.get(flavour, HOST_ADVICE[""]))
    saved = float(steady["what_if_ns"].sum())
    if saved >= FINDING_SHARE * total:
        top = int(steady.groupby("root_rank")["what_if_ns"].sum().idxmax())
        add("straggler", saved, f"work of a rank slower than its peers (most: rank {top}) matched to theirs",
            f"find what slows rank {top} (straggler_heatmap gives its cause)")
    out = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    return out.sort_values("share_pct", ascending=False, kind="stable").reset_index(drop=True)
