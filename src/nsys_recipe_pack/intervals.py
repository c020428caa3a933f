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
    if span.max() <= 1:  # each event in one window at most, as usual: no repeats
        ev = np.flatnonzero(span)
        win = first[ev]
    else:
        ev = np.repeat(np.arange(len(starts)), span)
        offsets = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
        win = np.repeat(first, span) + offsets
    cs = np.maximum(starts[ev], win_start[win])
    ce = np.minimum(ends[ev], win_end[win])
    keep = ce > cs
    if keep.all():
        return ev, win, cs, ce
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
    head = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))  # each group's first interval
    code = np.repeat(np.arange(len(head)), np.diff(head, append=len(group)))  # quicker than a cumulative sum
    piece_code, piece_start, piece_end = _union_pieces(code, s, e)
    return group[head], _sum_per_group(piece_code, piece_end - piece_start, len(head))


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


class GroupLift:
    """Keys that order (group, value) pairs as the pairs order, in int64: each group's values lifted above all
    earlier groups' (groups small integers from 0), the values' ranks among `values` standing in for them where
    the values would not fit."""

    def __init__(self, groups: int, values: np.ndarray):
        self.low = int(values.min()) if len(values) else 0
        span = int(values.max()) - self.low + 1 if len(values) else 1
        self.ranks = None if int(groups) * span < 1 << 62 else np.unique(values)
        self.scale = span if self.ranks is None else len(self.ranks) + 1

    def key(self, group: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The keys of pairs whose values are among those the lift was made for."""
        offset = values - self.low if self.ranks is None else np.searchsorted(self.ranks, values)
        return np.asarray(group, np.int64) * self.scale + offset

    def value(self, group: np.ndarray, keys: np.ndarray) -> np.ndarray:
        offset = keys - np.asarray(group, np.int64) * self.scale
        return offset + self.low if self.ranks is None else self.ranks[offset]


def running_max_by_group(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The running maximum of `values` that restarts with each group, for rows sorted by group (small integers
    from 0): one maximum.accumulate serves every group, over the values themselves where no group's maximum reaches
    into a later group (times in windows apart, as iterations are), else over the lifted keys (`GroupLift`)."""
    if not len(values):
        return np.zeros(0, np.int64)
    if group[0] == group[-1]:  # one group
        return np.maximum.accumulate(values)
    heads = np.flatnonzero(group[1:] != group[:-1]) + 1
    if values[:heads[0]].max() <= values[heads[0]]:  # the first group below the next (threads side by side are not)
        running = np.maximum.accumulate(values)
        if (running[heads - 1] <= values[heads]).all():
            return running
    lift = GroupLift(int(group.max()) + 1, values)
    return lift.value(group, np.maximum.accumulate(lift.key(group, values)))


OTHERS_FOR_PASSES = 1 / 7  # above this share of intervals outside the lowest level, a pass per prefix is quicker


def prefix_union_lengths(group: np.ndarray, starts: np.ndarray, ends: np.ndarray, level: np.ndarray, levels: int,
                         n: int) -> np.ndarray:
    """covered[i, g]: the length of the union of group g's intervals of level below i, for i in 0..levels (groups
    and levels small integers from 0, n groups).

    One sort by group and start serves every prefix. Where the lowest level holds nearly all intervals, as kernels
    mostly do, its union is taken once and each later prefix adds the union of the few others in it less the part
    the lowest level's covers (a cumulative sum and a binary search over its pieces); else each prefix is a pass over
    all its intervals, which is then the quicker."""
    covered = np.zeros((levels + 1, n), np.int64)
    if not len(starts):
        return covered
    order = np.lexsort((starts, group))
    g, s, e, lv = (np.asarray(a, np.int64)[order] for a in (group, starts, ends, level))
    present = np.flatnonzero(np.bincount(lv, minlength=levels) > 0)
    base = present[0]
    lowest = lv == base
    if np.count_nonzero(~lowest) > OTHERS_FOR_PASSES * len(lv):
        for i in range(base, levels):
            covered[i + 1] = covered[i]
            if i in present:
                on = lv <= i
                p_group, p_start, p_end = _union_pieces(g[on], s[on], e[on])
                covered[i + 1] = _sum_per_group(p_group, p_end - p_start, n)
        return covered
    a_group, a_start, a_end = _union_pieces(g[lowest], s[lowest], e[lowest])
    covered[base + 1] = _sum_per_group(a_group, a_end - a_start, n)
    g, s, e, lv = g[~lowest], s[~lowest], e[~lowest], lv[~lowest]
    lift = GroupLift(n, np.concatenate([a_start, s, e]))
    a_key = lift.key(a_group, a_start)
    before = np.r_[0, np.cumsum(a_end - a_start)]  # the lowest level's length in the pieces before each

    def lowest_up_to(group_of: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The lowest level's length before t in the group, plus all of it in the groups before."""
        i = np.searchsorted(a_key, lift.key(group_of, t), side="right") - 1
        at = np.maximum(i, 0)
        inside = np.where(a_group[at] == group_of, np.minimum(t, a_end[at]), a_end[at]) - a_start[at]
        return np.where(i >= 0, before[at] + inside, 0)

    for i in range(base + 1, levels):
        if i not in present:
            covered[i + 1] = covered[i]
            continue
        on = lv <= i
        p_group, p_start, p_end = _union_pieces(g[on], s[on], e[on])
        outside = p_end - p_start - (lowest_up_to(p_group, p_end) - lowest_up_to(p_group, p_start))
        covered[i + 1] = covered[base + 1] + _sum_per_group(p_group, outside, n)
    return covered


def _union_pieces(group: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                  np.ndarray]:
    """(group, start, end) of the disjoint pieces each group's intervals cover, for intervals sorted by group and
    start; in that order."""
    if not len(starts):
        return group, starts, ends
    reach = running_max_by_group(group, ends)
    new = np.ones(len(starts), bool)
    new[1:] = (group[1:] != group[:-1]) | (starts[1:] > reach[:-1])
    firsts = np.flatnonzero(new)  # a piece ends at its group's running maximum
    return group[firsts], starts[firsts], reach[np.r_[firsts[1:] - 1, len(starts) - 1]]


def _sum_per_group(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact sums of values per group, for rows sorted by group (n groups)."""
    out = np.zeros(n, np.int64)
    if len(group):
        lead = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        out[group[lead]] = np.add.reduceat(values, lead)
    return out


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


def union_segments_by_group(group: np.ndarray, starts: np.ndarray, ends: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`union_segments` of each group at once: (group, start, end) of the disjoint segments, by group then start."""
    if not len(starts):
        return (np.zeros(0, np.int64),) * 3
    g, s, e = (np.asarray(a, np.int64) for a in (group, starts, ends))
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    reach = running_max_by_group(g, e)
    new = np.r_[True, (g[1:] != g[:-1]) | (s[1:] > reach[:-1])]
    firsts = np.flatnonzero(new)
    return g[firsts], s[firsts], reach[np.r_[firsts[1:] - 1, len(s) - 1]]


def overlay(a: tuple, b: tuple, both: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, start, end) of the pieces of time inside a's segments and (both) inside b's, or (not both) outside
    b's. a, b: (group, start, end) of disjoint segments per group (`union_segments_by_group`). The instants where
    either side begins or ends, in order, cut the time into pieces each wholly in or out of each side."""
    if not len(a[0]):
        return (np.zeros(0, np.int64),) * 3
    group = np.concatenate([a[0], a[0], b[0], b[0]])
    when = np.concatenate([a[1], a[2], b[1], b[2]])
    na, nb = len(a[0]), len(b[0])
    step_a = np.r_[np.ones(na, np.int64), -np.ones(na, np.int64), np.zeros(2 * nb, np.int64)]
    step_b = np.r_[np.zeros(2 * na, np.int64), np.ones(nb, np.int64), -np.ones(nb, np.int64)]
    order = np.lexsort((when, group))
    group, when, in_a, in_b = group[order], when[order], np.cumsum(step_a[order]), np.cumsum(step_b[order])
    # the piece from each instant to the next in the same group (a group's sides are closed by its last instant)
    keep = np.r_[(group[1:] == group[:-1]) & (when[1:] > when[:-1]), False] & (in_a > 0) & \
        ((in_b > 0) if both else (in_b == 0))
    at = np.flatnonzero(keep)
    return group[at], when[at], when[at + 1]


def overlay_lengths(a: tuple, b: tuple, n: int, both: bool) -> np.ndarray:
    """Per group 0..n-1, the length of `overlay`'s pieces."""
    group, start, end = overlay(a, b, both)
    out = np.zeros(n, np.int64)
    np.add.at(out, group, end - start)
    return out


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
    start, grouped by iteration) are only sorted within their ties: a few passes instead of a lexsort. Rows in
    order of start from a few groups taking turns (a span's ranges, by thread) are first put in group order by a
    stable sort of the groups' codes (by radix)."""
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
