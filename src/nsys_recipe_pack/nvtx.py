"""NVTX nesting without loops: stack levels of ranges, and the innermost range around given instants.

On one thread push/pop ranges nest properly, so the depth at an instant is (ranges started) minus
(ranges ended), and the range enclosing an instant at depth d is the latest range of level d that
started before it: counts and an as-of join.
"""

from __future__ import annotations

import re

import numpy as np

from .groups import SortedGroups, factorize, stable_order


def nesting(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each range's (thread, start, end) level on its thread, 0 = outermost, and its parent's position (the latest
    range one level up on its thread before it, -1: none), ranges in any order, nested or not.

    Taken per thread in range order (start_order): a range's level is the ranges started before it less those ended
    by then (at equal times an end comes before a start, that of a range of no length after the starts), so each end
    placed among the sorted starts makes the levels a running count, without sorting the ends. A level rises by at
    most one from a range to the next, so a range whose predecessor on its thread is one level up has it for parent,
    and any other one its previous sibling's: a forward fill over the ranges in order of thread and level."""
    tid, start, end = (np.asarray(a, np.int64) for a in (tid, start, end))
    n = len(tid)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = None if in_start_order(start, end) else start_order(start, end)
    if order is not None:
        tid, start, end = tid[order], start[order], end[order]
    threads, thread = factorize(tid)
    level, before = np.empty(n, np.int64), np.empty(n, np.int64)  # before: the range before on the thread, or -1
    for rows in _rows_by_thread(thread, len(threads)):
        s, e = (start, end) if rows is None else (start[rows], end[rows])
        # before which start each range has ended: the next one's, unless that starts inside it (as a child does)
        closes = np.arange(1, len(s) + 1)
        zero = e == s
        inside = np.flatnonzero((s[1:] < e[:-1]) | (zero[:-1] & (s[1:] == e[:-1])))
        closes[inside] = np.searchsorted(s, e[inside], side="left")
        inside = inside[zero[inside]]  # a range of no length ends after the starts at its instant
        closes[inside] = np.searchsorted(s, e[inside], side="right")
        ended = np.cumsum(np.bincount(closes, minlength=len(s) + 1)[:len(s)])
        if rows is None:
            level[:] = np.arange(n) - ended
            before[0], before[1:] = -1, np.arange(n - 1)
        else:
            level[rows] = np.arange(len(rows)) - ended
            before[rows] = np.r_[-1, rows[:-1]]
    by_level = stable_order(thread * (int(level.max()) + 1) + level)
    lv, prior = level[by_level], before[by_level]
    root = lv == 0
    first_child = root | (level[np.maximum(prior, 0)] == lv - 1)  # its parent the range before it
    at = np.maximum.accumulate(np.where(first_child, np.arange(n), 0))
    parent = np.empty(n, np.int64)
    parent[by_level] = np.where(root, -1, prior)[at]
    if order is None:
        return level, parent
    out_level, out_parent = np.empty(n, np.int64), np.empty(n, np.int64)
    out_level[order] = level
    out_parent[order] = np.where(parent >= 0, order[np.maximum(parent, 0)], -1)
    return out_level, out_parent


def _rows_by_thread(thread: np.ndarray, threads: int) -> list:
    """The rows of each thread by its code, 0 to threads - 1 (-1: none; None: every row): a pass per thread where
    few, else one sort."""
    if threads == 1 and (thread == 0).all():
        return [None]
    if threads <= 8:
        return [np.flatnonzero(thread == t) for t in range(threads)]
    groups, rows = SortedGroups(thread), [np.zeros(0, np.intp)] * threads
    for g, t in enumerate(groups.keys.tolist()):
        if t >= 0:
            rows[t] = groups.rows(g)
    return rows


def innermost_of(r_tid: np.ndarray, r_start: np.ndarray, r_end: np.ndarray, tid: np.ndarray, start: np.ndarray,
                 end: np.ndarray) -> np.ndarray:
    """Position of the innermost range (thread, start, end) on the same thread enclosing each [start, end]
    query, or -1.

    Taken per thread from the ranges in order of start (at one instant, ranges that end come first, then those
    that start, longer first, then the queries): the depth before an event is the starts before it minus the
    ends by its time, a range's level is the depth before its start, and the range around a query is the last
    start of level depth - 1 before it (any later start of that level would be nested deeper). Counting ends with
    a binary search over the sorted ends, not sorting every start, end and query together, is what keeps this to
    one sort of the ends.
    """
    tid = np.asarray(tid, np.int64)
    out = np.full(len(tid), -1, np.int64)
    if not len(tid) or not len(r_tid):
        return out
    r_tid, r_start, r_end = (np.asarray(a, np.int64) for a in (r_tid, r_start, r_end))
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    threads, q_thread = factorize(tid)
    # a range of no length encloses nothing, and its end sorting before its start would upset the depth; a range on
    # a thread no query is on, nothing asked for
    if len(threads) == 1:
        out[:] = _innermost_on_thread(r_start, r_end, np.flatnonzero((r_tid == threads[0]) & (r_end > r_start)),
                                      start, end)
        return out
    at = np.minimum(np.searchsorted(threads, r_tid), len(threads) - 1)
    kept = np.flatnonzero((threads[at] == r_tid) & (r_end > r_start))
    ranges, queries = SortedGroups(at[kept]), SortedGroups(q_thread)  # every query thread is a group of queries
    for g, thread in enumerate(ranges.keys.tolist()):
        q = queries.rows(thread)
        out[q] = _innermost_on_thread(r_start, r_end, kept[ranges.rows(g)], start[q], end[q])
    return out


def _innermost_on_thread(r_start: np.ndarray, r_end: np.ndarray, own: np.ndarray, start: np.ndarray,
                         end: np.ndarray) -> np.ndarray:
    """innermost_of for queries on one thread and its ranges `own` (positions into r_start, r_end)."""
    if not len(own):
        return np.full(len(start), -1, np.int64)
    s, e = r_start[own], r_end[own]
    order = start_order(s, e)
    s_sorted, e_sorted = s[order], np.sort(e)
    n = len(own)
    level = np.arange(n) - np.searchsorted(e_sorted, s_sorted, side="right")
    started = np.searchsorted(s_sorted, start, side="right")  # the starts before each query
    wanted = started - np.searchsorted(e_sorted, start, side="right") - 1
    by_level = stable_order(level)  # level, then order of start
    at = np.searchsorted(level[by_level] * n + by_level, wanted * n + started - 1, side="right") - 1
    hit = by_level[np.maximum(at, 0)]
    pos = own[order[hit]]
    found = (wanted >= 0) & (at >= 0) & (level[hit] == wanted) & (r_end[pos] >= end)
    return np.where(found, pos, -1)


def innermost_nested(r_tid: np.ndarray, r_start: np.ndarray, r_end: np.ndarray, r_parent: np.ndarray,
                     tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """innermost_of for properly nested ranges in range order (by start, the longer first) whose parents are known
    (nesting: positions into these arrays, -1 none): the ranges open at an instant are one chain, so the innermost
    is the last range on the query's thread to start by its start, or the first of its ancestors still open then. A
    search and a few steps up, where innermost_of counts every range's level again."""
    out = np.full(len(tid), -1, np.int64)
    if not len(tid) or not len(r_tid):
        return out
    threads, code = factorize(np.asarray(r_tid))
    tid, start, end = (np.asarray(a, np.int64) for a in (tid, start, end))
    at = np.minimum(np.searchsorted(threads, tid), len(threads) - 1)
    q_thread = np.where(threads[at] == tid, at, -1)  # -1: a thread without ranges
    for own, q in zip(_rows_by_thread(code, len(threads)), _rows_by_thread(q_thread, len(threads)), strict=True):
        last = np.searchsorted(r_start if own is None else r_start[own], start if q is None else start[q],
                               side="right") - 1
        if own is not None:  # positions among the thread's ranges, as positions among all
            last = np.where(last >= 0, own[np.maximum(last, 0)], -1)
        out[slice(None) if q is None else q] = last
    walking = np.flatnonzero(out >= 0)
    while len(walking):  # up from a range closed by the query's start (one of no length is never open)
        walking = walking[r_end[out[walking]] <= start[walking]]
        out[walking] = r_parent[out[walking]]
        walking = walking[out[walking] >= 0]
    return np.where((out >= 0) & (r_end[np.maximum(out, 0)] >= end), out, -1)


def start_order(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Ranges by start, the longer first at one start, else in input order; without a sort when they come so (as
    an export's rows do)."""
    if in_start_order(start, end):
        return np.arange(len(start))
    return np.lexsort((start - end, start))


def in_start_order(start: np.ndarray, end: np.ndarray) -> bool:
    """Whether ranges come by start, the longer first at one start (start_order would keep them as they are)."""
    step = np.diff(start)
    return bool((step >= 0).all() and ((step > 0) | (end[:-1] >= end[1:])).all())


OP_INSTANCE_RE = re.compile(r",\s*(?:seq|op_id|sizes|input_op_ids)\s*=.*$", re.DOTALL)


def op_name(names):
    """A range name without what numbers one instance of an op (`aten::mm, seq = 65, op_id = 7` -> `aten::mm`):
    PyTorch's emit_nvtx names every op instance, and thousands of instances compare better as one op."""
    return names.astype(str).str.replace(OP_INSTANCE_RE, "", regex=True)
