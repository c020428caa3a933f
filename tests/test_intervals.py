from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nsys_recipe_pack import intervals
from nsys_recipe_pack.intervals import (
    consecutive_union_lengths,
    outermost,
    prefix_union_lengths,
    split_into_windows,
    union_lengths,
    union_segments,
)


def test_union_length_by_group_hand_case():
    # group 0: [0,10) and [5,15) overlap -> 15; [20,25) -> 5; total 20
    # group 1: [0,5) inside [0,10) -> 10
    g = np.array([0, 0, 0, 1, 1])
    s = np.array([5, 0, 20, 0, 0])
    e = np.array([15, 10, 25, 10, 5])
    groups, lengths = union_lengths(g, s, e)
    assert dict(zip(groups.tolist(), lengths.tolist(), strict=True)) == {0: 20, 1: 10}


def test_union_touching_intervals_are_not_double_counted():
    groups, lengths = union_lengths(np.zeros(3, int), np.array([0, 10, 10]), np.array([10, 20, 15]))
    assert (groups.tolist(), lengths.tolist()) == ([0], [20])


MIN = np.iinfo(np.int64).min


def _figures(group, index):
    """Each group's first and last place and how many intervals it has, from its (group, interval) pairs."""
    groups = sorted(set(group.tolist()))
    at = [index[group == g] for g in groups]
    return (np.array(groups, np.int64), *(np.array([f(i) for i in at], np.int64) for f in (np.min, np.max, len)))


def test_consecutive_unions_by_hand():
    # intervals by start: 0 [0,10) 1 [2,4) 2 [5,20) 3 [12,14) 4 [16,30) 5 [25,26)
    s, e = np.array([0, 2, 5, 12, 16, 25]), np.array([10, 4, 20, 14, 30, 26])
    first, last, count = np.array([0, 3, 2, 5, 2, 0]), np.array([1, 3, 4, 5, 3, 4]), np.array([2, 1, 2, 1, 2, 3])
    floor = np.array([MIN, MIN, 8, 40, 18, 0])
    lengths, right = consecutive_union_lengths(first, last, count, floor, s, e)
    # 0: from the start, one after another -> 10; 1: under [5,20), which is not its own -> not right; 2: [2] and
    # [4] apart -> not right; 3: its floor above the ends before it -> not right; 4: [5,20) and [12,14) from its
    # floor 18 -> [18,20) -> 2; 5: [0, 2, 4] with one between -> not right
    assert right.tolist() == [True, False, False, False, True, False]
    assert lengths[right].tolist() == [10, 2]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 25), st.booleans()), min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(0, 5), st.integers(0, 29), st.integers(0, 3)), max_size=60),
       st.lists(st.one_of(st.just(None), st.integers(0, 400)), min_size=6, max_size=6), st.booleans())
def test_consecutive_unions_equal_the_union_of_clipped_intervals(steps, picks, floors, by_part):
    """Right where said so against union_lengths of each group's intervals clipped below at its floor; and said so
    for a group whose intervals come one after another, none before in its part reaching past the first one's end
    and its floor not either. Parts: intervals in order of part, then start, each part's from about 0 again (the
    reach of one part is not another's)."""
    part = np.cumsum([p for _, _, p in steps]) if by_part else np.zeros(len(steps), np.int64)
    s = np.cumsum([a for a, _, _ in steps]).astype(np.int64)  # in order of start within a part, ties included
    s -= s[np.searchsorted(part, part)]
    e = s + np.array([d for _, d, _ in steps], np.int64)
    # a group is (group, part): some runs, some spread
    pairs = sorted({(g * 64 + int(part[j]), j) for g, i, n in picks
                    for j in [min(i, len(s) - 1) if n else i % len(s)]})
    if not pairs:
        return
    group, index = (np.array(c, np.int64) for c in zip(*pairs, strict=True))
    groups, first, last, count = _figures(group, index)
    floor = np.array([MIN if f is None else f for f in floors], np.int64)[groups // 64]
    lengths, right = consecutive_union_lengths(first, last, count, floor, s, e, part if by_part else None)
    clipped = np.maximum(s[index], floor[np.searchsorted(groups, group)])
    beyond = e[index] > clipped
    want = dict.fromkeys(groups.tolist(), 0)
    want.update(zip(*(a.tolist() for a in union_lengths(group[beyond], clipped[beyond], e[index][beyond])),
                    strict=True))
    assert lengths[right].tolist() == [want[g] for g in groups[right]]
    # one after another, with nothing before the first in its part, nor its floor, later than that one's end: its own
    # reach is the running one
    part_first = np.searchsorted(part, part[first])
    before = np.array([e[p:f].max() if f > p else MIN for p, f in zip(part_first, first, strict=True)], np.int64)
    assert right[(count == last - first + 1) & (np.maximum(before, floor) <= e[first])].all()


def test_prefix_unions_by_hand():
    # group 0: level 0 [0,10), level 1 [5,20), level 2 [30,40); group 1: level 1 [0,4)
    covered = prefix_union_lengths(np.array([0, 0, 0, 1]), np.array([0, 5, 30, 0]), np.array([10, 20, 40, 4]),
                                   np.array([0, 1, 2, 1]), 3, 2)
    assert covered.tolist() == [[0, 0], [10, 0], [20, 4], [30, 4]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-50, 50), st.integers(0, 40), st.integers(0, 4)),
                max_size=40),
       st.booleans(), st.sampled_from([0.0, 1.0]))
