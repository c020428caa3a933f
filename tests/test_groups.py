"""Grouped reductions over NumPy arrays (nsys_recipe_pack.groups), against hand-worked cases and pandas."""

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from nsys_recipe_pack.groups import (
    SortedGroups,
    add_counts,
    distinct,
    factorize,
    one_of,
    runs_of_about,
    stable_order,
    sums_by_key,
)


def test_groups_of_a_small_case_by_hand():
    key = np.array([3, 1, 3, 2, 1, 3])
    values = np.array([10, 20, 30, 40, 50, 60])
    g = SortedGroups(key)
    assert g.keys.tolist() == [1, 2, 3] and g.size.tolist() == [2, 1, 3]
    assert g.lead.tolist() == [1, 3, 0]  # each group's first row in input order
    assert g.sum(values).tolist() == [70, 40, 100]
    assert g.min(values).tolist() == [20, 40, 10] and g.max(values).tolist() == [50, 40, 60]
    empty = SortedGroups(np.zeros(0, np.int64))
    assert len(empty) == 0 and empty.sum(np.zeros(0, np.int64)).dtype == np.int64 and empty.size.tolist() == []


@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-10**12, 10**12)), max_size=60))
def test_groups_agree_with_pandas(rows):
    key = np.array([k for k, _ in rows], np.int64)
    values = np.array([v for _, v in rows], np.int64)
    g = SortedGroups(key)
    expected = pd.Series(values, dtype="int64").groupby(key).agg(["sum", "min", "max", "size", "first"])
    assert g.keys.tolist() == expected.index.tolist()
    assert g.sum(values).tolist() == expected["sum"].tolist()
    assert g.min(values).tolist() == expected["min"].tolist() and g.max(values).tolist() == expected["max"].tolist()
    assert g.size.tolist() == expected["size"].tolist() and values[g.lead].tolist() == expected["first"].tolist()
    assert distinct(key).tolist() == sorted(set(key.tolist()))


@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-10**12, 10**12), st.integers(0, 9)), max_size=60),
       st.sampled_from([1, 10**9]))
def test_sums_by_key_agree_with_pandas(rows, spread):
    # keys in a narrow span (counted) or far apart (sorted): the same distinct keys, counts and sums
    key = np.array([k for k, _, _ in rows], np.int64) * spread
    values = [np.array([v for _, v, _ in rows], np.int64), np.array([w for _, _, w in rows], np.int64)]
    keys, count, sums = sums_by_key(key, values)
    expected = pd.DataFrame({"a": values[0], "b": values[1]}).groupby(key).agg(["sum", "size"])
    assert keys.tolist() == expected.index.tolist() and count.tolist() == expected[("a", "size")].tolist()
    assert [s.tolist() for s in sums] == [expected[("a", "sum")].tolist(), expected[("b", "sum")].tolist()]
    assert count.dtype == np.int64 and all(s.dtype == np.int64 for s in sums)


def test_factorize_of_a_small_case_by_hand():
    words, codes = factorize(np.array([7, 3, 7, 7, 3]))
    assert words.tolist() == [3, 7] and codes.tolist() == [1, 0, 1, 1, 0]
    words, codes = factorize(np.zeros(0, np.int64))
    assert words.tolist() == [] and codes.tolist() == []
    values = np.full(5000, 9)
    values[1] = 4  # a value the sample (every 4th row, and the last) does not see
    words, codes = factorize(values)
    assert words.tolist() == [4, 9] and codes[:3].tolist() == [1, 0, 1] and codes.sum() == 4999


@given(st.lists(st.sampled_from([-(10**15), 2, 294065908970382, 294065908970657, 10**16]), max_size=3000),
       st.integers(0, 2999), st.integers(-(10**17), 10**17), st.integers(0, 12))
def test_factorize_agrees_with_numpy_unique(values, at, rare, more):
    """Few distinct values (threads), a rare one that a sample of the column misses, or many (a binary search)."""
    values = np.array(values + list(range(more)), np.int64)
    if len(values):
        values[at % len(values)] = rare
    words, codes = factorize(values)
    expected_words, expected_codes = np.unique(values, return_inverse=True)
    assert words.tolist() == expected_words.tolist() and codes.tolist() == expected_codes.reshape(-1).tolist()


