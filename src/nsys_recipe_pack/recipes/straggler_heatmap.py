"""Straggler heatmap: which rank makes the others wait, in which iterations, and why.

A straggler arrives last at the iteration's sync point, so it *waits least*; the ranks that wait for
it are victims. So the measure is busy time: the iteration's duration minus the time spent waiting in
collectives and sync points, compared with the other ranks' busy time in the same iteration. A rank is
ready at a sync point only once its own work is done on the host *and* on the GPU: a host-side
collective or sync call counts as waiting only from when the GPU work the rank launched before it had
finished (a rank whose GPU is behind spends the start of the collective waiting for itself), and a
collective kernel (NCCL) counts as waiting from its start, which stream order puts after the rank's own
work. So a rank whose GPU work makes the others wait is the one whose busy time grows, whether the delay
is on its host or its GPU. A cell is flagged when the excess is large relative to the iteration
(`threshold`) and relative to the noise, estimated robustly over the whole run, either for busy time as
a whole or for one component (an NVTX child range's host time, the GPU time of the work it launched,
GPU compute, memcpy, host time outside them) that accounts for at least half of the excess (`sigma`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from .. import collective_match, microbatches, parallel, peers
from ..driver import fold_rank
from ..gpu import call_key, collective_ops, gpu_frames, gpu_intervals, launched_ops
from ..groups import SortedGroups
from ..inputs import arrow_of, dictionary_column, sorted_place
from ..inputs.chunks import END_OF_TIME
from ..intervals import covered_length, split_into_windows, union_lengths, union_segments
from ..iteration_scan import find_iterations
from ..iteration_slices import sliced_stream
from ..iterations import (
    SYNC_SOURCES,
    WARMUP_RULE,
    SyncPoints,
    range_arrays,
    sync_points,
    warmup_option,
)
from ..lazy import pd
from ..phases import child_ranges, launching_child
from ..spill import RankedRows, folder_of
from ..straggler_cells import Verdicts, cell_frame, cell_schema, rank_rows, rank_scores, read_cells, warmup_iterations
from ..straggler_compare import flags, median_iteration, medians
from ..straggler_noise import Blocks, ComponentCauses, ComponentRows
from ..straggler_verdicts import incidental, most_frequent, pattern, recurrence, verdicts
from . import Metric, Recipe, comma_list, indented, iteration_options, ms_cell, parallel_option

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime", "mpi"}
GROUP_NEEDS = {"payload"}  # NCCL's NVTX payloads: the groups (collective_match.py); a long capture reads none
DEFAULT_THRESHOLD = 0.10
DEFAULT_SIGMA = 4.0
GPU_COMPONENTS = ("gpu_compute", "memcpy")  # GPU work launched outside every child range


def _windowed_union(win_start, win_end, starts, ends, n) -> np.ndarray:
    """Per window, the length of the union of the intervals inside it."""
    return _union_per_window(split_into_windows(starts, ends, win_start, win_end), n)


def _union_per_window(split: tuple, n: int, kept: np.ndarray | None = None) -> np.ndarray:
    """_windowed_union of intervals already cut into the windows (intervals.split_into_windows); kept: which of
    the intervals count (none: all)."""
    ev, win, cs, ce = split
    if kept is not None:
        at = kept[ev]
        win, cs, ce = win[at], cs[at], ce[at]
    out = np.zeros(n, np.int64)
    if len(win):
        groups, lengths = union_lengths(win, cs, ce)
        out[groups] = lengths
    return out


def ready_times(points: SyncPoints, launch_ns: np.ndarray, done_ns: np.ndarray) -> np.ndarray:
    """When the rank was ready in each sync point: for a host-side one, once the GPU work launched before
    it (launch_ns, done_ns: each op's launching call and its end on the GPU) had finished, within the
    interval; for a collective kernel, its start."""
    ready = points.start_ns.copy()
    host = np.flatnonzero(~points.on_gpu)
    if len(host) and len(launch_ns):
        order = np.argsort(launch_ns, kind="stable")
        done = np.maximum.accumulate(done_ns[order])
        at = np.searchsorted(launch_ns[order], points.start_ns[host], side="left") - 1
        finished = np.where(at >= 0, done[np.maximum(at, 0)], points.start_ns[host])
        ready[host] = np.clip(finished, points.start_ns[host], points.end_ns[host])
    return ready


def map_rank(rank_data, options: dict) -> dict:
    """Per-iteration busy/wait/GPU time and per-component times for one rank. No cross-rank logic."""
    if rank_data.streamed is not None:  # a long capture, measured a few iterations at a time as it was read
        return fold_rank(STREAM, rank_data, options)
    ranges = range_arrays(rank_data.frame("nvtx"))
    it = find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel"))
    piece = iteration_rows(rank_data, ranges, it, options)
    return {**map_result(it, [piece], ranges.names[:-1], piece.any_peer, piece.present),
            **collective_match.nccl_kernels(rank_data, it)}


@dataclass
class Piece:
    """What `iteration_rows` gives for some of a rank's iterations (`first` the index of the first): per iteration
    (arrival_peer / arrival_any: when the rank was ready at the last sync point where ranks meet / of any kind,
    -1 for none), per (iteration, child range name) host time and GPU time of the work it launched, per fixed
    component, and the facts about the rank that decide which of those a whole map keeps."""
    first: int
    start_ns: np.ndarray
    end_ns: np.ndarray
    wait_ns: np.ndarray
    gpu_busy_ns: np.ndarray | None  # None: the report has no CUDA trace
    arrival_peer: np.ndarray
    arrival_any: np.ndarray
    used: np.ndarray  # sync points that begin inside the iterations, per SYNC_SOURCES
    used_ns: np.ndarray  # the time inside the iterations in sync points, per SYNC_SOURCES
    child: tuple  # (iteration, name, host ns) in the order of the iteration, then of the name
    launched_in: tuple  # (iteration, name, GPU ns) in the order of the iteration, then of the name's code
    names: np.ndarray  # the words child and launched_in name codes refer to
    fixed: dict  # FIXED component -> ns per iteration
    present: set  # the FIXED components the rank has: GPU work of theirs, or child ranges at all
    any_peer: bool  # a sync point where ranks meet
    covered_keys: np.ndarray  # launch keys of the ops launched inside child ranges


FIXED = (*GPU_COMPONENTS, "host_gap")


def iteration_rows(rank_data, ranges, it, options: dict, before: int = END_OF_TIME, first: int = 0,
                   covered_keys: np.ndarray | None = None) -> Piece:
    """The per-iteration measures of the iterations `it` (the rank's, or some of them: index `first` onward),
    from the events of the rank that bear on them. GPU work whose launching call starts at `before` or later is
    left out of `present` (iterations still to come may own it); `covered_keys`: launch keys of ops launched
    inside child ranges of earlier iterations."""
    window_start, window_end = it.start_ns, it.end_ns
    n = len(window_start)
    points = sync_points(rank_data, ranges, options.get("sync"))
    ops = launched_ops(rank_data) if rank_data.has_cuda else None
    own = np.zeros(0, np.int64) if ops is None else np.flatnonzero(~ops.collective)  # not waiting for peers
    ready = ready_times(points, ops.call_start_ns[own], ops.end_ns[own]) if ops is not None else points.start_ns
    wait = _windowed_union(window_start, window_end, ready, points.end_ns, n)

    # arrival: when the rank was ready at the last sync point where ranks meet that begins inside the
    # iteration (a CUDA sync only when the report shows no collective at all: map_result chooses)
    arrival = {}
    for kind, meet in (("peer", np.flatnonzero(points.peer)), ("any", np.arange(len(ready)))):
        arrival[kind] = np.full(n, -1, np.int64)
        if len(meet):
            idx = np.searchsorted(points.start_ns[meet], window_end, side="left") - 1
            ok = idx >= 0
            ok[ok] = points.start_ns[meet][idx[ok]] >= window_start[ok]
            arrival[kind][ok] = ready[meet][idx[ok]]
    inside = np.searchsorted(window_start, points.start_ns, side="right") - 1
    inside = (inside >= 0) & (points.start_ns < window_end[np.maximum(inside, 0)]) if n else np.zeros(len(ready), bool)
    used = np.bincount(points.source[inside], minlength=len(SYNC_SOURCES))
    # the time inside the iterations in each kind of sync point (a few kinds): how the rank communicated
    used_ns = np.array([_windowed_union(window_start, window_end, points.start_ns[points.source == k],
                                        points.end_ns[points.source == k], n).sum() for k in range(len(SYNC_SOURCES))],
                       np.int64)

    child_start, child_end, child_name, child_it = child_ranges(ranges, it)

    fixed, present = {}, set()
    gpu_busy = None
    launched_in = (np.zeros(0, np.int64),) * 3  # iteration, name code, GPU ns of the work each child launched
    covered_out = np.zeros(0, np.int64)
    if rank_data.has_cuda:
        op_start, op_end = gpu_intervals(rank_data)
        op_split = split_into_windows(op_start, op_end, window_start, window_end)  # the ops of each union below
        gpu_busy = _union_per_window(op_split, n)
        op_key = np.concatenate([call_key(f) for f in gpu_frames(rank_data)]) if len(op_start) else \
            np.zeros(0, np.int64)
        covered = np.isin(op_key, covered_keys) if covered_keys is not None else np.zeros(len(op_start), bool)
        later = np.zeros(len(op_start), bool)  # launched at `before` or later
        later[ops.op[ops.call_start_ns >= before]] = True
        if len(child_start) and len(own):
            child, op = launching_child(rank_data, ranges, it.tid, ops, own, child_start, child_end)
            covered[ops.op[op]] = True
            launched_in = _union_sums(child_it[child], child_name[child], ops.start_ns[op], ops.end_ns[op],
                                      ranges.names)
        covered_out = op_key[covered]
        kernels = rank_data.frame("kernels")
        n_kernels = 0 if kernels is None else len(kernels)
        memcpy = rank_data.frame("memcpy")
        n_memcpy = 0 if memcpy is None else len(memcpy)
        position = np.arange(len(op_start))
        for component, sel in zip(GPU_COMPONENTS, [(position < n_kernels) & ~collective_ops(rank_data),
                                                   (position >= n_kernels) & (position < n_kernels + n_memcpy)],
                                  strict=True):
            sel &= ~covered
            if (sel & ~later).any():
                present.add(component)
            fixed[component] = _union_per_window(op_split, n, sel)

    child = (np.zeros(0, np.int64),) * 3  # iteration, name code, host ns of each child range name
    if len(child_start):
        present.add("host_gap")
        # the time the host sat in a sync call until its own GPU work was done is that work's, not the range's host
        # work (a pipeline syncs the device after every exchange: its slow GPU would read as host time in it)
        host = np.flatnonzero(~points.on_gpu)
        blocked = union_segments(points.start_ns[host], ready[host])
        child = _child_sums(child_it, child_name,
                            child_end - child_start - covered_length(*blocked, child_start, child_end), ranges.names)
    cov = _windowed_union(window_start, window_end, np.concatenate([child_start, points.start_ns]),
                          np.concatenate([child_end, points.end_ns]), n)
    fixed["host_gap"] = (window_end - window_start) - cov
    return Piece(first, window_start, window_end, wait, gpu_busy, arrival["peer"], arrival["any"], used, used_ns, child,
                 launched_in, ranges.names, fixed, present, bool(points.peer.any()), covered_out)


def map_result(it, pieces: list[Piece], names, any_peer: bool, present: set) -> dict:
    """The map's result from the pieces of all a rank's iterations, in order: the iteration table, and the
    component table with its names coded into the rank's NVTX names (`names`, as its whole table gives them)
    followed by the FIXED components it has. The pieces let go of their child, launched and fixed parts once those
    are put together (a long capture's: as many rows as the component table)."""
    names = list(names)
    components = [c for c in FIXED if c in present]
    words = [*names, *components]
    place = {w: i for i, w in enumerate(names)}

    # each piece's name codes as codes into `names` (None: the same already)
    recode = [None if list(p.names[:-1]) == names else np.array([place[w] for w in p.names[:-1]] or [0], np.int64)
              for p in pieces]

    def part(what: str) -> list:
        """(iteration, name code, ns) of every piece, one column at a time (a long capture: millions of rows)."""
        iteration = np.concatenate([getattr(p, what)[0] for p in pieces]).astype(np.int64, copy=False)
        iteration += np.repeat([p.first for p in pieces], [len(getattr(p, what)[0]) for p in pieces])
        name = np.concatenate([getattr(p, what)[1] if r is None else r[getattr(p, what)[1]]
                               for p, r in zip(pieces, recode, strict=True)]).astype(np.int64, copy=False)
        return [iteration, name, np.concatenate([getattr(p, what)[2] for p in pieces]).astype(np.int64, copy=False)]

    child, launched = part("child"), part("launched_in")
    for p in pieces:
        p.child = p.launched_in = None
    order = np.lexsort((launched[1], launched[0]))  # by iteration, then name code, as a whole map has them
    launched = [v[order] for v in launched]
    del order
    n = sum(len(p.start_ns) for p in pieces)
    counts = (len(child[0]), len(launched[0]))
    fixed = [np.concatenate([p.fixed.get(c, np.zeros(len(p.start_ns), np.int64)) for p in pieces]) for c in components]
    for p in pieces:
        p.fixed = {}
    on_gpu = [int(c in GPU_COMPONENTS) for c in components]

    def column(i: int, others: list) -> np.ndarray:
        """A column of the child and launched rows, then of the fixed components', letting go of its parts."""
        out = np.concatenate([child[i], launched[i], *others])
        child[i] = launched[i] = None
        return out

    iteration = arrow_of(column(0, [np.arange(n, dtype=np.int64)] * len(components)))
    name = dictionary_column(column(1, [np.full(n, len(names) + i) for i in range(len(components))]), words)
    ns = arrow_of(column(2, fixed).astype(np.int64, copy=False))
    del fixed
    comps = pa.Table.from_arrays([
        iteration, name, ns,
        arrow_of(np.concatenate([np.zeros(counts[0], np.int64), np.ones(counts[1], np.int64),
                                 *[np.full(n, g, np.int64) for g in on_gpu]])),
    ], names=list(COMPONENT_DTYPES))
    start, end = (np.concatenate([getattr(p, c) for p in pieces]) for c in ("start_ns", "end_ns"))
    wait = np.concatenate([p.wait_ns for p in pieces])
    no_gpu = pieces[0].gpu_busy_ns is None if pieces else True
    gpu_busy = np.zeros(n, np.int64) if no_gpu else np.concatenate([p.gpu_busy_ns for p in pieces])
    arrival = np.concatenate([p.arrival_peer if any_peer else p.arrival_any for p in pieces])
    used = np.sum([p.used for p in pieces], axis=0) if pieces else np.zeros(len(SYNC_SOURCES), np.int64)
    used_ns = np.sum([p.used_ns for p in pieces], axis=0) if pieces else np.zeros(len(SYNC_SOURCES), np.int64)
    iters = pa.Table.from_arrays([
        arrow_of(np.arange(n, dtype=np.int64)), arrow_of(start), arrow_of(end), arrow_of(end - start),
        arrow_of(wait), arrow_of((end - start) - wait),
        arrow_of(gpu_busy, valid=np.zeros(n, bool) if no_gpu else None),
        arrow_of(np.where(arrival >= 0, arrival, 0), valid=arrival >= 0),
    ], names=list(ITERATION_DTYPES))
    return {"iterations": iters, "components": comps, "delimiter": it.delimiter.as_dict(),
            "sync_points": np.asarray(used).tolist(), "sync_time_ns": np.asarray(used_ns).tolist()}


def _measure(*args) -> tuple[Piece, dict]:
    """`iteration_rows` of a few iterations of a long capture (iteration_slices), and the launch keys of the ops
    launched inside child ranges, to carry: the piece kept until the end lets go of them (a key for every such op,
    more than the iterations' rows of the result)."""
    piece = iteration_rows(*args[:-1], args[-1]["key"])
    carry = {"key": piece.covered_keys}
    empty = np.zeros(0, np.int64)
    if len(piece.start_ns):
        return replace(piece, covered_keys=empty), carry
    # no iteration: only what it tells of the rank is kept
    return replace(piece, child=(empty,) * 3, launched_in=(empty,) * 3, names=None, fixed={},
                   covered_keys=empty), carry


def _finish(it, pieces: list[Piece], names: list) -> dict:
    present = set().union(*(p.present for p in pieces))
    return map_result(it, [p for p in pieces if len(p.start_ns)], names, any(p.any_peer for p in pieces), present)


STREAM = sliced_stream(_measure, _finish, NEEDS, nccl=True)


def _union_sums(iteration: np.ndarray, name: np.ndarray, start: np.ndarray, end: np.ndarray, names: np.ndarray):
    """(iteration, name code, ns): the union of the intervals per iteration and range name."""
    named = name >= 0
    iteration, name, start, end = iteration[named], name[named], start[named], end[named]
    if not len(iteration):
        return (np.zeros(0, np.int64),) * 3
    width = max(len(names) - 1, 1)
    groups, lengths = union_lengths(iteration * width + name, start, end)
    return groups // width, groups % width, lengths.astype(np.int64)


ITERATION_DTYPES = {"iteration": "int64", "start_ns": "int64", "end_ns": "int64", "duration_ns": "int64",
                    "wait_ns": "int64", "busy_ns": "int64", "gpu_busy_ns": "Int64", "arrival_ns": "Int64"}
COMPONENT_DTYPES = {"iteration": "int64", "component": "str", "ns": "int64", "on_gpu": "int64"}


def _child_sums(iteration: np.ndarray, name: np.ndarray, ns: np.ndarray, names: np.ndarray):
    """(iteration, name code, ns) summed per iteration and range name, sorted by both (ranges with no name
    left out)."""
    named = name >= 0
    iteration, name, ns = iteration[named], name[named], ns[named]
    groups = SortedGroups(iteration * max(len(names) - 1, 1) + sorted_place(names[:-1])[name])
    return iteration[groups.lead], name[groups.lead], groups.sum(ns)


def reduce(per_rank: list[dict], options: dict) -> dict:
    """Cross-rank comparison. per_rank items: the map output plus rank and offset_ns (clock alignment)."""
    threshold = float(options.get("threshold", DEFAULT_THRESHOLD))
    sigma = float(options.get("sigma", DEFAULT_SIGMA))
    per_rank = sorted(per_rank, key=lambda r: r["rank"])  # the cells in the output's order: by rank, then iteration
    matched = collective_match.match(per_rank, options, only_parallel=True)
    parallel_job = parallel.is_parallel(matched.groups)
    ranks_in = np.array([r["rank"] for r in per_rank], np.int64)
    counts = np.array([len(r["iterations"]) for r in per_rank], np.int64)
    # a rank is compared with the ranks of its own pipeline stage (all ranks, in a job without one): its cohort
    stage = peers.stages(matched.groups, ranks_in) if parallel_job else np.zeros(len(ranks_in), np.int64)
    width = int(stage[counts > 0].max()) + 1 if counts.sum() else 1  # as peers.cohorts codes them
    comps = ComponentRows([(r["components"], first, s) for r, first, s in zip(
        per_rank, np.cumsum(counts) - counts, stage.tolist(), strict=True)], width)
    codes, names, on_gpu = comps.columns(set(options.get("sync") or []))
    n_iterations = int(counts.max(initial=0))
    iteration_rows = np.bincount(counts, minlength=n_iterations + 1)[::-1].cumsum()[::-1][1:]  # cells
    iteration_rows[:len(comps.iteration_rows)] += comps.iteration_rows
    blocks = Blocks(iteration_rows, comps.counts[codes])
    near = folder_of(r["iterations"] for r in per_rank)
    cells = read_cells(per_rank, stage, width, blocks.iteration_run, near)
    causes = None
    try:
        # an iteration that is warm-up on any rank (start-up, not straggling) is not compared, nor sets the noise scale
        is_warmup = warmup_iterations(cells, median_iteration(cells, len(blocks.iterations)))
        found = medians(cells, blocks.iterations, ~is_warmup if not options.get("keep_warmup") else
                        np.ones(n_iterations, bool))
        busy_scale = max(found.busy_scale, max(1000.0, 0.005 * found.typical_ns))
        # an iteration of one rank is every component's median itself: no excess, no cause and never flagged, so
        # where no iteration has two ranks (one long capture) the cell x component work is skipped
        if len(codes) and (found.peers >= 2).any():
            causes = ComponentCauses(comps, codes, blocks, found.peers, cells.n, near)
        else:
            names, on_gpu = np.zeros(0, object), np.zeros(0, bool)
        micro = iters = None
        if parallel_job:
            iters = cell_frame(cells)
            micro = _uneven_microbatches(matched, iters, found.compared[iters["iteration"].to_numpy()], threshold)
        flagged = flags(cells, blocks.iterations, found, busy_scale, causes, len(names), threshold, sigma,
                        micro.cell_excess_ns if micro is not None and len(micro.finding) else None)
    finally:
        cells.close()
        if causes is not None:
            causes.close()
    verdicts = Verdicts(width, found.median_busy_ns, is_warmup, busy_scale, flagged.cause,
                        pa.array(names.tolist(), pa.string()), np.r_[on_gpu, False].astype(bool), flagged.flagged,
                        flagged.recoverable_ns, stage if parallel_job else None)

    median_score, worst_score = rank_scores(cells, found.median_busy_ns)
    flagged_at = np.searchsorted(cells.first, flagged.flagged, side="right") - 1  # each flagged cell's rank's place
    has = counts > 0  # a rank without an iteration has no row
    ranks = pd.DataFrame({
        "iterations": counts[has],
        "straggler_iterations": np.bincount(flagged_at, minlength=len(has))[has].astype(np.int64),
        "median_score": median_score, "worst_score": worst_score,
    }, index=pd.Index(ranks_in[has], name="rank"))
    # iterations.parquet made a rank at a time as it is written; stragglers.parquet, the flagged cells' rows, now
    iterations = RankedRows(cell_schema(parallel_job), [(int(r), at) for at, r in enumerate(cells.ranks)],
                            lambda _, at: rank_rows(cells, verdicts, at))
    stragglers = pa.concat_tables([iterations.schema.empty_table(), *(
        rows.filter(rows.column("is_straggler")) for rows in RankedRows(
            iterations.schema, [(int(cells.ranks[at]), at) for at in np.unique(flagged_at)],
            iterations.made).tables())]).to_pandas()
    for c in ("cause", "cause_side"):  # text or None, as the output's other text columns
        stragglers[c] = stragglers[c].astype(object).where(stragglers[c].notna(), None)

    by_rank = stragglers.groupby("rank")
    ranks["top_cause"] = by_rank["cause"].agg(most_frequent)
    ranks["excess_total_ns"] = by_rank["excess_ns"].sum().reindex(ranks.index).fillna(0).astype("int64")
    ranks["top_cause"] = ranks["top_cause"].astype(object).where(ranks["top_cause"].notna(), None)
    top_cause = stragglers["rank"].map(ranks["top_cause"])
    of_top = stragglers[top_cause.notna().to_numpy() & (stragglers["cause"].to_numpy() == top_cause.to_numpy())]
    side = of_top.groupby("rank")["cause_side"].agg(most_frequent)
    ranks["top_cause_side"] = side.reindex(ranks.index).astype(object).where(lambda s: s.notna(), None)
    ranks = ranks.reset_index().sort_values(
        ["straggler_iterations", "excess_total_ns", "median_score"], ascending=False, kind="mergesort"
    ).reset_index(drop=True)
    ranks["incidental"] = incidental(ranks, stragglers)
    run_ns = int(found.median_duration_ns[cells.per_iteration() > 0].sum())
    ranks["recoverable_ns"] = ranks["rank"].map(stragglers.groupby("rank")["recoverable_ns"].sum()).fillna(0) \
        .astype("int64")
    ranks["recoverable_pct"] = 100.0 * ranks["recoverable_ns"] / max(run_ns, 1)
    ranks = ranks.join(recurrence(ranks, stragglers), on="rank")
    used = np.sum([r.get("sync_points", [0] * len(SYNC_SOURCES)) for r in per_rank], axis=0)
    used_ns = np.sum([r.get("sync_time_ns", [0] * len(SYNC_SOURCES)) for r in per_rank], axis=0)
    settings = {"threshold": threshold, "sigma": sigma, "busy_noise_ns": busy_scale,
                "sync_points": {name: int(c) for name, c in zip(SYNC_SOURCES, used, strict=True) if c},
                "sync_time_ns": {name: int(t) for name, t in zip(SYNC_SOURCES, used_ns, strict=True) if t},
                "run_ns": run_ns, "pattern": pattern(ranks),
                "warmup": {"rule": WARMUP_RULE, "left_out": not options.get("keep_warmup"),
                           "iterations": np.flatnonzero(is_warmup).tolist()}}
    tables = {"iterations": iterations, "ranks": ranks, "stragglers": stragglers, "settings": settings}
    if parallel_job:
        tables.update(_parallel_tables(tables, matched, iters, found.compared[iters["iteration"].to_numpy()], threshold,
                                       micro))
    return tables


def _uneven_microbatches(matched, iters: pd.DataFrame, compared: np.ndarray, threshold: float):
    """microbatches.py's finding over the cells of `iters` (their times on the clocks collective_match aligned the
    NCCL kernels to)."""
    start = iters["start_aligned_ns"] - iters["rank"].map(matched.host_offsets()).fillna(0).astype("int64")
    cells = pd.DataFrame({"rank": iters["rank"], "iteration": iters["iteration"], "stage": iters["stage"],
                          "start_aligned_ns": start, "end_aligned_ns": start + iters["duration_ns"],
                          "duration_ns": iters["duration_ns"]})
    return microbatches.microbatch_imbalance(matched.kernels, cells, compared, threshold)


def _parallel_tables(tables: dict, matched, iters: pd.DataFrame, compared: np.ndarray, threshold: float,
                     micro) -> dict:
    """What a job with tensor or pipeline parallel groups adds: each straggler's cost by who waited for it, each
    rank's stage, a stage slower throughout and uneven micro-batches as findings of their own, the micro-batches'
    spread per stage, and the groups."""
    stragglers, ranks = tables["stragglers"], tables["ranks"]
    stragglers = pd.concat([stragglers, peers.waited_for(matched.collectives, stragglers["rank"].to_numpy(),
                                                         stragglers["iteration"].to_numpy())], axis=1)
    waited = stragglers.groupby("rank")[peers.WAITED_COLUMNS].sum()
    ranks = ranks.join(waited, on="rank")
    ranks[peers.WAITED_COLUMNS] = ranks[peers.WAITED_COLUMNS].fillna(0).astype("int64")
    ranks.insert(1, "stage", peers.stages(matched.groups, ranks["rank"].to_numpy()))
    findings = peers.stage_imbalance(iters, compared, matched.groups, threshold)
    if len(micro.finding):
        findings = pd.concat([findings, micro.finding], ignore_index=True).astype(peers.FINDING_DTYPES)
    settings = {**tables["settings"], "groups_source": matched.source,
                "notes": matched.notes + peers.peerless_note(matched.groups),
                "findings": [peers.sentence(f) for f in findings.itertuples()]}
    out = {"stragglers": stragglers, "ranks": ranks, "findings": findings, "groups": matched.groups,
           "settings": settings}
    if len(micro.spread):  # a pipeline whose micro-batches could be compared
        out["microbatches"] = micro.spread
        out["microbatch_steps"] = micro.steps
    return out


def add_options(add, framework: bool = False) -> None:
    iteration_options(add)
    add("--sync", metavar="NAME[,NAME]", type=comma_list, default=None,
        help="extra NVTX range names that are sync points (collective names are matched anyway)")
    add("--threshold", type=float, default=DEFAULT_THRESHOLD,
        help="minimum excess busy time over the iteration's median peer (its pipeline stage's ranks, else every rank), "
             "as a fraction of the iteration (default 0.1)")
    add("--sigma", type=float, default=DEFAULT_SIGMA,
        help="minimum excess in units of the run-wide robust noise scale (default 4)")
    warmup_option(add)
    parallel_option(add)


def summary(out, top: int = 5) -> list[str]:
    ranks = pd.read_parquet(out / "ranks.parquet")
    analysis = json.loads((out / "analysis.json").read_text())
    d = analysis.get("delimiter") or {}
    lines = [f"iterations delimited by {d.get('kind')} {d.get('name')!r} ({d.get('source')}); "
             f"{analysis.get('ranks')} ranks" + (", each compared with its pipeline stage's ranks"
                                                 if "stage" in ranks else "")]
    lines.extend(analysis.get("findings", []))
    holds_back = ~ranks["incidental"] if "incidental" in ranks else True  # outputs of earlier versions lack it
    flagged = ranks[(ranks["straggler_iterations"] > 0) & holds_back].head(top)
    if flagged.empty:
        lines.append("no rank holds the others back" if (ranks["straggler_iterations"] > 0).any()
                     else "no straggler found")
        lines.extend(verdicts(ranks, pd.read_parquet(out / "stragglers.parquet"), top))
        return lines
    table = pd.DataFrame({
        "rank": flagged["rank"],
        "straggler iterations": flagged["straggler_iterations"].astype(str) + "/" + flagged["iterations"].astype(str),
        "excess ms": flagged["excess_total_ns"].map(ms_cell),
        "worst score": flagged["worst_score"].map(lambda v: f"{v:.2f}"),
        "top cause": flagged["top_cause"].fillna(""),
    })
    lines.extend(indented("top stragglers:", table.to_string(index=False)))
    lines.extend(verdicts(ranks, pd.read_parquet(out / "stragglers.parquet"), top))
    if analysis.get("pattern"):
        lines.append(f"pattern: {analysis['pattern']}")
    return lines


def headline(out) -> str:
    ranks = pd.read_parquet(out / "ranks.parquet")
    said = verdicts(ranks, pd.read_parquet(out / "stragglers.parquet"), top=1)
    said += json.loads((out / "analysis.json").read_text()).get("findings", [])
    return said[0] if said else f"no straggler in {len(ranks)} ranks"


def diff_metrics(ranks) -> pd.DataFrame | None:
    """The time the whole job would have saved had every straggling rank matched the median rank (a run whose
    iterations cannot be found, or where ranks hold no NVTX or CUDA data, has none; nor has one rank)."""
    from ..runner import analysed

    tables = analysed("straggler_heatmap", ranks) if len(ranks) >= 2 else None  # one rank: none to wait for
    if tables is None:
        return None
    return pd.DataFrame({"metric": "recoverable_ns", "key": "all ranks",
                         "value": [float(tables["ranks"]["recoverable_ns"].sum())]})


RECIPE = Recipe(
    name="straggler_heatmap",
    display_name="Straggler heatmap",
    description="Which rank holds the others back, in which iterations, and why (rank x iteration heatmap).",
    needs=frozenset(NEEDS | GROUP_NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    per_iteration=True,
    lazy_tables=True,
    stream=STREAM,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.straggler_heatmap",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("recoverable_ns", "recoverable time", always_tracked=True, new_is_bad=True),),
)
