"""Vectorised interval arithmetic: assign events to windows, clip them, and take unions per group.

Nsight Systems events are half-open [start, end) intervals in ns; these helpers never loop over events
in Python, so they stay fast on millions of rows.
"""

from __future__ import annotations

import numpy as np

from .groups import factorize, stable_order


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
    group = np.asarray(group)
    if len(starts) == 0:
        return np.zeros(0, group.dtype), np.zeros(0, np.int64)
    s = np.asarray(starts, np.int64)
    e = np.asarray(ends, np.int64)
    order = np.lexsort((s, group))  # one sort: by group, then start
    group, s, e = group[order], s[order], e[order]
    head = np.r_[True, group[1:] != group[:-1]]  # a group's first interval
    reach = running_max_by_group(np.cumsum(head) - 1, e)
    new = head.copy()  # a segment of the union begins
    new[1:] |= s[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    seg_len = reach[np.r_[firsts[1:] - 1, len(s) - 1]] - s[firsts]
    group_first = np.flatnonzero(head[firsts])
    return group[firsts[group_first]], np.add.reduceat(seg_len, group_first)


def consecutive_union_lengths(first: np.ndarray, last: np.ndarray, count: np.ndarray, floor: np.ndarray,
                              starts: np.ndarray, ends: np.ndarray,
                              part: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, right): for groups of intervals sorted by part (small integers from 0, say the thread that launched
    them; none: one part) and start, each group's in one part and given by the places of its first and last interval
    in that order and how many it has, how much each covers beyond its floor (the union of [max(start, floor), end)),
    right where its intervals come one after another and, from its second on, its own reach (or its floor) is the
    greatest end of all before in its part (the ops of one range on one stream, as usual): a difference of prefix sums
    over one running maximum, where union_lengths sorts every interval of every group."""
    reach = np.empty(len(starts) + 1, np.int64)  # reach[k]: the greatest end before interval k in its part
    reach[0] = np.iinfo(np.int64).min
    if part is None:
        np.maximum.accumulate(ends, out=reach[1:])
    else:
        reach[1:] = running_max_by_group(part, ends)
        reach[1:][np.r_[part[1:] != part[:-1], False]] = reach[0]  # a part's first has nothing before it
    prefix = np.r_[0, np.cumsum(np.maximum(ends - np.maximum(starts, reach[:-1]), 0))]  # what each adds to all before
    right = (count == last - first + 1) & ((np.maximum(floor, reach[first]) <= ends[first]) | (floor == reach[first]))
    lengths = np.maximum(ends[first] - np.maximum(starts[first], floor), 0) + prefix[last + 1] - prefix[first + 1]
    return lengths, right


def running_max_by_group(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The running maximum of `values` that restarts with each group, for rows sorted by group (small integers
    from 0): each group's values lifted above all earlier groups' (on their ranks where that would not fit in
    int64), so that one maximum.accumulate serves every group."""
    if not len(values):
        return np.zeros(0, np.int64)
    group = np.asarray(group, np.int64)
    low = int(values.min())
    span = int(values.max()) - low + 1
    if (int(group.max()) + 1) * span < 1 << 62:
        lift = group * span
        return np.maximum.accumulate(values - low + lift) - lift + low
    distinct, rank = np.unique(values, return_inverse=True)
    lift = group * (len(distinct) + 1)
    return distinct[np.maximum.accumulate(rank.reshape(-1) + lift) - lift]


def prefix_union_lengths(group: np.ndarray, starts: np.ndarray, ends: np.ndarray, level: np.ndarray, levels: int,
                         n: int) -> np.ndarray:
    """covered[i, g]: the length of the union of group g's intervals of level below i, for i in 0..levels (groups
    and levels small integers from 0, n groups).

    One sort of all intervals by group and start serves every prefix of levels: each keeps that order, so its
    union is a running maximum per group (union_lengths would sort again for each)."""
    covered = np.zeros((levels + 1, n), np.int64)
    if not len(starts):
        return covered
    order = np.lexsort((starts, group))
    g, s, e, lv = (np.asarray(a, np.int64)[order] for a in (group, starts, ends, level))
    present = np.bincount(lv, minlength=levels) > 0
    for i in range(levels):
        covered[i + 1] = covered[i]
        if not present[i]:
            continue
        sel = lv <= i
        gi, si, ei = g[sel], s[sel], e[sel]
        reach = running_max_by_group(gi, ei)
        new = np.ones(len(si), bool)
        new[1:] = (gi[1:] != gi[:-1]) | (si[1:] > reach[:-1])
        firsts = np.flatnonzero(new)  # each disjoint piece's first interval, in order of group
        group_of, piece = gi[firsts], reach[np.r_[firsts[1:] - 1, len(si) - 1]] - si[firsts]
        lead = np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1]])
        covered[i + 1] = 0
        covered[i + 1][group_of[lead]] = np.add.reduceat(piece, lead)
    return covered


