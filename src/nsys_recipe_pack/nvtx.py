"""NVTX nesting without loops: stack levels of ranges, and the innermost range around given instants.

On one thread push/pop ranges nest properly, so the depth at an instant is (ranges started) minus
(ranges ended), and the range enclosing an instant at depth d is the latest range of level d that
started before it. Both are a sort, a cumulative sum and an as-of join.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def stack_levels(ranges: pd.DataFrame) -> pd.Series:
    """Level of each range on its thread (0 = outermost), index aligned with `ranges`."""
    if len(ranges) == 0:
        return pd.Series(dtype="int64")
    level = _levels(ranges["tid"].to_numpy(np.int64), ranges["start_ns"].to_numpy(np.int64),
                    ranges["end_ns"].to_numpy(np.int64))
    return pd.Series(level, index=ranges.index)


def _levels(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    n = len(tid)
    ev_tid = np.concatenate([tid, tid])
    ev_t = np.concatenate([start, end])
    # at equal times an end comes before a start; a longer range starts before a shorter one
    ev_order = np.concatenate([np.ones(n, np.int64), np.zeros(n, np.int64)])
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


def innermost(ranges: pd.DataFrame, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Position (into `ranges`) of the innermost range on the same thread enclosing [start, end], or -1."""
    return innermost_of(ranges["tid"].to_numpy(np.int64), ranges["start_ns"].to_numpy(np.int64),
                        ranges["end_ns"].to_numpy(np.int64), tid, start, end)


def innermost_of(r_tid: np.ndarray, r_start: np.ndarray, r_end: np.ndarray, tid: np.ndarray, start: np.ndarray,
                 end: np.ndarray) -> np.ndarray:
    """`innermost` over ranges given as arrays (thread, start, end)."""
    m = len(tid)
    n = len(r_tid)
    if m == 0 or n == 0:
        return np.full(m, -1, np.int64)
    lvl = _levels(r_tid, r_start, r_end)
    tid = np.asarray(tid, np.int64)
    ev_tid = np.concatenate([r_tid, r_tid, tid])
    ev_t = np.concatenate([r_start, r_end, np.asarray(start, np.int64)])
    ev_order = np.concatenate([np.zeros(n, np.int64), np.zeros(n, np.int64) - 1, np.ones(m, np.int64)])
    ev_delta = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64), np.zeros(m, np.int64)])
    ev_q = np.concatenate([np.full(2 * n, -1), np.arange(m)])
    o = np.lexsort((ev_order, ev_t, ev_tid))
    depth = np.cumsum(ev_delta[o])  # per thread, as in stack_levels
    q_sorted = ev_q[o]
    is_q = q_sorted >= 0
    q_depth = np.empty(m, np.int64)
    q_depth[q_sorted[is_q]] = depth[is_q]
    pos = _asof_backward(tid, q_depth - 1, np.asarray(start, np.int64), r_tid, lvl, r_start)
    out = np.full(m, -1, np.int64)
    q = np.flatnonzero(pos >= 0)
    pos = pos[q]
    contains = r_end[pos] >= np.asarray(end, np.int64)[q]
    out[q[contains]] = pos[contains]
    return out


def parents(ranges: pd.DataFrame, levels: np.ndarray) -> np.ndarray:
    """Position of each range's parent (the enclosing range one level up on the same thread), or -1."""
    n = len(ranges)
    if n == 0:
        return np.zeros(0, np.int64)
    tid, t = ranges["tid"].to_numpy(np.int64), ranges["start_ns"].to_numpy(np.int64)
    return _asof_backward(tid, np.asarray(levels) - 1, t, tid, np.asarray(levels), t)


def _asof_backward(q_tid, q_level, q_t, c_tid, c_level, c_t) -> np.ndarray:
    """For each query, the candidate on the same thread and level with the latest start <= the query's time
    (the last such candidate in input order on a tie), or -1: an as-of join on sorted integer keys."""
    nq = len(q_t)
    if nq == 0 or len(c_t) == 0:
        return np.full(nq, -1, np.int64)
    _, tid_code = np.unique(np.concatenate([q_tid, c_tid]), return_inverse=True)
    levels = np.concatenate([q_level, c_level]).astype(np.int64) + 1  # queries may ask for level -1
    group = tid_code.astype(np.int64) * (int(levels.max()) + 1) + levels
    _, t_rank = np.unique(np.concatenate([q_t, c_t]), return_inverse=True)
    span = int(t_rank.max()) + 1
    key = group * span + t_rank  # group-major, then time: one sortable integer
    q_key, c_key = key[:nq], key[nq:]
    order = np.argsort(c_key, kind="stable")
    at = np.searchsorted(c_key[order], q_key, side="right") - 1
    out = np.full(nq, -1, np.int64)
    ok = at >= 0
    hit = order[at[ok]]
    same = group[nq:][hit] == group[:nq][ok]
    out[np.flatnonzero(ok)[same]] = hit[same]
    return out
