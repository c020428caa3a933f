"""critical_path: for each iteration, the chain of work across ranks that set its length, the rank at its root, and
what the iteration would have taken had that rank worked as its peers did (critical_path.py does the walk and the
re-timing).

The ranks meet at NCCL kernels (matched across their communicators, SendRecv pairs included: collective_match.py)
or, in a job with none, at host collectives: collective NVTX ranges and MPI calls, the n-th of an iteration on each
rank matched with the n-th on the others, a rank arriving once its own GPU work launched before it is done. A
segment of the path is a meeting point's transfer (`communication`, `p2p` between pipeline stages), or a rank's
work between meeting points: `compute` where its GPU ran kernels through most of it, else `host`; named by the NVTX
range directly inside the iteration it lies in.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from .. import collective_match, critical_path, parallel
from ..errors import NotApplicableError
from ..gpu import collective_ops, gpu_intervals, launched_ops
from ..groups import factorize
from ..inputs.frames import arrow_of, dictionary_column
from ..intervals import covered_length, union_segments, union_segments_by_group
from ..iteration_scan import find_iterations
from ..iterations import SYNC_SOURCES, range_arrays, steady_rows, sync_points, warmup
from ..lazy import pd
from ..microbatches import chains
from ..phases import child_ranges
from . import Metric, Recipe, indented, iteration_and_parallel_options, ms, ranked_times
from .straggler_heatmap import ready_times
from .sync_summary import flavour

NEEDS = {"nvtx", "kernel", "runtime", "mpi", "payload"}
HOST_MEETINGS = (SYNC_SOURCES.index("collective NVTX range"), SYNC_SOURCES.index("MPI call"))
ITERATION_COLUMNS = ["iteration", "duration_ns", "root_rank", "root_op", "root_range", "root_work_ns", "what_if_ns",
                     "is_warmup"]


def _table(columns: dict) -> pa.Table:
    return pa.table({c: arrow_of(np.asarray(v, np.int64)) for c, v in columns.items()})


def map_rank(rank_data, options: dict) -> dict:
    """The rank's iterations, its meeting points on the host (where it ran no NCCL kernel), the union of its GPU
    compute per iteration and how many GPU operations it launched in each, and its NVTX ranges directly inside the
    iterations, with its NCCL kernels."""
    ranges = range_arrays(rank_data.frame("nvtx"))
    it = find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel"))

    points = sync_points(rank_data, ranges, options.get("sync"))
    host = host_start = np.zeros(0, np.int64)
    if not points.on_gpu.any():
        ops = launched_ops(rank_data) if rank_data.has_cuda else None
        own = np.flatnonzero(~ops.collective) if ops is not None else np.zeros(0, np.int64)
        ready = ready_times(points, ops.call_start_ns[own], ops.end_ns[own]) if ops is not None else points.start_ns
        meets = np.flatnonzero(np.isin(points.source, HOST_MEETINGS))
        # a meeting point inside another (an MPI call inside a collective range) is part of it
        reach = np.maximum.accumulate(points.end_ns[meets]) if len(meets) else meets
        host = meets[np.r_[True, points.start_ns[meets][1:] >= reach[:-1]]] if len(meets) else meets
        host_start = ready[host]
    host_it = it.of(points.start_ns[host])
    seq = np.zeros(len(host), np.int64)
    if len(host):
        seq = np.arange(len(host)) - np.searchsorted(host_it, host_it)  # the n-th of its iteration
    op_start, op_end = gpu_intervals(rank_data) if rank_data.has_cuda else (np.zeros(0, np.int64),) * 2
    compute = ~collective_ops(rank_data) if len(op_start) else np.zeros(0, bool)
    op_it = it.of(op_start[compute])
    busy = union_segments_by_group(op_it, op_start[compute], op_end[compute])
    counted, n = op_it >= 0, len(it.start_ns)
    short = (op_end[compute] - op_start[compute])[counted] < critical_path.SHORT_OP_NS
    c_start, c_end, c_name, c_it = child_ranges(ranges, it)
    words = ranges.names[:-1] if len(ranges) else np.zeros(0, object)
    names, at = np.unique(np.asarray(words[c_name] if len(c_name) else [], dtype=str), return_inverse=True)
    return {"bounds": _table({"start_ns": it.start_ns, "end_ns": it.end_ns}),
            "host": _table({"iteration": host_it, "seq": seq, "start_ns": host_start,
                            "end_ns": points.end_ns[host], "source": points.source[host]}),
            "compute": _table({"iteration": busy[0], "start_ns": busy[1], "end_ns": busy[2]}),
            "launches": _table({"iteration": np.arange(n), "gpu_ops": np.bincount(op_it[counted], minlength=n),
                                "short_ops": np.bincount(op_it[counted], weights=short, minlength=n)}),
            "children": pa.table({"start_ns": arrow_of(np.asarray(c_start, np.int64)),
                                  "end_ns": arrow_of(np.asarray(c_end, np.int64)),
                                  "name": dictionary_column(at.reshape(-1).astype(np.int64), names.tolist())}),
            "delimiter": it.delimiter.as_dict(), "start_ns": it.start_ns, "flavour": flavour(rank_data.env),
            **collective_match.nccl_kernels(rank_data, it)}


def reduce(per_rank: list[dict], options: dict) -> dict:
    matched = collective_match.match(per_rank, options)
    groups = matched.groups
    shift = matched.shifts(per_rank)
    bounds = ranked_times(per_rank, "bounds", shift)
    bounds["iteration"] = bounds.groupby("rank").cumcount()
    cells = bounds.rename(columns={"start_ns": "start_aligned_ns", "end_ns": "end_aligned_ns"})
    stage_of = groups.set_index("rank")["pp"].fillna(0).astype("int64") if parallel.is_parallel(groups) else {}
    cells["stage"] = cells["rank"].map(stage_of).fillna(0).astype("int64")
    members, names = _members(per_rank, matched, shift)
    if members is None:
        raise NotApplicableError(
            f"critical_path does not apply: the {len(per_rank)} rank(s) never meet (no NCCL kernel, collective NVTX "
            "range or MPI call inside the iterations on every rank)")
    ch = chains(members, cells)
    path = critical_path.walk(ch, cells, names)
    segments = _described(path.segments, ranked_times(per_rank, "compute", shift),
                          ranked_times(per_rank, "children", shift))
    out = critical_path.roots(path)
    root_work = segments[(segments["kind"].isin(["compute", "host"])) &
                         (segments["rank"] == segments["iteration"].map(out["root_rank"]))]
    top = root_work.groupby(["iteration", "kind"])["duration_ns"].sum().reset_index()
    out["root_op"] = top.loc[top.groupby("iteration")["duration_ns"].idxmax()].set_index("iteration")["kind"]
    named = root_work.dropna(subset=["name"]).groupby(["iteration", "name"])["duration_ns"].sum().reset_index()
    out["root_range"] = named.loc[named.groupby("iteration")["duration_ns"].idxmax()].set_index("iteration")["name"] \
        if len(named) else None
    out["what_if_ns"] = critical_path.what_if(ch, cells, out["root_rank"]).reindex(out.index).fillna(0).astype("int64")
    out = out.reset_index().rename(columns={"index": "iteration"})
    out["is_warmup"] = warmup(np.zeros(len(out), np.int64), out["iteration"].to_numpy(), out["duration_ns"].to_numpy())
    for c in ("root_op", "root_range"):
        out[c] = out[c].astype(object).where(out[c].notna(), None)
    return {"iterations": out[ITERATION_COLUMNS], "critical_path": segments, "groups": groups,
            "findings": critical_path.findings(segments, out, _launches(per_rank),
                                               pd.Series([r["flavour"] for r in per_rank]).mode().iat[0]),
            "settings": {"groups_source": matched.source, "notes": matched.notes,
                         "meeting_points": "NCCL kernels" if names.name == "nccl" else "host collectives"}}


def _launches(per_rank: list[dict]) -> pd.DataFrame:
    """Every rank's GPU operations per iteration, and how many of them were short (critical_path.SHORT_OP_NS)."""
    out = pa.concat_tables([r["launches"] for r in per_rank]).to_pandas()
    out["rank"] = np.repeat([r["rank"] for r in per_rank], [r["launches"].num_rows for r in per_rank])
    return out


