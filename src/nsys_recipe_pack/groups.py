"""Grouping helpers over NumPy arrays.

`np.unique` without `return_inverse` takes a hash-table path in NumPy 2.3+ that is tens of times slower than
sorting on millions of distinct integers, so distinct values of large arrays are taken by sorting here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values, as np.unique(values) gives them; integers within a narrow span (threads, domains,
    kinds) counted rather than sorted, which is several times quicker."""
    values = np.asarray(values)
    if not len(values):
        return values
    if values.dtype.kind in "iu":
        low, high = int(values.min()), int(values.max())
        if high - low <= 4 * len(values) + 1024:
            counts = np.bincount((values - low if low else values).astype(np.intp, copy=False))
            return np.flatnonzero(counts).astype(values.dtype) + values.dtype.type(low)
    s = np.sort(values, kind="quicksort")
    return s[np.r_[True, s[1:] != s[:-1]]]


def one_of(values: np.ndarray, choices) -> np.ndarray:
    """np.isin(values, choices) for a few choices (event types, kinds of call): a comparison per choice, an order of
    magnitude quicker than np.isin's general path."""
    choices = np.asarray(choices).ravel()
    values = np.asarray(values)
    if len(choices) > 8 or values.dtype.kind not in "iub":
        return np.isin(values, choices)
    out = np.zeros(values.shape, bool)
    for choice in choices.tolist():
        out |= values == choice
    return out


def picked(mask: np.ndarray) -> np.ndarray | slice:
    """The rows a mask picks, a slice where it picks them all: arrays taken by it are then views, not copies (as a
    span's rows usually all are what a view keeps)."""
    return slice(None) if mask.all() else np.flatnonzero(mask)


def stable_order(values: np.ndarray) -> np.ndarray:
    """np.argsort(values, kind="stable"); values that fit in 16 bits (levels, codes of a few groups) are sorted as
    such, which NumPy does by radix."""
    values = np.asarray(values)
    if len(values) and values.dtype.kind in "iu" and values.dtype.itemsize > 2 and \
            -(1 << 15) <= int(values.min()) and int(values.max()) < 1 << 15:
        values = values.astype(np.int16)
    return np.argsort(values, kind="stable")


def runs_of_about(sizes: np.ndarray, about: int) -> list[tuple[int, int]]:
    """Consecutive items (of these sizes) in runs of about `about` in all, as (first, stop) index ranges: an item
    joins the run where its first unit falls, so a run holds at least one item and an item is never split."""
    sizes = np.asarray(sizes, np.int64)
    run = (np.cumsum(sizes) - sizes) // max(about, 1)
    cut = np.flatnonzero(np.diff(run)) + 1
    return list(zip(np.r_[0, cut].tolist(), np.r_[cut, len(sizes)].tolist(), strict=True)) if len(sizes) else []


def add_counts(target: np.ndarray, places: np.ndarray, step: int = 1) -> None:
    """np.add.at(target, places, step), by counting the places in the window they span when it is narrow (a span's
    ops among every launch key), which is far quicker than np.add.at's unbuffered loop."""
    if not len(places):
        return
    low, high = int(places.min()), int(places.max()) + 1
    if high - low > 4 * len(places) + 1024:
        np.add.at(target, places, step)
        return
    target[low:high] += (np.bincount(places - low, minlength=high - low) * step).astype(target.dtype, copy=False)


class SortedGroups:
    """Rows grouped by an integer key, sorted once (stably), then reduced per group as often as needed:
    the sort, first-of-each-group and `reduceat` idiom written once. Groups come in key order."""

    def __init__(self, key: np.ndarray):
        key = np.asarray(key)
        self.order = stable_order(key)  # rows in group order, each group's rows in input order
        sorted_key = key[self.order]
        self.first = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) if len(key) else \
            np.zeros(0, np.intp)  # where each group starts in `order`
        self.keys = sorted_key[self.first]
        self.lead = self.order[self.first]  # each group's first row
        self.size = np.diff(np.r_[self.first, len(key)])

    def __len__(self) -> int:
        return len(self.first)

    def rows(self, group: int) -> np.ndarray:
        """The rows of the group at this place (in key order), in input order."""
        return self.order[self.first[group]:self.first[group] + self.size[group]]

    def _reduce(self, ufunc, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if not len(self.first):
            return np.zeros(0, values.dtype)
        return ufunc.reduceat(values[self.order], self.first)

    def sum(self, values: np.ndarray) -> np.ndarray:
        return self._reduce(np.add, values)

    def min(self, values: np.ndarray) -> np.ndarray:
        return self._reduce(np.minimum, values)

    def max(self, values: np.ndarray) -> np.ndarray:
        return self._reduce(np.maximum, values)


def sums_by_key(key: np.ndarray, values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(the distinct keys in order, each one's rows, each of the integer `values` summed per key), as SortedGroups
    gives them; keys within a narrow span (names of a few domains) counted into a table of the span rather than
    sorted."""
    if not len(key):
        return key, np.zeros(0, np.int64), [np.zeros(0, np.int64) for _ in values]
    low, high = int(key.min()), int(key.max())
    if high - low > 4 * len(key) + 1024:
        groups = SortedGroups(key)
        return groups.keys, groups.size.astype(np.int64), [groups.sum(v) for v in values]
    at = key - low
    size = np.bincount(at, minlength=high - low + 1)
    present = np.flatnonzero(size)
    sums = []
    for v in values:
        total = np.zeros(len(size), np.int64)
        np.add.at(total, at, v)
        sums.append(total[present])
    return present + low, size[present].astype(np.int64), sums


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, codes) as np.unique(values, return_inverse=True) gives them, for a column of few
    distinct values (threads, processes, devices) without sorting it: each row is placed among the values a sample
    of the column holds, and only a column with a value the sample missed is sorted."""
    values = np.asarray(values)
    if not len(values):
        return values[:0], np.zeros(0, np.intp)
    guess = np.unique(np.r_[values[:: max(1, len(values) // 1024)], values[-1:]])
    if len(guess) <= 8:  # a pass per value beats a binary search per row
        codes = np.zeros(len(values), np.intp)
        for value in guess[:-1]:
            codes += values > value
    else:
        codes = np.searchsorted(guess, values)
    if (guess.take(codes, mode="clip") == values).all():
        return guess, codes
    distinct, codes = np.unique(values, return_inverse=True)
    return distinct, codes.reshape(-1)


class Vocabulary:
    """Ids for the distinct values (strings, None, or ints) met so far, given in order of first sight: names read a
    piece at a time keep one id across the pieces. `words`: those met already, in the order of their ids."""

    def __init__(self, words: Iterable = ()):
        self.words: list = list(words)
        self.id_of: dict = {w: i for i, w in enumerate(self.words)}

    def ids(self, words: Iterable) -> np.ndarray:
        out = []
        for w in words:
            i = self.id_of.get(w)
            if i is None:
                i = self.id_of[w] = len(self.words)
                self.words.append(w)
            out.append(i)
        return np.array(out, np.int64)