def test_prefix_unions_equal_one_union_per_prefix(rows, wide, others_for_passes):
    """Against union_lengths over each prefix of levels, both ways of taking them (a pass per prefix, or the lowest
    level's union once and the others against it); `wide` spreads the times over 2**61 ns, where the ends cannot be
    lifted per group and their ranks are used."""
    g = np.array([r[0] for r in rows], np.int64)
    s = np.array([r[1] for r in rows], np.int64) * (2**55 if wide else 1)
    e = s + np.array([r[2] for r in rows], np.int64)
    level = np.array([r[3] for r in rows], np.int64)
    with mock.patch.object(intervals, "OTHERS_FOR_PASSES", others_for_passes):
        covered = prefix_union_lengths(g, s, e, level, 5, 4)
    for i in range(6):
        want = np.zeros(4, np.int64)
        sel = level < i
        if sel.any():
            groups, lengths = union_lengths(g[sel], s[sel], e[sel])
            want[groups] = lengths
        assert covered[i].tolist() == want.tolist()


def test_split_into_windows_clips_events_spanning_windows():
    # windows [0,10) [10,20) [30,40); event [5,35) covers 5 + 10 + 5 inside windows
    ev, win, cs, ce = split_into_windows(np.array([5, 12]), np.array([35, 13]),
                                         np.array([0, 10, 30]), np.array([10, 20, 40]))
    rows = sorted(zip(ev.tolist(), win.tolist(), cs.tolist(), ce.tolist(), strict=False))
    assert rows == [(0, 0, 5, 10), (0, 1, 10, 20), (0, 2, 30, 35), (1, 1, 12, 13)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), max_size=30),
       st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=6), st.booleans())
def test_split_into_windows_against_each_event_and_window(events, windows, short):
    """Against every (event, window) pair with a positive overlap, in order of event then window: events no longer
    than the gaps between windows (each in one window at most: the quick way) and longer ones."""
    edges = np.cumsum([w for pair in windows for w in pair])  # windows apart, sorted: [e0, e1), [e2, e3), ...
    win_start, win_end = edges[0::2], edges[1::2]
    starts = np.array([s for s, _ in events], np.int64)
    ends = starts + np.array([min(n, 1) if short else n for _, n in events], np.int64)
    want = [(i, w, max(s, ws), min(e, we)) for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
            for w, (ws, we) in enumerate(zip(win_start.tolist(), win_end.tolist(), strict=True))
            if min(e, we) > max(s, ws)]
    got = list(zip(*(a.tolist() for a in split_into_windows(starts, ends, win_start, win_end)), strict=True))
    assert got == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-50, 50)), min_size=1, max_size=40), st.booleans())
def test_running_max_by_group_restarts_in_each_group(rows, apart):
    """Against a maximum kept group by group: groups whose values lie apart (each above the last group's, as
    intervals of iterations apart in time; one running maximum serves them all) or mixed."""
    rows = sorted(rows, key=lambda r: r[0])
    group = np.array([g for g, _ in rows], np.int64)
    values = np.array([v + (1000 * g if apart else 0) for g, v in rows], np.int64)
    want, best = [], {}
    for g, v in zip(group.tolist(), values.tolist(), strict=True):
        best[g] = max(best.get(g, v), v)
        want.append(best[g])
    assert intervals.running_max_by_group(group, values).tolist() == want


def test_events_outside_all_windows_vanish():
    ev, *_ = split_into_windows(np.array([20]), np.array([25]), np.array([0, 30]), np.array([10, 40]))
    assert len(ev) == 0


def test_union_segments():
    s, e = union_segments(np.array([3, 0, 20]), np.array([8, 5, 30]))
    assert s.tolist() == [0, 20] and e.tolist() == [8, 30]


def test_task_sizes_cover_every_file_once_and_shrink_to_single_files():
    from nsys_recipe_pack.runner import task_sizes

    for n, workers in [(1, 2), (5, 2), (256, 2), (1000, 8)]:
        tasks = task_sizes(n, workers)
        firsts = [f for f, _ in tasks]
        sizes = [s for _, s in tasks]
        assert firsts == list(np.cumsum([0] + sizes[:-1])) and sum(sizes) == n  # contiguous, no file twice
        assert max(sizes) <= 16 and sizes == sorted(sizes, reverse=True) and sizes[-1] == 1
    assert [s for _, s in task_sizes(256, 2)][:9] == [16] * 9  # 256 // 8 = 32 > 16 until 112 files are left


