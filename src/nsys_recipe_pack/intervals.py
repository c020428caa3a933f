"""Vectorised interval arithmetic: assign events to windows, clip them, and take unions per group.

Nsight Systems events are half-open [start, end) intervals in ns; these helpers never loop over events
in Python, so they stay fast on millions of rows.
"""

from __future__ import annotations

import numpy as np


def split_into_windows(
    starts: np.ndarray, ends: np.ndarray, win_start: np.ndarray, win_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Clip each event to every window it overlaps.

    Windows must be sorted by start and must not overlap. Returns (event_index, window_index,
    clipped_start, clipped_end) with one row per (event, window) overlap of positive length.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    win_start = np.asarray(win_start, dtype=np.int64)
    win_end = np.asarray(win_end, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    if len(starts) == 0 or len(win_start) == 0:
        return empty, empty, empty, empty
    # first window that ends after the event starts; last window that starts before the event ends
    first = np.searchsorted(win_end, starts, side="right")
    last = np.searchsorted(win_start, ends, side="left") - 1
    span = np.maximum(last - first + 1, 0)
    ev = np.repeat(np.arange(len(starts)), span)
    offsets = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
    win = np.repeat(first, span) + offsets
    cs = np.maximum(starts[ev], win_start[win])
    ce = np.minimum(ends[ev], win_end[win])
    keep = ce > cs
    return ev[keep], win[keep], cs[keep], ce[keep]


def union_lengths(group: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(groups, lengths): each group value (sorted) and the total length of the union of its intervals."""
    if len(starts) == 0:
        return np.zeros(0, np.asarray(group).dtype), np.zeros(0, np.int64)
    groups, g = np.unique(np.asarray(group), return_inverse=True)
    s = np.asarray(starts, np.int64)
    e = np.asarray(ends, np.int64)
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    # a running maximum of the ends that restarts with each group: on dense ranks of the ends, shifted
    # by group so that every group's ranks lie above all earlier groups' ranks
    values, rank = np.unique(e, return_inverse=True)
    shift = g.astype(np.int64) * (len(values) + 1)
    reach = values[np.maximum.accumulate(rank + shift) - shift]
    new = np.ones(len(s), bool)
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    firsts = np.flatnonzero(new)
    seg_len = reach[np.r_[firsts[1:] - 1, len(s) - 1]] - s[firsts]
    seg_group = g[firsts]
    group_first = np.flatnonzero(np.r_[True, seg_group[1:] != seg_group[:-1]])
    return groups[seg_group[group_first]], np.add.reduceat(seg_len, group_first)


def union_segments(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint segments covering a set of intervals (one group)."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(starts, kind="mergesort")
    s = np.asarray(starts, np.int64)[order]
    e = np.asarray(ends, np.int64)[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    return s[firsts], reach[np.r_[firsts[1:] - 1, len(s) - 1]]  # a segment ends at its running maximum


def touching(seg_start: np.ndarray, seg_end: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each [start, end] meets one of the disjoint sorted segments [seg_start, seg_end] (from
    `union_segments`), a shared instant included."""
    i = np.searchsorted(seg_start, np.asarray(ends, np.int64), side="right") - 1
    return (i >= 0) & (seg_end[np.maximum(i, 0)] >= np.asarray(starts, np.int64)) if len(seg_start) else \
        np.zeros(len(starts), bool)


def covered_length(seg_start: np.ndarray, seg_end: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Length of [start, end) covered by disjoint sorted segments (from `union_segments`), for each query.

    The covered length up to an instant is a cumulative sum and a binary search, so any number of
    queries, overlapping or not, cost one pass.
    """
    if len(seg_start) == 0:
        return np.zeros(len(starts), np.int64)
    before = np.concatenate([[0], np.cumsum(seg_end - seg_start)])

    def up_to(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(seg_start, t, side="right") - 1
        inside = np.minimum(t - seg_start[np.maximum(i, 0)], seg_end[np.maximum(i, 0)] - seg_start[np.maximum(i, 0)])
        return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0)

    return up_to(np.asarray(ends, np.int64)) - up_to(np.asarray(starts, np.int64))


def outermost(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Positions of the intervals not inside an earlier one of the same group (thread, iteration), ordered
    by group, start, longest first."""
    order = np.lexsort((-end, start, group))
    if not len(order):
        return order
    g, s, e = group[order], start[order], end[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    ends, rank = np.unique(e, return_inverse=True)
    shift = (np.cumsum(new_group) - 1) * len(ends)  # each group's running maximum above all earlier groups'
    reach = ends[np.maximum.accumulate(rank.reshape(-1) + shift) - shift]
    return order[new_group | (s >= np.r_[s[:1], reach[:-1]])]