def _members(per_rank: list[dict], matched, shift: dict):
    """The meeting points as collective_match's members table (rank, iteration, aligned start and end, group,
    instance) and a name per instance: the NCCL kernels where they were matched, else the host ones, the n-th of an
    iteration on every rank one instance (None: none)."""
    k = matched.kernels
    if k is not None and (k["instance"] >= 0).any():
        c = matched.collectives
        names = pd.Series((c["op"] + np.where(c["group"].isin(["tp", "pp", "dp"]), " (" + c["group"] + ")", "")
                           ).to_numpy(object), index=np.arange(len(c)), name="nccl")
        return k, names
    host = ranked_times(per_rank, "host", shift)
    host = host[host["iteration"] >= 0]
    if host.empty:
        return None, None
    ranks = host["rank"].nunique()
    key = host["iteration"] * (int(host["seq"].max()) + 1) + host["seq"]
    everywhere = key.map(key.value_counts()) == ranks  # met by every rank
    host = host[everywhere.to_numpy()]
    if host.empty or ranks < 2:
        return None, None
    _, instance = factorize(key[everywhere].to_numpy())
    members = pd.DataFrame({"rank": host["rank"], "iteration": host["iteration"], "start_aligned_ns": host["start_ns"],
                            "end_aligned_ns": host["end_ns"], "group": "host", "instance": instance})
    source = host.groupby(instance)["source"].first()
    return members.reset_index(drop=True), pd.Series([SYNC_SOURCES[s] for s in source], index=source.index,
                                                     name="host")


