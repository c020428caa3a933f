"""An iteration's phases: the NVTX ranges directly inside it on its thread (forward, backward, optimizer...),
and which phase launched each GPU op."""

from __future__ import annotations

import numpy as np

from .intervals import outermost
from .iterations import Iterations, Ranges
from .nvtx import innermost_of


def child_ranges(ranges: Ranges, it: Iterations) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, name code, iteration) of the outermost ranges inside each iteration on the delimiter's
    thread, sorted by start (none when iterations are not NVTX ranges)."""
    empty = np.zeros(0, np.int64)
    if it.delimiter.kind != "nvtx" or not len(it.start_ns):
        return empty, empty, empty, empty
    window_start, window_end = it.start_ns, it.end_ns
    on = np.flatnonzero(ranges.tid == it.tid)
    start, end, name = ranges.start_ns[on], ranges.end_ns[on], ranges.name[on]
    idx = np.searchsorted(window_start, start, side="right") - 1
    at = np.maximum(idx, 0)
    within = (idx >= 0) & (end <= window_end[at])
    # starts as an iteration does: the last to start by then; names: the few words
    is_delim = (window_start[at] == start) & (ranges.names == it.delimiter.name)[name]
    kid = np.flatnonzero(within & ~is_delim)
    if not len(kid):
        return empty, empty, empty, empty
    kid_start, kid_end = start[kid], end[kid]
    if (kid_start[1:] > kid_start[:-1]).all() and (window_start[1:] >= window_end[:-1]).all():
        # in order of start, no two at once, iterations apart (as usual): an iteration's ranges end before the next
        # one's start, so one running maximum of the ends over all of them finds the outermost in each
        reach = np.maximum.accumulate(kid_end)
        top = kid[np.r_[True, kid_start[1:] >= reach[:-1]]]
    else:
        top = kid[outermost(idx[kid], kid_start, kid_end)]
        top = top[np.argsort(start[top], kind="stable")]
    return start[top], end[top], name[top], idx[top]


def launching_child(rank_data, ranges: Ranges, tid: int, ops, own: np.ndarray, child_start: np.ndarray,
                    child_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(child, op) pairs: the child range (sorted by start, not overlapping) whose time holds the call that
    launched each op of `own` (positions in `ops`, a gpu.Launched), for ops launched by the delimiter's thread,
    or by another thread of its process that had no NVTX range of its own open then (PyTorch's autograd
    thread)."""
    launch_tid, launch_pid = ops.tid[own], ops.pid[own]
    delimiter_pid = launch_pid[launch_tid == tid]
    pid = int(delimiter_pid[0]) if len(delimiter_pid) else (rank_data.pid if rank_data.pid is not None else -1)
    other = np.flatnonzero((launch_tid != tid) & (launch_pid == pid))
    bare = np.zeros(len(own), bool)
    bare[other] = innermost_of(ranges.tid, ranges.start_ns, ranges.end_ns, launch_tid[other],
                               ops.call_start_ns[own][other], ops.call_end_ns[own][other]) < 0
    take = own[(launch_tid == tid) | bare]
    at = np.searchsorted(child_start, ops.call_start_ns[take], side="right") - 1
    ok = at >= 0
    ok[ok] = ops.call_start_ns[take][ok] < child_end[at[ok]]
    return at[ok], take[ok]