def test_stable_order_by_hand():
    """Ties keep their input order, whether the values fit in 16 bits (sorted as such) or not."""
    assert stable_order(np.array([3, -1, 3, 0, -1], np.int64)).tolist() == [1, 4, 3, 0, 2]
    assert stable_order(np.array([1 << 15, 5, 1 << 15, -(1 << 15)], np.int64)).tolist() == [3, 1, 0, 2]
    assert stable_order(np.array([], np.int64)).tolist() == []


@given(st.lists(st.integers(-(1 << 16), 1 << 16), max_size=500), st.sampled_from([np.int64, np.int32, np.uint32]))
def test_stable_order_is_a_stable_argsort(values, dtype):
    values = np.array(values).astype(dtype)
    assert stable_order(values).tolist() == sorted(range(len(values)), key=lambda i: values[i])


def test_add_counts_by_hand():
    target = np.array([5, 5, 5, 5, 5], np.int32)
    add_counts(target, np.array([3, 1, 3, 3]), -1)
    assert target.tolist() == [5, 4, 5, 2, 5] and target.dtype == np.int32
    add_counts(target, np.zeros(0, np.int64))
    assert target.tolist() == [5, 4, 5, 2, 5]


@given(st.lists(st.integers(0, 3000), max_size=40), st.sampled_from([1, -1, 3]))
def test_add_counts_agrees_with_add_at(places, step):
    """Both ways: places close together (counted in their window) and spread wide (np.add.at)."""
    places = np.array(places, np.int64)
    target, expected = np.arange(3001, dtype=np.int64), np.arange(3001, dtype=np.int64)
    add_counts(target, places, step)
    np.add.at(expected, places, step)
    assert target.tolist() == expected.tolist()


def test_runs_of_about_some_size_never_split_an_item():
    # first units at 0, 5, 10 | 15, 20 for runs of 12; an item larger than a run is a run of its own
    assert runs_of_about(np.array([5, 5, 5, 5, 3]), 12) == [(0, 3), (3, 5)]
    assert runs_of_about(np.array([1, 30, 1, 1]), 10) == [(0, 2), (2, 4)]
    assert runs_of_about(np.array([], np.int64), 10) == []


@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=40), st.integers(0, 5000), st.booleans(),
       st.sampled_from([np.int64, np.int32, np.uint64]))
def test_distinct_agrees_with_numpy_unique(wide, narrow, spread, dtype):
    """Values in a narrow span (counted) and spread over the whole type (sorted), signed and unsigned."""
    info = np.iinfo(dtype)
    values = np.array([v for v in wide if info.min <= v <= info.max] if spread else [narrow, narrow + 3, narrow],
                      dtype)
    if spread and len(values):
        values = np.r_[values, values[:1]]
    got, expected = distinct(values), np.unique(values)
    assert got.dtype == expected.dtype and got.tolist() == expected.tolist()


def test_distinct_of_values_at_the_ends_of_their_type_by_hand():
    low = np.array([-(1 << 63) + 5, -(1 << 63), -(1 << 63) + 5])
    assert distinct(low).tolist() == [-(1 << 63), -(1 << 63) + 5]
    high = np.array([(1 << 64) - 1, (1 << 64) - 3, (1 << 64) - 1], np.uint64)
    assert distinct(high).tolist() == [(1 << 64) - 3, (1 << 64) - 1] and distinct(high).dtype == np.uint64


@given(st.lists(st.integers(-3, 80), max_size=200), st.lists(st.integers(-3, 80), max_size=12))
def test_one_of_agrees_with_numpy_isin(values, choices):
    """A few choices compared one by one, more than a few through np.isin."""
    values = np.array(values, np.int64)
    assert one_of(values, choices).tolist() == np.isin(values, choices).tolist()
    assert one_of(values, (59, 60)).tolist() == [v in (59, 60) for v in values.tolist()]