def _described(segments: pd.DataFrame, compute: pd.DataFrame, children: pd.DataFrame) -> pd.DataFrame:
    """The path's work segments as compute (the rank's GPU ran through most of them) or host, named by the NVTX range
    directly inside the iteration that holds each one's middle; transfers between pipeline stages as p2p."""
    seg = segments.reset_index(drop=True)
    work = np.flatnonzero(seg["kind"].to_numpy() == "work")
    if len(work):
        start, end = seg["start_aligned_ns"].to_numpy()[work], seg["end_aligned_ns"].to_numpy()[work]
        rank = seg["rank"].to_numpy()[work]
        covered = np.zeros(len(work), np.int64)
        gpu = compute.sort_values(["rank", "start_ns"], kind="stable")
        for r, rows in gpu.groupby("rank"):  # a rank at a time: its work segments against its GPU time
            mine = np.flatnonzero(rank == r)
            if len(mine):
                s_start, s_end = union_segments(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy())
                covered[mine] = covered_length(s_start, s_end, start[mine], end[mine])
        seg.loc[work, "kind"] = np.where(2 * covered >= end - start, "compute", "host")
        seg.loc[work, "name"] = _range_names(seg.iloc[work], children)
    p2p = seg["kind"].eq("communication") & seg["name"].astype(str).str.endswith("(pp)")
    seg.loc[p2p, "kind"] = "p2p"
    return seg


def _range_names(work: pd.DataFrame, children: pd.DataFrame) -> np.ndarray:
    """The name of the NVTX range (directly inside an iteration) on each segment's rank that holds its middle."""
    if children.empty:
        return np.full(len(work), None, object)
    mid = pd.DataFrame({"rank": work["rank"].to_numpy(), "t": ((work["start_aligned_ns"] + work["end_aligned_ns"])
                                                              // 2).to_numpy(), "row": np.arange(len(work))})
    found = pd.merge_asof(mid.sort_values("t"), children.sort_values("start_ns").rename(columns={"start_ns": "t"}),
                          on="t", by="rank", direction="backward").sort_values("row")
    inside = found["end_ns"].to_numpy() > found["t"].to_numpy()
    return np.where(inside, found["name"].to_numpy(object), None)


def summary(out) -> list[str]:
    it = pd.read_parquet(out / "iterations.parquet")
    steady = steady_rows(it)
    roots = steady.groupby("root_rank").agg(iterations=("iteration", "size"), work_ns=("root_work_ns", "sum"),
                                            what_if_ns=("what_if_ns", "sum")).sort_values("iterations",
                                                                                         ascending=False)
    table = pd.DataFrame({"root rank": roots.index, "iterations": roots["iterations"],
                          "its work on the path, ms": roots["work_ns"].map(lambda v: f"{v / 1e6:,.1f}"),
                          "what-if saves, ms": roots["what_if_ns"].map(lambda v: f"{v / 1e6:,.1f}")})
    settings = json.loads((out / "analysis.json").read_text())
    found = pd.read_parquet(out / "findings.parquet") if (out / "findings.parquet").exists() else pd.DataFrame()
    return [headline(out), f"meeting points: {settings.get('meeting_points')}"] + indented(
        "roots of the steady iterations:", table.to_string(index=False)) + [
        f"{f.evidence}: {f.advice}" for f in found.itertuples()]


def headline(out) -> str:
    it = pd.read_parquet(out / "iterations.parquet")
    steady = steady_rows(it)
    counts = steady["root_rank"].value_counts()
    top = int(counts.index[0])
    mine = steady[steady["root_rank"] == top]
    return (f"rank {top} roots the critical path in {int(counts.iloc[0])} of {len(steady)} steady iterations (its work "
            f"{100 * mine['root_work_ns'].sum() / max(mine['duration_ns'].sum(), 1):.0f} % of them); had it matched "
            f"its peers they would have taken {ms(mine['what_if_ns'].mean())} less each")


def diff_metrics(ranks) -> pd.DataFrame | None:
    """The median steady iteration's length along its critical path (a run whose ranks never meet has none)."""
    from ..runner import analysed

    tables = analysed("critical_path", ranks)
    if tables is None:
        return None
    it = tables["iterations"]
    steady = steady_rows(it)
    return pd.DataFrame({"metric": "critical_path_ns", "key": "median iteration",
                         "value": [float(steady["duration_ns"].median())]})


RECIPE = Recipe(
    name="critical_path",
    display_name="Critical path",
    description="For each iteration, the chain of work across ranks that set its length, the rank at its root, and "
                "what the iteration would take had that rank worked as its peers did.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=iteration_and_parallel_options,
    per_iteration=True,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.critical_path",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("critical_path_ns", "critical path", always_tracked=True),),
)
