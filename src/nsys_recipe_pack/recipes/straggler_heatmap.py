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

from ..gpu import call_key, collective_ops, gpu_frames, gpu_intervals, launched_ops
from ..groups import SortedGroups, runs_of_about
from ..inputs import Frame, arrow_of, dictionary_column, sorted_place
from ..inputs.chunks import END_OF_TIME
from ..intervals import split_into_windows, union_lengths
from ..iteration_scan import find_iterations
from ..iteration_slices import sliced_stream
from ..iterations import (
    DEFAULT_SYNC_RE,
    SYNC_SOURCES,
    WARMUP_RULE,
    SyncPoints,
    range_arrays,
    sync_points,
    warmup,
    warmup_option,
)
from ..lazy import pd
from ..phases import child_ranges, launching_child
from . import Metric, Recipe, comma_list, indented, iteration_options, ms_cell

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime", "mpi"}
DEFAULT_THRESHOLD = 0.10
DEFAULT_SIGMA = 4.0
MAD_TO_SIGMA = 1.4826
Q90_TO_SIGMA = 1.645  # the 90th percentile of |N(0, 1)|
EXPLAINS = 0.5  # a component must account for this share of the excess to flag on its own noise
COMPONENT_BUSY_SIGMA = 0.75  # ... and then the busy excess needs only this fraction of sigma
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
    ranges = range_arrays(rank_data.frame("nvtx"))
    it = find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel"))
    piece = iteration_rows(rank_data, ranges, it, options)
    return map_result(it, [piece], ranges.names[:-1], piece.any_peer, piece.present)


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
        child = _child_sums(child_it, child_name, child_end - child_start, ranges.names)
    cov = _windowed_union(window_start, window_end, np.concatenate([child_start, points.start_ns]),
                          np.concatenate([child_end, points.end_ns]), n)
    fixed["host_gap"] = (window_end - window_start) - cov
    return Piece(first, window_start, window_end, wait, gpu_busy, arrival["peer"], arrival["any"], used, child,
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
    iters = pa.Table.from_arrays([
        arrow_of(np.arange(n, dtype=np.int64)), arrow_of(start), arrow_of(end), arrow_of(end - start),
        arrow_of(wait), arrow_of((end - start) - wait),
        arrow_of(gpu_busy, valid=np.zeros(n, bool) if no_gpu else None),
        arrow_of(np.where(arrival >= 0, arrival, 0), valid=arrival >= 0),
    ], names=list(ITERATION_DTYPES))
    return {"iterations": iters, "components": comps, "delimiter": it.delimiter.as_dict(),
            "sync_points": np.asarray(used).tolist()}


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


STREAM = sliced_stream(_measure, _finish, NEEDS)


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


def _robust_scale(x: pd.Series) -> float:
    x = x.dropna()
    if x.empty:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def _component_causes(cell_iteration: np.ndarray, comp_cell: np.ndarray, comps: Frame, sync_names: set,
                      cell_excess: np.ndarray, typical: float, sigma: float) -> tuple[np.ndarray, ...]:
    """For each cell (rank, iteration): whether one component accounts for its excess and stands out of
    that component's own noise, the component furthest above its cross-rank median (None if none is), and
    whether that is host time or GPU time ("host", "gpu").

    Over a cell x component table, 0 where a cell lacks a component, of which only the components each cell
    has are held: with torch's emit_nvtx every op's range name carries its sequence number, so a report can
    have tens of thousands of child range names and the whole table would not fit in memory.
    """
    codes, words = comps.codes("component")
    codes = codes * 2 + comps.values("on_gpu")  # a range's host time and the GPU time of its work apart
    words, gpu_side = np.repeat(words, 2), np.tile([False, True], len(words))
    present = np.unique(codes)
    present = present[np.argsort(words[present], kind="stable")]  # columns in name order, as a pivot table's
    kept = np.array([not (DEFAULT_SYNC_RE.search(str(w)) or w in sync_names) for w in words[present]], bool)
    names = np.asarray(words[present][kept], dtype=object)
    on_gpu = gpu_side[present][kept]
    column = np.full(len(words), -1)
    column[present[kept]] = np.arange(len(names))
    take = column[codes] >= 0
    n_cells = len(cell_iteration)
    cell, col, excess, scale = _component_excess(cell_iteration, comp_cell[take] * len(names) + column[codes][take],
                                                 comps.values("ns")[take].astype(np.float64), len(names))
    scale = np.maximum(scale, max(1000.0, 0.001 * typical))
    explains = (excess >= EXPLAINS * cell_excess[cell]) & (excess / scale[col] > sigma)
    noise_ok = np.zeros(n_cells, bool)
    noise_ok[cell[explains]] = True
    # the cause: the largest excess above 0, the first component in name order among equals
    above = excess > 0
    top = np.full(n_cells, -np.inf)
    np.maximum.at(top, cell[above], excess[above])
    at_top = above & (excess == top[cell])
    first_col = np.full(n_cells, len(names))
    np.minimum.at(first_col, cell[at_top], col[at_top])
    cause = np.full(n_cells, None, dtype=object)
    cause_side = np.full(n_cells, None, dtype=object)
    has = first_col < len(names)
    cause[has] = names[first_col[has]]
    cause_side[has] = np.where(on_gpu[first_col[has]], "gpu", "host")
    return noise_ok, cause, cause_side


EXCESS_CHUNK_ROWS = 1_000_000  # component cells `_component_excess` works on at once (~170 B each at its peak)


def _component_excess(cell_iteration: np.ndarray, cell_col: np.ndarray, ns: np.ndarray, n_names: int):
    """`_excess_by_component` over runs of components of about EXCESS_CHUNK_ROWS cells at a time: a component's
    excess and scale depend on its own cells only, so that a long capture or many ranks (tens of millions of
    cells) need not hold every column of the work at once. Rows come by component run."""
    col = cell_col % max(n_names, 1)
    per_col = np.bincount(col, minlength=n_names)
    runs = runs_of_about(per_col, EXCESS_CHUNK_ROWS)
    if len(cell_col) <= EXCESS_CHUNK_ROWS or len(runs) < 2:
        return _excess_by_component(cell_iteration, cell_col, ns, n_names)
    by_col = np.argsort(col, kind="stable")
    ends = np.cumsum(per_col)
    cell, out_col, excess = np.empty(len(col), np.int64), np.empty(len(col), np.int64), np.empty(len(col))
    scale, at = np.zeros(n_names), 0  # the runs' rows, one after another (fewer where a cell's repeats are summed)
    for low, high in runs:
        rows = by_col[ends[low] - per_col[low]:ends[high - 1]]
        width = high - low
        part = _excess_by_component(cell_iteration, cell_col[rows] // n_names * width + col[rows] - low, ns[rows],
                                    width)
        size = len(part[0])
        cell[at:at + size], out_col[at:at + size], excess[at:at + size], scale[low:high] = part
        out_col[at:at + size] += low
        at += size
    return cell[:at], out_col[:at], excess[:at], scale


def _excess_by_component(cell_iteration: np.ndarray, cell_col: np.ndarray, ns: np.ndarray, n_names: int):
    """The cell x component table's excess over each iteration's median and each component's noise scale
    (the larger of the MAD scale and the 90th percentile of the absolute deviation read as a normal
    quantile, over every cell: on a contended CPU a forward pass's time is heavy-tailed, and the MAD alone
    would call its ordinary slow iterations outliers), from the cells' own components only: (cell, component,
    excess) of each component a cell has, and the scale of each component. Component times are never negative,
    so a component a cell lacks is at or below the median there: it can neither explain a cell's excess nor be
    its cause."""
    n_cells = len(cell_iteration)
    sorted_cell_col = np.sort(cell_col)
    if (sorted_cell_col[1:] == sorted_cell_col[:-1]).any():  # a child range named like a fixed component
        cell_col, at = np.unique(cell_col, return_inverse=True)
        ns = np.bincount(at.reshape(-1), weights=ns)
    cell, col = np.divmod(cell_col, max(n_names, 1))
    del sorted_cell_col, cell_col  # millions of rows each: no more columns of their length at once than needed
    # each (iteration, component)'s median over the iteration's cells, the cells without it counting 0
    per_iteration = np.bincount(cell_iteration)
    group_key = cell_iteration[cell] * n_names + col
    order = _by_group(group_key, ns, 1)
    sorted_ns = ns[order]
    first = np.flatnonzero(np.r_[True, group_key[order][1:] != group_key[order][:-1]]) if len(order) else \
        np.zeros(0, np.int64)
    size = np.diff(np.r_[first, len(order)])
    cells_in = per_iteration[cell_iteration[cell[order[first]]]]
    lacking = cells_in - size

    # the middle two of each group, its missing cells as zeros before its values
    median = np.median(np.stack([np.where(n < lacking, 0.0, sorted_ns[first + np.maximum(n - lacking, 0)])
                                 for n in ((cells_in - 1) // 2, cells_in // 2)]), axis=0)
    excess = np.empty(len(ns))
    excess[order] = sorted_ns - np.repeat(median, size)
    group_col = col[order[first]]
    del order, sorted_ns, group_key, first, size
    # each component's excess over all cells: the cells that have it, those of the same iterations that
    # lack it (0 minus the median), and those of iterations where no cell has it (0)
    covered = np.bincount(group_col, weights=cells_in, minlength=n_names).astype(np.int64)
    x_col = np.concatenate([col, group_col, np.arange(n_names)])
    x = np.concatenate([excess, 0.0 - median, np.zeros(n_names)])
    weight = np.concatenate([np.ones(len(excess), np.int64), lacking, n_cells - covered])
    middle = [(n_cells - 1) // 2, n_cells // 2]
    deviation = x
    deviation -= np.median(_order_stats(x_col, x, weight, n_cells, middle, 2), axis=0)[x_col]
    np.abs(deviation, out=deviation)
    del x
    q90 = (n_cells - 1) * 0.90  # where np.quantile finds it: between two values
    around = [int(np.floor(q90)), min(int(np.floor(q90)) + 1, n_cells - 1)]
    dev = _order_stats(x_col, deviation, weight, n_cells, middle + around, 4)
    # np.median and np.quantile on the values they would pick from the whole column: the same to the last bit
    scale = np.maximum(MAD_TO_SIGMA * np.median(dev[:2], axis=0),
                       np.quantile(dev[2:], q90 - np.floor(q90), axis=0) / Q90_TO_SIGMA)
    return cell, col, excess, scale


def _order_stats(col: np.ndarray, x: np.ndarray, weight: np.ndarray, n: int, positions: list[int],
                 step: int) -> np.ndarray:
    """The values at these positions of each column's sorted values, each value repeated `weight` times
    (every column's weights add up to n)."""
    order = _by_group(col, x, step)
    ends = np.cumsum(weight[order])
    columns = np.arange(int(col.max()) + 1 if len(col) else 0) * n
    return np.stack([x[order[np.searchsorted(ends, columns + p, side="right")]] for p in positions])


def _by_group(group: np.ndarray, x: np.ndarray, step: int) -> np.ndarray:
    """The order that sorts by group, then by x within a group (ties in any order). Times in ns, and their
    medians and deviations, are whole multiples of 1/step: then one sort of one packed integer key does it,
    several times faster than np.lexsort on millions of rows."""
    if len(x):
        scaled = x * step
        low = float(scaled.min())
        span = int(scaled.max() - low) + 1
        if span < 1 << 52 and (int(group.max()) + 1) * span < 1 << 62 and (scaled == np.floor(scaled)).all():
            scaled -= low
            key = scaled.astype(np.int64)
            del scaled
            key += group * span
            return np.argsort(key)
    return np.lexsort((x, group))


def reduce(per_rank: list[dict], options: dict) -> dict:
    """Cross-rank comparison. per_rank items: the map output plus rank and offset_ns (clock alignment)."""
    threshold = float(options.get("threshold", DEFAULT_THRESHOLD))
    sigma = float(options.get("sigma", DEFAULT_SIGMA))
    sync_names = set(options.get("sync") or [])
    iters = Frame(pa.concat_tables([r["iterations"] for r in per_rank]), ITERATION_DTYPES).to_pandas()
    counts = np.array([r["iterations"].num_rows for r in per_rank], np.int64)
    iters["rank"] = np.repeat(np.array([r["rank"] for r in per_rank], np.int64), counts)
    iters["offset"] = np.repeat(np.array([r["offset_ns"] for r in per_rank], np.int64), counts)
    comps = Frame(pa.concat_tables([r["components"] for r in per_rank]), COMPONENT_DTYPES)
    # each component row's (rank, iteration) row in iters: its rank's first row plus its iteration
    comp_cell = np.repeat(np.cumsum(counts) - counts, [r["components"].num_rows for r in per_rank]) + \
        comps.values("iteration")

    iters["start_aligned_ns"] = iters["start_ns"] + iters["offset"]
    arrival_aligned = iters["arrival_ns"] + iters["offset"]
    iters["arrival_skew_ns"] = (arrival_aligned - arrival_aligned.groupby(iters["iteration"]).transform("min"))
    iters["arrival_skew_ns"] = iters["arrival_skew_ns"].astype("Int64")

    med_busy = iters.groupby("iteration")["busy_ns"].transform("median")
    iters["excess_ns"] = (iters["busy_ns"] - med_busy).round().astype("int64")
    iters["score"] = np.where(med_busy > 0, iters["busy_ns"] / med_busy.where(med_busy > 0, 1), 1.0)
    # an iteration that is warm-up on any rank (start-up, not straggling) is not compared, nor sets the noise scale
    warm = warmup(iters["rank"].to_numpy(), iters["iteration"].to_numpy(), iters["duration_ns"].to_numpy())
    iters["is_warmup"] = np.isin(iters["iteration"].to_numpy(), np.unique(iters["iteration"].to_numpy()[warm]))
    compared = ~iters["is_warmup"] if not options.get("keep_warmup") else pd.Series(True, index=iters.index)
    typical = float(np.median(med_busy)) if len(med_busy) else 0.0
    floor = max(1000.0, 0.005 * typical)
    busy_scale = max(_robust_scale(iters["excess_ns"][compared]), floor)
    z_busy = iters["excess_ns"] / busy_scale

    key = ["rank", "iteration"]
    n_ranks = iters.groupby("iteration")["rank"].transform("nunique")
    # an iteration of one rank is every component's median itself: no excess, no cause and never flagged (below),
    # so where no iteration has two ranks (one long capture) the cell x component work is skipped
    if len(comps) and (n_ranks >= 2).any():
        noise_ok, cause, cause_side = _component_causes(iters["iteration"].to_numpy(), comp_cell, comps,
                                                        sync_names, iters["excess_ns"].to_numpy(dtype=float),
                                                        typical, sigma)
    else:
        noise_ok = np.zeros(len(iters), bool)
        cause = cause_side = np.full(len(iters), None, dtype=object)
    iters["cause"] = pd.Series(cause, index=iters.index, dtype=object)
    iters["cause_side"] = pd.Series(cause_side, index=iters.index, dtype=object)
    iters["noise_z"] = z_busy.astype("float64")
    med_duration = iters.groupby("iteration")["duration_ns"].transform("median")
    iters["is_straggler"] = (iters["excess_ns"] > threshold * med_duration) & (
        (z_busy > sigma) | (noise_ok & (z_busy > COMPONENT_BUSY_SIGMA * sigma)))
    iters.loc[(n_ranks < 2) | ~compared, "is_straggler"] = False

    cols = ["rank", "iteration", "start_ns", "start_aligned_ns", "duration_ns", "wait_ns", "busy_ns",
            "gpu_busy_ns", "arrival_skew_ns", "score", "is_straggler", "cause", "cause_side", "excess_ns", "noise_z",
            "is_warmup"]
    iterations = iters[cols].sort_values(key, kind="mergesort").reset_index(drop=True)
    for c in ["rank", "iteration", "start_ns", "start_aligned_ns", "duration_ns", "wait_ns", "busy_ns",
              "excess_ns"]:
        iterations[c] = iterations[c].astype("int64")
    iterations["gpu_busy_ns"] = iterations["gpu_busy_ns"].astype("Int64")
    iterations["is_straggler"] = iterations["is_straggler"].astype(bool)

    iterations["recoverable_ns"] = _recoverable(iterations, med_busy.reindex(iters.index), iters).astype("int64")
    stragglers = iterations[iterations["is_straggler"]].reset_index(drop=True)
    g = iterations.groupby("rank")
    ranks = pd.DataFrame({
        "iterations": g.size(),
        "straggler_iterations": g["is_straggler"].sum().astype("int64"),
        "median_score": g["score"].median(),
        "worst_score": g["score"].max(),
    })
    flagged = stragglers.groupby("rank")
    ranks["top_cause"] = flagged["cause"].agg(most_frequent)
    ranks["excess_total_ns"] = flagged["excess_ns"].sum().reindex(ranks.index).fillna(0).astype("int64")
    ranks["top_cause"] = ranks["top_cause"].astype(object).where(ranks["top_cause"].notna(), None)
    top_cause = stragglers["rank"].map(ranks["top_cause"])
    of_top = stragglers[top_cause.notna().to_numpy() & (stragglers["cause"].to_numpy() == top_cause.to_numpy())]
    side = of_top.groupby("rank")["cause_side"].agg(most_frequent)
    ranks["top_cause_side"] = side.reindex(ranks.index).astype(object).where(lambda s: s.notna(), None)
    ranks = ranks.reset_index().sort_values(
        ["straggler_iterations", "excess_total_ns", "median_score"], ascending=False, kind="mergesort"
    ).reset_index(drop=True)
    ranks["incidental"] = incidental(ranks, stragglers)
    run_ns = int(iterations.groupby("iteration")["duration_ns"].median().sum())
    ranks["recoverable_ns"] = ranks["rank"].map(stragglers.groupby("rank")["recoverable_ns"].sum()).fillna(0) \
        .astype("int64")
    ranks["recoverable_pct"] = 100.0 * ranks["recoverable_ns"] / max(run_ns, 1)
    ranks = ranks.join(recurrence(ranks, stragglers), on="rank")
    used = np.sum([r.get("sync_points", [0] * len(SYNC_SOURCES)) for r in per_rank], axis=0)
    settings = {"threshold": threshold, "sigma": sigma, "busy_noise_ns": busy_scale,
                "sync_points": {name: int(c) for name, c in zip(SYNC_SOURCES, used, strict=True) if c},
                "run_ns": run_ns, "pattern": pattern(ranks),
                "warmup": {"rule": WARMUP_RULE, "left_out": not options.get("keep_warmup"),
                           "iterations": sorted(int(i) for i in iterations.loc[iterations["is_warmup"], "iteration"]
                                                .unique())}}
    return {"iterations": iterations, "ranks": ranks, "stragglers": stragglers, "settings": settings}


def most_frequent(values: pd.Series):
    """The most frequent value that is not missing, None when every one is (a flagged cell that no component
    explains has no cause)."""
    counts = values.value_counts()
    return counts.index[0] if len(counts) else None


FIXED_CAUSES = {"gpu_compute": "GPU compute (kernels not launched inside an NVTX phase)",
                "memcpy": "copies (not launched inside an NVTX phase)",
                "host_gap": "host time outside every NVTX phase"}


def spans(values) -> str:
    """Sorted whole numbers as runs: 3, 5–7, 15–24."""
    v = np.unique(np.asarray(values, np.int64))
    if not len(v):
        return ""
    cut = np.flatnonzero(np.diff(v) != 1) + 1
    runs = [(int(r[0]), int(r[-1])) for r in np.split(v, cut)]
    text = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:8]]
    return ", ".join(text) + (", …" if len(runs) > 8 else "")


INCIDENTAL_CELLS = 3  # fewer flagged iterations than this, or as few as this apart from one another: incidental


def _of_the_others(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each row, the largest value among the other rows of its group (-inf when it is alone)."""
    n = len(values)
    order = np.lexsort((-values, group))  # by group, then largest first
    g, v = group[order], values[order]
    first = np.r_[True, g[1:] != g[:-1]] if n else np.zeros(0, bool)
    head = np.flatnonzero(first)
    nxt = np.minimum(head + 1, max(n - 1, 0))
    second = np.where((head + 1 < n) & (g[nxt] == g[head]), v[nxt], -np.inf)
    at = np.cumsum(first) - 1
    out = np.empty(n)
    out[order] = np.where(first, second[at], v[head][at])
    return out


def _recoverable(iterations: pd.DataFrame, med_busy: pd.Series, iters: pd.DataFrame) -> np.ndarray:
    """For each flagged cell, the time the whole iteration would have been shorter had the rank's busy time been
    the median rank's: its busy time above the busiest of the others (or the median, if higher), and no more
    than the others waited beyond its own wait (the least-waiting other rank). 0 for cells not flagged."""
    merged = iterations[["rank", "iteration", "busy_ns", "wait_ns", "is_straggler"]].merge(
        iters[["rank", "iteration"]].assign(med_busy=med_busy.to_numpy()), on=["rank", "iteration"], how="left")
    group = merged["iteration"].to_numpy()
    busy, wait = merged["busy_ns"].to_numpy(float), merged["wait_ns"].to_numpy(float)
    above = busy - np.maximum(merged["med_busy"].to_numpy(float), _of_the_others(group, busy))
    waited_more = -_of_the_others(group, -wait) - wait  # the least-waiting other rank's wait, beyond this rank's
    saving = np.clip(np.minimum(above, np.where(np.isfinite(waited_more), waited_more, 0.0)), 0.0, None)
    return np.round(np.where(merged["is_straggler"].to_numpy(), saving, 0.0))


PERSISTENT_RUN = 3  # consecutive flagged iterations that make a rank's straggling persistent


def recurrence(ranks: pd.DataFrame, stragglers: pd.DataFrame) -> pd.DataFrame:
    """Per rank: episodes (runs of consecutive flagged iterations), the longest, its share of all flagged cells,
    and whether its straggling is persistent (a run of 3 or more, or a fifth of the iterations) or
    intermittent; by rank."""
    out = pd.DataFrame(index=pd.Index(ranks["rank"], name="rank"))
    s = stragglers.sort_values(["rank", "iteration"])
    rank, it = s["rank"].to_numpy(), s["iteration"].to_numpy()
    new_run = np.r_[True, (rank[1:] != rank[:-1]) | (it[1:] != it[:-1] + 1)] if len(s) else np.zeros(0, bool)
    out["episodes"] = pd.Series(new_run.astype(np.int64), index=rank).groupby(level=0).sum()
    out["longest_run"] = longest_runs(stragglers)
    out = out.fillna(0).astype("int64")
    cells = ranks.set_index("rank")["straggler_iterations"]
    out["flagged_share"] = cells / max(int(cells.sum()), 1)
    persistent = (out["longest_run"] >= PERSISTENT_RUN) | (cells >= 0.2 * ranks.set_index("rank")["iterations"])
    out["recurrence"] = np.where(cells == 0, None, np.where(persistent, "persistent", "intermittent"))
    return out


def pattern(ranks: pd.DataFrame) -> str:
    """Whether one rank dominates the run's straggling, the culprit moves from rank to rank, or a few share it."""
    flagged = ranks[ranks["straggler_iterations"] > 0].sort_values("flagged_share", ascending=False)
    if flagged.empty:
        return "no rank straggles"
    top = flagged.iloc[0]
    if top["flagged_share"] > 0.6:
        return f"one rank dominates: rank {top['rank']} has {top['flagged_share']:.0%} of the flagged iterations"
    if len(flagged) >= 3 and top["flagged_share"] <= 1 / 3:
        return (f"the culprit moves: {len(flagged)} ranks share the {int(flagged['straggler_iterations'].sum())} "
                f"flagged iterations, none more than {int(flagged['straggler_iterations'].max())}")
    return "a few ranks share it: " + ", ".join(f"rank {r.rank} ({r.flagged_share:.0%})"
                                                   for r in flagged.head(5).itertuples())


def longest_runs(stragglers: pd.DataFrame) -> pd.Series:
    """Per rank, the most consecutive iterations it was flagged in."""
    if stragglers.empty:
        return pd.Series(dtype="int64")
    s = stragglers.sort_values(["rank", "iteration"])
    rank, it = s["rank"].to_numpy(), s["iteration"].to_numpy()
    new_run = np.r_[True, (rank[1:] != rank[:-1]) | (it[1:] != it[:-1] + 1)]
    run_id = np.cumsum(new_run)
    lengths = np.bincount(run_id)[run_id]
    return pd.Series(lengths, index=rank).groupby(level=0).max()


def incidental(ranks: pd.DataFrame, stragglers: pd.DataFrame) -> pd.Series:
    """Which flagged ranks were flagged only now and then: one-off delays, not a rank that holds the job back
    (fewer than 3 iterations, or a few scattered single iterations)."""
    n = ranks["straggler_iterations"]
    run = ranks["rank"].map(longest_runs(stragglers)).fillna(0)
    few = (n <= np.maximum(INCIDENTAL_CELLS, 0.05 * ranks["iterations"])) & (run <= 1)
    return (n > 0) & ((n < INCIDENTAL_CELLS) | few)


def verdicts(ranks: pd.DataFrame, stragglers: pd.DataFrame, top: int = 5) -> list[str]:
    """The answer first: one sentence per rank that holds the others back (the most flagged first), where,
    how much and in what; then one for the ranks flagged only incidentally. Names are as recorded: escape
    them where they are shown."""
    lines = []
    flagged = ranks[ranks["straggler_iterations"] > 0]
    odd = incidental(flagged, stragglers)
    for r in flagged[~odd].head(top).itertuples():
        cells = stragglers[stragglers["rank"] == r.rank]
        cause, side = r.top_cause, getattr(r, "top_cause_side", None)
        if cause is None:
            what = "busy time"
        elif cause in FIXED_CAUSES:
            what = FIXED_CAUSES[cause]
        else:
            what = f"{'GPU work launched in' if side == 'gpu' else 'host time in'} {cause}"
        recurring = getattr(r, "recurrence", None)
        if recurring == "intermittent":
            recurring = f"intermittent: {r.episodes} episodes"
        cost = (f"{r.recoverable_ns / 1e6:,.0f} ms recoverable, {r.recoverable_pct:.1f} % of the run"
                if hasattr(r, "recoverable_ns") else f"{cells['excess_ns'].sum() / 1e6:,.1f} ms of excess busy time")
        lines.append(f"rank {r.rank} holds the others back in {len(cells)} of {r.iterations} iterations "
                     f"({spans(cells['iteration'])}{', ' + recurring if isinstance(recurring, str) else ''}): "
                     f"{cost}; {what}, +{np.median(cells['excess_ns']) / 1e6:,.1f} ms per iteration")
    if odd.any():
        few = flagged[odd]
        lines.append("incidental: " + ", ".join(
            f"rank {r.rank} in {r.straggler_iterations} iteration{'s' if r.straggler_iterations > 1 else ''}"
            for r in few.head(8).itertuples()) + (", …" if len(few) > 8 else "")
            + " (one-off delays, not a rank that holds the job back)")
    return lines


def add_options(add, framework: bool = False) -> None:
    iteration_options(add)
    add("--sync", metavar="NAME[,NAME]", type=comma_list, default=None,
        help="extra NVTX range names that are sync points (collective names are matched anyway)")
    add("--threshold", type=float, default=DEFAULT_THRESHOLD,
        help="minimum excess busy time over the iteration's cross-rank median, as a fraction (default 0.1)")
    add("--sigma", type=float, default=DEFAULT_SIGMA,
        help="minimum excess in units of the run-wide robust noise scale (default 4)")
    warmup_option(add)


def summary(out, top: int = 5) -> list[str]:
    ranks = pd.read_parquet(out / "ranks.parquet")
    analysis = json.loads((out / "analysis.json").read_text())
    d = analysis.get("delimiter") or {}
    lines = [f"iterations delimited by {d.get('kind')} {d.get('name')!r} ({d.get('source')}); "
             f"{analysis.get('ranks')} ranks"]
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
    return said[0] if said else f"no straggler in {len(ranks)} ranks"


def diff_metrics(ranks) -> pd.DataFrame | None:
    """The time the whole job would have saved had every straggling rank matched the median rank (a run whose
    iterations cannot be found, or where ranks hold no NVTX or CUDA data, has none; nor has one rank)."""
    from ..errors import PackError
    from ..runner import analyse

    if len(ranks) < 2:  # no rank to wait for
        return None
    try:
        tables, _ = analyse("straggler_heatmap", ranks)
    except PackError:
        return None
    return pd.DataFrame({"metric": "recoverable_ns", "key": "all ranks",
                         "value": [float(tables["ranks"]["recoverable_ns"].sum())]})


RECIPE = Recipe(
    name="straggler_heatmap",
    display_name="Straggler heatmap",
    description="Which rank holds the others back, in which iterations, and why (rank x iteration heatmap).",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    per_iteration=True,
    stream=STREAM,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.straggler_heatmap",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("recoverable_ns", "recoverable time", always_tracked=True, new_is_bad=True),),
)