def union_segments(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint segments covering a set of intervals (one group)."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if np.any(s[1:] < s[:-1]):  # else in order already, as a long capture's calls mostly are: no sorted copies
        order = np.argsort(s, kind="mergesort")
        s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    return s[firsts], reach[np.r_[firsts[1:] - 1, len(s) - 1]]  # a segment ends at its running maximum


def touching(seg_start: np.ndarray, seg_end: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each [start, end] meets one of the disjoint sorted segments [seg_start, seg_end] (from
    `union_segments`), a shared instant included."""
    if not len(seg_start) or not len(starts):
        return np.zeros(len(starts), bool)
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    # only the segments between the earliest start and the latest end: a batch of a long capture's rows meets few,
    # and searching those few stays in cache
    low = int(np.searchsorted(seg_end, starts.min(), side="left"))
    seg_start, seg_end = seg_start[low:int(np.searchsorted(seg_start, ends.max(), side="right"))], seg_end[low:]
    if not len(seg_start):
        return np.zeros(len(starts), bool)
    i = np.searchsorted(seg_start, ends, side="right") - 1
    return (i >= 0) & (seg_end[np.maximum(i, 0)] >= starts)


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
    order = _by_group_start_longest(group, start, end)
    if not len(order):
        return order
    g, s, e = group[order], start[order], end[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    reach = running_max_by_group(np.cumsum(new_group) - 1, e)
    return order[new_group | (s >= np.r_[s[:1], reach[:-1]])]


def _by_group_start_longest(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """np.lexsort((-end, start, group)). Rows in order of group and start already (ranges of a table sorted by
    start, grouped by iteration) are only sorted within their ties: a few passes, where the lexsort of 100 k
    ranges takes 5 ms. Rows in order of start from a few groups taking turns (a span's ranges, by thread) are
    first put in group order by a stable sort of the groups' codes (by radix)."""
    order = _in_group_start_order(group, start, end)
    if order is None and len(start) >= 256:
        _, code = factorize(group)
        by_group = stable_order(code)
        inner = _in_group_start_order(code[by_group], start[by_group], end[by_group])
        order = None if inner is None else by_group[inner]
    return order if order is not None else np.lexsort((-end, start, group))


def _in_group_start_order(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """_by_group_start_longest's order for rows in order of group and start already (ties apart), else None."""
    if len(start) <= 1:
        return np.arange(len(start))
    # compared, not subtracted: a start of INT64_MIN (compute_memory_share's carried reach) would overflow a diff
    same_group, same_start = group[1:] == group[:-1], start[1:] == start[:-1]
    if not ((group[1:] >= group[:-1]).all() and (~same_group | (start[1:] >= start[:-1])).all()):
        return None
    tie = same_group & same_start
    order = np.arange(len(start))
    if tie.any():
        rows = np.flatnonzero(np.r_[tie, False] | np.r_[False, tie])
        order[rows] = rows[np.lexsort((-end[rows], start[rows], group[rows]))]
    return order
