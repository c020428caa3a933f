"""Exact order statistics (a median, a 90th percentile) of values too many to hold, read again in passes: each pass
narrows every statistic's candidates to one bin of a histogram of the values still in its range, until they are few
enough to sort or all equal. The values are whatever the reader gives, the same on every call (straggler_heatmap's
medians and noise scales over every rank x iteration cell, read from files a run of iterations at a time)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

HOLD_ROWS = 1 << 20  # candidate values collected and sorted in one pass, at most
HISTOGRAM_BINS = 4096  # bins of a statistic's range per pass, at most...
HISTOGRAM_CELLS = 1 << 22  # ... and of all the statistics' histograms together


def order_statistics(read: Callable[[], Iterable[tuple]], n_groups: int, positions: np.ndarray,
                     bounds: tuple | None = None) -> np.ndarray:
    """The values at these places of each group's values in order, each value counted `weight` times: positions
    (n_groups x k) are 0-based places in the group's sorted, repeated values. read() gives (group, value, weight)
    chunks (weight None: 1 each) and gives the same values, in any order, each time it is called. bounds, where the
    caller knows them: per group a value at or below its least, one at or above its greatest, and how many values
    (rows) it has: a pass fewer. NaN where a group has none."""
    positions = np.asarray(positions, np.int64)
    k = positions.shape[1]
    wanted = positions.reshape(-1)
    group = np.repeat(np.arange(n_groups), k)
    if bounds is None:
        low, high = np.full(n_groups * k, -np.inf), np.full(n_groups * k, np.inf)
        rows = np.full(n_groups * k, np.iinfo(np.int64).max)  # of the group's values in [low, high]
    else:
        low, high, rows = (np.repeat(np.asarray(b), k) for b in bounds)
        low, high, rows = low.astype(np.float64), high.astype(np.float64), rows.astype(np.int64)
    below = np.zeros(n_groups * k, np.int64)  # weight of the group's values under `low`
    result = np.full(n_groups * k, np.nan)
    done = rows <= 0
    while not done.all():
        todo = np.flatnonzero(~done)
        # statistics of one group whose candidates are the same share what a pass gathers of them (a slot)
        key = np.stack([group[todo], low[todo], high[todo]])
        _, first, slot = np.unique(key, axis=1, return_index=True, return_inverse=True)
        slots = todo[first]
        # the slots with fewest candidates collected, as many as HOLD_ROWS candidates in all; the others narrowed
        fewest = np.argsort(rows[slots], kind="stable")
        collected = np.zeros(len(slots), bool)
        collected[fewest[np.cumsum(np.minimum(rows[slots][fewest], HOLD_ROWS + 1)) <= HOLD_ROWS]] = True
        seen = _Pass(n_groups, group[slots], low[slots], high[slots], collected)
        for chunk in read():
            seen.add(*chunk)
        slot = slot.reshape(-1)
        collect = seen.collect[slot]
        if collect.any():
            at = todo[collect]
            result[at] = seen.picked(slot[collect], wanted[at] - below[at])
            done[at] = True
        for t, s in zip(todo[~collect].tolist(), slot[~collect].tolist(), strict=True):
            w, r, least, most = seen.histogram(s)
            if not r.sum():  # no value at all in the group
                done[t] = True
                continue
            b = min(int(np.searchsorted(np.cumsum(w), wanted[t] - below[t], side="right")), len(w) - 1)
            below[t] += int(w[:b].sum())
            low[t], high[t], rows[t] = least[b], most[b], r[b]
            if low[t] == high[t]:
                result[t], done[t] = low[t], True
    return result.reshape(n_groups, k)


def medians(read: Callable[[], Iterable[tuple]], n_groups: int, count: int, bounds: tuple | None = None) -> np.ndarray:
    """Each group's median of its `count` values (read, bounds: as order_statistics takes them), as np.median gives
    it: the mean of the middle two."""
    middle = np.tile([(count - 1) // 2, count // 2], (n_groups, 1))
    return np.median(order_statistics(read, n_groups, middle, bounds), axis=1)


def deviations(read: Callable[[], Iterable[tuple]], n_groups: int, count: int, bounds: tuple,
               places: list[int]) -> np.ndarray:
    """The values at these places (the same in each group) of each group's absolute deviations from its median
    (`medians`): what a MAD or a percentile of the deviations picks from. bounds: each group's least and greatest
    value and its rows, as order_statistics takes them."""
    center = medians(read, n_groups, count, bounds)

    def apart():
        for group, value, weight in read():
            deviation = value - center[group]
            np.abs(deviation, out=deviation)
            yield group, deviation, weight

    least, most, rows = bounds
    farthest = np.maximum(np.abs(least - center), np.abs(most - center))
    return order_statistics(apart, n_groups, np.tile(places, (n_groups, 1)), (np.zeros(n_groups), farthest, rows))


class _Pass:
    """What one pass gathers of each slot's values in its range [low, high] (group: each slot's): a histogram (weight,
    rows, least and greatest value per bin), or where `collect`, the values themselves. A range without finite ends
    is one bin."""

    def __init__(self, n_groups: int, group: np.ndarray, low: np.ndarray, high: np.ndarray, collect: np.ndarray):
        self.low, self.high, self.collect = low, high, collect
        counted = ~collect
        self.bins = np.where(counted, 1, 0)
        finite = counted & np.isfinite(low) & np.isfinite(high)
        self.bins[finite] = max(16, min(HISTOGRAM_BINS, HISTOGRAM_CELLS // max(int(finite.sum()), 1)))
        self.first = np.cumsum(self.bins) - self.bins
        size = int(self.bins.sum())
        self.weight, self.rows = np.zeros(size, np.int64), np.zeros(size, np.int64)
        self.least, self.most = np.full(size, np.inf), np.full(size, -np.inf)
        span = np.where(finite, high - low, 0.0)
        self.per_unit = np.where(span > 0, self.bins / np.where(span > 0, span, 1.0), 0.0)
        self.origin = np.where(finite, low, 0.0)
        # each group's slots, as columns of a table (-1: none): a group mostly has one
        per_group = np.bincount(group, minlength=n_groups)
        self.of_group = np.full((n_groups, max(int(per_group.max()), 1)), -1)
        order = np.argsort(group, kind="stable")
        column = np.arange(len(group)) - (np.cumsum(per_group) - per_group)[group[order]]
        self.of_group[group[order], column] = order
        self.kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, group: np.ndarray, value: np.ndarray, weight: np.ndarray | None) -> None:
        for j in range(self.of_group.shape[1]):
            s = self.of_group[group, j]
            inside = (s >= 0) & (value >= self.low[s]) & (value <= self.high[s])
            if inside.all():  # a first pass: no copies
                v, w = value, weight
            else:
                take = np.flatnonzero(inside)
                if not len(take):
                    continue
                s, v, w = s[take], value[take], None if weight is None else weight[take]
            kept = self.collect[s]
            if kept.any():
                self.kept.append((s[kept], v[kept], np.ones(int(kept.sum()), np.int64) if w is None else
                                  np.asarray(w, np.int64)[kept]))
                s, v, w = s[~kept], v[~kept], None if w is None else w[~kept]
            if not len(s):
                continue
            b = np.minimum(((v - self.origin[s]) * self.per_unit[s]).astype(np.int64), self.bins[s] - 1)
            at = self.first[s] + b
            rows = np.bincount(at, minlength=len(self.rows))
            self.rows += rows
            self.weight += rows if w is None else np.bincount(at, weights=w, minlength=len(self.weight)).astype(
                np.int64)
            np.minimum.at(self.least, at, v)
            np.maximum.at(self.most, at, v)

    def histogram(self, s: int) -> tuple[np.ndarray, ...]:
        at = slice(self.first[s], self.first[s] + self.bins[s])
        return self.weight[at], self.rows[at], self.least[at], self.most[at]

    def picked(self, slots: np.ndarray, place: np.ndarray) -> np.ndarray:
        """The value at `place` (weighted, 0-based) among the collected values of each of these slots."""
        if not self.kept:
            return np.full(len(slots), np.nan)
        s = np.concatenate([c[0] for c in self.kept])
        value = np.concatenate([c[1] for c in self.kept])
        weight = np.concatenate([c[2] for c in self.kept])
        order = np.lexsort((value, s))
        s, value, ends = s[order], value[order], np.cumsum(weight[order])
        start, stop = np.searchsorted(s, slots, side="left"), np.searchsorted(s, slots, side="right")
        before = np.where(start > 0, ends[np.maximum(start - 1, 0)], 0)
        at = np.searchsorted(ends, before + place, side="right")
        ok = (stop > start) & (at < stop)
        return np.where(ok, value[np.minimum(at, max(len(value) - 1, 0))], np.nan)
