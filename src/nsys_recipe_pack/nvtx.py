"""NVTX nesting without loops: stack levels of ranges, and the innermost range around given instants.

On one thread push/pop ranges nest properly, so the depth at an instant is (ranges started) minus
(ranges ended), and the range enclosing an instant at depth d is the latest range of level d that
started before it. Both are a sort, a cumulative sum and an as-of join.
"""

from __future__ import annotations

import re

import numpy as np

from .groups import factorize


def stack_levels_of(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Level of each range (thread, start, end) on its thread, 0 = outermost."""
    n = len(tid)
    ev_tid = np.concatenate([tid, tid])
    ev_t = np.concatenate([start, end])
    # at equal times an end comes before a start (a range of no length ends after the starts, inside
    # what is open then); a longer range starts before a shorter one
    ev_order = np.concatenate([np.ones(n, np.int64), np.where(end == start, 2, 0)])
    ev_neg_len = np.concatenate([start - end, np.zeros(n, np.int64)])
    ev_delta = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    ev_row = np.concatenate([np.arange(n), np.full(n, -1)])
    o = np.lexsort((ev_neg_len, ev_order, ev_t, ev_tid))
    # every range adds +1 and -1 on its own thread, so one running sum over the thread-sorted events
    # equals a running sum per thread
    depth = np.cumsum(ev_delta[o])
    row = ev_row[o]
    starts = row >= 0
    level = np.empty(n, np.int64)
    level[row[starts]] = depth[starts] - 1
    return level


def innermost_of(r_tid: np.ndarray, r_start: np.ndarray, r_end: np.ndarray, tid: np.ndarray, start: np.ndarray,
                 end: np.ndarray) -> np.ndarray:
    """Position of the innermost range (thread, start, end) on the same thread enclosing each [start, end]
    query, or -1.

    One sort of all range starts, range ends and queries: walking it, the depth is a running sum, a
    range's level is the depth at its start, and the range around a query is the last start of level
    depth - 1 before it on its thread (any later start of that level would be nested deeper).
    """
    # a range of no length encloses nothing, and its end sorting before its start would upset the depth; a range on
    # a thread no query is on, nothing asked for
    threads = np.unique(np.asarray(tid))
    on_threads = np.asarray(r_tid) == threads[0] if len(threads) == 1 else np.isin(r_tid, threads)
    kept = np.flatnonzero((np.asarray(r_end) > np.asarray(r_start)) & on_threads)
    r_tid, r_start, r_end = (np.asarray(a, np.int64)[kept] for a in (r_tid, r_start, r_end))
    m, n = len(tid), len(r_tid)
    if m == 0 or n == 0:
        return np.full(m, -1, np.int64)
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    ev_tid = np.concatenate([r_tid, r_tid, np.asarray(tid, np.int64)])
    ev_t = np.concatenate([r_start, r_end, start])
    # at one instant: ranges that end, then ranges that start (longer first), then the queries
    at_instant = np.concatenate([r_start - r_end, np.full(n, np.iinfo(np.int64).min), np.ones(m, np.int64)])
    one_thread = ev_tid.min() == ev_tid.max()  # the usual case: one sort key fewer
    o = np.lexsort((at_instant, ev_t) if one_thread else (at_instant, ev_t, ev_tid))
    depth = np.cumsum(np.repeat(np.array([1, -1, 0], np.int64), [n, n, m])[o])  # per thread: each balances
    tid_sorted = ev_tid[o]
    thread = np.cumsum(np.r_[0, tid_sorted[1:] != tid_sorted[:-1]])
    is_start, is_query = o < n, o >= 2 * n
    wanted = depth - (is_start | is_query)  # a start's level; the level a query looks for
    group = (thread * (int(depth.max()) + 2) + wanted + 1) * len(o) + np.arange(len(o))  # thread, level, order
    starts = np.flatnonzero(is_start)
    starts = starts[np.argsort(group[starts])]
    at = np.searchsorted(group[starts], group[is_query], side="right") - 1
    queries = o[is_query] - 2 * n
    hit = starts[np.maximum(at, 0)]
    same = (at >= 0) & (group[hit] // len(o) == group[is_query] // len(o))
    pos = o[hit]
    out = np.full(m, -1, np.int64)
    inside = same & (r_end[np.where(same, pos, 0)] >= end[queries])
    out[queries[inside]] = kept[pos[inside]]
    return out


def parents_of(tid: np.ndarray, start: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Position of each range's parent (the enclosing range one level up on the same thread), or -1, from
    the ranges' threads, starts and levels."""
    return parents_among(tid, start, levels, tid, start, levels)


def parents_among(tid: np.ndarray, start: np.ndarray, levels: np.ndarray, c_tid: np.ndarray, c_start: np.ndarray,
                  c_levels: np.ndarray) -> np.ndarray:
    """Position among candidate ranges (in range order) of each range's parent, or -1: the latest candidate one
    level up on its thread that started before it."""
    if len(tid) == 0:
        return np.zeros(0, np.int64)
    return _asof_backward(tid, np.asarray(levels) - 1, start, c_tid, np.asarray(c_levels), c_start)


def _asof_backward(q_tid, q_level, q_t, c_tid, c_level, c_t) -> np.ndarray:
    """For each query, the candidate on the same thread and level with the latest start <= the query's time
    (the last such candidate in input order on a tie), or -1: an as-of join on sorted integer keys."""
    nq = len(q_t)
    if nq == 0 or len(c_t) == 0:
        return np.full(nq, -1, np.int64)
    _, tid_code = factorize(np.concatenate([q_tid, c_tid]))
    levels = np.concatenate([q_level, c_level]).astype(np.int64) + 1  # queries may ask for level -1
    group = tid_code.astype(np.int64) * (int(levels.max()) + 1) + levels
    t = np.concatenate([q_t, c_t]).astype(np.int64)
    low = int(t.min())
    span = int(t.max()) - low + 1
    if (int(group.max()) + 1) * span < 1 << 62:
        t = t - low
    else:  # times too far apart to lift each group above the last: their ranks instead
        _, t = np.unique(t, return_inverse=True)
        span = int(t.max()) + 1
    key = group * span + t.reshape(-1)  # group-major, then time: one sortable integer
    q_key, c_key = key[:nq], key[nq:]
    order = np.argsort(c_key, kind="stable")
    at = np.searchsorted(c_key[order], q_key, side="right") - 1
    out = np.full(nq, -1, np.int64)
    ok = at >= 0
    hit = order[at[ok]]
    same = group[nq:][hit] == group[:nq][ok]
    out[np.flatnonzero(ok)[same]] = hit[same]
    return out


OP_INSTANCE_RE = re.compile(r",\s*(?:seq|op_id|sizes|input_op_ids)\s*=.*$", re.DOTALL)


def op_name(names):
    """A range name without what numbers one instance of an op (`aten::mm, seq = 65, op_id = 7` -> `aten::mm`):
    PyTorch's emit_nvtx names every op instance, and thousands of instances compare better as one op."""
    return names.astype(str).str.replace(OP_INSTANCE_RE, "", regex=True)