def test_covered_length_by_hand():
    from nsys_recipe_pack.intervals import covered_length

    # GPU work [0,10) and [5,12) and [20,30): union [0,12) + [20,30)
    seg = union_segments(np.array([0, 20, 5]), np.array([10, 30, 12]))
    assert [list(seg[0]), list(seg[1])] == [[0, 20], [12, 30]]
    got = covered_length(*seg, np.array([5, 12, -5, 25, 11]), np.array([25, 18, 100, 25, 21]))
    assert got.tolist() == [7 + 5, 0, 22, 0, 1 + 1]
    assert covered_length(np.zeros(0, np.int64), np.zeros(0, np.int64), np.array([1]), np.array([2])).tolist() == [0]


def _outermost_by_walk(group, start, end) -> list[int]:
    """intervals.outermost by its definition, one interval at a time."""
    rows = sorted(range(len(start)), key=lambda i: (group[i], start[i], -end[i]))
    out, reach = [], {}
    for i in rows:
        if group[i] not in reach or start[i] >= reach[group[i]]:
            out.append(i)
        reach[group[i]] = max(reach.get(group[i], end[i]), end[i])
    return out


def test_outermost_by_hand():
    # group 0: [0, 10] holds [2, 5]; [10, 12] starts where it ends. group 1: two ranges from 0, the longer first
    group, start, end = np.array([0, 0, 0, 1, 1]), np.array([0, 2, 10, 0, 0]), np.array([10, 5, 12, 3, 7])
    assert outermost(group, start, end).tolist() == [0, 2, 4]
    assert _outermost_by_walk(group, start, end) == [0, 2, 4]


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 20)), max_size=40), st.booleans())
def test_outermost_agrees_with_its_definition(rows, in_order):
    """Rows in order of group and start (the quick way, ties sorted apart) or in any order."""
    if in_order:
        rows = sorted(rows, key=lambda r: r[:2])
    group = np.array([g for g, _, _ in rows], np.int64)
    start = np.array([s for _, s, _ in rows], np.int64)
    end = start + np.array([d for _, _, d in rows], np.int64)
    assert outermost(group, start, end).tolist() == _outermost_by_walk(group, start, end)


@given(st.lists(st.tuples(st.sampled_from([77, 1000, 1007, 5000]), st.integers(0, 60), st.integers(0, 20)),
                min_size=256, max_size=400), st.integers(0, 3))
@settings(max_examples=30)
def test_outermost_of_groups_taking_turns_in_order_of_start(rows, carried):
    """Enough rows for the path that puts a few groups (threads) taking turns in order by their codes first, some
    of them led by a reach carried from before (a start of INT64_MIN, which a difference of starts overflows)."""
    rows = sorted(rows, key=lambda r: r[1])
    low = np.iinfo(np.int64).min
    group = np.array([g for g, _, _ in rows[:carried]] + [g for g, _, _ in rows], np.int64)
    start = np.array([low] * carried + [s for _, s, _ in rows], np.int64)
    end = np.array([s + d for _, s, d in rows[:carried]] + [s + d for _, s, d in rows], np.int64)
    assert outermost(group, start, end).tolist() == _outermost_by_walk(group, start, end)


def test_overlay_by_hand():
    """Group 0: a = [0, 3) + [2, 4) + [5, 10), b = [1, 6): inside both [1, 4) and [5, 6), a alone [0, 1) and
    [6, 10); group 1: a = [0, 4), b = [3, 9): both [3, 4), a alone [0, 3); group 2 has no b."""
    a = intervals.union_segments_by_group(np.array([0, 0, 1, 0, 2]), np.array([0, 5, 0, 2, 7]),
                                          np.array([3, 10, 4, 4, 8]))
    assert [x.tolist() for x in a] == [[0, 0, 1, 2], [0, 5, 0, 7], [4, 10, 4, 8]]
    b = intervals.union_segments_by_group(np.array([0, 1]), np.array([1, 3]), np.array([6, 9]))
    assert [x.tolist() for x in intervals.overlay(a, b, both=True)] == [[0, 0, 1], [1, 5, 3], [4, 6, 4]]
    assert [x.tolist() for x in intervals.overlay(a, b, both=False)] == [[0, 0, 1, 2], [0, 6, 0, 7], [1, 10, 3, 8]]
    assert intervals.overlay_lengths(a, b, 3, both=True).tolist() == [4, 1, 0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 12), st.booleans()), max_size=30))
def test_overlay_equals_a_timeline_of_instants(rows):
    """Each group's time in a and b, or in a outside b, against a count of the integer instants covered."""
    group = np.array([r[0] for r in rows], np.int64)
    start = np.array([r[1] for r in rows], np.int64)
    end = start + np.array([r[2] for r in rows], np.int64)
    side_a = np.array([r[3] for r in rows], bool)
    a = intervals.union_segments_by_group(group[side_a], start[side_a], end[side_a])
    b = intervals.union_segments_by_group(group[~side_a], start[~side_a], end[~side_a])
    for both in (True, False):
        want = []
        for g in range(3):
            t = np.arange(60)
            in_a = ((start[side_a & (group == g)][:, None] <= t) & (t < end[side_a & (group == g)][:, None])).any(0)
            in_b = ((start[~side_a & (group == g)][:, None] <= t) & (t < end[~side_a & (group == g)][:, None])).any(0)
            want.append(int((in_a & (in_b if both else ~in_b)).sum()))
        assert intervals.overlay_lengths(a, b, 3, both).tolist() == want
